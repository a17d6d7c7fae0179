"""cuGetProcAddress by version, and the CUDA 13 ABIs the bindings reach through it.

cuda.bindings resolves every function by name at the version its ABI first shipped in: the
unsuffixed name at a newer version must hand out the newer ABI (a different signature), and a
version before a function existed must be refused as not sufficient.
"""

import ctypes
import threading
import time

import pytest
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
Q = cu.CUdriverProcAddressQueryResult


def address(name, version):
    return int(check(cu.cuGetProcAddress(name, version, 0))[0])


@pytest.mark.parametrize(
    "name, old, new, suffixed",
    [
        (b"cuMulticastBindMem", 12010, 13010, b"cuMulticastBindMem_v2"),
        (b"cuMulticastBindAddr", 12010, 13010, b"cuMulticastBindAddr_v2"),
        (b"cuCtxGetDevice", 2000, 13000, b"cuCtxGetDevice_v2"),
        (b"cuCtxSynchronize", 2000, 13000, b"cuCtxSynchronize_v2"),
        (b"cuLaunchHostFunc", 10000, 13020, b"cuLaunchHostFunc_v2"),
        (b"cuGraphAddNode", 12030, 13041, b"cuGraphAddNode_v3"),
        (b"cuCtxCreate", 11040, 12050, b"cuCtxCreate_v4"),
    ],
)
def test_a_newer_version_gets_the_newer_abi(context, name, old, new, suffixed):
    assert address(name, new) == address(suffixed, new)
    assert address(name, new) != address(name, old)
    assert address(name, new - 10) == address(name, old)


def raw_lookup(name, version):
    """cuGetProcAddress_v2 called directly: the bindings drop the status on an error."""
    lookup = ctypes.CDLL("libcuda.so.1").cuGetProcAddress_v2
    lookup.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_uint),
    ]
    pfn, status = ctypes.c_void_p(1), ctypes.c_uint(99)
    err = lookup(name, ctypes.byref(pfn), version, 0, ctypes.byref(status))
    return R(err), pfn.value, Q(status.value)


@pytest.mark.parametrize(
    "name, first",
    [(b"cuMemPoolCreate", 11020), (b"cuCheckpointProcessLock", 12080), (b"cuMemCreate", 10020)],
)
def test_a_version_before_the_first_abi_is_not_sufficient(context, name, first):
    err, pfn, status = raw_lookup(name, first)
    assert (err, status) == (R.CUDA_SUCCESS, Q.CU_GET_PROC_ADDRESS_SUCCESS)
    assert pfn
    err, pfn, status = raw_lookup(name, first - 10)
    assert err == R.CUDA_ERROR_NOT_FOUND
    assert not pfn
    assert status == Q.CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT


def test_an_unknown_name_is_not_found(context):
    err, pfn, status = raw_lookup(b"cuNoSuchFunction", 13000)
    assert err == R.CUDA_ERROR_NOT_FOUND
    assert not pfn
    assert status == Q.CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND


def test_context_calls_take_the_context(context):
    other = check(cu.cuCtxCreate(None, 0, check(cu.cuDeviceGet(1))))
    try:
        check(cu.cuCtxSetCurrent(context))
        assert int(check(cu.cuCtxGetDevice())) == 0
        assert int(check(cu.cuCtxGetDevice_v2(other))) == 1
        assert int(check(cu.cuCtxGetDevice_v2(None))) == 0
        check(cu.cuCtxSynchronize_v2(other))
    finally:
        check(cu.cuCtxDestroy(other))
        check(cu.cuCtxSetCurrent(context))
    err, _ = cu.cuCtxGetDevice_v2(other)
    assert err == R.CUDA_ERROR_INVALID_CONTEXT
    (err,) = cu.cuCtxSynchronize_v2(other)
    assert err == R.CUDA_ERROR_INVALID_CONTEXT


HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_host_functions_take_a_sync_mode_and_a_context_drains_them(context):
    ran = threading.Event()

    @HOST_FN
    def slow(_):
        time.sleep(0.2)
        ran.set()

    fn = cu.CUhostFn(ctypes.cast(slow, ctypes.c_void_p).value)
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    try:
        spin = cu.CUhostTaskSyncMode.CU_HOST_TASK_SPINWAIT
        check(cu.cuLaunchHostFunc_v2(stream, fn, 0, int(spin)))
        check(cu.cuCtxSynchronize_v2(context))  # a non-blocking stream is drained too
        assert ran.is_set()
        (err,) = cu.cuLaunchHostFunc_v2(stream, fn, 0, 7)
        assert err == R.CUDA_ERROR_INVALID_VALUE
    finally:
        check(cu.cuStreamDestroy(stream))


def test_multicast_binds_through_the_v2_abi(context):
    device = check(cu.cuDeviceGet(0))
    posix = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    mc_prop = cu.CUmulticastObjectProp()
    mc_prop.numDevices = 1
    mc_prop.handleTypes = posix
    mc_prop.size = 2 << 20
    granularity = check(
        cu.cuMulticastGetGranularity(
            mc_prop, cu.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_MINIMUM
        )
    )
    size = max(int(granularity), 2 << 20)
    mc_prop.size = size
    mc = check(cu.cuMulticastCreate(mc_prop))
    check(cu.cuMulticastAddDevice(mc, device))
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    prop.requestedHandleTypes = posix
    mem = check(cu.cuMemCreate(size, prop, 0))
    try:
        # With the v1 ABI behind this name the device would be read as the offset.
        check(cu.cuMulticastBindMem_v2(mc, device, 0, mem, 0, size, 0))
        check(cu.cuMulticastUnbind(mc, device, 0, size))
        (err,) = cu.cuMulticastBindMem_v2(mc, device, 0, mem, 1, size, 0)
        assert err == R.CUDA_ERROR_INVALID_VALUE
    finally:
        check(cu.cuMemRelease(mem))
        check(cu.cuMemRelease(mc))
