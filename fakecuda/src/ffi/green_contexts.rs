//! Green contexts (see [`crate::extras::green`]) through the C ABI.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::resources::{RawDevResource, TYPE_SM, put_resource};
use super::{gated, handle_ptr, put, with, with_out};
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use cudarc::driver::sys::{CUcontext, CUdevice, CUstream};
use cudarc::driver::sys::{CUdevResourceDesc, CUevent, CUgreenCtx, CUgreenCtx_st};
use std::ffi::{c_int, c_uint, c_ulonglong};

fn green(g: CUgreenCtx) -> u64 {
    g as usize as u64
}

export! {
    /// `cuDevResourceGenerateDesc`: SM resources (at least one) and workqueue resources, which
    /// change nothing here.
    fn cuDevResourceGenerateDesc(
        out: *mut CUdevResourceDesc,
        resources: *mut RawDevResource,
        n: c_uint,
    ) {
        with(|d| {
            if out.is_null() || resources.is_null() || n == 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `n` CUdevResource (cuda.h), non-null.
            let all = unsafe { std::slice::from_raw_parts(resources, n as usize) };
            let sms: Vec<u32> = all
                .iter()
                .filter(|r| r.type_ == TYPE_SM)
                .map(|r| r.sm[0])
                .collect();
            let h = d.green_desc(&sms)?;
            // SAFETY: CUdevResourceDesc out-parameter (cuda.h), non-null.
            unsafe { put(out, handle_ptr(h)) }
        })
    }
}

/// `CU_GREEN_CTX_DEFAULT_STREAM`, the flag a green context must be made with.
const GREEN_CTX_DEFAULT_STREAM: c_uint = 1;

export! {
    fn cuGreenCtxCreate(
        out: *mut CUgreenCtx,
        desc: CUdevResourceDesc,
        dev: CUdevice,
        flags: c_uint,
    ) {
        with(|d| {
            if out.is_null() || flags != GREEN_CTX_DEFAULT_STREAM {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let g = d.green_create(desc as usize as u64, dev)?;
            // SAFETY: CUgreenCtx out-parameter (cuda.h), non-null.
            unsafe { put(out, handle_ptr::<CUgreenCtx_st>(g)) }
        })
    }

    safe fn cuGreenCtxDestroy(g: CUgreenCtx) {
        with(|d| d.green_destroy(green(g)))
    }

    fn cuCtxFromGreenCtx(out: *mut CUcontext, g: CUgreenCtx) -> out |d| {
        d.green_ctx(green(g)).map(handle_ptr)
    }

    fn cuGreenCtxGetDevResource(g: CUgreenCtx, out: *mut RawDevResource, type_: c_uint) {
        with(|d| {
            let ctx = d.green_ctx(green(g))?;
            let device = d.contexts.device_of(ctx).unwrap_or(0);
            put_resource(out, type_, device, d.ctx_sms(ctx))
        })
    }

    fn cuGreenCtxGetId(g: CUgreenCtx, out: *mut c_ulonglong) -> out |d| {
        d.green_ctx(green(g))?;
        Ok(green(g))
    }

    /// `cuGreenCtxStreamCreate`: a non-blocking stream of the green context, current or not.
    fn cuGreenCtxStreamCreate(out: *mut CUstream, g: CUgreenCtx, flags: c_uint, priority: c_int) {
        with(|d| {
            if out.is_null() || flags != crate::abi::consts::STREAM_NON_BLOCKING {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let ctx = d.green_ctx(green(g))?;
            let h = d.next_handle();
            let s = d.contexts.create_stream_in(ctx, h, flags, priority)?;
            // SAFETY: CUstream out-parameter (cuda.h), non-null.
            unsafe { put(out, handle_ptr(s)) }
        })
    }

    /// `cuStreamGetGreenCtx`: the green context of the stream's context, or null.
    fn cuStreamGetGreenCtx(s: CUstream, out: *mut CUgreenCtx) -> out |d| {
        let ctx = memcpy::issuer(&d.contexts.target(Some(s as usize as u64))?);
        let g = d.green_of(ctx).unwrap_or(0);
        Ok(handle_ptr::<CUgreenCtx_st>(g))
    }

    /// `cuGreenCtxRecordEvent`: the event is reached once the work the green context's streams
    /// hold now has run (the caller waits for it here).
    safe fn cuGreenCtxRecordEvent(g: CUgreenCtx, e: CUevent) {
        gated(|| {
            let (ev, streams) = driver::with(|d| {
                let ctx = d.green_ctx(green(g))?;
                let ev = super::graph_events::event_in(d, e)?.event;
                Ok((ev, d.contexts.streams_of(ctx, false)))
            })?;
            let n = ev.record();
            let drained = streams
                .iter()
                .map(|s| s.synchronize())
                .fold(Ok(()), CuResult::and);
            ev.reach(n);
            drained
        })
    }

    /// `cuGreenCtxWaitEvent`: the green context's later work waits for the event's latest record
    /// (the caller waits for it here, so nothing it submits afterwards can run before).
    safe fn cuGreenCtxWaitEvent(g: CUgreenCtx, e: CUevent) {
        gated(|| {
            let ev = driver::with(|d| {
                d.green_ctx(green(g))?;
                Ok(super::graph_events::event_in(d, e)?.event)
            })?;
            ev.wait_for(ev.latest());
            Ok(())
        })
    }
}
