//! `cuGetProcAddress*` and the runtime's `cudaGetDriverEntryPoint*`: the real lookup runs
//! first (so the driver's choice of version and its errors stand), then a wrapped symbol is
//! replaced by the shim's wrapper for the exact function the driver chose.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::dlsym::real_dlsym;
use super::{entry, symbols};
use crate::driver::call;
use crate::driver::driver;
use crate::sys::entries::id;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// # Safety
/// `pfn` is null or valid for reading and writing one pointer.
unsafe fn replace(pfn: *mut *mut c_void) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: non-null and valid per the caller.
    unsafe { *pfn = symbols::substitute(*pfn) };
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> u32 {
    entry(id::cuGetProcAddress, || {
        call!(
            driver()?,
            cuGetProcAddress(symbol, pfn, cuda_version, flags)
        )?;
        // SAFETY: the driver just wrote the result through `pfn`.
        unsafe { replace(pfn) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> u32 {
    entry(id::cuGetProcAddress_v2, || {
        call!(
            driver()?,
            cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status)
        )?;
        // SAFETY: the driver just wrote the result through `pfn`.
        unsafe { replace(pfn) };
        Ok(())
    })
}

/// `cudaErrorInitializationError`: what the runtime says when it cannot reach the driver.
const CUDA_ERROR_INITIALIZATION: c_int = 3;

/// The runtime's own function `name`: the next definition after the shim, or one in an
/// already-loaded `libcudart`.
fn runtime_function(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NEXT lookup of a NUL-terminated name.
    let found = unsafe { real_dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !found.is_null() {
        return found;
    }
    for library in [c"libcudart.so.13", c"libcudart.so.12", c"libcudart.so"] {
        // SAFETY: RTLD_NOLOAD only finds an already-loaded library; it loads nothing.
        let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let found = unsafe { real_dlsym(handle, name.as_ptr()) };
        // SAFETY: drops the reference NOLOAD took; the library stays loaded by its owner.
        unsafe { libc::dlclose(handle) };
        if !found.is_null() {
            return found;
        }
    }
    std::ptr::null_mut()
}

type EntryPoint = unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> c_int;
type EntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> c_int;

fn guarded(name: &'static str, body: impl FnOnce() -> c_int) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(_) => {
            crate::state::process::mark_failed(name);
            CUDA_ERROR_INITIALIZATION
        }
    }
}

/// Runs the runtime's own function `name` (its address given to `forward`, which calls it with
/// the caller's arguments), then replaces a wrapped result, with panics caught.
///
/// # Safety
/// `pfn` is null or valid for reading and writing one pointer.
unsafe fn through_runtime(
    name: &'static CStr,
    pfn: *mut *mut c_void,
    forward: impl FnOnce(*mut c_void) -> c_int,
) -> c_int {
    let shown = name.to_str().unwrap_or_default();
    guarded(shown, || {
        let real = runtime_function(name);
        if real.is_null() {
            crate::log!("{shown}: no CUDA runtime library is loaded");
            return CUDA_ERROR_INITIALIZATION;
        }
        let code = forward(real);
        if code == 0 {
            // SAFETY: the runtime just wrote the result through `pfn`, valid per the caller.
            unsafe { replace(pfn) };
        }
        code
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let forward = |real| {
        // SAFETY: the runtime's function of this name has this prototype (CUDA ≥ 12).
        let real = unsafe { std::mem::transmute::<*mut c_void, EntryPoint>(real) };
        // SAFETY: the caller's arguments, forwarded.
        unsafe { real(symbol, pfn, flags, status) }
    };
    // SAFETY: `pfn` is the caller's output, null or one writable pointer (its contract).
    unsafe { through_runtime(c"cudaGetDriverEntryPoint", pfn, forward) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_uint,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let forward = |real| {
        // SAFETY: the runtime's function of this name has this prototype (CUDA ≥ 12.5).
        let real = unsafe { std::mem::transmute::<*mut c_void, EntryPointByVersion>(real) };
        // SAFETY: the caller's arguments, forwarded.
        unsafe { real(symbol, pfn, cuda_version, flags, status) }
    };
    // SAFETY: `pfn` is the caller's output, null or one writable pointer (its contract).
    unsafe { through_runtime(c"cudaGetDriverEntryPointByVersion", pfn, forward) }
}
