//! Classic allocations, copies and memsets, host registration.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> RawResult {
    with(|d| {
        if dptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.mem_alloc(bytesize as u64)?;
        // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
        unsafe { put(dptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> RawResult {
    with(|d| d.mem_free(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> RawResult {
    with(|d| {
        let (base, size) = d.address_range(dptr)?;
        // SAFETY: both out-parameters are optional (cuda.h); non-null ones are writable.
        unsafe {
            if !pbase.is_null() {
                put(pbase, base)?;
            }
            if !psize.is_null() {
                put(psize, size as usize)?;
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> RawResult {
    // SAFETY: forwarded with the default stream.
    unsafe { cuMemcpyHtoDAsync_v2(dst, src, n, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if src.is_null() && n > 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `src` is the caller's host buffer of `n` bytes (cuda.h).
        unsafe { memcpy::htod(dst, src.cast(), n, Some(stream as usize as u64)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> RawResult {
    // SAFETY: forwarded with the default stream.
    unsafe { cuMemcpyDtoHAsync_v2(dst, src, n, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if dst.is_null() && n > 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `dst` is the caller's writable host buffer of `n` bytes (cuda.h).
        unsafe { memcpy::dtoh(dst.cast(), src, n, Some(stream as usize as u64)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> RawResult {
    gated(|| memcpy::dtod(dst, src, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| memcpy::dtod(dst, src, n, Some(stream as usize as u64)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> RawResult {
    // Unified addressing: with both sides device memory this is a device-to-device copy.
    gated(|| memcpy::dtod(dst, src, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> RawResult {
    gated(|| memcpy::memset_d8(dst, value, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: c_uchar,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| memcpy::memset_d8(dst, value, n, Some(stream as usize as u64)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytesize: usize,
    flags: c_uint,
) -> RawResult {
    with(|d| d.host_register(p as usize as u64, bytesize as u64, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> RawResult {
    with(|d| d.host_unregister(p as usize as u64))
}
