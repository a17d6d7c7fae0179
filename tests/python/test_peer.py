"""Peer access through cuda.bindings on fakecuda's two devices: a copy is the work of its
context's device, so device 1 cannot touch device 0's cuMemAlloc memory until its context
enables peer access to device 0's, and then reaches what device 0 allocated before and after;
disabling ends it. Under the shim cuMemAlloc memory is VMM memory, which peer access alone
does not reach: the shim grants it, so the results are the same both ways."""

import numpy as np
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
SIZE = 1 << 16


def primary(device):
    return check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(device))))


def read(dptr):
    out = np.zeros(SIZE, dtype=np.uint8)
    err, = cu.cuMemcpyDtoH(out.ctypes.data, dptr, SIZE)
    return err, out


def write(dptr, value):
    data = np.full(SIZE, value, dtype=np.uint8)
    check(cu.cuMemcpyHtoD(dptr, data.ctypes.data, SIZE))


def test_peer_capability_and_its_errors(context):
    d0, d1 = check(cu.cuDeviceGet(0)), check(cu.cuDeviceGet(1))
    assert check(cu.cuDeviceCanAccessPeer(d0, d1)) == 1
    assert check(cu.cuDeviceCanAccessPeer(d0, d0)) == 0
    supported = cu.CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED
    assert check(cu.cuDeviceGetP2PAttribute(supported, d1, d0)) == 1
    assert cu.cuDeviceGetP2PAttribute(supported, d0, d0)[0] == R.CUDA_ERROR_INVALID_DEVICE
    c0 = primary(0)
    c1 = primary(1)
    check(cu.cuCtxSetCurrent(c1))
    try:
        assert cu.cuCtxEnablePeerAccess(c0, 1)[0] == R.CUDA_ERROR_INVALID_VALUE
        assert cu.cuCtxEnablePeerAccess(c1, 0)[0] == R.CUDA_ERROR_INVALID_CONTEXT
        assert cu.cuCtxDisablePeerAccess(c0)[0] == R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        check(cu.cuCtxEnablePeerAccess(c0, 0))
        assert cu.cuCtxEnablePeerAccess(c0, 0)[0] == R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        check(cu.cuCtxDisablePeerAccess(c0))
    finally:
        check(cu.cuCtxSetCurrent(context))


def test_peer_access_reaches_memory_allocated_before_and_after(context):
    c0, c1 = primary(0), primary(1)
    check(cu.cuCtxSetCurrent(c0))
    before = check(cu.cuMemAlloc(SIZE))
    write(before, 1)
    check(cu.cuCtxSetCurrent(c1))
    try:
        own = check(cu.cuMemAlloc(SIZE))
        err, _ = read(before)
        assert err == R.CUDA_ERROR_ILLEGAL_ADDRESS, "no peer access yet"
        assert cu.cuMemcpyDtoD(own, before, SIZE)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS
        # A peer copy names both contexts and needs no peer access.
        check(cu.cuMemcpyPeer(own, c1, before, c0, SIZE))
        err, out = read(own)
        assert err == R.CUDA_SUCCESS and (out == 1).all()

        check(cu.cuCtxEnablePeerAccess(c0, 0))
        err, out = read(before)
        assert err == R.CUDA_SUCCESS and (out == 1).all(), "allocated before the enable"
        write(before, 2)
        check(cu.cuCtxSetCurrent(c0))
        after = check(cu.cuMemAlloc(SIZE))
        write(after, 3)
        # One way: device 0 has no access to device 1's memory.
        assert read(own)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS
        check(cu.cuCtxSetCurrent(c1))
        err, out = read(after)
        assert err == R.CUDA_SUCCESS and (out == 3).all(), "allocated after the enable"
        stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        check(cu.cuMemsetD8Async(after, 4, SIZE, stream))
        check(cu.cuStreamSynchronize(stream))
        check(cu.cuStreamDestroy(stream))
        assert (read(after)[1] == 4).all()

        check(cu.cuCtxDisablePeerAccess(c0))
        assert read(before)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS, "disabled"
        assert read(after)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS, "disabled"
        check(cu.cuMemFree(own))
    finally:
        check(cu.cuCtxSetCurrent(c0))
        check(cu.cuMemFree(before))
        check(cu.cuMemFree(after))
        check(cu.cuCtxSetCurrent(context))
