//! Device resources (SMs, for green contexts): what a device, a context or a stream has, and
//! splitting an SM resource into groups, by count (`cuDevSmResourceSplitByCount`) or structured
//! (CUDA 13's `cuDevSmResourceSplit`), and the workqueue resources. fakecuda's device reports
//! 132 SMs, allocatable in groups of 2 (the partition size and co-scheduling alignment it
//! reports); a green context reports its share. Locality domains are not modelled.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{get, put, run, with};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use cudarc::driver::sys::{CUcontext, CUdevice, CUstream};
use std::ffi::{c_uint, c_void};

/// `CU_DEV_RESOURCE_TYPE_SM`, `_WORKQUEUE_CONFIG`, `_WORKQUEUE`.
pub(super) const TYPE_SM: c_uint = 1;
const TYPE_WORKQUEUE_CONFIG: c_uint = 1000;
const TYPE_WORKQUEUE: c_uint = 10000;
/// The SM count `cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)` reports.
const SM_COUNT: u32 = crate::state::extras::green::DEVICE_SMS;
/// A workqueue configuration's default concurrency limit (`CUDA_DEVICE_MAX_CONNECTIONS`'s
/// default) and sharing scope (`CU_WORKQUEUE_SCOPE_DEVICE_CTX`).
const WORKQUEUE_LIMIT: u32 = 8;
const WORKQUEUE_SCOPE: u32 = 0;
/// Minimum partition size and co-scheduling alignment.
const SM_GRANULARITY: u32 = 2;

/// `CUdevResource`: the type, padding, a 40-byte union (for SMs: count, minimum partition,
/// alignment, flags, locality domain) and the next resource.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawDevResource {
    pub(super) type_: c_uint,
    padding: [u8; 92],
    pub(super) sm: [u32; 10],
    next: *mut c_void,
}

const _: () = assert!(
    std::mem::size_of::<RawDevResource>()
        == std::mem::size_of::<cudarc::driver::sys::CUdevResource>()
);

fn sm_resource(count: u32) -> RawDevResource {
    let mut sm = [0u32; 10];
    sm[0] = count;
    sm[1] = SM_GRANULARITY;
    sm[2] = SM_GRANULARITY;
    RawDevResource {
        type_: TYPE_SM,
        padding: [0; 92],
        sm,
        next: std::ptr::null_mut(),
    }
}

/// A resource of `type_` for `device` with `sms` SMs: its SMs, its workqueue configuration
/// (the device, the concurrency limit, the sharing scope) or its workqueue (opaque).
pub(super) fn put_resource(
    out: *mut RawDevResource,
    type_: c_uint,
    device: u32,
    sms: u32,
) -> CuResult<()> {
    let resource = match type_ {
        TYPE_SM => sm_resource(sms),
        TYPE_WORKQUEUE_CONFIG | TYPE_WORKQUEUE => {
            let mut r = sm_resource(0);
            r.type_ = type_;
            r.sm = [0; 10];
            if type_ == TYPE_WORKQUEUE_CONFIG {
                r.sm[..3].copy_from_slice(&[device, WORKQUEUE_LIMIT, WORKQUEUE_SCOPE]);
            }
            r
        }
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: CUdevResource out-parameter (cuda.h).
    unsafe { put(out, resource) }
}

export! {
    fn cuDeviceGetDevResource(dev: CUdevice, out: *mut RawDevResource, type_: c_uint) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            put_resource(out, type_, dev, SM_COUNT)
        })
    }

    fn cuCtxGetDevResource(ctx: CUcontext, out: *mut RawDevResource, type_: c_uint) {
        with(|d| {
            let ctx = ctx as usize as u64;
            let device = d
                .contexts
                .device_of(ctx)
                .ok_or(CuError::CUDA_ERROR_INVALID_CONTEXT)?;
            put_resource(out, type_, device, d.ctx_sms(ctx))
        })
    }

    fn cuStreamGetDevResource(s: CUstream, out: *mut RawDevResource, type_: c_uint) {
        with(|d| {
            let ctx = memcpy::issuer(&d.contexts.target(Some(s as usize as u64))?);
            let device = d.contexts.device_of(ctx).unwrap_or(0);
            put_resource(out, type_, device, d.ctx_sms(ctx))
        })
    }

    /// Splits an SM resource into groups of `min_count` SMs (rounded up to the granularity):
    /// with `result` null, says how many groups fit; else makes at most `*groups` of them and puts
    /// the SMs left over in `remaining`.
    fn cuDevSmResourceSplitByCount(
        result: *mut RawDevResource,
        groups: *mut c_uint,
        input: *const RawDevResource,
        remaining: *mut RawDevResource,
        flags: c_uint,
        min_count: c_uint,
    ) {
        run(|| {
            if groups.is_null() || flags != 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: CUdevResource input (cuda.h).
            let input = unsafe { get(input) }?;
            if input.type_ != TYPE_SM {
                return Err(CuError::CUDA_ERROR_INVALID_RESOURCE_TYPE);
            }
            let size = min_count.max(1).div_ceil(SM_GRANULARITY) * SM_GRANULARITY;
            let fit = input.sm[0] / size;
            // SAFETY: the caller's in/out group count (cuda.h), non-null.
            let wanted = unsafe { groups.read() };
            let made = if result.is_null() || wanted == 0 {
                fit
            } else {
                wanted.min(fit)
            };
            if !result.is_null() && wanted != 0 {
                for i in 0..made as usize {
                    // SAFETY: `result` has room for `wanted` resources (cuda.h);
                    // `i < made <= wanted`.
                    unsafe { result.add(i).write(sm_resource(size)) };
                }
            }
            if !remaining.is_null() {
                let used = if result.is_null() { 0 } else { made * size };
                // SAFETY: CUdevResource out-parameter (cuda.h).
                unsafe { put(remaining, sm_resource(input.sm[0] - used)) }?;
            }
            // SAFETY: as above.
            unsafe { groups.write(made) };
            Ok(())
        })
    }
}

/// `CU_DEV_SM_RESOURCE_GROUP_PARAMS` (CUDA 13.1 to 13.3: 16 unsigned ints; 13.4 took one of the
/// reserved ones for `localityDomainId`, same size).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawGroupParams {
    sm_count: c_uint,
    coscheduled_sm_count: c_uint,
    preferred_coscheduled_sm_count: c_uint,
    flags: c_uint,
    reserved: [c_uint; 12],
}

const _: () = assert!(
    std::mem::size_of::<RawGroupParams>()
        == std::mem::size_of::<cudarc::driver::sys::CU_DEV_SM_RESOURCE_GROUP_PARAMS>()
);

/// `CU_DEV_SM_RESOURCE_GROUP_BACKFILL`: constraints are a hint (any even count will do).
const GROUP_BACKFILL: c_uint = 1;
/// `CU_DEV_RESOURCE_TYPE_INVALID`, for an empty remainder.
const TYPE_INVALID: c_uint = 0;

/// The SMs of each group of a structured split, in order: a group asks for `sm_count` SMs
/// (0: discover, it gets what is left, in whole co-scheduled units) in units of
/// `coscheduled_sm_count` (0: the resource's alignment). `with_results`: the groups become
/// resources, so none may end up empty. Returns each group's count and what remains.
fn structured_split(
    input: u32,
    params: &[RawGroupParams],
    with_results: bool,
) -> CuResult<(Vec<u32>, u32)> {
    let mut left = input;
    let mut counts = Vec::with_capacity(params.len());
    for p in params {
        if p.flags & !GROUP_BACKFILL != 0 {
            // Locality domains are not modelled.
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        let unit = match p.coscheduled_sm_count {
            0 => SM_GRANULARITY,
            c if c % SM_GRANULARITY == 0 && c <= 32 => c,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        let step = if p.flags & GROUP_BACKFILL != 0 {
            SM_GRANULARITY
        } else {
            unit
        };
        let count = match p.sm_count {
            0 => left / step * step,
            n if n % step != 0 || n < SM_GRANULARITY || n > input => {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            n => n,
        };
        if count > left || (with_results && (count == 0 || count < unit)) {
            return Err(CuError::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        left -= count;
        counts.push(count);
    }
    Ok((counts, left))
}

export! {
    /// Splits an SM resource into `groups` structured groups as `params` asks, filling in the
    /// count of each group that asked to discover it; `result` (may be null: discovery only) gets
    /// the groups, `remainder` (may be null) what is left.
    fn cuDevSmResourceSplit(
        result: *mut RawDevResource,
        groups: c_uint,
        input: *const RawDevResource,
        remainder: *mut RawDevResource,
        flags: c_uint,
        params: *mut RawGroupParams,
    ) {
        run(|| {
            if flags != 0 || groups == 0 || params.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: CUdevResource input (cuda.h).
            let input = unsafe { get(input) }?;
            if input.type_ != TYPE_SM {
                return Err(CuError::CUDA_ERROR_INVALID_RESOURCE_TYPE);
            }
            // SAFETY: `groups` parameter entries (cuda.h), non-null.
            let wanted = unsafe { std::slice::from_raw_parts_mut(params, groups as usize) };
            let (counts, left) = structured_split(input.sm[0], wanted, !result.is_null())?;
            for (i, (&count, p)) in counts.iter().zip(wanted.iter_mut()).enumerate() {
                if p.sm_count == 0 {
                    p.sm_count = count;
                }
                if !result.is_null() {
                    // SAFETY: `result` has room for `groups` resources (cuda.h); `i < groups`.
                    unsafe { result.add(i).write(sm_resource(count)) };
                }
            }
            if !remainder.is_null() {
                let mut rest = sm_resource(left);
                if left == 0 {
                    rest.type_ = TYPE_INVALID;
                }
                // SAFETY: CUdevResource out-parameter (cuda.h), non-null.
                unsafe { put(remainder, rest) }?;
            }
            Ok(())
        })
    }
}
