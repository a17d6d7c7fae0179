//! The C ABI edge: every exported CUDA entry point. Each one is thin: it passes the
//! checkpoint gate, catches panics, reads its pointer arguments (null → invalid value) and
//! calls safe logic; results leave as raw `CUresult` integers.

#![allow(non_snake_case, clippy::missing_safety_doc)]
// The safety contract of every entry point is the one cuda.h documents for it.

use crate::driver::{self, DriverState};
use crate::error::{CuError, CuResult, RawResult, to_raw};
use crate::state::gate;
use std::panic::{AssertUnwindSafe, catch_unwind};

fn run(f: impl FnOnce() -> CuResult<()>) -> RawResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => to_raw(r),
        // The panic hook already printed the message; the caller gets an error code.
        Err(_) => CuError::CUDA_ERROR_UNKNOWN.raw(),
    }
}

/// Entry points the application calls: they wait while the process is locked.
fn gated(f: impl FnOnce() -> CuResult<()>) -> RawResult {
    if driver::forked_child() {
        return CuError::CUDA_ERROR_NOT_INITIALIZED.raw();
    }
    let _pass = gate::enter();
    run(f)
}

fn with(f: impl FnOnce(&mut DriverState) -> CuResult<()>) -> RawResult {
    gated(|| driver::with(f))
}

/// `f`'s value written to the out-parameter `out`; a null `out` is `INVALID_VALUE` before
/// `f` runs, so a refused call changes nothing.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, f: impl FnOnce() -> CuResult<T>) -> CuResult<()> {
    if out.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let value = f()?;
    // SAFETY: non-null, and valid for writes per the caller.
    unsafe { put(out, value) }
}

/// [`write_out`] of a value computed on the locked driver.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn with_out<T>(out: *mut T, f: impl FnOnce(&mut DriverState) -> CuResult<T>) -> RawResult {
    // SAFETY: per the caller.
    with(|d| unsafe { write_out(out, || f(d)) })
}

/// Writes an output argument.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> CuResult<()> {
    if p.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, per the caller, valid for writes.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads an input argument.
///
/// # Safety
/// `p` is null or valid for a read of `T`, and its bytes are a valid `T`.
unsafe fn get<T: Copy>(p: *const T) -> CuResult<T> {
    if p.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, per the caller, valid for reads.
    Ok(unsafe { p.read() })
}

/// A granularity query: `query` checks the properties at `prop` (read as plain integers) and
/// answers; the answer is written to `out`.
///
/// # Safety
/// `prop` is null or points at a readable `P`; `out` is null or valid for a write of a size_t.
unsafe fn granularity_of<P: Copy>(
    out: *mut usize,
    prop: *const P,
    query: impl FnOnce(&DriverState, &P) -> CuResult<u64>,
) -> RawResult {
    with(|d| {
        // SAFETY: per the caller.
        let p = unsafe { get(prop) }?;
        let g = query(d, &p)?;
        // SAFETY: per the caller.
        unsafe { put(out, g as usize) }
    })
}

fn handle_ptr<T>(h: u64) -> *mut T {
    std::ptr::without_provenance_mut(h as usize)
}

/// Declares exported entry points: each `fn NAME(PARAMS) ...` becomes `#[unsafe(no_mangle)]
/// pub unsafe extern "C" fn NAME(PARAMS) -> RawResult`, its doc comments and attributes kept,
/// so the symbol and its C signature are exactly what is written.
///
/// - `fn NAME(PARAMS) -> OUT |d| { BODY }`: BODY's value, computed on the locked driver, is
///   written to the out-parameter OUT through [`with_out`] (null OUT: `INVALID_VALUE`, BODY
///   does not run).
/// - `fn NAME(PARAMS) { BODY }`: the body as written.
/// - `for (PARAMS) { fn A { BODY } fn B { BODY } }`: several symbols of one ABI, each its own
///   behaviour.
/// - `safe fn NAME(PARAMS) { BODY }`: a safe `pub extern "C" fn`, for one that dereferences
///   no pointer it is given.
///
/// Safety: the caller of every entry point keeps cuda.h's contract for it; for an OUT that
/// contract is that it is null or valid for a write of its type, what `with_out` requires.
macro_rules! export {
    () => {};
    (for $params:tt { $($(#[$meta:meta])* fn $name:ident $body:block)* } $($rest:tt)*) => {
        export! { $($(#[$meta])* fn $name $params $body)* }
        export! { $($rest)* }
    };
    (
        $(#[$meta:meta])* fn $name:ident $params:tt -> $out:ident |$d:tt| $body:block
        $($rest:tt)*
    ) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name $params -> RawResult {
            // SAFETY: `$out` is null or valid for a write of its type: cuda.h's contract for
            // this out-parameter, which the caller keeps.
            unsafe { with_out($out, |$d| $body) }
        }
        export! { $($rest)* }
    };
    ($(#[$meta:meta])* fn $name:ident $params:tt $body:block $($rest:tt)*) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name $params -> RawResult $body
        export! { $($rest)* }
    };
    ($(#[$meta:meta])* safe fn $name:ident $params:tt $body:block $($rest:tt)*) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub extern "C" fn $name $params -> RawResult $body
        export! { $($rest)* }
    };
}

mod contexts;
mod devices;
mod extras;
mod graph_events;
mod graph_memory;
mod graph_nodes;
mod graph_params;
mod graph_queries;
mod graphs;
mod green_contexts;
mod init;
mod managed;
mod memory;
mod multicast_objects;
mod native_checkpoint;
mod native_ipc;
mod pools;
pub mod proc_address;
mod resources;
mod streams;
mod user_objects;
mod virtual_memory;
