//! The generated pass-throughs' one helper: resolve the driver's function of the entry's exact
//! name (once), pass the gate unless the entry is open, call it.

use crate::driver::driver;
use crate::state::{gate, process};
use crate::sys::entries::{COUNT, NAMES, OPEN, name as entry_name};
use crate::sys::error::CuError;
use std::ffi::{CStr, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};

/// 0: not resolved yet; 1: the driver lacks it; else the function's address.
static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
const MISSING: usize = 1;

#[cold]
fn resolve(index: usize) -> Result<*mut c_void, CuError> {
    let d = driver()?;
    let name = NAMES[index];
    let name =
        CStr::from_bytes_with_nul(name.as_bytes()).expect("every entry of NAMES ends in NUL");
    let p = d.library.symbol(name);
    if p.is_null() {
        REAL[index].store(MISSING, Ordering::Relaxed);
        crate::log!(
            "{} is not in the driver library; the call returns CUDA_ERROR_NOT_SUPPORTED",
            entry_name(index)
        );
        return Err(CuError::NOT_SUPPORTED);
    }
    REAL[index].store(p as usize, Ordering::Release);
    Ok(p)
}

/// Runs one generated pass-through: `call` receives the driver's function.
#[inline]
pub fn forward(index: usize, call: impl FnOnce(*mut c_void) -> u32) -> u32 {
    let f = match REAL[index].load(Ordering::Acquire) {
        0 => match resolve(index) {
            Ok(f) => f,
            Err(e) => return e.0,
        },
        MISSING => return CuError::NOT_SUPPORTED.0,
        f => f as *mut c_void,
    };
    let pass = if OPEN[index] {
        None
    } else {
        match gate::enter(index) {
            Ok(pass) => Some(pass),
            Err(e) => return e.0,
        }
    };
    let result = catch_unwind(AssertUnwindSafe(|| call(f)));
    drop(pass);
    match result {
        Ok(code) => code,
        Err(_) => {
            process::mark_failed(entry_name(index));
            CuError::UNKNOWN.0
        }
    }
}

/// One exported pass-through (`shim/src/ffi/pass_throughs.rs` has one per generated entry
/// point): `pass_through!(INDEX, cuName(a0: T0, …))` exports `cuName` with that C prototype,
/// forwarding to the driver's function of the same name through [`forward`].
macro_rules! pass_through {
    ($index:literal, $name:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        #[unsafe(no_mangle)]
        #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> u32 {
            $crate::ffi::forwarding::forward($index, |f| {
                // SAFETY: `f` is the driver's own function of the entry's exact name, resolved
                // by that name from the driver library; its C prototype is the one cudarc's
                // bindings declare for the name, with each argument reduced to its ABI class
                // (as the generator wrote it here); the caller's arguments are passed on
                // unchanged, under the caller's cuda.h contract.
                unsafe {
                    std::mem::transmute::<
                        *mut std::ffi::c_void,
                        unsafe extern "C" fn($($ty),*) -> u32,
                    >(f)($($arg),*)
                }
            })
        }
    };
}
pub(crate) use pass_through;
