"""Memory-pool IPC through NVIDIA's cuda.core, checkpointed by cuinterpose: a
`DeviceMemoryResource(ipc_enabled=True)` pool shared by its creator (this process) with 1 to 3
importers, toggled in place (checkpoint and restore) by the `cuinterpose` binary while every
process keeps its buffers. Bytes, addresses and the sharing itself (writes seen across
processes) are checked after each toggle; buffers are freed before, between and after the
toggles, and nothing is left in the pool at the end.

Run by `clients/tests/pool_ipc.rs`, only with the shim preloaded: without it, the driver's
native checkpoint refuses a process whose pool is shared (fakecuda models that)."""

import json
import multiprocessing
import os
import subprocess

import numpy as np
import pytest
from cuda.core import Device, DeviceMemoryResource, DeviceMemoryResourceOptions
from cuda.core import LegacyPinnedMemoryResource

import pool_peer

MIB = 1 << 20


@pytest.fixture(scope="module")
def device():
    assert "libcuinterpose" in os.environ.get("LD_PRELOAD", ""), "run under the shim"
    # CUDA processes must not fork (cuda.core checks the global start method).
    multiprocessing.set_start_method("spawn", force=True)
    d = Device(0)
    d.set_current()
    return d


def cuinterpose(*args):
    """Runs the cuinterpose binary (never under the shim itself) and returns its JSON report."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(
        [os.environ["CUINTERPOSE_BIN"], *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"cuinterpose {args}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def fill_and_check(buffer, value, stream):
    buffer.fill(value, stream=stream)
    stream.sync()
    assert pool_peer.holds(buffer, value, stream)


class Peer:
    """One importing process and its command pipe."""

    def __init__(self, resource):
        context = multiprocessing.get_context("spawn")
        self.pipe, theirs = context.Pipe()
        # Daemonic: a failed test that never says quit must not hang the suite at exit.
        self.process = context.Process(
            target=pool_peer.run, args=(resource.allocation_handle, theirs), daemon=True
        )
        self.process.start()

    def ask(self, *command):
        self.pipe.send(command)
        assert self.pipe.poll(60), f"the importer did not answer {command[0]}"
        return self.pipe.recv()

    def finish(self):
        assert self.ask("quit") == ("bye",)
        self.process.join(60)
        assert self.process.exitcode == 0


@pytest.mark.parametrize("processes", [2, 4])
def test_pool_buffers_survive_toggles_shared(device, processes):
    stream = device.create_stream()
    options = DeviceMemoryResourceOptions(ipc_enabled=True, max_size=64 * MIB)
    resource = DeviceMemoryResource(device, options=options)
    assert resource.is_ipc_enabled
    # Freed before any checkpoint: nothing of it may come back.
    early = resource.allocate(MIB, stream=stream)
    early.close(stream)
    sizes = {"a": MIB, "b": 3 * MIB, "c": 2 * MIB + 4096}
    buffers = {n: resource.allocate(s, stream=stream) for n, s in sizes.items()}
    for i, (name, buffer) in enumerate(buffers.items()):
        fill_and_check(buffer, 10 + i, stream)
    expected = {name: 10 + i for i, name in enumerate(buffers)}
    addresses = {n: int(b.handle) for n, b in buffers.items()}

    peers = [Peer(resource) for _ in range(processes - 1)]
    imported = []
    for peer in peers:
        seen = {}
        for name, buffer in buffers.items():
            reply = peer.ask("import", name, buffer.ipc_descriptor)
            assert reply[:2] == ("imported", name)
            seen[name] = reply[2]
        imported.append(seen)
        assert peer.ask("check", expected) == ("checked", {n: True for n in expected})

    inspection = cuinterpose("inspect")
    assert inspection["valid"], inspection
    assert inspection["summary"]["participants"] == processes, inspection
    assert inspection["summary"]["shared_allocations"] >= len(buffers), inspection

    for round_ in range(2):
        report = cuinterpose("toggle", "--pid", str(os.getpid()))
        assert report["command"] == "toggle", report
        # Every shared buffer was saved once (by its creator) and loaded back.
        shared = sum(b.size for b in buffers.values())
        assert report["bytes"] >= 2 * shared, report
        # The same bytes at the same addresses, in the creator and in every importer.
        for name, buffer in buffers.items():
            assert int(buffer.handle) == addresses[name]
            assert pool_peer.holds(buffer, expected[name], stream), (round_, name)
        for peer, seen in zip(peers, imported):
            assert peer.ask("check", expected) == ("checked", {n: True for n in expected})
        # Still shared: each importer's write is seen by the creator and the other importers.
        for k, peer in enumerate(peers):
            value = 100 + 10 * round_ + k
            assert peer.ask("write", "b", value) == ("wrote", "b")
            expected["b"] = value
            assert pool_peer.holds(buffers["b"], value, stream)
            for other in peers:
                assert other.ask("check", {"b": value}) == ("checked", {"b": True})
        fill_and_check(buffers["a"], 50 + round_, stream)
        expected["a"] = 50 + round_
        if round_ == 0:
            # Freed between the checkpoints, by the importers first, then by the creator.
            for peer in peers:
                assert peer.ask("close", "c") == ("closed", "c")
            buffers.pop("c").close(stream)
            del expected["c"]
            stream.sync()
            # Allocated and shared after a restore.
            late = resource.allocate(MIB, stream=stream)
            fill_and_check(late, 77, stream)
            for peer in peers:
                assert peer.ask("import", "late", late.ipc_descriptor)[:2] == ("imported", "late")
            buffers["late"] = late
            expected["late"] = 77
            addresses["late"] = int(late.handle)

    for peer in peers:
        assert peer.ask("check", expected) == ("checked", {n: True for n in expected})
        peer.finish()
    for buffer in buffers.values():
        buffer.close(stream)
    stream.sync()
    assert resource.attributes.used_mem_current == 0
    resource.close()
    after = cuinterpose("inspect")
    assert after["summary"]["shared_allocations"] == 0, after
