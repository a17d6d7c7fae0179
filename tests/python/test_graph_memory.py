"""Graph memory through cuda.bindings: allocation nodes reserve their address when added, an
executable graph gets the memory at its first launch and keeps it until it is destroyed or
the device's graph memory is trimmed, and the device's graph-memory attributes count it. The
same with and without the shim."""

import numpy as np
import pytest
from cuda.bindings import driver as cu

from conftest import check
from driver_support import device_to_host

R = cu.CUresult
T = cu.CUgraphNodeType
G = cu.CUgraphMem_attribute
SIZE = 4096


def alloc_params(device=0, size=SIZE):
    p = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    p.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.poolProps.location.id = device
    p.bytesize = size
    return p


def memory(attribute):
    return int(check(cu.cuDeviceGetGraphMemAttribute(0, attribute)))


def fill_then_read(graph, dptr, after, host, value):
    """A memset of the allocation, then a copy of it to `host`; returns the copy node."""
    fill = cu.CUgraphNodeParams()
    fill.type = T.CU_GRAPH_NODE_TYPE_MEMSET
    fill.memset.dst = dptr
    fill.memset.elementSize = 1
    fill.memset.width = SIZE
    fill.memset.height = 1
    fill.memset.value = value
    memset = check(cu.cuGraphAddNode(graph, [after], None, 1, fill))
    copy = cu.CUgraphNodeParams()
    copy.type = T.CU_GRAPH_NODE_TYPE_MEMCPY
    device_to_host(copy.memcpy.copyParams, dptr, host, SIZE)
    return check(cu.cuGraphAddNode(graph, [memset], None, 1, copy))


@pytest.fixture
def graph(context):
    stream = check(cu.cuStreamCreate(0))
    g = check(cu.cuGraphCreate(0))
    params = alloc_params()
    alloc = check(cu.cuGraphAddMemAllocNode(g, None, 0, params))
    assert int(params.dptr) != 0, "the address is known when the node is added"
    host = np.zeros(SIZE, dtype=np.uint8)
    copy = fill_then_read(g, params.dptr, alloc, host, 7)
    check(cu.cuGraphAddMemFreeNode(g, [copy], 1, params.dptr))
    yield g, int(params.dptr), host, stream
    check(cu.cuGraphDestroy(g))
    check(cu.cuStreamDestroy(stream))


def test_an_executable_graph_holds_its_memory_from_its_first_launch(graph):
    g, dptr, host, stream = graph
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))
    assert (host == 7).all(), "the allocation was written and read within the launch"
    used = memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    assert used >= SIZE
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == used
    assert memory(G.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) == used
    assert memory(G.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) == used
    # A graph with memory nodes has one executable graph at a time.
    err, _ = cu.cuGraphInstantiate(g, 0)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    # Trimmed, the memory goes back; the next launch gets it again.
    check(cu.cuDeviceGraphMemTrim(0))
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == used
    check(cu.cuGraphExecDestroy(graph_exec))
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == 0
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == used, "the mark stays"
    check(cu.cuDeviceSetGraphMemAttribute(0, G.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)))
    assert memory(G.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) == 0
    # Only a high-water mark may be set, and only to 0.
    for attribute, value in [
        (G.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, 0),
        (G.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, 5),
    ]:
        (err,) = cu.cuDeviceSetGraphMemAttribute(0, attribute, cu.cuuint64_t(value))
        assert err == R.CUDA_ERROR_INVALID_VALUE
    # Destroyed, an executable graph frees the way for another.
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    check(cu.cuGraphExecDestroy(graph_exec))


def test_bad_memory_nodes_are_refused(graph):
    g, dptr, _, _ = graph
    refused = [
        cu.cuGraphAddMemFreeNode(g, None, 0, dptr)[0],  # already freed by a node
        cu.cuGraphAddMemFreeNode(g, None, 0, dptr + SIZE)[0],  # not an allocation
        cu.cuGraphAddMemAllocNode(g, None, 0, alloc_params(size=0))[0],
        cu.cuGraphAddMemAllocNode(g, None, 0, alloc_params(device=99))[0],
    ]
    assert refused[:3] == [R.CUDA_ERROR_INVALID_VALUE] * 3
    assert refused[3] == R.CUDA_ERROR_INVALID_DEVICE
    host = alloc_params()
    host.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    assert cu.cuGraphAddMemAllocNode(g, None, 0, host)[0] == R.CUDA_ERROR_INVALID_VALUE
    # A graph with memory nodes cannot be another's child.
    parent = check(cu.cuGraphCreate(0))
    err, _ = cu.cuGraphAddChildGraphNode(parent, None, 0, g)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    check(cu.cuGraphDestroy(parent))


def test_generic_parameters_make_memory_nodes_too(context):
    g = check(cu.cuGraphCreate(0))
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_MEM_ALLOC
    p.alloc.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.alloc.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.alloc.poolProps.location.id = 0
    p.alloc.bytesize = SIZE
    alloc = check(cu.cuGraphAddNode(g, None, None, 0, p))
    assert int(p.alloc.dptr) != 0
    assert check(cu.cuGraphNodeGetType(alloc)) == T.CU_GRAPH_NODE_TYPE_MEM_ALLOC
    free = cu.CUgraphNodeParams()
    free.type = T.CU_GRAPH_NODE_TYPE_MEM_FREE
    free.free.dptr = p.alloc.dptr
    node = check(cu.cuGraphAddNode(g, [alloc], None, 1, free))
    assert check(cu.cuGraphNodeGetType(node)) == T.CU_GRAPH_NODE_TYPE_MEM_FREE
    check(cu.cuGraphDestroy(g))
