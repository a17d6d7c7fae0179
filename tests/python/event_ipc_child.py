"""The opening side of test_event_ipc: opens the creator's interprocess event, reports that
it is not yet reached, waits for it, then records it itself for the creator to wait on."""

import ctypes
import time

from cuda.bindings import driver as cu


def check(result):
    err, *values = result if isinstance(result, tuple) else (result,)
    assert err == cu.CUresult.CUDA_SUCCESS, f"{err!r}"
    return values[0] if len(values) == 1 else None


def run(handle_bytes, results):
    check(cu.cuInit(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))
    check(cu.cuCtxSetCurrent(ctx))
    handle = cu.CUipcEventHandle()
    ctypes.memmove(handle.getPtr(), handle_bytes, 64)
    event = check(cu.cuIpcOpenEventHandle(handle))
    (query,) = cu.cuEventQuery(event)
    results.put(("pending", query == cu.CUresult.CUDA_ERROR_NOT_READY))
    start = time.monotonic()
    check(cu.cuEventSynchronize(event))
    results.put(("waited", time.monotonic() - start))
    stream = check(cu.cuStreamCreate(0))
    check(cu.cuEventRecord(event, stream))
    check(cu.cuStreamSynchronize(stream))
    results.put(("recorded", True))
