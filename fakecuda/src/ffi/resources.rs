//! Device resources (SMs, for green contexts): what a device, a context or a stream has, and
//! splitting an SM resource into groups. fakecuda's device reports 132 SMs, allocatable in
//! groups of 2 (the partition size and co-scheduling alignment of current data-center GPUs).
//! Green contexts themselves are not modelled.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;

/// `CU_DEV_RESOURCE_TYPE_SM`.
const TYPE_SM: c_uint = 1;
/// The SM count `cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)` reports.
const SM_COUNT: u32 = 132;
/// Minimum partition size and co-scheduling alignment.
const SM_GRANULARITY: u32 = 2;

/// `CUdevResource`: the type, padding, a 40-byte union (for SMs: count, minimum partition,
/// alignment, flags, locality domain) and the next resource.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawDevResource {
    type_: c_uint,
    padding: [u8; 92],
    sm: [u32; 10],
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

fn put_sm(out: *mut RawDevResource, type_: c_uint) -> CuResult<()> {
    if type_ != TYPE_SM {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: CUdevResource out-parameter (cuda.h).
    unsafe { put(out, sm_resource(SM_COUNT)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDevResource(
    dev: CUdevice,
    out: *mut RawDevResource,
    type_: c_uint,
) -> RawResult {
    with(|d| {
        d.config.check_device(dev)?;
        put_sm(out, type_)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevResource(
    ctx: CUcontext,
    out: *mut RawDevResource,
    type_: c_uint,
) -> RawResult {
    with(|d| {
        d.contexts.check_live(ctx as usize as u64)?;
        put_sm(out, type_)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetDevResource(
    s: CUstream,
    out: *mut RawDevResource,
    type_: c_uint,
) -> RawResult {
    with(|d| {
        d.contexts.target(Some(s as usize as u64))?;
        put_sm(out, type_)
    })
}

/// Splits an SM resource into groups of `min_count` SMs (rounded up to the granularity):
/// with `result` null, says how many groups fit; else makes at most `*groups` of them and puts
/// the SMs left over in `remaining`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevSmResourceSplitByCount(
    result: *mut RawDevResource,
    groups: *mut c_uint,
    input: *const RawDevResource,
    remaining: *mut RawDevResource,
    flags: c_uint,
    min_count: c_uint,
) -> RawResult {
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
                // SAFETY: `result` has room for `wanted` resources (cuda.h); `i < made <= wanted`.
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
