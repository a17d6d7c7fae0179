"""An importing process of test_pool_sharing: imports a cuda.core IPC memory pool and the
buffers it is sent, and checks or writes them on command (over a multiprocessing pipe)."""

import numpy as np
from cuda.core import Buffer, Device, DeviceMemoryResource, LegacyPinnedMemoryResource


def holds(buffer, value, stream):
    """Whether every byte of `buffer` is `value` (read back through pinned memory)."""
    pinned = LegacyPinnedMemoryResource().allocate(buffer.size)
    pinned.copy_from(buffer, stream=stream)
    stream.sync()
    ok = bool((np.from_dlpack(pinned).view(np.uint8) == value).all())
    pinned.close()
    return ok


def run(handle, pipe):
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    resource = DeviceMemoryResource.from_allocation_handle(device, handle)
    buffers = {}
    while True:
        command, *args = pipe.recv()
        if command == "import":
            name, descriptor = args
            buffers[name] = Buffer.from_ipc_descriptor(resource, descriptor, stream=stream)
            pipe.send(("imported", name, int(buffers[name].handle)))
        elif command == "check":
            (expected,) = args
            pipe.send(("checked", {n: holds(buffers[n], v, stream) for n, v in expected.items()}))
        elif command == "write":
            name, value = args
            buffers[name].fill(value, stream=stream)
            stream.sync()
            pipe.send(("wrote", name))
        elif command == "close":
            (name,) = args
            buffers.pop(name).close(stream)
            stream.sync()
            pipe.send(("closed", name))
        elif command == "quit":
            for buffer in buffers.values():
                buffer.close(stream)
            stream.sync()
            pipe.send(("bye",))
            return
