"""Graph nodes from generic parameters (cuGraphAddNode) and conditional nodes through
cuda.bindings: if (with an else), switch and while nodes whose bodies the driver creates and
the application fills, run with their condition's default value (no device code runs here to
change it); a while node whose condition is set is refused at launch instead of looping
forever. The same with and without the shim."""

import numpy as np
from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
T = cu.CUgraphNodeType
COND = cu.CUgraphConditionalNodeType
SIZE = 8


def memset(dptr, offset, value):
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_MEMSET
    p.memset.dst = int(dptr) + offset
    p.memset.elementSize = 1
    p.memset.width = 1
    p.memset.height = 1
    p.memset.value = value
    return p


def conditional(graph, context, kind, size, default):
    handle = check(cu.cuGraphConditionalHandleCreate(graph, context, default, 1))
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle = handle
    p.conditional.type = kind
    p.conditional.size = size
    p.conditional.ctx = context
    err, _ = cu.cuGraphAddNode(graph, None, None, 0, p)
    return err, p


def launched(context, kind, size, default):
    """The bytes after a graph with one conditional node, body i setting byte i to 10 + i."""
    dptr = check(cu.cuMemAlloc(SIZE))
    check(cu.cuMemsetD8(dptr, 0, SIZE))
    graph = check(cu.cuGraphCreate(0))
    err, p = conditional(graph, context, kind, size, default)
    assert err == R.CUDA_SUCCESS
    bodies = [p.conditional.phGraph_out[i] for i in range(size)]
    assert all(int(b) != 0 for b in bodies) and len(set(map(int, bodies))) == size
    for i, body in enumerate(bodies):
        check(cu.cuGraphAddNode(body, None, None, 0, memset(dptr, i, 10 + i)))
    graph_exec = check(cu.cuGraphInstantiate(graph, 0))
    stream = check(cu.cuStreamCreate(0))
    (err,) = cu.cuGraphLaunch(graph_exec, stream)
    check(cu.cuStreamSynchronize(stream))
    out = np.zeros(SIZE, dtype=np.uint8)
    check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, SIZE))
    for done in (cu.cuGraphExecDestroy(graph_exec), cu.cuGraphDestroy(graph)):
        check(done)
    check(cu.cuStreamDestroy(stream))
    check(cu.cuMemFree(dptr))
    return err, list(out[:4])


def test_generic_nodes_run_in_order(context):
    dptr = check(cu.cuMemAlloc(SIZE))
    graph = check(cu.cuGraphCreate(0))
    first = check(cu.cuGraphAddNode(graph, None, None, 0, memset(dptr, 0, 5)))
    empty = cu.CUgraphNodeParams()
    empty.type = T.CU_GRAPH_NODE_TYPE_EMPTY
    check(cu.cuGraphAddNode(graph, [first], None, 1, empty))
    kernel = cu.CUgraphNodeParams()
    kernel.type = T.CU_GRAPH_NODE_TYPE_KERNEL
    assert cu.cuGraphAddNode(graph, None, None, 0, kernel)[0] == R.CUDA_ERROR_NOT_SUPPORTED
    graph_exec = check(cu.cuGraphInstantiate(graph, 0))
    check(cu.cuGraphLaunch(graph_exec, 0))
    check(cu.cuCtxSynchronize())
    out = np.zeros(1, dtype=np.uint8)
    check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, 1))
    assert out[0] == 5
    check(cu.cuGraphExecDestroy(graph_exec))
    check(cu.cuGraphDestroy(graph))
    check(cu.cuMemFree(dptr))


def test_conditional_nodes_take_their_default_value(context):
    assert launched(context, COND.CU_GRAPH_COND_TYPE_IF, 1, 1) == (R.CUDA_SUCCESS, [10, 0, 0, 0])
    assert launched(context, COND.CU_GRAPH_COND_TYPE_IF, 1, 0) == (R.CUDA_SUCCESS, [0, 0, 0, 0])
    assert launched(context, COND.CU_GRAPH_COND_TYPE_IF, 2, 0) == (R.CUDA_SUCCESS, [0, 11, 0, 0])
    assert launched(context, COND.CU_GRAPH_COND_TYPE_SWITCH, 3, 2) == (R.CUDA_SUCCESS, [0, 0, 12, 0])
    assert launched(context, COND.CU_GRAPH_COND_TYPE_SWITCH, 3, 7) == (R.CUDA_SUCCESS, [0, 0, 0, 0])
    assert launched(context, COND.CU_GRAPH_COND_TYPE_WHILE, 1, 0) == (R.CUDA_SUCCESS, [0, 0, 0, 0])
    err, out = launched(context, COND.CU_GRAPH_COND_TYPE_WHILE, 1, 1)
    assert err == R.CUDA_ERROR_NOT_SUPPORTED and out == [0, 0, 0, 0], "refused, not run forever"


def test_conditional_arguments_are_checked(context):
    graph = check(cu.cuGraphCreate(0))
    other = check(cu.cuGraphCreate(0))
    assert cu.cuGraphConditionalHandleCreate(graph, context, 0, 2)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert conditional(graph, context, COND.CU_GRAPH_COND_TYPE_IF, 3, 1)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert conditional(graph, context, COND.CU_GRAPH_COND_TYPE_WHILE, 2, 1)[0] == R.CUDA_ERROR_INVALID_VALUE
    foreign = check(cu.cuGraphConditionalHandleCreate(other, context, 1, 1))
    p = cu.CUgraphNodeParams()
    p.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle = foreign
    p.conditional.type = COND.CU_GRAPH_COND_TYPE_IF
    p.conditional.size = 1
    p.conditional.ctx = context
    assert cu.cuGraphAddNode(graph, None, None, 0, p)[0] == R.CUDA_ERROR_INVALID_VALUE, "another graph's"
    check(cu.cuGraphDestroy(graph))
    check(cu.cuGraphDestroy(other))
