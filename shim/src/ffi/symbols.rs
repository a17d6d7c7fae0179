//! Which names the shim wraps, and where its wrappers are.

use std::ffi::{CStr, c_void};

/// The shim's wrapper for a driver symbol name, if it answers that name (every driver entry
/// point of the generated table: hand-written tracked wrappers and gated pass-throughs).
pub fn wrapper(name: &[u8]) -> Option<*mut c_void> {
    crate::sys::entries::index(name).map(super::generated::wrapper)
}

fn dladdr(p: *const c_void) -> Option<libc::Dl_info> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    (unsafe { libc::dladdr(p, &mut info) } != 0).then_some(info)
}

fn basename(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// Whether `p` lies in a CUDA library: the driver (`libcuda.so*`, or the library named by
/// `CUINTERPOSE_DRIVER`) or the runtime (`libcudart.so*`).
pub fn is_cuda_library(p: *const c_void) -> bool {
    let Some(info) = dladdr(p) else {
        return false;
    };
    if info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = basename(file);
    if file.starts_with(b"libcuda.so") || file.starts_with(b"libcudart.so") {
        return true;
    }
    let driver = crate::sys::settings::driver_library();
    driver != crate::sys::settings::DEFAULT_DRIVER && basename(driver) == file
}

/// The wrapper to hand out in place of `found`, a pointer a driver or runtime lookup
/// returned: the wrapper of the exact driver symbol at that address, or `found` itself.
pub fn substitute(found: *mut c_void) -> *mut c_void {
    if found.is_null() || !is_cuda_library(found) {
        return found;
    }
    let Some(info) = dladdr(found) else {
        return found;
    };
    if info.dli_sname.is_null() || info.dli_saddr != found {
        return found;
    }
    // SAFETY: dladdr's symbol name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_sname) };
    wrapper(name.to_bytes()).unwrap_or(found)
}
