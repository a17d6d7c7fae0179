//! Contexts, primary and created.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, handle_ptr, put, with, with_out};
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use cudarc::driver::sys::{CUcontext, CUctx_st, CUctxCreateParams, CUdevice, CUexecAffinityParam};
use std::ffi::{c_int, c_uint};

export! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> pctx |d| {
        let dev = d.config.check_device(dev)?;
        let h = d.contexts.primary_retain(dev)?;
        Ok(handle_ptr::<CUctx_st>(h))
    }

    safe fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            d.contexts.primary_release(dev)
        })
    }

    safe fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            // cudaDeviceReset: everything the primary context owned goes with it.
            d.release_context_memory(d.contexts.primary_handle(dev))?;
            d.contexts.primary_reset(dev)
        })
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            let on = d.contexts.primary_state(dev)?;
            // SAFETY: out-parameters (cuda.h).
            unsafe {
                put(flags, 0)?;
                put(active, c_int::from(on))
            }
        })
    }
}

pub(super) fn ctx_create(pctx: *mut CUcontext, dev: CUdevice) -> CuResult<()> {
    driver::with(|d| {
        let dev = d.config.check_device(dev)?;
        if pctx.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.next_handle();
        d.contexts.create(h, dev);
        // SAFETY: CUcontext out-parameter (cuda.h), non-null.
        unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }
    })
}

/// A context's creation flags: scheduling and map-host (bits 0..=4, 0x80), which change
/// nothing in a synchronous model; anything else is `CUDA_ERROR_INVALID_VALUE`.
fn ctx_flags(flags: c_uint) -> CuResult<()> {
    if flags & !0x9f != 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

export! {
    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) {
        gated(|| {
            ctx_flags(flags)?;
            ctx_create(pctx, dev)
        })
    }

    fn cuCtxCreate_v3(
        pctx: *mut CUcontext,
        params: *mut CUexecAffinityParam,
        num_params: c_int,
        flags: c_uint,
        dev: CUdevice,
    ) {
        gated(|| {
            ctx_flags(flags)?;
            if num_params < 0 || (num_params > 0 && params.is_null()) {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            if num_params > 0 {
                // Execution affinity (SM partitioning) is not modelled.
                return Err(CuError::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
            }
            ctx_create(pctx, dev)
        })
    }

    fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        params: *mut CUctxCreateParams,
        flags: c_uint,
        dev: CUdevice,
    ) {
        gated(|| {
            ctx_flags(flags)?;
            if !params.is_null() {
                // SAFETY: optional CUctxCreateParams (cuda.h); plain pointers and ints.
                let p = unsafe { params.read() };
                if p.numExecAffinityParams != 0 || !p.cigParams.is_null() {
                    return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
                }
            }
            ctx_create(pctx, dev)
        })
    }

    safe fn cuCtxDestroy_v2(ctx: CUcontext) {
        with(|d| {
            let ctx = ctx as usize as u64;
            d.contexts.destroy(ctx)?;
            // What the context owned goes with it.
            d.release_context_memory(ctx)
        })
    }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) -> pctx |d| {
        let h = d.contexts.current_handle();
        Ok(handle_ptr::<CUctx_st>(h))
    }

    safe fn cuCtxSetCurrent(ctx: CUcontext) {
        with(|d| d.contexts.set_current(ctx as usize as u64))
    }

    safe fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        with(|d| d.contexts.push(ctx as usize as u64))
    }

    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) {
        with(|d| {
            d.contexts.current()?;
            let h = d.contexts.pop()?;
            if !pctx.is_null() {
                // SAFETY: optional CUcontext out-parameter (cuda.h).
                unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }?;
            }
            Ok(())
        })
    }
}

/// Drains every stream of context `ctx` (null: the current one), non-blocking ones too; the
/// first kept error is reported.
fn synchronize(ctx: CUcontext) -> RawResult {
    gated(|| {
        let streams = driver::with(|d| {
            let (ctx, _) = d.contexts.given_or_current(ctx as usize as u64)?;
            Ok(d.contexts.streams_of(ctx, false))
        })?;
        streams
            .iter()
            .map(|s| s.synchronize())
            .fold(Ok(()), CuResult::and)
    })
}

export! {
    safe fn cuCtxSynchronize() {
        synchronize(std::ptr::null_mut())
    }

    /// CUDA 13: the context to drain is an argument (null: the current one).
    safe fn cuCtxSynchronize_v2(ctx: CUcontext) {
        synchronize(ctx)
    }
}

/// # Safety
/// `device` is null or valid for one `CUdevice`.
unsafe fn device_of(device: *mut CUdevice, ctx: CUcontext) -> RawResult {
    // SAFETY: CUdevice out-parameter (cuda.h), per the caller.
    unsafe {
        with_out(device, |d| {
            let (_, dev) = d.contexts.given_or_current(ctx as usize as u64)?;
            Ok(dev as CUdevice)
        })
    }
}

export! {
    fn cuCtxGetDevice(device: *mut CUdevice) {
        // SAFETY: the caller's out-parameter (cuda.h).
        unsafe { device_of(device, std::ptr::null_mut()) }
    }

    /// CUDA 13: the context is an argument (null: the current one).
    fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) {
        // SAFETY: the caller's out-parameter (cuda.h).
        unsafe { device_of(device, ctx) }
    }

    safe fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) {
        with(|d| {
            if flags != 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let config = &d.config;
            d.contexts
                .enable_peer(peer as usize as u64, |a, b| config.can_access_peer(a, b))
        })
    }

    safe fn cuCtxDisablePeerAccess(peer: CUcontext) {
        with(|d| d.contexts.disable_peer(peer as usize as u64))
    }
}
