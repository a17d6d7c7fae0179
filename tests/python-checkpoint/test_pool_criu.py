"""cuda.core memory-pool IPC through CRIU: a creator and an importer sharing pool buffers are
checkpointed (`cuinterpose checkpoint --criu`: the sharing taken apart, native checkpoint, CRIU
dump, which ends the tree) and restored (`cuinterpose restore --criu`) twice; after each restore
both processes find every byte at the same address and the importer's writes reach the creator.
Needs CRIU (`$CUINTERPOSE_CRIU`, set by clients/tests/python.rs); fails without it."""

import os
import subprocess
import sys
import time

from test_pool_sharing import cuinterpose

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def namespace_root(unshare):
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{unshare}/task/{unshare}/children") as f:
            children = f.read().split()
        if children:
            return int(children[0])
        assert time.monotonic() < deadline, "the workload's namespace did not start"
        time.sleep(0.01)


def test_pool_sharing_survives_criu_dump_and_restore(tmp_path):
    criu = os.environ.get("CUINTERPOSE_CRIU")
    assert criu and os.access(criu, os.X_OK), f"no CRIU (CUINTERPOSE_CRIU={criu!r})"
    work = str(tmp_path)
    unshare = subprocess.Popen(
        ["unshare", "-fp", "setsid", sys.executable, os.path.join(HERE, "criu_workload.py"), work],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # CRIU mounts the tree's /proc at ./proc.crtools: a directory of its own.
        cwd=work,
    )
    root = None
    try:
        root = namespace_root(unshare.pid)
        wait_for(os.path.join(work, "ready"))
        for round_ in (1, 2):
            images = os.path.join(work, f"checkpoint-{round_}")
            taken = cuinterpose("checkpoint", "--pid", str(root), "--criu", "--criu-binary", criu, "--dir", images)
            assert taken["command"] == "checkpoint", taken
            if round_ == 1:
                unshare.wait(30)
            restored = cuinterpose("restore", "--criu", "--criu-binary", criu, "--dir", images)
            assert restored["command"] == "restore", restored
            # The restored tree's root: the lowest namespace PID among the participants.
            pids = restored["host_pids"]
            root = pids[min(pids, key=int)]
            open(os.path.join(work, f"go{round_}"), "w").close()
            said = wait_for(os.path.join(work, f"done{round_}"))
            assert said == "ok", said + wait_for(os.path.join(work, "workload.log"))
        open(os.path.join(work, "quit"), "w").close()
        # The restored workload ends by itself, its importer first.
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{root}"):
            assert time.monotonic() < deadline, "the restored workload did not end"
            time.sleep(0.02)
        root = None
    finally:
        # Whatever happened, no tree outlives the test (killing a namespace's init ends it).
        if unshare.poll() is None:
            unshare.kill()
        if root is not None:
            try:
                os.kill(root, 9)
            except ProcessLookupError:
                pass
