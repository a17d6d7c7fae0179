//! Initialisation, versions, error names and strings, `cuGetProcAddress`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::proc_address;
use super::{gated, put, run};
use crate::driver::{self};
use crate::error::{CuError, RawResult};
use std::ffi::{c_char, c_int, c_uint, c_void};

export! {
    safe fn cuInit(flags: c_uint) {
        gated(|| {
            driver::init(flags, || {
                crate::checkpoint::server::start().map_err(|e| {
                    eprintln!("fakecuda: cuInit failed: cannot start the control socket: {e}");
                    CuError::CUDA_ERROR_OPERATING_SYSTEM
                })
            })
        })
    }

    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: `version` is the caller's int out-parameter (cuda.h).
        gated(|| unsafe { put(version, 13010) })
    }

    fn cuGetErrorName(error: c_uint, p_str: *mut *const c_char) {
        run(|| {
            let name = crate::error::error_name(error);
            // SAFETY: `p_str` is the caller's string out-parameter (cuda.h).
            unsafe { put(p_str, name.map_or(std::ptr::null(), |n| n.as_ptr())) }?;
            name.map(|_| ()).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
        })
    }

    fn cuGetErrorString(error: c_uint, p_str: *mut *const c_char) {
        run(|| {
            let s = crate::error::error_string(error);
            // SAFETY: `p_str` is the caller's string out-parameter (cuda.h).
            unsafe { put(p_str, s.map_or(std::ptr::null(), |n| n.as_ptr())) }?;
            s.map(|_| ()).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
        })
    }

    fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
    ) {
        // SAFETY: forwarded under the same contract, with no status out-parameter.
        unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
        symbol_status: *mut c_uint,
    ) {
        gated(|| {
            if symbol.is_null() || pfn.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `symbol` is a NUL-terminated C string (cuda.h).
            let name = unsafe { std::ffi::CStr::from_ptr(symbol) }
                .to_str()
                .unwrap_or("");
            let (ptr, status, result) = proc_address::lookup(name, cuda_version, flags);
            // SAFETY: `pfn` is the caller's pointer out-parameter (checked non-null above).
            unsafe { put(pfn, ptr) }?;
            if !symbol_status.is_null() {
                // SAFETY: optional CUdriverProcAddressQueryResult out-parameter (a C enum: u32).
                unsafe { put(symbol_status, status) }?;
            }
            result
        })
    }
}
