//! Streams and events (see [`crate::state::stream`] for their ordering on the host).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, handle_ptr, put, with, with_out};
use crate::driver::{self, DriverState};
use crate::error::{CUDA_SUCCESS, CuError, CuResult, RawResult};
use crate::memcpy;
use crate::state::context::Target;
use crate::state::stream::{self, Event};
use cudarc::driver::sys::{CUcontext, CUctx_st, CUstream, CUstream_st};
use cudarc::driver::sys::{CUevent, CUevent_st, CUgreenCtx};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

fn stream_of(s: CUstream) -> u64 {
    s as usize as u64
}

pub(super) fn event(d: &DriverState, e: CUevent) -> CuResult<Arc<Event>> {
    d.events
        .get(&(e as usize as u64))
        .cloned()
        .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
}

fn create_stream(ph_stream: *mut CUstream, flags: c_uint, priority: c_int) -> RawResult {
    // SAFETY: CUstream out-parameter (cuda.h).
    unsafe {
        with_out(ph_stream, |d| {
            let h = d.next_handle();
            d.contexts.create_stream(h, flags, priority)?;
            Ok(handle_ptr::<CUstream_st>(h))
        })
    }
}

export! {
    fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) {
        create_stream(ph_stream, flags, stream::PRIORITY_LEAST)
    }

    fn cuStreamCreateWithPriority(ph_stream: *mut CUstream, flags: c_uint, priority: c_int) {
        // Out-of-range priorities are clamped, as the driver does.
        create_stream(ph_stream, flags, priority)
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        with(|d| {
            d.contexts.current()?;
            if !least.is_null() {
                // SAFETY: optional int out-parameter (cuda.h).
                unsafe { put(least, stream::PRIORITY_LEAST) }?;
            }
            if !greatest.is_null() {
                // SAFETY: as above.
                unsafe { put(greatest, stream::PRIORITY_GREATEST) }?;
            }
            Ok(())
        })
    }
}

/// A stream's context and, for created streams, the stream itself.
fn describe(d: &DriverState, s: CUstream) -> CuResult<(u64, Option<Arc<stream::Stream>>)> {
    match d.contexts.target(Some(stream_of(s)))? {
        Target::Now { ctx, .. } => Ok((ctx, None)),
        Target::Queue(s) => Ok((s.ctx, Some(s))),
    }
}

export! {
    fn cuStreamGetPriority(s: CUstream, priority: *mut c_int) {
        with(|d| {
            let (_, created) = describe(d, s)?;
            let value = created.map_or(stream::PRIORITY_LEAST, |s| s.priority);
            // SAFETY: int out-parameter (cuda.h).
            unsafe { put(priority, value) }
        })
    }

    fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) {
        with(|d| {
            let (_, created) = describe(d, s)?;
            let value = created.map_or(0, |s| s.flags);
            // SAFETY: unsigned out-parameter (cuda.h).
            unsafe { put(flags, value) }
        })
    }

    fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) -> pctx |d| {
        let (ctx, _) = describe(d, s)?;
        Ok(handle_ptr::<CUctx_st>(ctx))
    }

    fn cuStreamGetCtx_v2(s: CUstream, pctx: *mut CUcontext, pgreen: *mut CUgreenCtx) {
        with(|d| {
            let (ctx, _) = describe(d, s)?;
            // SAFETY: CUcontext out-parameter (cuda.h).
            unsafe { put(pctx, handle_ptr::<CUctx_st>(ctx)) }?;
            if !pgreen.is_null() {
                // fakecuda has no green contexts: a stream of a plain context reports none.
                // SAFETY: optional CUgreenCtx out-parameter (cuda.h).
                unsafe { put(pgreen, std::ptr::null_mut()) }?;
            }
            Ok(())
        })
    }

    fn cuStreamGetId(s: CUstream, id: *mut c_ulonglong) -> id |d| {
        describe(d, s)?;
        Ok(stream_of(s))
    }

    safe fn cuStreamQuery(s: CUstream) {
        with(|d| match describe(d, s)? {
            (_, Some(created)) => created.query(),
            (_, None) => Ok(()),
        })
    }

    safe fn cuStreamSynchronize(s: CUstream) {
        stream_sync_delay();
        gated(|| match memcpy::target(Some(stream_of(s)))? {
            // The legacy stream's implicit wait on blocking streams already ran.
            Target::Now { .. } => Ok(()),
            Target::Queue(created) => created.synchronize(),
        })
    }
}

/// Test hook: `FAKECUDA_STREAM_SYNC_DELAY_MS` makes every `cuStreamSynchronize` take that
/// long before it does anything (holding nothing), so a test can have a thread parked inside
/// a driver call.
pub(super) fn stream_sync_delay() {
    static DELAY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *DELAY.get_or_init(|| {
        std::env::var("FAKECUDA_STREAM_SYNC_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

export! {
    safe fn cuStreamDestroy_v2(s: CUstream) {
        with(|d| d.contexts.destroy_stream(stream_of(s)))
    }

    safe fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) {
        gated(|| {
            // CU_EVENT_WAIT_DEFAULT (0) and CU_EVENT_WAIT_EXTERNAL (1).
            if flags > 1 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let ev = driver::with(|d| event(d, e))?;
            let upto = ev.latest();
            if upto == 0 {
                // Waiting for a never-recorded event waits for nothing.
                return memcpy::target(Some(stream_of(s))).map(drop);
            }
            memcpy::host_work(Some(stream_of(s)), move || ev.wait_for(upto))
        })
    }
}

/// `CUhostFn`.
type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
/// `CUstreamCallback`.
type StreamCallback = Option<unsafe extern "C" fn(CUstream, c_uint, *mut c_void)>;

/// The application's pointer handed back to its own callback on a worker thread.
#[derive(Clone, Copy)]
struct UserData(usize);

/// `CU_HOST_TASK_SPINWAIT`, the greatest `CUhostTaskSyncMode`. How the stream waits for the
/// host function (blocking or spinning) changes nothing here: a worker thread runs it.
pub(super) const HOST_TASK_SPINWAIT: c_uint = 1;

export! {
    fn cuLaunchHostFunc(s: CUstream, f: HostFn, user: *mut c_void) {
        // SAFETY: the caller's arguments, as cuda.h documents them; blocking is v1's mode.
        unsafe { cuLaunchHostFunc_v2(s, f, user, 0) }
    }

    /// CUDA 13.2: the caller picks how the stream waits for the host function.
    fn cuLaunchHostFunc_v2(s: CUstream, f: HostFn, user: *mut c_void, sync_mode: c_uint) {
        gated(|| {
            if sync_mode > HOST_TASK_SPINWAIT {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let f = f.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            let user = UserData(user as usize);
            memcpy::host_work(Some(stream_of(s)), move || {
                let user = user;
                // SAFETY: the application's host function with its own argument (cuda.h), called
                // once in stream order.
                unsafe { f(user.0 as *mut c_void) }
            })
        })
    }

    fn cuStreamAddCallback(s: CUstream, f: StreamCallback, user: *mut c_void, flags: c_uint) {
        gated(|| {
            let f = f.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            if flags != 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let (user, handle) = (UserData(user as usize), UserData(s as usize));
            memcpy::host_work(Some(stream_of(s)), move || {
                let (user, handle) = (user, handle);
                // SAFETY: the application's callback with its own arguments (cuda.h); the status
                // is CUDA_SUCCESS, as work before it completed.
                unsafe { f(handle.0 as CUstream, CUDA_SUCCESS, user.0 as *mut c_void) }
            })
        })
    }

    fn cuEventCreate(ph_event: *mut CUevent, flags: c_uint) -> ph_event |d| {
        if flags & !stream::EVENT_FLAGS != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let interprocess = flags & stream::EVENT_INTERPROCESS != 0;
        if interprocess && flags & stream::EVENT_DISABLE_TIMING == 0 {
            // An interprocess event cannot be timed (cuda.h).
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        d.contexts.current()?;
        let shared = if interprocess {
            Some(crate::state::ipc_event::SharedMarks::new()?)
        } else {
            None
        };
        let h = d.next_handle();
        d.events.insert(h, Event::with_marks(flags, shared));
        Ok(handle_ptr::<CUevent_st>(h))
    }

    safe fn cuEventDestroy_v2(e: CUevent) {
        with(|d| {
            d.events
                .remove(&(e as usize as u64))
                .map(drop)
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
        })
    }
}

fn record(e: CUevent, s: CUstream) -> RawResult {
    gated(|| {
        let ev = driver::with(|d| event(d, e))?;
        let n = ev.record();
        memcpy::host_work(Some(stream_of(s)), move || ev.reach(n))
    })
}

export! {
    safe fn cuEventRecord(e: CUevent, s: CUstream) {
        record(e, s)
    }

    safe fn cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint) {
        // CU_EVENT_RECORD_DEFAULT (0) and CU_EVENT_RECORD_EXTERNAL (1, for graphs).
        if flags > 1 {
            return CuError::CUDA_ERROR_INVALID_VALUE.raw();
        }
        record(e, s)
    }

    safe fn cuEventQuery(e: CUevent) {
        with(|d| event(d, e)?.query())
    }

    safe fn cuEventSynchronize(e: CUevent) {
        gated(|| {
            let ev = driver::with(|d| event(d, e))?;
            ev.wait_for(ev.latest());
            Ok(())
        })
    }

    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> ms |d| {
        let (start, end) = (event(d, start)?, event(d, end)?);
        let value = stream::elapsed_ms(&start, &end)?;
        Ok(value)
    }

    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) {
        // SAFETY: same contract; _v2 (CUDA 12.8) differs only in its resolution on the GPU.
        unsafe { cuEventElapsedTime(ms, start, end) }
    }

    fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) {
        with(|d| {
            let ctx = if ctx.is_null() {
                d.contexts.current()?.0
            } else {
                ctx as usize as u64
            };
            d.contexts.check_live(ctx)?;
            // The API version of contexts created through the current driver API (cuda.h).
            // SAFETY: unsigned out-parameter (cuda.h).
            unsafe { put(version, 3020) }
        })
    }

    /// Stream capture (graphs) is not modelled: no stream is ever capturing.
    fn cuStreamIsCapturing(s: CUstream, status: *mut c_uint) -> status |d| {
        describe(d, s)?;
        Ok(0)
    }
}
