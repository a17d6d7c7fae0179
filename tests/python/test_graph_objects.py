"""User objects and event nodes in graphs through cuda.bindings: a user object's destructor runs
once its last reference (the application's, a graph's, an executable graph's) goes; event
record and wait nodes record and wait when they run, and their events can change. The same
with and without the shim."""

import ctypes

from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
T = cu.CUgraphNodeType
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
NO_SYNC = cu.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
MOVE = cu.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE


def user_object(destroyed, tag, refs=1):
    @HOST_FN
    def destroy(ptr):
        destroyed.append(ptr)

    fn = cu.CUhostFn(ctypes.cast(destroy, ctypes.c_void_p).value)
    obj = check(cu.cuUserObjectCreate(tag, fn, refs, NO_SYNC))
    return obj, destroy


def test_a_user_objects_destructor_runs_with_its_last_reference(context):
    destroyed = []
    obj, _keep = user_object(destroyed, 7, refs=2)
    check(cu.cuUserObjectRelease(obj, 1))
    assert destroyed == []
    check(cu.cuUserObjectRetain(obj, 1))
    check(cu.cuUserObjectRelease(obj, 2))
    assert destroyed == [7]
    (err,) = cu.cuUserObjectRelease(obj, 1)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "gone"
    err, _ = cu.cuUserObjectCreate(1, cu.CUhostFn(0), 1, NO_SYNC)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "a destructor is required"


def test_graphs_and_executable_graphs_hold_references(context):
    destroyed = []
    obj, _keep = user_object(destroyed, 9)
    g = check(cu.cuGraphCreate(0))
    check(cu.cuGraphAddEmptyNode(g, None, 0))
    check(cu.cuGraphRetainUserObject(g, obj, 1, MOVE))  # the application's reference moves
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    check(cu.cuGraphDestroy(g))
    assert destroyed == [], "the executable graph still holds it"
    check(cu.cuGraphExecDestroy(graph_exec))
    assert destroyed == [9]
    # A graph may release only what it holds.
    obj, _keep2 = user_object(destroyed, 10)
    g = check(cu.cuGraphCreate(0))
    check(cu.cuGraphRetainUserObject(g, obj, 2, 0))
    (err,) = cu.cuGraphReleaseUserObject(g, obj, 3)
    assert err == R.CUDA_ERROR_INVALID_VALUE
    check(cu.cuGraphReleaseUserObject(g, obj, 2))
    check(cu.cuUserObjectRelease(obj, 1))
    assert destroyed == [9, 10]
    check(cu.cuGraphDestroy(g))


def test_event_nodes_record_and_wait_when_they_run(context):
    stream = check(cu.cuStreamCreate(0))
    first = check(cu.cuEventCreate(0))
    second = check(cu.cuEventCreate(0))
    g = check(cu.cuGraphCreate(0))
    record = check(cu.cuGraphAddEventRecordNode(g, None, 0, first))
    wait = check(cu.cuGraphAddEventWaitNode(g, [record], 1, first))
    assert check(cu.cuGraphNodeGetType(record)) == T.CU_GRAPH_NODE_TYPE_EVENT_RECORD
    assert check(cu.cuGraphNodeGetType(wait)) == T.CU_GRAPH_NODE_TYPE_WAIT_EVENT
    assert int(check(cu.cuGraphEventRecordNodeGetEvent(record))) == int(first)
    assert int(check(cu.cuGraphEventWaitNodeGetEvent(wait))) == int(first)
    err, _ = cu.cuGraphEventWaitNodeGetEvent(record)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "a record node is not a wait node"
    graph_exec = check(cu.cuGraphInstantiate(g, 0))
    # The executable graph records the other event from now on; the graph keeps its own.
    check(cu.cuGraphExecEventRecordNodeSetEvent(graph_exec, record, second))
    check(cu.cuGraphLaunch(graph_exec, stream))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuEventSynchronize(second))
    assert check(cu.cuEventElapsedTime(second, second)) == 0.0, "second was recorded"
    err, _ = cu.cuEventElapsedTime(first, first)
    assert err == R.CUDA_ERROR_INVALID_HANDLE, "first never was"
    assert int(check(cu.cuGraphEventRecordNodeGetEvent(record))) == int(first)
    check(cu.cuGraphEventRecordNodeSetEvent(record, second))
    assert int(check(cu.cuGraphEventRecordNodeGetEvent(record))) == int(second)
    generic = check(cu.cuGraphNodeGetParams(wait))
    assert generic.type == T.CU_GRAPH_NODE_TYPE_WAIT_EVENT
    for done in (cu.cuGraphExecDestroy(graph_exec), cu.cuGraphDestroy(g)):
        check(done)
    for e in (first, second):
        check(cu.cuEventDestroy(e))
    check(cu.cuStreamDestroy(stream))
