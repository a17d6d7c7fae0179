"""Green contexts through cuda.bindings: a descriptor over SM groups of a split, a green
context that reports its share of SMs and is not current until set, its non-blocking streams,
events recorded and waited for across it, and the workqueue resources. The same with and
without the shim."""

import numpy as np
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
RT = cu.CUdevResourceType
DEFAULT_STREAM = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
NON_BLOCKING = cu.CUstream_flags.CU_STREAM_NON_BLOCKING


def green_context(device, groups_of):
    whole = check(cu.cuDeviceGetDevResource(device, RT.CU_DEV_RESOURCE_TYPE_SM))
    groups, count, _ = check(cu.cuDevSmResourceSplitByCount(2, whole, 0, groups_of))
    assert count == 2
    desc = check(cu.cuDevResourceGenerateDesc([groups[0]], 1))
    return check(cu.cuGreenCtxCreate(desc, device, DEFAULT_STREAM)), whole


def test_a_green_context_has_its_share_of_sms(context):
    device = check(cu.cuDeviceGet(0))
    green, whole = green_context(device, 8)
    assert check(cu.cuGreenCtxGetDevResource(green, RT.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount == 8
    ctx = check(cu.cuCtxFromGreenCtx(green))
    assert int(check(cu.cuCtxGetCurrent())) != int(ctx), "not current until set"
    assert check(cu.cuCtxGetDevResource(ctx, RT.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount == 8
    assert whole.sm.smCount == 132
    assert int(check(cu.cuGreenCtxGetId(green))) != 0
    check(cu.cuGreenCtxDestroy(green))
    err, _ = cu.cuCtxFromGreenCtx(green)
    assert err == R.CUDA_ERROR_INVALID_HANDLE
    err, _ = cu.cuGreenCtxCreate(check(cu.cuDevResourceGenerateDesc([whole], 1)), device, 0)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "CU_GREEN_CTX_DEFAULT_STREAM is required"


def test_green_streams_run_work_in_the_green_context(context):
    device = check(cu.cuDeviceGet(0))
    green, _ = green_context(device, 4)
    err, _ = cu.cuGreenCtxStreamCreate(green, 0, 0)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "green streams are non-blocking"
    stream = check(cu.cuGreenCtxStreamCreate(green, NON_BLOCKING, 0))
    assert int(check(cu.cuStreamGetGreenCtx(stream))) == int(green)
    assert check(cu.cuStreamGetDevResource(stream, RT.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount == 4
    plain = check(cu.cuStreamCreate(0))
    assert int(check(cu.cuStreamGetGreenCtx(plain))) == 0, "not a green context's stream"
    # Work in the green context: set current, allocate, copy in its stream.
    check(cu.cuCtxSetCurrent(check(cu.cuCtxFromGreenCtx(green))))
    dptr = check(cu.cuMemAlloc(64))
    check(cu.cuMemsetD8Async(dptr, 3, 64, stream))
    out = np.zeros(64, dtype=np.uint8)
    check(cu.cuMemcpyDtoHAsync(out.ctypes.data, dptr, 64, stream))
    event = check(cu.cuEventCreate(0))
    check(cu.cuGreenCtxRecordEvent(green, event))
    check(cu.cuEventSynchronize(event))
    assert (out == 3).all(), "the record covers the green context's work"
    check(cu.cuGreenCtxWaitEvent(green, event))
    check(cu.cuMemFree(dptr))
    check(cu.cuEventDestroy(event))
    check(cu.cuStreamDestroy(stream))
    check(cu.cuCtxSetCurrent(context))
    check(cu.cuStreamDestroy(plain))
    check(cu.cuGreenCtxDestroy(green))


def test_workqueue_resources_describe_the_device(context):
    config = check(cu.cuDeviceGetDevResource(1, RT.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG))
    assert config.type == RT.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG
    assert int(config.wqConfig.device) == 1 and config.wqConfig.wqConcurrencyLimit >= 1
    assert (
        config.wqConfig.sharingScope
        == cu.CUdevWorkqueueConfigScope.CU_WORKQUEUE_SCOPE_DEVICE_CTX
    )
    wq = check(cu.cuDeviceGetDevResource(1, RT.CU_DEV_RESOURCE_TYPE_WORKQUEUE))
    assert wq.type == RT.CU_DEV_RESOURCE_TYPE_WORKQUEUE
    err, _ = cu.cuDeviceGetDevResource(1, RT.CU_DEV_RESOURCE_TYPE_INVALID)
    assert err == R.CUDA_ERROR_INVALID_VALUE
