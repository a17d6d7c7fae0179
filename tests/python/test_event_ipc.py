"""Interprocess events through cuda.bindings: a record made in one process is seen, waited
for and recorded again in another. The same with and without the shim."""

import ctypes
import multiprocessing
import threading
import time

from cuda.bindings import driver as cu

from conftest import check

R = cu.CUresult
F = cu.CUevent_flags
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_an_interprocess_event_is_shared_between_processes(context):
    import event_ipc_child

    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
    assert check(cu.cuDeviceGetAttribute(attr, 0)) == 1
    err, _ = cu.cuEventCreate(F.CU_EVENT_INTERPROCESS)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "an interprocess event cannot be timed"
    plain = check(cu.cuEventCreate(0))
    err, _ = cu.cuIpcGetEventHandle(plain)
    assert err == R.CUDA_ERROR_INVALID_VALUE, "only interprocess events have handles"
    event = check(cu.cuEventCreate(F.CU_EVENT_INTERPROCESS | F.CU_EVENT_DISABLE_TIMING))
    handle = check(cu.cuIpcGetEventHandle(event))
    err, _ = cu.cuIpcOpenEventHandle(handle)
    assert err == R.CUDA_ERROR_INVALID_CONTEXT, "not in the process that made it"

    # The record sits behind a host function that holds the stream until released.
    release = threading.Event()

    @HOST_FN
    def hold(_):
        release.wait(30)

    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    check(cu.cuLaunchHostFunc(stream, cu.CUhostFn(ctypes.cast(hold, ctypes.c_void_p).value), 0))
    check(cu.cuEventRecord(event, stream))
    multiprocessing.set_start_method("spawn", force=True)
    results = multiprocessing.Queue()
    child = multiprocessing.Process(
        target=event_ipc_child.run, args=(ctypes.string_at(handle.getPtr(), 64), results)
    )
    child.start()
    assert results.get(timeout=60) == ("pending", True), "the opener sees the record pending"
    time.sleep(0.3)
    release.set()
    kind, waited = results.get(timeout=60)
    assert kind == "waited" and waited >= 0.2, "the opener waited for the creator's stream"
    assert results.get(timeout=60) == ("recorded", True)
    check(cu.cuEventSynchronize(event))  # the opener's record, reached
    child.join(60)
    assert child.exitcode == 0
    check(cu.cuStreamSynchronize(stream))
    for e in (event, plain):
        check(cu.cuEventDestroy(e))
    check(cu.cuStreamDestroy(stream))
