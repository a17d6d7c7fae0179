"""Peer access across a checkpoint, under the shim: device 1's context enables peer access
to device 0's, then the process is toggled (checkpoint and restore) by the `cuinterpose`
binary. Device 0's cuMemAlloc memory, shared through cuIpcGetMemHandle (so the shim takes it
apart and rebuilds it) or private, stays reachable from device 1 with its bytes; memory
allocated after the restore is reachable too, and disabling still ends it. The grant is in
the shim's record of the mapping, which is what a restore rebuilds."""

import os

import numpy as np
import pytest
from cuda.bindings import driver as cu

from driver_peer import check
from test_pool_sharing import cuinterpose

R = cu.CUresult
SIZE = 1 << 16


@pytest.fixture(scope="module")
def contexts():
    assert "libcuinterpose" in os.environ.get("LD_PRELOAD", ""), "run under the shim"
    check(cu.cuInit(0))
    return [check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(d)))) for d in (0, 1)]


def read(dptr):
    out = np.zeros(SIZE, dtype=np.uint8)
    (err,) = cu.cuMemcpyDtoH(out.ctypes.data, dptr, SIZE)
    return err, out


def holds(dptr, value):
    err, out = read(dptr)
    return err == R.CUDA_SUCCESS and bool((out == value).all())


def write(dptr, value):
    data = np.full(SIZE, value, dtype=np.uint8)
    check(cu.cuMemcpyHtoD(dptr, data.ctypes.data, SIZE))


def device_grants(inspection, address, pid=None):
    """The devices the shim's record of the mapping at `address` in process `pid` (this one by
    default) grants."""
    me = inspection["participants"][str(pid or os.getpid())]
    for record in me["records"]:
        if record["kind"] == "mapping" and int(record["address"], 16) == address:
            return sorted(a["location"]["id"] for a in record["access"])
    raise AssertionError(f"no mapping record at {address:#x}: {me['records']}")


def test_peer_access_survives_a_toggle(contexts):
    c0, c1 = contexts
    check(cu.cuCtxSetCurrent(c0))
    shared = check(cu.cuMemAlloc(SIZE))
    private = check(cu.cuMemAlloc(SIZE))
    allocated = [shared, private]
    try:
        check(cu.cuIpcGetMemHandle(shared))
        check(cu.cuCtxSetCurrent(c1))
        assert read(shared)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS, "no peer access yet"
        check(cu.cuCtxEnablePeerAccess(c0, 0))
        write(shared, 5)
        write(private, 6)
        assert device_grants(cuinterpose("inspect"), int(shared)) == [0, 1]

        for round_ in range(2):
            report = cuinterpose("toggle", "--pid", str(os.getpid()))
            assert report["command"] == "toggle", report
            assert holds(shared, 5 + round_) and holds(private, 6), round_
            write(shared, 6 + round_)
        assert device_grants(cuinterpose("inspect"), int(shared)) == [0, 1]

        check(cu.cuCtxSetCurrent(c0))
        later = check(cu.cuMemAlloc(SIZE))
        allocated.append(later)
        write(later, 9)
        check(cu.cuCtxSetCurrent(c1))
        assert holds(later, 9), "allocated after the restore"

        check(cu.cuCtxDisablePeerAccess(c0))
        for dptr in allocated:
            assert read(dptr)[0] == R.CUDA_ERROR_ILLEGAL_ADDRESS, "disabled"
        assert device_grants(cuinterpose("inspect"), int(shared)) == [0]
    finally:
        # A failure here must not leave shared memory behind for the suite's other toggles.
        cu.cuCtxSetCurrent(c1)
        cu.cuCtxDisablePeerAccess(c0)
        check(cu.cuCtxSetCurrent(c0))
        for dptr in allocated:
            check(cu.cuMemFree(dptr))
