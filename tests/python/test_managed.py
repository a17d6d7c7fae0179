"""Managed memory's advice, prefetches and range attributes through cuda.bindings (the CUDA
12.2 location ABI) and the legacy device-ordinal ABI by symbol, and the settable pointer
attribute; the same with and without the shim."""

import ctypes

import pytest
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
A = cu.CUmem_advise
RA = cu.CUmem_range_attribute
L = cu.CUmemLocationType
PAGE = 4096
SIZE = 4 * PAGE


def place(kind, id=0):
    at = cu.CUmemLocation()
    at.type = kind
    at.id = id
    return at


def attribute(ptr, attr, size=4, count=SIZE):
    return check(cu.cuMemRangeGetAttribute(size, attr, ptr, count))


@pytest.fixture
def managed(context):
    ptr = check(cu.cuMemAllocManaged(SIZE, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    yield ptr
    check(cu.cuMemFree(ptr))


def test_unadvised_memory_reads_as_unset(managed):
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 0
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == -2
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == -2
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, 8) == [-2, -2]


def test_advice_holds_per_page_and_a_range_reads_what_all_its_pages_share(managed):
    device = place(L.CU_MEM_LOCATION_TYPE_DEVICE, 1)
    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_READ_MOSTLY, device))
    check(cu.cuMemAdvise(managed, PAGE, A.CU_MEM_ADVISE_UNSET_READ_MOSTLY, device))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) == 0
    tail = int(managed) + PAGE
    assert attribute(tail, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, count=SIZE - PAGE) == 1

    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, device))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == 1
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE) == int(
        L.CU_MEM_LOCATION_TYPE_DEVICE
    )
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID) == 1
    host = place(L.CU_MEM_LOCATION_TYPE_HOST)
    check(cu.cuMemAdvise(managed, PAGE, A.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == -2, "mixed"
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, count=PAGE) == -1

    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_ACCESSED_BY, host))
    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_ACCESSED_BY, device))
    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_ACCESSED_BY, device))
    # Devices by ordinal, then the CPU, the rest CU_DEVICE_INVALID.
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, 12) == [1, -1, -2]
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, 4) == [1]
    check(cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_UNSET_ACCESSED_BY, host))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, 8) == [1, -2]

    # The list form reads the same.
    attrs = [RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY]
    values = check(cu.cuMemRangeGetAttributes([4, 8], attrs, 2, tail, SIZE - PAGE))
    assert values == [1, [1, -2]]


def test_a_prefetch_is_recorded_in_stream_order(managed):
    stream = check(cu.cuStreamCreate(0))
    check(cu.cuMemPrefetchAsync(managed, SIZE, place(L.CU_MEM_LOCATION_TYPE_DEVICE, 0), 0, stream))
    check(cu.cuStreamSynchronize(stream))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == 0
    numa = place(L.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)
    check(cu.cuMemPrefetchAsync(managed, PAGE, numa, 0, stream))
    check(cu.cuStreamSynchronize(stream))
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION) == -2, "mixed"
    first = RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE
    assert attribute(managed, first, count=PAGE) == int(L.CU_MEM_LOCATION_TYPE_HOST_NUMA)
    (err,) = cu.cuMemPrefetchAsync(managed, SIZE, numa, 1, stream)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "no flags are defined"
    check(cu.cuStreamDestroy(stream))


def test_the_legacy_abi_names_a_device_or_the_cpu(managed):
    advise = ctypes.CDLL("libcuda.so.1").cuMemAdvise
    advise.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int]
    preferred = int(A.CU_MEM_ADVISE_SET_PREFERRED_LOCATION)
    assert advise(int(managed), SIZE, preferred, -1) == 0
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == -1
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE) == int(
        L.CU_MEM_LOCATION_TYPE_HOST
    )
    assert advise(int(managed), SIZE, preferred, 1) == 0
    assert attribute(managed, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION) == 1
    assert advise(int(managed), SIZE, preferred, 99) == int(R.CUDA_ERROR_INVALID_DEVICE)


def test_bad_advice_and_ranges_are_refused(managed):
    device = place(L.CU_MEM_LOCATION_TYPE_DEVICE, 0)
    plain = check(cu.cuMemAlloc(SIZE))
    refused = [
        cu.cuMemAdvise(plain, SIZE, A.CU_MEM_ADVISE_SET_READ_MOSTLY, device),  # not managed
        cu.cuMemAdvise(managed, 1 << 30, A.CU_MEM_ADVISE_SET_READ_MOSTLY, device),  # past it
        cu.cuMemAdvise(managed, 0, A.CU_MEM_ADVISE_SET_READ_MOSTLY, device),
        cu.cuMemAdvise(managed, SIZE, A.CU_MEM_ADVISE_SET_ACCESSED_BY, place(0)),
        cu.cuMemRangeGetAttribute(8, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, managed, SIZE)[:1],
        cu.cuMemRangeGetAttribute(6, RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, managed, SIZE)[:1],
    ]
    assert [r[0] for r in refused] == [R.CUDA_ERROR_INVALID_VALUE] * len(refused)
    check(cu.cuMemFree(plain))


def test_sync_memops_is_the_one_settable_pointer_attribute(managed):
    P = cu.CUpointer_attribute
    for value in (True, False, True):
        check(cu.cuPointerSetAttribute(value, P.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, managed))
        got = check(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, managed))
        assert bool(got) is value
    inside = int(managed) + PAGE  # the attribute is the allocation's
    assert check(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, inside))
    (err,) = cu.cuPointerSetAttribute(1, P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, managed)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    (err,) = cu.cuPointerSetAttribute(1, P.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, 8)
    assert err == R.CUDA_ERROR_INVALID_VALUE


def test_batches_prefetch_each_range_to_the_location_that_applies(context):
    stream = check(cu.cuStreamCreate(0))
    flags = cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value
    ranges = [check(cu.cuMemAllocManaged(SIZE, flags)) for _ in range(3)]
    device = place(L.CU_MEM_LOCATION_TYPE_DEVICE, 1)
    host = place(L.CU_MEM_LOCATION_TYPE_HOST)
    # Device 1 for the first range, the host from the second on.
    check(cu.cuMemPrefetchBatchAsync(ranges, [SIZE] * 3, 3, [device, host], [0, 1], 2, 0, stream))
    check(cu.cuStreamSynchronize(stream))
    last = RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION
    assert [attribute(r, last) for r in ranges] == [1, -1, -1]
    check(cu.cuMemDiscardBatchAsync(ranges, [SIZE] * 3, 3, 0, stream))
    check(cu.cuMemDiscardAndPrefetchBatchAsync(ranges[:1], [SIZE], 1, [host], [0], 1, 0, stream))
    check(cu.cuStreamSynchronize(stream))
    assert attribute(ranges[0], last) == -1
    refused = [
        cu.cuMemPrefetchBatchAsync(ranges, [SIZE] * 3, 3, [device], [1], 1, 0, stream),  # not 0
        cu.cuMemPrefetchBatchAsync(ranges, [SIZE] * 3, 3, [device, host], [1, 1], 2, 0, stream),
        cu.cuMemDiscardBatchAsync(ranges, [SIZE] * 3, 3, 1, stream),  # no flags
        cu.cuMemDiscardBatchAsync(ranges, [1 << 30] * 3, 3, 0, stream),  # past the memory
    ]
    assert [r[0] for r in refused] == [R.CUDA_ERROR_INVALID_VALUE] * 4
    for r in ranges:
        check(cu.cuMemFree(r))
    check(cu.cuStreamDestroy(stream))
