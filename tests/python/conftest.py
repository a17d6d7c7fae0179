"""Fixtures for the cuda-python suite: a driver context on fakecuda's device 0.

The suite runs twice from `clients/tests/python.rs`: on fakecuda alone and with the shim
preloaded; every test must pass both ways.
"""

import multiprocessing
import os

import pytest
from cuda.bindings import driver

import driver_support


def check(result):
    """Unwraps a cuda-bindings return tuple, failing the test on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    assert err == driver.CUresult.CUDA_SUCCESS, f"{err!r}"
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@pytest.fixture(scope="session")
def context():
    yield driver_support.primary_context()


def run_importer(target, resource, buffer, size):
    """Runs `target(allocation handle, IPC descriptor, size, results)` of `resource` and its
    `buffer` in a spawned process, which must report that it saw the creator's bytes and
    wrote its own."""
    # CUDA processes must not fork (cuda.core checks the global start method).
    multiprocessing.set_start_method("spawn", force=True)
    results = multiprocessing.Queue()
    child = multiprocessing.Process(
        target=target,
        args=(resource.allocation_handle, buffer.ipc_descriptor, size, results),
    )
    child.start()
    assert results.get(timeout=60) == ("saw", True), "the importer saw the creator's bytes"
    assert results.get(timeout=60) == ("wrote", True)
    child.join(60)
    assert child.exitcode == 0


@pytest.fixture
def shim_preloaded():
    return "libcuinterpose" in os.environ.get("LD_PRELOAD", "")
