"""What the processes of both cuda-python suites share: the test processes and the peers they
spawn, here and in tests/python-checkpoint (whose conftest puts this folder on sys.path)."""

from cuda.bindings import driver


def check(result):
    """Unwraps a cuda-bindings return tuple, raising on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err!r}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def primary_context():
    """Initialises the driver and makes device 0's primary context current; returns it."""
    check(driver.cuInit(0))
    device = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(device))
    check(driver.cuCtxSetCurrent(ctx))
    return ctx


def device_to_host(params, source, host, size):
    """Fills `params` (a CUDA_MEMCPY3D) for a copy of `size` bytes from the device memory at
    `source` into the numpy array `host`."""
    params.srcMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    params.srcDevice = source
    params.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_HOST
    params.dstHost = host.ctypes.data
    params.WidthInBytes = size
    params.Height = 1
    params.Depth = 1
