"""Graph nodes read and changed through cuda.bindings: node types and lists, the typed and
generic getters and setters, and an executable graph's own parameters, which its next launch
runs while the graph keeps what it had. The same with and without the shim."""

import numpy as np
import pytest
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
T = cu.CUgraphNodeType
M = cu.CUmemorytype
SIZE = 64


def memset_params(dptr, value, height=1):
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_MEMSET
    p.memset.dst = dptr
    p.memset.elementSize = 1
    p.memset.width = SIZE
    p.memset.height = height
    p.memset.pitch = SIZE
    p.memset.value = value
    return p


def copy_params(src, dst_host):
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_MEMCPY
    c = p.memcpy.copyParams
    c.srcMemoryType = M.CU_MEMORYTYPE_DEVICE
    c.srcDevice = src
    c.dstMemoryType = M.CU_MEMORYTYPE_HOST
    c.dstHost = dst_host
    c.WidthInBytes = SIZE
    c.Height = 1
    c.Depth = 1
    return p


@pytest.fixture
def graph(context):
    a, b = check(cu.cuMemAlloc(SIZE)), check(cu.cuMemAlloc(SIZE))
    host = np.zeros(SIZE, dtype=np.uint8)
    g = check(cu.cuGraphCreate(0))
    fill = check(cu.cuGraphAddNode(g, None, None, 0, memset_params(a, 1)))
    copy = check(cu.cuGraphAddNode(g, [fill], None, 1, copy_params(a, host.ctypes.data)))
    stream = check(cu.cuStreamCreate(0))
    yield g, fill, copy, a, b, host, stream
    check(cu.cuStreamDestroy(stream))
    check(cu.cuGraphDestroy(g))
    check(cu.cuMemFree(a))
    check(cu.cuMemFree(b))


def run(graph_exec, stream):
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))


def test_nodes_tell_their_type_and_graph_lists_them(graph):
    g, fill, copy, *_ = graph
    assert check(cu.cuGraphNodeGetType(fill)) == T.CU_GRAPH_NODE_TYPE_MEMSET
    assert check(cu.cuGraphNodeGetType(copy)) == T.CU_GRAPH_NODE_TYPE_MEMCPY
    nodes, count = cu.cuGraphGetNodes(g, 0)[1:]
    assert count == 2
    nodes, count = check(cu.cuGraphGetNodes(g, 2))
    assert [int(n) for n in nodes] == [int(fill), int(copy)] and count == 2


def test_typed_and_generic_getters_hand_back_what_was_given(graph):
    _, fill, copy, a, _, host, _ = graph
    got = check(cu.cuGraphMemcpyNodeGetParams(copy))
    assert int(got.srcDevice) == int(a) and int(got.dstHost) == host.ctypes.data
    assert got.srcMemoryType == M.CU_MEMORYTYPE_DEVICE and got.WidthInBytes == SIZE
    m = check(cu.cuGraphMemsetNodeGetParams(fill))
    assert (int(m.dst), m.value, m.elementSize, m.width) == (int(a), 1, 1, SIZE)
    generic = check(cu.cuGraphNodeGetParams(fill))
    assert generic.type == T.CU_GRAPH_NODE_TYPE_MEMSET and generic.memset.value == 1
    # A getter of another kind of node is refused.
    err, _ = cu.cuGraphMemcpyNodeGetParams(fill)
    assert err == R.CUDA_ERROR_INVALID_VALUE


def test_a_graphs_node_changes_for_later_instantiations_only(graph):
    g, fill, copy, a, b, host, stream = graph
    before = check(cu.cuGraphInstantiate(g, 0))
    check(cu.cuMemsetD8(b, 9, SIZE))
    check(cu.cuGraphNodeSetParams(copy, copy_params(b, host.ctypes.data)))
    assert int(check(cu.cuGraphMemcpyNodeGetParams(copy)).srcDevice) == int(b)
    run(before, stream)
    assert (host == 1).all()  # the executable graph kept the old copy
    after = check(cu.cuGraphInstantiate(g, 0))
    run(after, stream)
    assert (host == 9).all()
    # A node's kind does not change.
    (err,) = cu.cuGraphNodeSetParams(copy, memset_params(a, 3))
    assert err == R.CUDA_ERROR_INVALID_VALUE
    for e in (before, after):
        check(cu.cuGraphExecDestroy(e))


def test_an_executable_graph_takes_new_parameters_under_the_drivers_rules(graph):
    g, fill, copy, a, b, host, stream = graph
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    check(cu.cuGraphExecNodeSetParams(graph_exec, fill, memset_params(a, 11)))
    run(graph_exec, stream)
    assert (host == 11).all()
    assert check(cu.cuGraphMemsetNodeGetParams(fill)).value == 1  # the graph is unchanged
    # Typed setters too.
    m = check(cu.cuGraphMemsetNodeGetParams(fill))
    m.value = 12
    check(cu.cuGraphExecMemsetNodeSetParams(graph_exec, fill, m, None))
    run(graph_exec, stream)
    assert (host == 12).all()
    # Not one-dimensional, another kind, or a node of another graph: refused.
    (err,) = cu.cuGraphExecNodeSetParams(graph_exec, fill, memset_params(a, 5, height=2))
    assert err == R.CUDA_ERROR_INVALID_VALUE
    (err,) = cu.cuGraphExecNodeSetParams(graph_exec, copy, memset_params(a, 5))
    assert err == R.CUDA_ERROR_INVALID_VALUE
    other = check(cu.cuGraphCreate(0))
    stray = check(cu.cuGraphAddNode(other, None, None, 0, memset_params(b, 5)))
    (err,) = cu.cuGraphExecNodeSetParams(graph_exec, stray, memset_params(b, 6))
    assert err == R.CUDA_ERROR_INVALID_VALUE
    # A copy side may not turn from host into device memory.
    p = copy_params(a, host.ctypes.data)
    p.memcpy.copyParams.dstMemoryType = M.CU_MEMORYTYPE_DEVICE
    p.memcpy.copyParams.dstDevice = b
    (err,) = cu.cuGraphExecNodeSetParams(graph_exec, copy, p)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    check(cu.cuGraphDestroy(other))
    check(cu.cuGraphExecDestroy(graph_exec))


def test_host_nodes_change_their_function_argument(context):
    import ctypes

    seen = []
    fn_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    @fn_type
    def record(user):
        seen.append(user)

    g = check(cu.cuGraphCreate(0))
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_HOST
    p.host.fn = cu.CUhostFn(ctypes.cast(record, ctypes.c_void_p).value)
    p.host.userData = 5
    node = check(cu.cuGraphAddNode(g, None, None, 0, p))
    got = check(cu.cuGraphHostNodeGetParams(node))
    assert int(got.userData) == 5
    got.userData = 6
    check(cu.cuGraphHostNodeSetParams(node, got))
    stream = check(cu.cuStreamCreate(0))
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    run(graph_exec, stream)
    got.userData = 7
    check(cu.cuGraphExecHostNodeSetParams(graph_exec, node, got))
    run(graph_exec, stream)
    assert seen == [6, 7]
    check(cu.cuGraphExecDestroy(graph_exec))
    check(cu.cuGraphDestroy(g))
    check(cu.cuStreamDestroy(stream))


def test_child_graph_nodes_cannot_change(graph):
    g, *_ = graph
    parent = check(cu.cuGraphCreate(0))
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_GRAPH
    p.graph.graph = g
    child = check(cu.cuGraphAddNode(parent, None, None, 0, p))
    assert check(cu.cuGraphNodeGetType(child)) == T.CU_GRAPH_NODE_TYPE_GRAPH
    (err,) = cu.cuGraphNodeSetParams(child, p)
    assert err == R.CUDA_ERROR_NOT_SUPPORTED
    err, _ = cu.cuGraphNodeGetParams(child)
    assert err == R.CUDA_ERROR_NOT_SUPPORTED
    check(cu.cuGraphDestroy(parent))
