"""The importing side of test_host_pool.test_host_numa_pools_share_bytes_between_processes:
imports the pinned host pool and the buffer, checks the creator's bytes, writes its own."""

import ctypes

from cuda.core import Buffer, Device, PinnedMemoryResource


def run(handle, descriptor, size, results):
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    resource = PinnedMemoryResource.from_allocation_handle(handle)
    buffer = Buffer.from_ipc_descriptor(resource, descriptor, stream=stream)
    # Host memory: the CPU reads and writes it directly.
    results.put(("saw", ctypes.string_at(int(buffer.handle), size) == b"\x07" * size))
    ctypes.memset(int(buffer.handle), 9, size)
    results.put(("wrote", True))
