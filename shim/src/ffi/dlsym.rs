//! The `dlsym` hook.
//!
//! `dlsym(handle, "cuMemCreate")` on a handle from `dlopen("libcuda.so.1")` searches only that
//! library, so a plain `LD_PRELOAD` never sees such calls. The hook substitutes the shim's
//! wrapper when the real lookup finds a wrapped driver symbol, and otherwise leaves the call
//! to glibc *by jumping*, not calling: glibc resolves `RTLD_NEXT` relative to its caller's
//! return address, which a jump keeps and a call would replace with the shim's.

use crate::driver::os::{REAL_DLSYM, glibc_dlsym};
use crate::ffi::symbols;
use std::ffi::{CStr, c_char, c_void};

/// glibc's `dlsym`, for the shim's own lookups.
///
/// # Safety
/// As for `dlsym(3)`: `handle` is a handle or pseudo-handle and `name` a C string.
pub unsafe fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: forwarded contract.
    unsafe { glibc_dlsym()(handle, name) }
}

/// Decides whether the hook answers with a wrapper. Returns null to let glibc answer (the
/// trampoline then jumps to it with the original arguments). Also makes sure `REAL_DLSYM` is
/// set before the trampoline reads it.
extern "C" fn decide(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let real = glibc_dlsym();
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    // Only names the shim wraps are looked at further; everything else goes straight to
    // glibc (this is also what keeps std's own weak-symbol lookups out of any shim logic).
    let Some(wrapper) = symbols::wrapper(name.to_bytes()) else {
        return std::ptr::null_mut();
    };
    // SAFETY: same arguments the application passed.
    let found = unsafe { real(handle, name.as_ptr()) };
    if found.is_null() {
        // Not there: glibc answers again, which also sets dlerror for the caller.
        return std::ptr::null_mut();
    }
    if found == wrapper || symbols::is_cuda_library(found) {
        wrapper
    } else {
        std::ptr::null_mut()
    }
}

/// The exported `dlsym`: save the arguments, ask [`decide`], return its wrapper or restore
/// the arguments and tail-jump to glibc's `dlsym`.
///
/// # Safety
/// As for `dlsym(3)`: `handle` is a handle or pseudo-handle and `name` a C string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // At entry rsp ≡ 8 (mod 16); two pushes and 8 bytes keep the call below 16-aligned.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "ret",
        "2:",
        "jmp qword ptr [rip + {real}]",
        decide = sym decide,
        real = sym REAL_DLSYM,
    )
}
