//! Streams and events with CUDA's ordering: work on a created stream runs in submission order,
//! after the call returned; events mark points in streams; the legacy default stream waits for
//! blocking streams; errors of queued work surface at synchronization.
//!
//! A "gate" host function parks a stream until the test opens it, so every ordering below is
//! observed by state, never by timing.

mod support;

use cuinterpose_abi::results::{
    CUDA_ERROR_ILLEGAL_ADDRESS as ILLEGAL_ADDRESS, CUDA_ERROR_NOT_READY as NOT_READY,
    CUDA_ERROR_TIMEOUT as TIMEOUT,
};
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};
use support::*;

/// A host function that blocks its stream until [`Gate::open`].
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

unsafe extern "C" fn wait_for_gate(user: *mut c_void) {
    // SAFETY: `user` is the `Gate` the test keeps alive (an `Arc` it holds) until the stream
    // has run this function.
    let gate = unsafe { &*(user as *const Gate) };
    let mut open = gate.open.lock().unwrap();
    while !*open {
        open = gate.cv.wait(open).unwrap();
    }
}

fn park(cu: &Cuda, stream: usize, gate: &Arc<Gate>) {
    ok(cu.cuLaunchHostFunc(
        stream,
        Some(wait_for_gate),
        Arc::as_ptr(gate) as *mut c_void,
    ));
}

fn stream(cu: &Cuda, flags: u32) -> usize {
    let mut s = 0;
    ok(cu.cuStreamCreate(&mut s, flags));
    s
}

fn event(cu: &Cuda) -> usize {
    let mut e = 0;
    ok(cu.cuEventCreate(&mut e, 0));
    e
}

/// One mapped, writable allocation for the test.
fn buffer(cu: &Cuda) -> (u64, u64) {
    let h = cu.create(GRAN, 0, 0);
    (h, cu.map_rw(h, GRAN, 0))
}

fn free(cu: &Cuda, (h, p): (u64, u64)) {
    cu.unmap_free(p, GRAN, h);
}

#[test]
fn queued_work_runs_later_and_in_order() {
    let (_serial, cu) = begin(0);
    let (h, p) = buffer(cu);
    cu.write(p, &[0u8; 8]);
    let s = stream(cu, 1);
    let gate = Arc::new(Gate::default());
    park(cu, s, &gate);
    let first = [1u8; 8];
    let second = [2u8; 8];
    ok(cu.cuMemcpyHtoDAsync_v2(p, first.as_ptr().cast(), 8, s));
    ok(cu.cuMemcpyHtoDAsync_v2(p, second.as_ptr().cast(), 8, s));
    // Both calls returned; nothing ran yet.
    assert_eq!(cu.cuStreamQuery(s), NOT_READY);
    assert_eq!(cu.read(p, 8), [0u8; 8], "the copies wait behind the gate");
    gate.open();
    ok(cu.cuStreamSynchronize(s));
    ok(cu.cuStreamQuery(s));
    assert_eq!(cu.read(p, 8), second, "the later copy ran last");
    ok(cu.cuStreamDestroy_v2(s));
    free(cu, (h, p));
}

#[test]
fn events_mark_points_in_a_stream() {
    let (_serial, cu) = begin(0);
    let s = stream(cu, 1);
    let (start, end, never) = (event(cu), event(cu), event(cu));
    ok(cu.cuEventQuery(never));
    let mut ms = 0f32;
    assert_eq!(
        cu.cuEventElapsedTime(&mut ms, never, never),
        INVALID_HANDLE,
        "elapsed time between never-recorded events"
    );
    ok(cu.cuEventRecord(start, s));
    let gate = Arc::new(Gate::default());
    park(cu, s, &gate);
    ok(cu.cuEventRecord(end, s));
    ok(cu.cuEventSynchronize(start));
    assert_eq!(cu.cuEventQuery(end), NOT_READY);
    assert_eq!(cu.cuEventElapsedTime(&mut ms, start, end), NOT_READY);
    gate.open();
    ok(cu.cuEventSynchronize(end));
    ok(cu.cuEventQuery(end));
    ok(cu.cuEventElapsedTime(&mut ms, start, end));
    assert!(ms >= 0.0, "end after start: {ms} ms");
    for e in [start, end, never] {
        ok(cu.cuEventDestroy_v2(e));
    }
    assert_eq!(cu.cuEventQuery(start), INVALID_HANDLE);
    ok(cu.cuStreamDestroy_v2(s));
}

#[test]
fn a_stream_waits_for_an_event_of_another() {
    let (_serial, cu) = begin(0);
    let (h, p) = buffer(cu);
    cu.write(p, &[0u8; 4]);
    let (a, b) = (stream(cu, 1), stream(cu, 1));
    let gate = Arc::new(Gate::default());
    park(cu, a, &gate);
    let e = event(cu);
    ok(cu.cuEventRecord(e, a));
    ok(cu.cuStreamWaitEvent(b, e, 0));
    let bytes = [9u8; 4];
    ok(cu.cuMemcpyHtoDAsync_v2(p, bytes.as_ptr().cast(), 4, b));
    assert_eq!(cu.cuStreamQuery(b), NOT_READY, "b waits for a's event");
    assert_eq!(cu.read(p, 4), [0u8; 4]);
    gate.open();
    ok(cu.cuStreamSynchronize(b));
    assert_eq!(cu.read(p, 4), bytes);
    ok(cu.cuEventDestroy_v2(e));
    ok(cu.cuStreamDestroy_v2(a));
    ok(cu.cuStreamDestroy_v2(b));
    free(cu, (h, p));
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_only() {
    let _serial = serial();
    let cu = cuda();
    let ctx = cu.setup(0);
    let (h, p) = buffer(cu);
    let (blocking, non_blocking) = (stream(cu, 0), stream(cu, 1));
    let gate = Arc::new(Gate::default());
    park(cu, non_blocking, &gate);
    // A non-blocking stream does not hold up legacy-stream work.
    cu.write(p, &[3u8; 4]);
    assert_eq!(cu.read(p, 4), [3u8; 4]);
    let queued = [4u8; 4];
    ok(cu.cuMemcpyHtoDAsync_v2(p, queued.as_ptr().cast(), 4, blocking));
    park(cu, blocking, &gate);
    // A blocking stream does: a synchronous copy (legacy stream) waits for it.
    let done = Arc::new(Mutex::new(None));
    let reader = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let cu = cuda();
            ok(cu.cuCtxSetCurrent(ctx));
            *done.lock().unwrap() = Some(cu.read(p, 4));
        })
    };
    assert_eq!(cu.cuStreamQuery(blocking), NOT_READY);
    assert!(done.lock().unwrap().is_none(), "the legacy copy waits");
    gate.open();
    reader.join().unwrap();
    assert_eq!(done.lock().unwrap().take(), Some(queued.to_vec()));
    ok(cu.cuCtxSynchronize());
    ok(cu.cuStreamDestroy_v2(blocking));
    ok(cu.cuStreamDestroy_v2(non_blocking));
    free(cu, (h, p));
}

#[test]
fn an_error_of_queued_work_surfaces_at_synchronization() {
    let (_serial, cu) = begin(0);
    let (h, p) = buffer(cu);
    let s = stream(cu, 1);
    let gate = Arc::new(Gate::default());
    park(cu, s, &gate);
    let bytes = [5u8; 16];
    ok(cu.cuMemcpyHtoDAsync_v2(p, bytes.as_ptr().cast(), 16, s));
    // The range goes away before the copy runs.
    ok(cu.cuMemUnmap(p, GRAN));
    gate.open();
    assert_eq!(cu.cuStreamSynchronize(s), ILLEGAL_ADDRESS);
    ok(cu.cuStreamSynchronize(s));
    // Issued now, the same copy fails at once.
    assert_eq!(
        cu.cuMemcpyHtoDAsync_v2(p, bytes.as_ptr().cast(), 16, s),
        INVALID_VALUE
    );
    ok(cu.cuStreamDestroy_v2(s));
    ok(cu.cuMemAddressFree(p, GRAN));
    ok(cu.cuMemRelease(h));
}

#[test]
fn stream_attributes_priorities_and_fills() {
    let _serial = serial();
    let cu = cuda();
    let ctx = cu.setup(0);
    let (mut least, mut greatest) = (1, 1);
    ok(cu.cuCtxGetStreamPriorityRange(&mut least, &mut greatest));
    assert_eq!((least, greatest), (0, -5));
    let mut s = 0;
    ok(cu.cuStreamCreateWithPriority(&mut s, 1, -100));
    let (mut priority, mut flags, mut owner) = (0, 0, 0);
    ok(cu.cuStreamGetPriority(s, &mut priority));
    ok(cu.cuStreamGetFlags(s, &mut flags));
    ok(cu.cuStreamGetCtx(s, &mut owner));
    assert_eq!(
        (priority, flags, owner),
        (-5, 1, ctx),
        "clamped to the greatest priority"
    );
    assert_eq!(
        cu.cuStreamCreate(&mut 0, 2),
        INVALID_VALUE,
        "unknown stream flags"
    );
    let (h, p) = buffer(cu);
    ok(cu.cuMemsetD16_v2(p, 0xBEEF, 4));
    assert_eq!(
        cu.read(p, 8),
        [0xEF, 0xBE, 0xEF, 0xBE, 0xEF, 0xBE, 0xEF, 0xBE]
    );
    ok(cu.cuMemsetD32Async(p + 8, 0x0102_0304, 2, s));
    assert_eq!(cu.cuMemsetD16_v2(p + 1, 0, 1), INVALID_VALUE, "misaligned");
    // Unified copy: device to host memory of the caller, in stream order.
    let mut host = [0u8; 8];
    ok(cu.cuMemcpyAsync(host.as_mut_ptr() as u64, p + 8, 8, s));
    ok(cu.cuStreamSynchronize(s));
    assert_eq!(host, [4, 3, 2, 1, 4, 3, 2, 1]);
    ok(cu.cuStreamDestroy_v2(s));
    assert_eq!(cu.cuStreamQuery(s), INVALID_HANDLE, "destroyed");
    free(cu, (h, p));
}

#[test]
fn the_native_lock_waits_for_queued_work() {
    let (_serial, cu) = begin(0);
    let s = stream(cu, 1);
    let gate = Arc::new(Gate::default());
    park(cu, s, &gate);
    let pid = std::process::id() as i32;
    // CUcheckpointLockArgs: timeoutMs in the first 32 bits.
    let mut args = [0u64; 8];
    args[0] = 200;
    assert_eq!(
        cu.cuCheckpointProcessLock(pid, &mut args),
        TIMEOUT,
        "a lock cannot complete while submitted work has not run"
    );
    gate.open();
    ok(cu.cuStreamSynchronize(s));
    args[0] = 10_000;
    ok(cu.cuCheckpointProcessLock(pid, &mut args));
    ok(cu.cuCheckpointProcessUnlock(pid, &mut [0u64; 8]));
    ok(cu.cuStreamDestroy_v2(s));
}
