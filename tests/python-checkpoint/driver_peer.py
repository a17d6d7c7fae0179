"""A process of test_pool_driver, driven over a multiprocessing pipe with NVIDIA's raw
`cuda.bindings` driver API: it creates or imports memory pools (pool FDs travel with
`multiprocessing.reduction.send_handle`), allocates, exports and imports pointers, checks,
writes and frees them on command."""

import ctypes
import os
from multiprocessing import reduction

from cuda.bindings import driver
from driver_support import check
from driver_support import primary_context as context


def ipc_pool(max_size=0):
    """A device-0 pool shareable as POSIX file descriptors."""
    props = driver.CUmemPoolProps()
    props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    props.maxSize = max_size
    return check(driver.cuMemPoolCreate(props))


def export_pool(pool):
    posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return check(driver.cuMemPoolExportToShareableHandle(pool, posix, 0))


def import_pool(fd):
    posix = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return check(driver.cuMemPoolImportFromShareableHandle(fd, posix, 0))


def export_bytes(data):
    """The 64 bytes of a CUmemPoolPtrExportData (opaque to the bindings)."""
    return ctypes.string_at(data.getPtr(), 64)


def export_data(raw):
    """A CUmemPoolPtrExportData holding `raw`."""
    data = driver.CUmemPoolPtrExportData()
    ctypes.memmove(data.getPtr(), raw, 64)
    return data


def holds(address, value, size):
    data = bytearray(size)
    check(driver.cuMemcpyDtoH(data, address, size))
    return data == bytes([value]) * size


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def run(pipe, context_first=True, visible=None):
    """Answers the test's commands. Without `context_first`, only `cuInit` runs until the test
    says `context` (a pool can then be imported with no context current). `visible`: this
    process's CUDA_VISIBLE_DEVICES, set before the driver reads it at `cuInit`."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    if context_first:
        context()
        stream = check(driver.cuStreamCreate(0))
    else:
        check(driver.cuInit(0))
    pools, memory = {}, {}
    while True:
        command, *args = pipe.recv()
        try:
            if command == "context":
                (ordinal,) = args
                ctx = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(ordinal))))
                check(driver.cuCtxSetCurrent(ctx))
                stream = check(driver.cuStreamCreate(0))
                pipe.send(("current", ordinal))
            elif command == "pool_access":
                name, ordinal = args
                location = driver.CUmemLocation()
                location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                location.id = ordinal
                pipe.send(("access", int(check(driver.cuMemPoolGetAccess(pools[name], location)))))
            elif command == "set_access":
                name, ordinal, flags = args
                grant = driver.CUmemAccessDesc()
                grant.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                grant.location.id = ordinal
                grant.flags = driver.CUmemAccess_flags(flags)
                check(driver.cuMemPoolSetAccess(pools[name], [grant], 1))
                pipe.send(("granted", name))
            elif command == "create_pool":
                (name,) = args
                pools[name] = ipc_pool()
                fd = export_pool(pools[name])
                reduction.send_handle(pipe, fd, os.getppid())
                os.close(fd)
                pipe.send(("created", name))
            elif command == "import_pool":
                (name,) = args
                fd = reduction.recv_handle(pipe)
                pools[name] = import_pool(fd)
                os.close(fd)
                pipe.send(("imported", name))
            elif command == "alloc":
                pool, key, size, value = args
                address = check(driver.cuMemAllocFromPoolAsync(size, pools[pool], stream))
                check(driver.cuMemsetD8Async(address, value, size, stream))
                check(driver.cuStreamSynchronize(stream))
                memory[key] = (int(address), size)
                data = check(driver.cuMemPoolExportPointer(address))
                pipe.send(("allocated", key, export_bytes(data)))
            elif command == "import_ptr":
                pool, key, exported, size = args
                address = check(driver.cuMemPoolImportPointer(pools[pool], export_data(exported)))
                memory[key] = (int(address), size)
                pipe.send(("mapped", key, int(address)))
            elif command == "check":
                (expected,) = args
                pipe.send(("checked", {k: holds(memory[k][0], v, memory[k][1]) for k, v in expected.items()}))
            elif command == "write":
                key, value = args
                address, size = memory[key]
                check(driver.cuMemsetD8(address, value, size))
                pipe.send(("wrote", key))
            elif command == "free":
                (key,) = args
                address, _ = memory.pop(key)
                check(driver.cuMemFreeAsync(address, stream))
                check(driver.cuStreamSynchronize(stream))
                pipe.send(("freed", key))
            elif command == "destroy":
                (name,) = args
                check(driver.cuMemPoolDestroy(pools.pop(name)))
                pipe.send(("destroyed", name))
            elif command == "fds":
                pipe.send(("fds", open_fds()))
            elif command == "release":
                # Everything freed and destroyed; what the process then holds.
                for address, _ in memory.values():
                    check(driver.cuMemFreeAsync(address, stream))
                check(driver.cuStreamSynchronize(stream))
                for pool in pools.values():
                    check(driver.cuMemPoolDestroy(pool))
                memory.clear()
                pools.clear()
                pipe.send(("released", open_fds()))
            elif command == "quit":
                pipe.send(("bye",))
                return
        except RuntimeError as error:
            # The driver's (or the shim's) refusal, for the test to check.
            pipe.send(("refused", str(error)))
