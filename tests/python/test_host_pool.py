"""Host and managed memory pools: pinned host pools through cuda.bindings (the CPU's memory,
reachable from a device once the pool grants it access, reported as host memory) and managed
pools through cuda.core's ManagedMemoryResource (every device's and the CPU's at once), and
pinned pools of a host NUMA node shared between processes (cuda.core's PinnedMemoryResource
with IPC); the same with and without the shim, which leaves host and managed pools to the
driver."""

import ctypes

import numpy as np
from cuda.bindings import driver as cu

from conftest import check, run_importer

R = cu.CUresult
SIZE = 1 << 16


def host_pool(numa):
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = (
        cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        if numa
        else cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    )
    props.location.id = 0
    return props


def test_host_pools_need_a_device_grant(context):
    attr = cu.CUdevice_attribute
    assert check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED, 0))
    ipc = host_pool(False)
    ipc.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    assert cu.cuMemPoolCreate(ipc)[0] == R.CUDA_ERROR_INVALID_VALUE, "never IPC capable"
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    device = cu.CUmemLocation()
    device.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    device.id = 0
    for numa in (False, True):
        pool = check(cu.cuMemPoolCreate(host_pool(numa)))
        ptr = check(cu.cuMemAllocFromPoolAsync(SIZE, pool, stream))
        kind = check(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr))
        assert kind == cu.CUmemorytype.CU_MEMORYTYPE_HOST
        flags = check(cu.cuMemPoolGetAccess(pool, device))
        assert flags == cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE
        assert cu.cuMemsetD8Async(ptr, 1, SIZE, stream)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS
        ctypes.memset(int(ptr), 2, SIZE)  # the CPU's memory
        grant = cu.CUmemAccessDesc()
        grant.location = device
        grant.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check(cu.cuMemPoolSetAccess(pool, [grant], 1))
        out = np.zeros(SIZE, dtype=np.uint8)
        check(cu.cuMemcpyDtoHAsync(out.ctypes.data, ptr, SIZE, stream))
        check(cu.cuMemsetD8Async(int(ptr) + 8, 4, 8, stream))
        check(cu.cuStreamSynchronize(stream))
        assert (out == 2).all()
        assert ctypes.string_at(int(ptr), 17) == b"\x02" * 8 + b"\x04" * 8 + b"\x02"
        check(cu.cuMemFreeAsync(ptr, stream))
        check(cu.cuStreamSynchronize(stream))
        check(cu.cuMemPoolDestroy(pool))
    check(cu.cuStreamDestroy(stream))


def test_cuda_core_managed_pools(context):
    from cuda.core import Device, DeviceMemoryResource, ManagedMemoryResource
    from cuda.core import ManagedMemoryResourceOptions

    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    for options in (
        None,
        ManagedMemoryResourceOptions(preferred_location=0),
        ManagedMemoryResourceOptions(preferred_location_type="host"),
    ):
        resource = ManagedMemoryResource(options)
        buffer = resource.allocate(SIZE, stream=stream)
        assert buffer.is_host_accessible and buffer.is_device_accessible
        buffer.fill(7, stream=stream)
        other = DeviceMemoryResource(device).allocate(SIZE, stream=stream)
        other.copy_from(buffer, stream=stream)
        stream.sync()
        assert ctypes.string_at(int(buffer.handle), 4) == b"\x07" * 4, options
        out = np.zeros(SIZE, dtype=np.uint8)
        check(cu.cuMemcpyDtoH(out.ctypes.data, int(other.handle), SIZE))
        assert (out == 7).all(), options
        buffer.close(stream)
        other.close(stream)
    check(cu.cuCtxSetCurrent(context))


def test_host_numa_pools_share_bytes_between_processes(context):
    from cuda.core import Device, PinnedMemoryResource, PinnedMemoryResourceOptions

    import host_pool_ipc_child

    # Only a NUMA node's pool is IPC capable; the host's as a whole never is (above).
    props = host_pool(True)
    props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    check(cu.cuMemPoolDestroy(check(cu.cuMemPoolCreate(props))))
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    resource = PinnedMemoryResource(PinnedMemoryResourceOptions(ipc_enabled=True, numa_id=0))
    assert resource.is_ipc_enabled and resource.is_host_accessible
    buffer = resource.allocate(SIZE, stream=stream)
    ctypes.memset(int(buffer.handle), 7, SIZE)
    run_importer(host_pool_ipc_child.run, resource, buffer, SIZE)
    assert ctypes.string_at(int(buffer.handle), SIZE) == b"\x09" * SIZE, "the creator sees it"
    # A device reaches the memory once the pool grants it, as for any host pool.
    out = np.zeros(SIZE, dtype=np.uint8)
    copy = (out.ctypes.data, int(buffer.handle), SIZE)
    assert cu.cuMemcpyDtoH(*copy)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS
    grant = cu.CUmemAccessDesc()
    grant.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    grant.location.id = 0
    grant.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(cu.cuMemPoolSetAccess(int(resource.handle), [grant], 1))
    check(cu.cuMemcpyDtoH(*copy))
    assert (out == 9).all()
    buffer.close(stream)
    resource.close()
