//! Virtual memory management: reservations, physical allocations, mappings, access, export and
//! import.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{get, granularity_of, put, with, with_out};
use crate::abi::{RawAccessDesc, RawAllocProp, RawLocation};
use crate::driver::DriverState;
use crate::error::{CuError, RawResult};
use cudarc::driver::sys::{CUdeviceptr, CUmemGenericAllocationHandle};
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};

export! {
    fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: c_ulonglong,
    ) -> ptr |d| {
        d.address_reserve(size as u64, alignment as u64, addr, flags)
    }

    safe fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        with(|d| d.address_free(ptr, size as u64))
    }

    fn cuMemCreate(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const RawAllocProp,
        flags: c_ulonglong,
    ) {
        with(|d| {
            // SAFETY: CUmemAllocationProp input (cuda.h), read as plain integers.
            let prop = unsafe { get(prop) }?;
            if handle.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let h = d.mem_create(size as u64, &prop, flags)?;
            // SAFETY: handle out-parameter (cuda.h), non-null.
            unsafe { put(handle, h) }
        })
    }

    safe fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        with(|d| d.mem_release(handle))
    }

    safe fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: CUmemGenericAllocationHandle,
        flags: c_ulonglong,
    ) {
        with(|d| d.mem_map(ptr, size as u64, offset as u64, handle, flags))
    }

    safe fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        with(|d| d.mem_unmap(ptr, size as u64))
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const RawAccessDesc, count: usize) {
        with(|d| {
            if desc.is_null() || count == 0 || count > 4096 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `desc` points at `count` CUmemAccessDesc (cuda.h), read as plain integers.
            let descs = unsafe { std::slice::from_raw_parts(desc, count) }.to_vec();
            d.set_access(ptr, size as u64, &descs)
        })
    }

    fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const RawLocation, ptr: CUdeviceptr) {
        with(|d| {
            // SAFETY: CUmemLocation input (cuda.h), read as plain integers.
            let loc = unsafe { get(location) }?;
            let f = d.get_access(&loc, ptr)?;
            // SAFETY: flags out-parameter (cuda.h).
            unsafe { put(flags, u64::from(f)) }
        })
    }

    fn cuMemRetainAllocationHandle(
        handle: *mut CUmemGenericAllocationHandle,
        addr: *mut c_void,
    ) -> handle |d| {
        d.retain_handle(addr as usize as u64)
    }

    fn cuMemGetAllocationPropertiesFromHandle(
        prop: *mut RawAllocProp,
        handle: CUmemGenericAllocationHandle,
    ) -> prop |d| {
        d.alloc_props(handle)
    }

    fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const RawAllocProp,
        option: c_uint,
    ) {
        // SAFETY: cuda.h's contract for the properties and the out-parameter.
        unsafe { granularity_of(granularity, prop, |d, p| d.allocation_granularity(p, option)) }
    }

    fn cuMemExportToShareableHandle(
        shareable: *mut c_void,
        handle: CUmemGenericAllocationHandle,
        handle_type: c_uint,
        flags: c_ulonglong,
    ) {
        let fd = |d: &mut DriverState| d.export(handle, handle_type, flags);
        // SAFETY: for POSIX FDs `shareable` points at an int (cuda.h); the caller owns the FD.
        unsafe { with_out(shareable.cast::<c_int>(), |d| fd(d).map(IntoRawFd::into_raw_fd)) }
    }

    fn cuMemImportFromShareableHandle(
        handle: *mut CUmemGenericAllocationHandle,
        os_handle: *mut c_void,
        handle_type: c_uint,
    ) {
        with(|d| {
            if handle.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            if handle_type != crate::abi::consts::HANDLE_TYPE_POSIX_FD {
                // Only POSIX FDs travel as numbers; fabric (no IMEX) and Win32 handles are not
                // supported here, anything else is no handle type.
                return d.import_type_check(handle_type);
            }
            // For POSIX FDs the "pointer" carries the descriptor number itself (cuda.h).
            let raw = os_handle as usize;
            let fd_num = i32::try_from(raw).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
            if nix::fcntl::fcntl(
                // SAFETY: only used to probe validity; F_GETFD on any number is harmless.
                unsafe { BorrowedFd::borrow_raw(fd_num) },
                nix::fcntl::FcntlArg::F_GETFD,
            )
            .is_err()
            {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: the descriptor is open (checked above) and stays open for this call; the
            // caller keeps ownership.
            let fd = unsafe { BorrowedFd::borrow_raw(fd_num) };
            let h = d.import(fd, handle_type)?;
            // SAFETY: handle out-parameter (cuda.h), non-null.
            unsafe { put(handle, h) }
        })
    }
}
