//! The FFI floor, the C ABI edge. Every exported function is thin: it reads and checks the application's
//! pointers, calls safe logic, writes results, and returns a raw `CUresult`. A panic never
//! crosses it: it becomes `CUDA_ERROR_UNKNOWN` and a sticky failure.

pub mod dlsym;
pub mod exports;
pub mod fork;
// Written by `cuinterpose-codegen entry-points`, checked for staleness: rustfmt must leave
// them as generated.
#[rustfmt::skip]
pub mod generated;
#[rustfmt::skip]
pub mod pass_throughs;
pub mod forwarding;
pub mod pools;
pub mod proc_address;
pub mod symbols;

use crate::state::{gate, process};
use crate::sys::entries::{self, name as entry_name};
use crate::sys::error::{CuError, CuResult, to_raw};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs one hand-written entry point's logic (`index`: its [`entries::id`]), converting a
/// panic into `CUDA_ERROR_UNKNOWN`. Unless the entry point is open (`schema/entry_points.ron`),
/// it first passes the gate, so tracked calls wait out a checkpoint like every other call.
#[inline]
pub fn entry(index: usize, body: impl FnOnce() -> CuResult<()>) -> u32 {
    let pass = if entries::OPEN[index] {
        None
    } else {
        match gate::enter(index) {
            Ok(pass) => Some(pass),
            Err(e) => return e.0,
        }
    };
    let result = catch_unwind(AssertUnwindSafe(body));
    drop(pass);
    match result {
        Ok(result) => to_raw(result),
        Err(_) => {
            process::mark_failed(entry_name(index));
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
