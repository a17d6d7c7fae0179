"""Fixtures for the cuda-python suite: a driver context on fakecuda's device 0.

The suite runs twice from `clients/tests/python.rs`: on fakecuda alone and with the shim
preloaded; every test must pass both ways.
"""

import os

import pytest
from cuda.bindings import driver


def check(result):
    """Unwraps a cuda-bindings return tuple, failing the test on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    assert err == driver.CUresult.CUDA_SUCCESS, f"{err!r}"
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@pytest.fixture(scope="session")
def context():
    check(driver.cuInit(0))
    device = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(device))
    check(driver.cuCtxSetCurrent(ctx))
    yield ctx


@pytest.fixture
def shim_preloaded():
    return "libcuinterpose" in os.environ.get("LD_PRELOAD", "")
