"""The importing side of test_core.test_pool_ipc_shares_bytes_between_processes: imports the
pool (before any context is current) and the buffer, checks the creator's bytes, writes its
own."""

import numpy as np
from cuda.core import Buffer, Device, DeviceMemoryResource, LegacyPinnedMemoryResource


def run(handle, descriptor, size, results):
    device = Device(0)
    # Imported before any context is current, as unpickling a resource does.
    resource = DeviceMemoryResource.from_allocation_handle(device, handle)
    device.set_current()
    stream = device.create_stream()
    buffer = Buffer.from_ipc_descriptor(resource, descriptor, stream=stream)
    pinned = LegacyPinnedMemoryResource().allocate(size)
    pinned.copy_from(buffer, stream=stream)
    stream.sync()
    host = np.from_dlpack(pinned).view(np.uint8)
    results.put(("saw", bool((host == 7).all())))
    buffer.fill(9, stream=stream)
    stream.sync()
    results.put(("wrote", True))
