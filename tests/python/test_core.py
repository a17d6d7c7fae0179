"""cuda.core on fakecuda: devices, streams, buffers, events, pinned memory, and the native
checkpoint of a plain process through cuda.core.checkpoint."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from cuda.core import Device, EventOptions, LegacyPinnedMemoryResource
from cuda.core import checkpoint

from conftest import run_importer


@pytest.fixture(scope="module")
def device():
    d = Device(0)
    d.set_current()
    return d


def test_buffers_round_trip_through_streams(device):
    stream = device.create_stream()
    buffer = device.allocate(1 << 20, stream=stream)
    pinned = LegacyPinnedMemoryResource().allocate(1 << 20)
    assert pinned.is_host_accessible
    host = np.from_dlpack(pinned).view(np.uint8) if hasattr(np, "from_dlpack") else None
    assert host is not None
    host[:] = 42
    buffer.copy_from(pinned, stream=stream)
    # The copy is queued: the host bytes may change only after the stream ran it.
    stream.sync()
    host[:] = 0
    pinned.copy_from(buffer, stream=stream)
    stream.sync()
    assert int(host.sum()) == 42 * (1 << 20)
    buffer.close(stream)
    pinned.close()


def test_events_measure_stream_work(device):
    stream = device.create_stream()
    timed = EventOptions(timing_enabled=True)
    first = stream.record(options=timed)
    buffer = device.allocate(1 << 20, stream=stream)
    buffer.fill(7, stream=stream)
    second = stream.record(options=timed)
    second.sync()
    assert second.is_done
    assert (second - first) >= 0.0
    buffer.close(stream)


CHILD = """
import sys, time
from cuda.core import Device
d = Device(0); d.set_current()
b = d.allocate(1 << 20, stream=d.default_stream)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_plain_process_checkpoints_and_restores(device):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=os.environ.copy(),
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        process = checkpoint.Process(child.pid)
        assert str(process.state).lower().endswith("running")
        process.lock()
        assert str(process.state).lower().endswith("locked")
        process.checkpoint()
        assert str(process.state).lower().endswith("checkpointed")
        process.restore()
        process.unlock()
        assert str(process.state).lower().endswith("running")
    finally:
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0


def test_device_memory_pools_allocate_in_stream_order(device):
    from cuda.core import DeviceMemoryResource

    stream = device.create_stream()
    resource = DeviceMemoryResource(device)
    buffer = resource.allocate(1 << 20, stream=stream)
    assert resource.attributes.used_mem_current >= 1 << 20
    buffer.fill(5, stream=stream)
    pinned = LegacyPinnedMemoryResource().allocate(1 << 20)
    pinned.copy_from(buffer, stream=stream)
    stream.sync()
    host = np.from_dlpack(pinned).view(np.uint8)
    assert int(host[0]) == 5 and int(host[-1]) == 5
    buffer.close(stream)
    stream.sync()
    assert resource.attributes.used_mem_current == 0
    pinned.close()


def test_pool_ipc_shares_bytes_between_processes(device):
    from cuda.core import DeviceMemoryResource, DeviceMemoryResourceOptions

    import pool_ipc_child

    size = 1 << 20
    stream = device.create_stream()
    options = DeviceMemoryResourceOptions(ipc_enabled=True, max_size=1 << 24)
    resource = DeviceMemoryResource(device, options=options)
    buffer = resource.allocate(size, stream=stream)
    buffer.fill(7, stream=stream)
    stream.sync()
    run_importer(pool_ipc_child.run, resource, buffer, size)
    pinned = LegacyPinnedMemoryResource().allocate(size)
    pinned.copy_from(buffer, stream=stream)
    stream.sync()
    assert (np.from_dlpack(pinned).view(np.uint8) == 9).all(), "the creator sees the write"
    buffer.close(stream)
    pinned.close()
