"""A graph's shape through cuda.bindings: roots, edges, dependencies and dependents, removing a
node, a DOT print, instantiation with parameters and upload, and memory nodes' parameters read
back. The same with and without the shim."""

from cuda.bindings import driver as cu

from conftest import check
from driver_support import device_to_host

R = cu.CUresult
SIZE = 4096


def ids(nodes):
    return [int(n) for n in nodes]


def diamond():
    """a -> b, a -> c, (b, c) -> d."""
    g = check(cu.cuGraphCreate(0))
    a = check(cu.cuGraphAddEmptyNode(g, None, 0))
    b = check(cu.cuGraphAddEmptyNode(g, [a], 1))
    c = check(cu.cuGraphAddEmptyNode(g, [a], 1))
    d = check(cu.cuGraphAddEmptyNode(g, [b, c], 2))
    return g, a, b, c, d


def test_a_graphs_shape_reads_back(context):
    g, a, b, c, d = diamond()
    roots, count = check(cu.cuGraphGetRootNodes(g, 4))
    assert ids(roots[:count]) == [int(a)]
    frm, to, data, count = check(cu.cuGraphGetEdges(g, 8))
    edges = set(zip(ids(frm[:count]), ids(to[:count])))
    assert edges == {(int(a), int(b)), (int(a), int(c)), (int(b), int(d)), (int(c), int(d))}
    assert count == 4
    deps, _, count = check(cu.cuGraphNodeGetDependencies(d, 2))
    assert ids(deps[:count]) == [int(b), int(c)]
    after, _, count = check(cu.cuGraphNodeGetDependentNodes(a, 2))
    assert ids(after[:count]) == [int(b), int(c)]
    # Asked for fewer, it says how many it wrote.
    _, _, count = check(cu.cuGraphNodeGetDependentNodes(a, 1))
    assert count == 1
    # A node goes with its edges.
    check(cu.cuGraphDestroyNode(b))
    deps, _, count = check(cu.cuGraphNodeGetDependencies(d, 2))
    assert ids(deps[:count]) == [int(c)]
    _, _, _, count = check(cu.cuGraphGetEdges(g, 0))
    assert count == 2
    (err,) = cu.cuGraphDestroyNode(b)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "already gone"
    check(cu.cuGraphDestroy(g))


def test_a_dot_print_names_every_node_and_edge(context, tmp_path):
    g, *_ = diamond()
    path = tmp_path / "graph.dot"
    check(cu.cuGraphDebugDotPrint(g, str(path).encode(), 0))
    text = path.read_text()
    assert text.startswith("digraph") and text.count("EMPTY") == 4 and text.count("->") == 4
    (err,) = cu.cuGraphDebugDotPrint(g, str(tmp_path / "no" / "such.dot").encode(), 0)
    assert err == R.CUDA_ERROR_OPERATING_SYSTEM
    check(cu.cuGraphDestroy(g))


def test_instantiation_with_parameters_says_how_it_went(context):
    g, *_ = diamond()
    stream = check(cu.cuStreamCreate(0))
    params = cu.CUDA_GRAPH_INSTANTIATE_PARAMS()
    params.flags = int(cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
    params.hUploadStream = stream
    graph_exec = check(cu.cuGraphInstantiateWithParams(g, params))
    assert params.result_out == cu.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS
    check(cu.cuGraphUpload(graph_exec, stream))
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuGraphExecDestroy(graph_exec))
    device_launch = cu.CUDA_GRAPH_INSTANTIATE_PARAMS()
    device_launch.flags = int(
        cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH
    )
    err, _ = cu.cuGraphInstantiateWithParams(g, device_launch)
    assert err == R.CUDA_ERROR_NOT_SUPPORTED
    assert (
        device_launch.result_out
        == cu.CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED
    )
    err, _ = cu.cuGraphInstantiateWithParams(g, cu.CUDA_GRAPH_INSTANTIATE_PARAMS())
    assert err == R.CUDA_SUCCESS
    check(cu.cuStreamDestroy(stream))
    check(cu.cuGraphDestroy(g))


def test_memory_nodes_read_back_their_parameters(context):
    g = check(cu.cuGraphCreate(0))
    p = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    p.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.poolProps.location.id = 0
    grant = cu.CUmemAccessDesc()
    grant.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    grant.location.id = 1
    grant.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    p.accessDescs = [grant]
    p.accessDescCount = 1
    p.bytesize = SIZE
    alloc = check(cu.cuGraphAddMemAllocNode(g, None, 0, p))
    free = check(cu.cuGraphAddMemFreeNode(g, [alloc], 1, p.dptr))
    got = check(cu.cuGraphMemAllocNodeGetParams(alloc))
    assert (int(got.dptr), got.bytesize, got.poolProps.location.id) == (int(p.dptr), SIZE, 0)
    assert got.accessDescCount == 1  # (the bindings do not read back a driver-owned array)
    assert int(check(cu.cuGraphMemFreeNodeGetParams(free))) == int(p.dptr)
    err, _ = cu.cuGraphMemFreeNodeGetParams(alloc)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    # An allocation a free node names stays.
    (err,) = cu.cuGraphDestroyNode(alloc)
    assert err == R.CUDA_ERROR_NOT_SUPPORTED
    check(cu.cuGraphDestroy(g))


def test_dependencies_added_later_order_the_launch(context):
    import numpy as np

    # b is added first but comes to depend on a: the launch runs a's fill, then b's copy.
    dptr = check(cu.cuMemAlloc(SIZE))
    host = np.zeros(SIZE, dtype=np.uint8)
    g = check(cu.cuGraphCreate(0))
    copy = cu.CUDA_MEMCPY3D()
    device_to_host(copy, dptr, host, SIZE)
    b = check(cu.cuGraphAddMemcpyNode(g, None, 0, copy, context))
    fill = cu.CUDA_MEMSET_NODE_PARAMS()
    fill.dst = dptr
    fill.elementSize = 1
    fill.width = SIZE
    fill.height = 1
    fill.value = 5
    a = check(cu.cuGraphAddMemsetNode(g, None, 0, fill, context))
    check(cu.cuGraphAddDependencies(g, [a], [b], None, 1))
    (err,) = cu.cuGraphAddDependencies(g, [a], [b], None, 1)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "already there"
    deps, _, count = check(cu.cuGraphNodeGetDependencies(b, 1))
    assert ids(deps[:count]) == [int(a)]
    stream = check(cu.cuStreamCreate(0))
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))
    assert (host == 5).all()
    # A cycle is refused when the graph is instantiated; removed, the edge is gone.
    check(cu.cuGraphAddDependencies(g, [b], [a], None, 1))
    err, _ = cu.cuGraphInstantiate(g, 0)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    check(cu.cuGraphRemoveDependencies(g, [b], [a], None, 1))
    (err,) = cu.cuGraphRemoveDependencies(g, [b], [a], None, 1)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "not there"
    check(cu.cuGraphExecDestroy(graph_exec))
    check(cu.cuGraphDestroy(g))
    check(cu.cuStreamDestroy(stream))
    check(cu.cuMemFree(dptr))
