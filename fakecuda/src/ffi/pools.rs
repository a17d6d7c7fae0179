//! Stream-ordered memory pools (see [`crate::pool`]).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, get, handle_ptr, put, with, with_out};
use crate::abi::{RawAccessDesc, RawLocation};
use crate::driver::{self, DriverState};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use cudarc::driver::sys::{CUdevice, CUdeviceptr, CUstream};
use cudarc::driver::sys::{CUmemPoolHandle_st, CUmemoryPool};
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};

fn pool_of(p: CUmemoryPool) -> u64 {
    p as usize as u64
}

/// Reads a `CUmemLocation` (two plain integers).
///
/// # Safety
/// `p` is null or points at a `CUmemLocation` (cuda.h).
unsafe fn location(p: *const RawLocation) -> CuResult<(u32, i32)> {
    // SAFETY: forwarded contract.
    let l = unsafe { get(p) }?;
    Ok((l.type_, l.id))
}

export! {
    fn cuDeviceGetDefaultMemPool(out: *mut CUmemoryPool, dev: CUdevice) -> out |d| {
        let dev = d.config.check_device(dev)?;
        let h = d.pool_default(crate::state::pool::Place::Device(dev));
        Ok(handle_ptr::<CUmemPoolHandle_st>(h))
    }

    fn cuDeviceGetMemPool(out: *mut CUmemoryPool, dev: CUdevice) -> out |d| {
        let dev = d.config.check_device(dev)?;
        let h = d.pool_current(crate::state::pool::Place::Device(dev));
        Ok(handle_ptr::<CUmemPoolHandle_st>(h))
    }

    safe fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            d.pool_set_current(dev, pool_of(pool))
        })
    }

    /// `cuMemGetMemPool` (CUDA 13): the current pool of a location for pinned or managed memory.
    fn cuMemGetMemPool(out: *mut CUmemoryPool, loc: *mut RawLocation, alloc_type: c_uint) {
        with(|d| {
            // SAFETY: CUmemLocation input (cuda.h).
            let (kind, id) = unsafe { location(loc) }?;
            let place = d.pool_place(alloc_type, (kind, id))?;
            let h = d.pool_current(place);
            // SAFETY: CUmemoryPool out-parameter (cuda.h).
            unsafe { put(out, handle_ptr::<CUmemPoolHandle_st>(h)) }
        })
    }

    fn cuMemPoolCreate(out: *mut CUmemoryPool, props: *const c_void) {
        with(|d| {
            if out.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `props` points at a CUmemPoolProps (cuda.h), read as plain integers.
            let p = unsafe { get(props.cast::<cuinterpose_abi::RawPoolProps>()) }?;
            let h = d.pool_create(
                p.alloc_type,
                p.handle_types,
                (p.location.type_, p.location.id),
                p.max_size as u64,
            )?;
            // SAFETY: CUmemoryPool out-parameter (cuda.h), non-null.
            unsafe { put(out, handle_ptr::<CUmemPoolHandle_st>(h)) }
        })
    }

    safe fn cuMemPoolDestroy(pool: CUmemoryPool) {
        with(|d| d.pool_destroy(pool_of(pool)))
    }
}

/// The attributes that are 32-bit ints (the reuse flags); the rest are 64-bit (cuda.h).
fn narrow(attr: u32) -> bool {
    (crate::pool::ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
        ..=crate::pool::ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)
        .contains(&attr)
}

export! {
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: c_uint, value: *mut c_void) {
        with(|d| {
            let v = d.pool_get_attribute(pool_of(pool), attr)?;
            if narrow(attr) {
                // SAFETY: an int out-parameter for this attribute (cuda.h).
                unsafe { put(value.cast::<i32>(), v as i32) }
            } else {
                // SAFETY: a cuuint64_t out-parameter for this attribute (cuda.h).
                unsafe { put(value.cast::<u64>(), v) }
            }
        })
    }

    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: c_uint, value: *mut c_void) {
        with(|d| {
            let v = if narrow(attr) {
                // SAFETY: an int input for this attribute (cuda.h).
                u64::from(unsafe { get(value.cast::<i32>().cast_const()) }? != 0)
            } else {
                // SAFETY: a cuuint64_t input for this attribute (cuda.h).
                unsafe { get(value.cast::<u64>().cast_const()) }?
            };
            d.pool_set_attribute(pool_of(pool), attr, v)
        })
    }

    fn cuMemPoolSetAccess(pool: CUmemoryPool, descs: *const RawAccessDesc, count: usize) {
        with(|d| {
            if descs.is_null() && count > 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let list = if count == 0 {
                &[][..]
            } else {
                // SAFETY: `count` CUmemAccessDesc (cuda.h), plain integers.
                unsafe { std::slice::from_raw_parts(descs, count) }
            };
            let grants: Vec<(u32, i32, u32)> = list
                .iter()
                .map(|g| (g.location.type_, g.location.id, g.flags))
                .collect();
            d.pool_set_access(pool_of(pool), &grants)
        })
    }

    fn cuMemPoolGetAccess(flags: *mut c_uint, pool: CUmemoryPool, loc: *mut RawLocation) {
        with(|d| {
            // SAFETY: CUmemLocation input (cuda.h).
            let l = unsafe { location(loc) }?;
            let f = d.pool_get_access(pool_of(pool), l)?;
            // SAFETY: CUmemAccess_flags out-parameter (a C enum: u32).
            unsafe { put(flags, f) }
        })
    }

    safe fn cuMemPoolTrimTo(pool: CUmemoryPool, _keep: usize) {
        // Freed memory is returned at once: nothing is kept to trim.
        with(|d| {
            d.pool_get_attribute(pool_of(pool), crate::pool::ATTR_USED_MEM_CURRENT)
                .map(drop)
        })
    }
}

/// A stream-ordered allocation (`alloc` gets the stream's context) written to `dptr`.
///
/// # Safety
/// `dptr` is null or valid for writing one `CUdeviceptr`.
unsafe fn alloc_for(
    dptr: *mut CUdeviceptr,
    stream: CUstream,
    alloc: impl FnOnce(&mut DriverState, u64) -> CuResult<u64>,
) -> RawResult {
    gated(|| {
        if dptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = memcpy::issuer(&memcpy::target(Some(stream as usize as u64))?);
        let p = driver::with(|d| alloc(d, ctx))?;
        // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
        unsafe { put(dptr, p) }
    })
}

export! {
    fn cuMemAllocFromPoolAsync(
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: CUmemoryPool,
        stream: CUstream,
    ) {
        // SAFETY: the caller's out-parameter (cuda.h).
        unsafe {
            alloc_for(dptr, stream, |d, _| {
                d.pool_alloc(pool_of(pool), bytesize as u64)
            })
        }
    }

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) {
        // SAFETY: the caller's out-parameter (cuda.h).
        unsafe {
            alloc_for(dptr, stream, |d, ctx| {
                let device = d
                    .contexts
                    .device_of(ctx)
                    .ok_or(CuError::CUDA_ERROR_INVALID_CONTEXT)?;
                let pool = d.pool_current(crate::state::pool::Place::Device(device));
                d.pool_alloc(pool, bytesize as u64)
            })
        }
    }

    safe fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) {
        gated(|| {
            driver::with(|d| d.pool_check_free(dptr))?;
            // The memory goes back when the stream reaches the free.
            memcpy::host_work(Some(stream as usize as u64), move || {
                if let Err(e) = driver::with(|d| d.pool_free(dptr)) {
                    eprintln!("fakecuda: cuMemFreeAsync of {dptr:#x} failed when it ran: {e}");
                }
            })
        })
    }

    fn cuMemPoolExportToShareableHandle(
        out: *mut c_void,
        pool: CUmemoryPool,
        handle_type: c_uint,
        flags: u64,
    ) {
        let fd = |d: &mut DriverState| d.pool_export(pool_of(pool), handle_type, flags);
        // SAFETY: for POSIX FDs `out` points at an int (cuda.h); the caller owns the FD.
        unsafe { with_out(out.cast::<c_int>(), |d| fd(d).map(IntoRawFd::into_raw_fd)) }
    }

    fn cuMemPoolImportFromShareableHandle(
        out: *mut CUmemoryPool,
        handle: *mut c_void,
        handle_type: c_uint,
        flags: u64,
    ) {
        with(|d| {
            if out.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let number = handle as usize as c_int;
            // SAFETY: F_GETFD only asks whether the number is an open descriptor.
            if number < 0 || unsafe { libc::fcntl(number, libc::F_GETFD) } < 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: open (checked above); the caller lends it for the call (cuda.h).
            let fd = unsafe { BorrowedFd::borrow_raw(number) };
            let h = d.pool_import(fd, handle_type, flags)?;
            // SAFETY: CUmemoryPool out-parameter (cuda.h), non-null.
            unsafe { put(out, handle_ptr::<CUmemPoolHandle_st>(h)) }
        })
    }

    fn cuMemPoolExportPointer(
        data: *mut [u8; crate::pool::POINTER_BYTES],
        ptr: CUdeviceptr,
    ) -> data |d| {
        d.pool_export_pointer(ptr)
    }

    fn cuMemPoolImportPointer(
        out: *mut CUdeviceptr,
        pool: CUmemoryPool,
        data: *const [u8; crate::pool::POINTER_BYTES],
    ) {
        gated(|| {
            if out.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: CUmemPoolPtrExportData input (64 bytes, cuda.h).
            let bytes = unsafe { get(data) }?;
            driver::with(|d| d.contexts.current().map(drop))?;
            let p = crate::pool::import_pointer(pool_of(pool), &bytes)?;
            // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
            unsafe { put(out, p) }
        })
    }
}
