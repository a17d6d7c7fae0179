//! Classic allocations, copies and memsets, host registration.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, get, put, with, with_out};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUstream};
use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

export! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> dptr |d| {
        d.mem_alloc(bytesize as u64)
    }

    safe fn cuMemFree_v2(dptr: CUdeviceptr) {
        with(|d| d.mem_free(dptr))
    }

    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
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

    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        // SAFETY: forwarded with the default stream.
        unsafe { cuMemcpyHtoDAsync_v2(dst, src, n, std::ptr::null_mut()) }
    }

    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, stream: CUstream) {
        gated(|| {
            if src.is_null() && n > 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `src` is the caller's host buffer of `n` bytes (cuda.h).
            unsafe { memcpy::htod(dst, src.cast(), n, Some(stream as usize as u64)) }
        })
    }

    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        // SAFETY: forwarded with the default stream.
        unsafe { cuMemcpyDtoHAsync_v2(dst, src, n, std::ptr::null_mut()) }
    }

    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, stream: CUstream) {
        gated(|| {
            if dst.is_null() && n > 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `dst` is the caller's writable host buffer of `n` bytes (cuda.h).
            unsafe { memcpy::dtoh(dst.cast(), src, n, Some(stream as usize as u64)) }
        })
    }

    safe fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        gated(|| memcpy::dtod(dst, src, n, None))
    }

    safe fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        gated(|| memcpy::dtod(dst, src, n, Some(stream as usize as u64)))
    }

    safe fn cuMemcpyPeer(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        n: usize,
    ) {
        cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, std::ptr::null_mut())
    }

    safe fn cuMemcpyPeerAsync(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        n: usize,
        stream: CUstream,
    ) {
        let (dst_ctx, src_ctx) = (dst_ctx as usize as u64, src_ctx as usize as u64);
        gated(|| memcpy::peer(dst, dst_ctx, src, src_ctx, n, Some(stream as usize as u64)))
    }

    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        // SAFETY: forwarded with the legacy default stream.
        unsafe { cuMemcpyAsync(dst, src, n, std::ptr::null_mut()) }
    }

    /// Unified addressing: each side is device memory or the caller's host memory.
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: CUstream) {
        // SAFETY: host sides are the caller's buffers of `n` bytes (cuda.h).
        gated(|| unsafe { memcpy::unified(dst, src, n, Some(stream as usize as u64)) })
    }
}

fn memset(
    dst: CUdeviceptr,
    value: u32,
    width: usize,
    n: usize,
    stream: Option<CUstream>,
) -> RawResult {
    gated(|| memcpy::memset(dst, value, width, n, stream.map(|s| s as usize as u64)))
}

export! {
    safe fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) {
        memset(dst, value.into(), 1, n, None)
    }

    safe fn cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream) {
        memset(dst, value.into(), 1, n, Some(stream))
    }

    safe fn cuMemsetD16_v2(dst: CUdeviceptr, value: c_ushort, n: usize) {
        memset(dst, value.into(), 2, n, None)
    }

    safe fn cuMemsetD16Async(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream) {
        memset(dst, value.into(), 2, n, Some(stream))
    }

    safe fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) {
        memset(dst, value, 4, n, None)
    }

    safe fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream) {
        memset(dst, value, 4, n, Some(stream))
    }

    safe fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) {
        with(|d| d.host_register(p as usize as u64, bytesize as u64, flags))
    }

    safe fn cuMemHostUnregister(p: *mut c_void) {
        with(|d| d.host_unregister(p as usize as u64))
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        // SAFETY: same contract; cuMemAllocHost is cuMemHostAlloc without flags.
        unsafe { cuMemHostAlloc(pp, bytesize, 0) }
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> pp |d| {
        d.host_alloc(bytesize as u64, flags)
            .map(|p| p as usize as *mut c_void)
    }

    safe fn cuMemFreeHost(p: *mut c_void) {
        with(|d| d.host_free(p as usize as u64))
    }

    fn cuMemHostGetDevicePointer_v2(
        pdptr: *mut CUdeviceptr,
        p: *mut c_void,
        flags: c_uint,
    ) -> pdptr |d| {
        d.host_device_pointer(p as usize as u64, flags)
    }

    fn cuMemHostGetFlags(pflags: *mut c_uint, p: *mut c_void) -> pflags |d| {
        d.host_flags(p as usize as u64)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> dptr |d| {
        d.mem_alloc_managed(bytesize as u64, flags)
    }
}

/// Writes one attribute value into the caller's storage of the attribute's type.
///
/// # Safety
/// `data` is valid for a write of the attribute's C type (cuda.h).
unsafe fn put_value(data: *mut c_void, value: crate::pointer::Value) -> CuResult<()> {
    match value {
        // SAFETY: a 32-bit attribute's storage (per the caller).
        crate::pointer::Value::U32(v) => unsafe { put(data.cast::<u32>(), v) },
        // SAFETY: a 64-bit attribute's storage (per the caller).
        crate::pointer::Value::U64(v) => unsafe { put(data.cast::<u64>(), v) },
    }
}

export! {
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr) {
        with(|d| {
            let value = d.pointer_attribute(attribute, ptr)?;
            // SAFETY: `data` is storage of the attribute's type (cuda.h).
            unsafe { put_value(data, value) }
        })
    }

    /// Only `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` (an unsigned boolean) is settable.
    fn cuPointerSetAttribute(value: *const c_void, attribute: c_uint, ptr: CUdeviceptr) {
        with(|d| {
            // SAFETY: the attribute's value (cuda.h): an unsigned int for the settable one.
            let v = unsafe { get(value.cast::<c_uint>()) }?;
            d.pointer_set_attribute(attribute, v, ptr)
        })
    }

    fn cuPointerGetAttributes(
        count: c_uint,
        attributes: *const c_uint,
        data: *mut *mut c_void,
        ptr: CUdeviceptr,
    ) {
        with(|d| {
            if count == 0 || attributes.is_null() || data.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: cuda.h: `count` attributes and `count` storage pointers.
            let (wanted, slots) = unsafe {
                (
                    std::slice::from_raw_parts(attributes, count as usize),
                    std::slice::from_raw_parts(data, count as usize),
                )
            };
            let values = d.pointer_attributes(wanted, ptr)?;
            for (&slot, value) in slots.iter().zip(values) {
                // SAFETY: each slot is storage of its attribute's type (cuda.h).
                unsafe { put_value(slot, value) }?;
            }
            Ok(())
        })
    }
}
