//! The rest of the surface clients probe, answered as a driver answers for a device that lacks
//! the feature, or modelled where it is host state: the profiler, coredump settings, kernel
//! and function names, modules (fakecuda runs no device code), CUDA arrays, and the legacy
//! (v1) names of entry points whose ABI did not change.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::contexts::cuDevicePrimaryCtxRelease_v2;
use super::contexts::cuDevicePrimaryCtxReset_v2;
use super::{handle_ptr, put, run, with, with_out};
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use cudarc::driver::sys::CUdevice;
use cudarc::driver::sys::{CUDA_ARRAY_DESCRIPTOR, CUarray, CUarray_st, CUfunction, CUkernel};
use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void};
use std::sync::Mutex;

export! {
    safe fn cuProfilerStart() {
        // No profiler is attached: starting and stopping collection has nothing to do.
        with(|d| d.contexts.current().map(drop))
    }

    safe fn cuProfilerStop() {
        with(|d| d.contexts.current().map(drop))
    }
}

/// Coredump settings: `CUcoredumpSettings` value → the bytes last set (global and per-process
/// context settings kept apart, as the driver keeps them).
type Settings = [HashMap<u32, Vec<u8>>; 2];
static COREDUMP: Mutex<Option<Settings>> = Mutex::new(None);
/// `CU_COREDUMP_ENABLE_ON_EXCEPTION` .. `CU_COREDUMP_GENERATION_FLAGS`.
const COREDUMP_SETTINGS: std::ops::RangeInclusive<u32> = 1..=7;
/// `CU_COREDUMP_FILE`, `CU_COREDUMP_PIPE`: C strings; the rest are booleans (flags: an int).
const COREDUMP_STRINGS: [u32; 2] = [5, 6];

fn coredump_default(attrib: u32) -> Vec<u8> {
    match attrib {
        5 | 6 => vec![0],
        7 => vec![0; 4],
        _ => vec![0],
    }
}

/// A setting's arguments: a known attribute, value and size given, and for the per-context
/// scope (1) a current context.
fn check_coredump(scope: usize, attrib: u32, value: *mut c_void, size: *mut usize) -> CuResult<()> {
    if !COREDUMP_SETTINGS.contains(&attrib) || value.is_null() || size.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    if scope == 1 {
        driver::with(|d| d.contexts.current().map(drop))?;
    }
    Ok(())
}

/// A setting's entry point: once the arguments are checked, the setting is set from (`set`)
/// or read into the caller's `value` of `*size` bytes.
///
/// # Safety
/// `value` and `size` as cuda.h documents them for the call.
unsafe fn coredump(
    scope: usize,
    set: bool,
    attrib: u32,
    value: *mut c_void,
    size: *mut usize,
) -> RawResult {
    run(|| {
        check_coredump(scope, attrib, value, size)?;
        // SAFETY: `size` is the caller's in/out size (cuda.h), non-null.
        let size = unsafe { &mut *size };
        let mut store = COREDUMP.lock().unwrap_or_else(|p| p.into_inner());
        let settings = &mut store.get_or_insert_with(Default::default)[scope];
        if set {
            // SAFETY: per the caller.
            let bytes = unsafe { read_setting(attrib, value, *size) }?;
            settings.insert(attrib, bytes);
            return Ok(());
        }
        let bytes = settings
            .get(&attrib)
            .cloned()
            .unwrap_or_else(|| coredump_default(attrib));
        if *size < bytes.len() && COREDUMP_STRINGS.contains(&attrib) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let n = (*size).min(bytes.len());
        // SAFETY: `value` has room for `*size` bytes (cuda.h); `n` is at most that.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), n) };
        *size = n;
        Ok(())
    })
}

/// The value a set gives: a C string, or `len` bytes.
///
/// # Safety
/// `value` holds `len` bytes, or a C string of at most that length (cuda.h).
unsafe fn read_setting(attrib: u32, value: *mut c_void, len: usize) -> CuResult<Vec<u8>> {
    if COREDUMP_STRINGS.contains(&attrib) {
        // SAFETY: a NUL-terminated string of at most `len` bytes (cuda.h).
        let s = unsafe { std::ffi::CStr::from_ptr(value.cast()) };
        // The size may or may not count the NUL (the bindings pass the string length).
        if s.to_bytes().len() > len {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        return Ok(s.to_bytes_with_nul().to_vec());
    }
    if len == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `len` readable bytes at `value` (cuda.h).
    Ok(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), len) }.to_vec())
}

export! {
    fn cuCoredumpSetAttributeGlobal(a: c_uint, v: *mut c_void, s: *mut usize) {
        // SAFETY: forwarded under cuda.h's contract.
        unsafe { coredump(0, true, a, v, s) }
    }

    fn cuCoredumpGetAttributeGlobal(a: c_uint, v: *mut c_void, s: *mut usize) {
        // SAFETY: forwarded under cuda.h's contract.
        unsafe { coredump(0, false, a, v, s) }
    }

    fn cuCoredumpSetAttribute(a: c_uint, v: *mut c_void, s: *mut usize) {
        // SAFETY: forwarded under cuda.h's contract.
        unsafe { coredump(1, true, a, v, s) }
    }

    fn cuCoredumpGetAttribute(a: c_uint, v: *mut c_void, s: *mut usize) {
        // SAFETY: forwarded under cuda.h's contract.
        unsafe { coredump(1, false, a, v, s) }
    }
}

/// No module, library, kernel or function ever exists here: a null handle is an invalid
/// value, any other an invalid handle.
fn no_such_code(handle: *mut c_void, name: *mut *const c_char) -> RawResult {
    run(|| {
        if handle.is_null() || name.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Err(CuError::CUDA_ERROR_INVALID_HANDLE)
    })
}

export! {
    safe fn cuKernelGetName(name: *mut *const c_char, k: CUkernel) {
        no_such_code(k.cast(), name)
    }

    safe fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) {
        no_such_code(f.cast(), name)
    }
}

/// fakecuda runs no device code: every image is refused as one built for no GPU present.
fn refuse_image(what: &str) -> RawResult {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "fakecuda: {what}: refused with CUDA_ERROR_NO_BINARY_FOR_GPU: fakecuda runs no GPU code"
        );
    });
    with(|d| {
        d.contexts.current()?;
        Err(CuError::CUDA_ERROR_NO_BINARY_FOR_GPU)
    })
}

export! {
    safe fn cuModuleLoad(_m: *mut c_void, _f: *const c_char) {
        refuse_image("cuModuleLoad")
    }

    safe fn cuModuleLoadData(_m: *mut c_void, _i: *const c_void) {
        refuse_image("cuModuleLoadData")
    }

    safe fn cuModuleLoadDataEx(
        _m: *mut c_void,
        _i: *const c_void,
        _n: c_uint,
        _o: *mut c_void,
        _v: *mut *mut c_void,
    ) {
        refuse_image("cuModuleLoadDataEx")
    }

    safe fn cuModuleLoadFatBinary(_m: *mut c_void, _i: *const c_void) {
        refuse_image("cuModuleLoadFatBinary")
    }
}

/// The library loads: their ABIs differ only in what the second argument points at (an image
/// or a file name), before the JIT and library option arrays.
macro_rules! library_loads {
    ($($name:ident($source:ty);)*) => {
        export! {$(
            safe fn $name(
                _l: *mut c_void,
                _source: $source,
                _jo: *mut c_void,
                _jv: *mut *mut c_void,
                _jn: c_uint,
                _lo: *mut c_void,
                _lv: *mut *mut c_void,
                _ln: c_uint,
            ) {
                refuse_image(stringify!($name))
            }
        )*}
    };
}

library_loads! {
    cuLibraryLoadData(*const c_void);
    cuLibraryLoadFromFile(*const c_char);
}

/// CUDA arrays: host memory of `Width × max(Height, 1) × NumChannels` elements.
type Arrays = HashMap<u64, (CUDA_ARRAY_DESCRIPTOR, Vec<u8>)>;
static ARRAYS: Mutex<Option<Arrays>> = Mutex::new(None);

/// Bytes per element of a `CUarray_format`, `None` for an unknown one.
fn element_size(format: u32) -> Option<usize> {
    Some(match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 4, // UNSIGNED_INT32, SIGNED_INT32, FLOAT
        _ => return None,
    })
}

export! {
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) {
        with(|d| {
            d.contexts.current()?;
            if handle.is_null() || desc.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // The descriptor's format is a C enum: read it as the integer it is.
            // SAFETY: `desc` points at a CUDA_ARRAY_DESCRIPTOR (cuda.h); the format field is a u32.
            let (width, height, format, channels) = unsafe {
                let p = desc.cast::<u8>();
                (
                    (p as *const usize).read_unaligned(),
                    (p.add(8) as *const usize).read_unaligned(),
                    (p.add(16) as *const u32).read_unaligned(),
                    (p.add(20) as *const u32).read_unaligned(),
                )
            };
            let size = element_size(format).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            if width == 0 || !matches!(channels, 1 | 2 | 4) {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let bytes = width
                .checked_mul(height.max(1))
                .and_then(|n| n.checked_mul(channels as usize * size))
                .ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
            let h = d.next_handle();
            // SAFETY: validated above: every field holds a value its type allows.
            let kept = unsafe { desc.read() };
            ARRAYS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(h, (kept, vec![0; bytes]));
            // SAFETY: CUarray out-parameter (cuda.h), non-null.
            unsafe { put(handle, handle_ptr::<CUarray_st>(h)) }
        })
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CUDA_ARRAY_DESCRIPTOR, array: CUarray) -> desc |d| {
        d.contexts.current()?;
        let arrays = ARRAYS.lock().unwrap_or_else(|p| p.into_inner());
        let (kept, _) = arrays
            .as_ref()
            .and_then(|a| a.get(&(array as usize as u64)))
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(*kept)
    }

    safe fn cuArrayDestroy(array: CUarray) {
        with(|d| {
            d.contexts.current()?;
            ARRAYS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .and_then(|a| a.remove(&(array as usize as u64)))
                .map(drop)
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
        })
    }
}

// Legacy names whose ABI is the one of their successor: what cuGetProcAddress hands out for a
// caller built for an older CUDA (the CUDA runtime asks for these at 4.1 and 7.0).

export! {
    safe fn cuDevicePrimaryCtxRelease(dev: CUdevice) {
        cuDevicePrimaryCtxRelease_v2(dev)
    }

    safe fn cuDevicePrimaryCtxReset(dev: CUdevice) {
        cuDevicePrimaryCtxReset_v2(dev)
    }
}
