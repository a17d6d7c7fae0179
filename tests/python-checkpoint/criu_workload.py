"""The workload of test_pool_criu, run as its own PID namespace (`unshare -fp setsid python
criu_workload.py DIR`) so that CRIU can dump and restore it: this process creates a cuda.core
IPC memory pool and buffers, an importer (pool_peer, spawned) maps them; then, for each round,
once the file DIR/goN appears (after a CRIU dump and restore), both check every byte, the
importer writes, the creator checks the write, and DIR/doneN says "ok" or what went wrong.
DIR/quit ends it. It talks to the test through files only: CRIU dumps no connection to a
process outside the tree."""

import multiprocessing
import os
import sys
import time
import traceback

from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions

import pool_peer

MIB = 1 << 20


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.02)


def say(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def main(work):
    multiprocessing.set_start_method("spawn", force=True)
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    options = DeviceMemoryResourceOptions(ipc_enabled=True, max_size=32 * MIB)
    resource = DeviceMemoryResource(device, options=options)
    buffers = {"x": resource.allocate(2 * MIB, stream=stream), "y": resource.allocate(MIB, stream=stream)}
    expected = {"x": 21, "y": 22}
    for name, buffer in buffers.items():
        buffer.fill(expected[name], stream=stream)
    stream.sync()
    pipe, theirs = multiprocessing.Pipe()
    importer = multiprocessing.Process(target=pool_peer.run, args=(resource.allocation_handle, theirs))
    importer.start()

    def ask(*command):
        pipe.send(command)
        return pipe.recv()

    for name, buffer in buffers.items():
        assert ask("import", name, buffer.ipc_descriptor)[:2] == ("imported", name)
    addresses = {n: int(b.handle) for n, b in buffers.items()}
    say(os.path.join(work, "ready"), str(os.getpid()))
    round_ = 0
    while True:
        round_ += 1
        go, done = os.path.join(work, f"go{round_}"), os.path.join(work, f"done{round_}")
        while not os.path.exists(go):
            if os.path.exists(os.path.join(work, "quit")):
                assert ask("quit") == ("bye",)
                importer.join(60)
                for buffer in buffers.values():
                    buffer.close(stream)
                stream.sync()
                return
            time.sleep(0.02)
        try:
            for name, buffer in buffers.items():
                assert int(buffer.handle) == addresses[name], f"{name} moved"
                assert pool_peer.holds(buffer, expected[name], stream), f"creator: {name} changed"
            assert ask("check", expected) == ("checked", {n: True for n in expected}), "importer"
            expected["x"] = 60 + round_
            assert ask("write", "x", expected["x"]) == ("wrote", "x")
            assert pool_peer.holds(buffers["x"], expected["x"], stream), "the importer's write"
            say(done, "ok")
        except Exception:
            say(done, traceback.format_exc())


if __name__ == "__main__":
    # The tree writes its own log (appending): a file that a process outside the tree also
    # writes would change size between the dump and the restore, which CRIU refuses.
    log = os.open(os.path.join(sys.argv[1], "workload.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    main(sys.argv[1])
