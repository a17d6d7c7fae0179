"""The importing side of test_sharing: VMM memory imported from a POSIX FD, and legacy
cuIpc memory opened from a 64-byte handle, each checked and written on command."""

import ctypes
import os
from multiprocessing import reduction

from cuda.bindings import driver as cu
from driver_support import check


def holds(address, value, size):
    data = bytearray(size)
    check(cu.cuMemcpyDtoH(data, address, size))
    return data == bytes([value]) * size


def vmm_map(handle, size):
    """Reserves, maps and grants device 0 read-write access to `size` bytes of `handle`."""
    address = check(cu.cuMemAddressReserve(size, 0, 0, 0))
    check(cu.cuMemMap(address, size, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cu.cuMemSetAccess(address, size, [access], 1))
    return address


def run(pipe):
    check(cu.cuInit(0))
    device = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(device))
    check(cu.cuCtxSetCurrent(ctx))
    posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    mapped = {}
    while True:
        command, *args = pipe.recv()
        if command == "vmm":
            size, value = args
            fd = reduction.recv_handle(pipe)
            handle = check(cu.cuMemImportFromShareableHandle(fd, posix))
            os.close(fd)
            address = vmm_map(handle, size)
            # The mapping keeps the memory; the imported handle may go.
            check(cu.cuMemRelease(handle))
            mapped["vmm"] = ("vmm", address, size)
            ok = holds(address, value, size)
            check(cu.cuMemsetD8(address, value + 1, size))
            pipe.send(("vmm", ok))
        elif command == "ipc":
            raw, size, value = args
            handle = cu.CUipcMemHandle()
            ctypes.memmove(handle.getPtr(), raw, 64)
            flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            address = check(cu.cuIpcOpenMemHandle(handle, flags))
            mapped["ipc"] = ("ipc", address, size)
            ok = holds(address, value, size)
            check(cu.cuMemsetD8(address, value + 1, size))
            pipe.send(("ipc", ok))
        elif command == "quit":
            for kind, address, size in mapped.values():
                if kind == "vmm":
                    check(cu.cuMemUnmap(address, size))
                    check(cu.cuMemAddressFree(address, size))
                else:
                    check(cu.cuIpcCloseMemHandle(address))
            pipe.send(("bye",))
            return
