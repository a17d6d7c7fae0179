//! The C ABI edge. Every exported function is thin: it reads and checks the application's
//! pointers, calls safe logic, writes results, and returns a raw `CUresult`. A panic never
//! crosses it: it becomes `CUDA_ERROR_UNKNOWN` and a sticky failure.

pub mod dlsym;
pub mod exports;
pub mod proc_address;
pub mod symbols;

use crate::error::{CuError, CuResult, to_raw};
use crate::process;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs one entry point's logic, converting a panic into `CUDA_ERROR_UNKNOWN`.
#[inline]
pub fn entry(name: &'static str, body: impl FnOnce() -> CuResult<()>) -> u32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => to_raw(result),
        Err(_) => {
            process::mark_failed(name);
            CuError::UNKNOWN.0
        }
    }
}

/// Reads an input struct.
///
/// # Safety
/// `p` is null or points at a readable `T` (any bit pattern of `T`'s plain-integer fields is
/// valid).
pub unsafe fn read<T: Copy>(p: *const T) -> CuResult<T> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: non-null and readable per the caller; `read_unaligned` tolerates any alignment.
    Ok(unsafe { p.read_unaligned() })
}

/// Writes an output value.
///
/// # Safety
/// `p` is null or points at writable memory for a `T`.
pub unsafe fn write<T>(p: *mut T, value: T) -> CuResult<()> {
    if p.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: non-null and writable per the caller.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` on a null output pointer, before any work is done.
pub fn non_null<T>(p: *mut T) -> CuResult<()> {
    if p.is_null() {
        Err(CuError::INVALID_VALUE)
    } else {
        Ok(())
    }
}
