"""cuda.bindings.driver on fakecuda: entry-point lookup, error names, streams, events,
async copies and fills, host memory and pointer attributes."""

import numpy as np
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
MIB = 1 << 20


def device_buffer(size):
    return check(cu.cuMemAlloc(size))


def test_every_result_has_a_name(context):
    # Names come from the driver headers' whole table, not only the codes fakecuda returns.
    assert check(cu.cuGetErrorName(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)) == (
        b"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    )
    assert check(cu.cuGetErrorString(R.CUDA_ERROR_INVALID_VALUE)) == b"invalid argument"


def test_proc_address_reports_its_status(context):
    # The unsuffixed name at CUDA 12+ is the five-argument _v2, which writes the status.
    pfn, status = check(cu.cuGetProcAddress(b"cuMemCreate", 13000, 0))
    assert pfn != 0
    assert status == cu.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS
    err, *_ = cu.cuGetProcAddress(b"cuNoSuchFunction", 13000, 0)
    assert err == R.CUDA_ERROR_NOT_FOUND


def test_async_copies_and_fills_run_in_stream_order(context):
    least, greatest = check(cu.cuCtxGetStreamPriorityRange())
    assert (least, greatest) == (0, -5)
    stream = check(cu.cuStreamCreateWithPriority(cu.CUstream_flags.CU_STREAM_NON_BLOCKING, -1))
    assert check(cu.cuStreamGetPriority(stream)) == -1
    dptr = device_buffer(MIB)
    src = np.arange(MIB // 4, dtype=np.uint32)
    out = np.zeros_like(src)
    check(cu.cuMemcpyHtoDAsync(dptr, src.ctypes.data, MIB, stream))
    check(cu.cuMemsetD32Async(int(dptr) + 16, 0xDEADBEEF, 4, stream))
    check(cu.cuMemcpyDtoHAsync(out.ctypes.data, dptr, MIB, stream))
    check(cu.cuStreamSynchronize(stream))
    expected = src.copy()
    expected[4:8] = 0xDEADBEEF
    assert np.array_equal(out, expected)
    assert cu.cuStreamQuery(stream)[0] == R.CUDA_SUCCESS
    check(cu.cuMemFree(dptr))
    check(cu.cuStreamDestroy(stream))


def test_events_time_and_order_streams(context):
    a = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    b = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    start = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT))
    end = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT))
    untimed = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    dptr = device_buffer(MIB)
    host = np.full(MIB, 3, dtype=np.uint8)
    check(cu.cuEventRecord(start, a))
    check(cu.cuMemcpyHtoDAsync(dptr, host.ctypes.data, MIB, a))
    check(cu.cuEventRecord(end, a))
    check(cu.cuEventRecord(untimed, a))
    # b reads only after a's copy: it waits for a's event.
    check(cu.cuStreamWaitEvent(b, end, 0))
    back = np.zeros(MIB, dtype=np.uint8)
    check(cu.cuMemcpyDtoHAsync(back.ctypes.data, dptr, MIB, b))
    check(cu.cuStreamSynchronize(b))
    assert np.array_equal(back, host)
    check(cu.cuEventSynchronize(end))
    assert check(cu.cuEventElapsedTime(start, end)) >= 0.0
    assert cu.cuEventElapsedTime(start, untimed)[0] == R.CUDA_ERROR_INVALID_HANDLE
    for e in (start, end, untimed):
        check(cu.cuEventDestroy(e))
    check(cu.cuMemFree(dptr))
    for s in (a, b):
        check(cu.cuStreamDestroy(s))


def test_host_and_managed_memory_describe_themselves(context):
    host = check(cu.cuMemHostAlloc(4096, cu.CU_MEMHOSTALLOC_DEVICEMAP))
    assert int(check(cu.cuMemHostGetDevicePointer(host, 0))) == int(host)
    kind = check(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, host))
    assert kind == cu.CUmemorytype.CU_MEMORYTYPE_HOST
    managed = check(cu.cuMemAllocManaged(4096, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))
    is_managed = check(
        cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED, managed)
    )
    assert is_managed
    data = np.full(4096, 9, dtype=np.uint8)
    check(cu.cuMemcpyHtoD(managed, data.ctypes.data, 4096))
    check(cu.cuMemcpy(host, managed, 4096))
    view = (np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * 4096).from_address(int(host))))
    assert np.array_equal(view, data)
    check(cu.cuMemFree(managed))
    check(cu.cuMemFreeHost(host))
    err, _ = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, data.ctypes.data)
    assert err == R.CUDA_ERROR_INVALID_VALUE


def test_features_without_device_code_answer_as_a_driver_does(context):
    # Profiling has nothing to collect; coredump settings are kept and read back.
    check(cu.cuProfilerStart())
    check(cu.cuProfilerStop())
    settings = cu.CUcoredumpSettings
    check(cu.cuCoredumpSetAttributeGlobal(settings.CU_COREDUMP_LIGHTWEIGHT, True))
    check(cu.cuCoredumpSetAttributeGlobal(settings.CU_COREDUMP_FILE, b"/tmp/fakecuda-core"))
    assert check(cu.cuCoredumpGetAttributeGlobal(settings.CU_COREDUMP_LIGHTWEIGHT)) is True
    assert check(cu.cuCoredumpGetAttributeGlobal(settings.CU_COREDUMP_FILE)) == b"/tmp/fakecuda-core"
    # No device code runs here: images are refused as built for no GPU present, and no kernel
    # or function handle can exist.
    err, _ = cu.cuModuleLoadData(b"\x7fELF not a cubin")
    assert err == R.CUDA_ERROR_NO_BINARY_FOR_GPU
    assert cu.cuKernelGetName(0)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert cu.cuFuncGetName(0)[0] == R.CUDA_ERROR_INVALID_VALUE
    # CUDA arrays: a descriptor is checked, kept and destroyed.
    desc = cu.CUDA_ARRAY_DESCRIPTOR()
    assert cu.cuArrayCreate(desc)[0] == R.CUDA_ERROR_INVALID_VALUE
    desc.Format = cu.CUarray_format.CU_AD_FORMAT_FLOAT
    desc.NumChannels = 4
    desc.Width = 16
    desc.Height = 2
    array = check(cu.cuArrayCreate(desc))
    kept = check(cu.cuArrayGetDescriptor(array))
    assert (kept.Width, kept.Height, kept.NumChannels) == (16, 2, 4)
    check(cu.cuArrayDestroy(array))
    assert cu.cuArrayDestroy(array)[0] == R.CUDA_ERROR_INVALID_HANDLE


def test_graphs_of_memset_nodes_run_in_dependency_order(context):
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    dptr = device_buffer(MIB)
    graph = check(cu.cuGraphCreate(0))
    first = cu.CUDA_MEMSET_NODE_PARAMS()
    first.dst = dptr
    first.value = 0x11111111
    first.elementSize = 4
    first.width = MIB // 4
    first.height = 1
    a = check(cu.cuGraphAddMemsetNode(graph, None, 0, first, context))
    second = cu.CUDA_MEMSET_NODE_PARAMS()
    second.dst = dptr
    second.value = 0x22
    second.elementSize = 1
    second.width = 16
    second.height = 1
    b = check(cu.cuGraphAddMemsetNode(graph, [a], 1, second, context))
    end = check(cu.cuGraphAddEmptyNode(graph, [a, b], 2))
    assert check(cu.cuGraphNodeGetLocalId(end)) == 2
    assert int(check(cu.cuGraphNodeGetContainingGraph(end))) == int(graph)
    assert check(cu.cuGraphGetId(graph)) > 0
    exec_ = check(cu.cuGraphInstantiate(graph, 0))
    check(cu.cuGraphLaunch(exec_, stream))
    check(cu.cuStreamSynchronize(stream))
    out = np.zeros(32, dtype=np.uint8)
    check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, 32))
    assert out[:16].tolist() == [0x22] * 16, "the dependent node ran second"
    assert out[16:].tolist() == [0x11] * 16
    # Generic node parameters of a kind fakecuda cannot run (a kernel): a clear error, not a
    # crash (the kinds it models are in test_graph_nodes.py).
    params = cu.CUgraphNodeParams()
    params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    assert cu.cuGraphAddNode(graph, None, None, 0, params)[0] == R.CUDA_ERROR_NOT_SUPPORTED
    check(cu.cuGraphExecDestroy(exec_))
    check(cu.cuGraphDestroy(graph))
    check(cu.cuMemFree(dptr))
    check(cu.cuStreamDestroy(stream))


def test_sm_resources_split_into_groups(context):
    sm = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    device = check(cu.cuDeviceGet(0))
    whole = check(cu.cuDeviceGetDevResource(device, sm))
    assert whole.sm.smCount > 0
    err, groups, count, remaining = cu.cuDevSmResourceSplitByCount(0, whole, 0, 8)
    assert err == R.CUDA_SUCCESS and count == whole.sm.smCount // 8 and len(groups) == 0
    err, groups, made, remaining = cu.cuDevSmResourceSplitByCount(3, whole, 0, 8)
    assert err == R.CUDA_SUCCESS and made == 3
    assert [g.sm.smCount for g in groups] == [8, 8, 8]
    assert remaining.sm.smCount == whole.sm.smCount - 24
    stream = check(cu.cuStreamCreate(0))
    assert check(cu.cuStreamGetDevResource(stream, sm)).sm.smCount == whole.sm.smCount
    check(cu.cuStreamDestroy(stream))


def test_sm_resources_split_in_structured_groups(context):
    sm = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    whole = check(cu.cuDeviceGetDevResource(check(cu.cuDeviceGet(0)), sm))

    def group(count, coscheduled=0):
        params = cu.CU_DEV_SM_RESOURCE_GROUP_PARAMS()
        params.smCount = count
        params.coscheduledSmCount = coscheduled
        return params

    # A fixed group of 16 in units of 8, then one that discovers the rest in units of 4.
    err, groups, remainder = cu.cuDevSmResourceSplit(2, whole, 0, [group(16, 8), group(0, 4)])
    assert err == R.CUDA_SUCCESS
    rest = (whole.sm.smCount - 16) // 4 * 4
    assert [g.sm.smCount for g in groups] == [16, rest]
    assert remainder.sm.smCount == whole.sm.smCount - 16 - rest
    # Everything taken: the remainder is no resource.
    err, groups, remainder = cu.cuDevSmResourceSplit(1, whole, 0, [group(0)])
    assert err == R.CUDA_SUCCESS and groups[0].sm.smCount == whole.sm.smCount
    assert remainder.type == cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_INVALID
    # More than the input, or than is left, or not a multiple of the unit: refused.
    too_many = whole.sm.smCount + 2
    assert cu.cuDevSmResourceSplit(1, whole, 0, [group(too_many)])[0] == R.CUDA_ERROR_INVALID_VALUE
    half = whole.sm.smCount // 2 + 2
    refused = cu.cuDevSmResourceSplit(2, whole, 0, [group(half), group(half)])[0]
    assert refused == R.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
    assert cu.cuDevSmResourceSplit(1, whole, 0, [group(12, 8)])[0] == R.CUDA_ERROR_INVALID_VALUE


def test_graph_memcpy_nodes_copy_in_dependency_order(context):
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    first, second = device_buffer(MIB), device_buffer(MIB)
    host = np.zeros(MIB, dtype=np.uint8)
    graph = check(cu.cuGraphCreate(0))
    fill = cu.CUDA_MEMSET_NODE_PARAMS()
    fill.dst = first
    fill.value = 0x5A
    fill.elementSize = 1
    fill.width = MIB
    fill.height = 1
    a = check(cu.cuGraphAddMemsetNode(graph, None, 0, fill, context))

    def copy(dst_type, dst, src_type, src, width, height=1, pitch=0):
        params = cu.CUDA_MEMCPY3D()
        params.srcMemoryType, params.dstMemoryType = src_type, dst_type
        if src_type == cu.CUmemorytype.CU_MEMORYTYPE_HOST:
            params.srcHost = src
        else:
            params.srcDevice = src
        if dst_type == cu.CUmemorytype.CU_MEMORYTYPE_HOST:
            params.dstHost = dst
        else:
            params.dstDevice = dst
        params.srcPitch = params.dstPitch = pitch
        params.WidthInBytes, params.Height, params.Depth = width, height, 1
        return params

    device, to_host = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, cu.CUmemorytype.CU_MEMORYTYPE_HOST
    # first → second (device to device), then second → host, row by row (2 rows of 4 KiB, 64 KiB apart).
    b = check(cu.cuGraphAddMemcpyNode(graph, [a], 1, copy(device, second, device, first, MIB), context))
    c = check(
        cu.cuGraphAddMemcpyNode(
            graph, [b], 1, copy(to_host, host.ctypes.data, device, second, 4096, 2, 65536), context
        )
    )
    assert check(cu.cuGraphNodeGetLocalId(c)) == 2
    exec_ = check(cu.cuGraphInstantiate(graph, 0))
    check(cu.cuGraphLaunch(exec_, stream))
    check(cu.cuStreamSynchronize(stream))
    assert host[:4096].tolist() == [0x5A] * 4096 and host[65536 : 65536 + 4096].tolist() == [0x5A] * 4096
    assert host[4096:65536].max() == 0, "only the rows were copied"
    # Arrays are not modelled; an empty copy is no copy.
    array = cu.CUmemorytype.CU_MEMORYTYPE_ARRAY
    assert cu.cuGraphAddMemcpyNode(graph, None, 0, copy(device, second, array, first, 16), context)[0] == (
        R.CUDA_ERROR_NOT_SUPPORTED
    )
    assert cu.cuGraphAddMemcpyNode(graph, None, 0, copy(device, second, device, first, 0), context)[0] == (
        R.CUDA_ERROR_INVALID_VALUE
    )
    check(cu.cuGraphExecDestroy(exec_))
    check(cu.cuGraphDestroy(graph))
    for dptr in (first, second):
        check(cu.cuMemFree(dptr))
    check(cu.cuStreamDestroy(stream))


def test_child_graph_nodes_run_a_copy_of_their_graph(context):
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    dptr = device_buffer(4096)

    def memset_node(graph, deps, value):
        params = cu.CUDA_MEMSET_NODE_PARAMS()
        params.dst = dptr
        params.value = value
        params.elementSize = 1
        params.width = 4096
        params.height = 1
        return check(cu.cuGraphAddMemsetNode(graph, deps, len(deps), params, context))

    child = check(cu.cuGraphCreate(0))
    memset_node(child, [], 0x33)
    parent = check(cu.cuGraphCreate(0))
    first = memset_node(parent, [], 0x11)
    # The child runs after the parent's first node and overwrites it.
    check(cu.cuGraphAddChildGraphNode(parent, [first], 1, child))
    # A node added to the child afterwards is not in the copy the parent holds.
    memset_node(child, [], 0x77)
    exec_ = check(cu.cuGraphInstantiate(parent, 0))
    check(cu.cuGraphLaunch(exec_, stream))
    check(cu.cuStreamSynchronize(stream))
    out = np.zeros(4096, dtype=np.uint8)
    check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, 4096))
    assert out.tolist() == [0x33] * 4096
    # A graph is not its own child.
    assert cu.cuGraphAddChildGraphNode(parent, None, 0, parent)[0] == R.CUDA_ERROR_INVALID_VALUE
    check(cu.cuGraphExecDestroy(exec_))
    for graph in (parent, child):
        check(cu.cuGraphDestroy(graph))
    check(cu.cuMemFree(dptr))
    check(cu.cuStreamDestroy(stream))


def test_a_pools_max_size_bounds_what_its_allocations_ask_for(context):
    # IPC pools (answered by the shim when it is loaded) and plain ones alike.
    for handle_types in (
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE,
        cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    ):
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 0
        props.handleTypes = handle_types
        props.maxSize = 2 << 20
        pool = check(cu.cuMemPoolCreate(props))
        stream = check(cu.cuStreamCreate(0))
        small = [check(cu.cuMemAllocFromPoolAsync(64, pool, stream)) for _ in range(4)]
        err, _ = cu.cuMemAllocFromPoolAsync(2 << 20, pool, stream)
        assert err == R.CUDA_ERROR_OUT_OF_MEMORY, handle_types
        for p in small:
            check(cu.cuMemFreeAsync(p, stream))
        check(cu.cuStreamSynchronize(stream))
        big = check(cu.cuMemAllocFromPoolAsync(2 << 20, pool, stream))
        check(cu.cuMemFreeAsync(big, stream))
        check(cu.cuStreamSynchronize(stream))
        check(cu.cuStreamDestroy(stream))
        check(cu.cuMemPoolDestroy(pool))
