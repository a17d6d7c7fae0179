//! The memory-pool entry points: the pool adapter's (`crate::calls::pool`) for IPC pools, the
//! driver's for every other pool. Every call that takes a pool handle or may free pool memory
//! is here, so an adapter handle never reaches the driver.

#![allow(non_snake_case, clippy::missing_safety_doc)]
// The safety contract of every function here is the one cuda.h documents for it.

use super::{entry, non_null, read, write};
use crate::calls::pool;
use crate::driver::call;
use crate::driver::driver;
use crate::state::pools::is_adapter_pool;
use crate::sys::abi::{RawAccessDesc, RawLocation, RawPoolProps, consts};
use crate::sys::entries::id;
use crate::sys::error::{CuError, CuResult};
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};

/// The pointer-sized pool handle as the shim keeps it.
fn handle(pool: usize) -> u64 {
    pool as u64
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(out: *mut usize, props: *const RawPoolProps) -> u32 {
    entry(id::cuMemPoolCreate, || {
        non_null(out)?;
        // SAFETY: `props` is null (refused by `read`) or a CUmemPoolProps (cuda.h).
        let p = unsafe { read(props) }?;
        match pool::create(&p)? {
            // SAFETY: the caller's output, checked non-null.
            Some(h) => unsafe { write(out, h as usize) },
            // The application's arguments, forwarded under their cuda.h contract.
            None => call!(driver()?, cuMemPoolCreate(out, props)),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(p: usize) -> u32 {
    entry(id::cuMemPoolDestroy, || {
        if is_adapter_pool(handle(p)) {
            return pool::destroy(handle(p));
        }
        call!(driver()?, cuMemPoolDestroy(p))?;
        crate::state::process::forget_pool(p);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(p: usize, attr: c_uint, value: *mut c_void) -> u32 {
    entry(id::cuMemPoolSetAttribute, || {
        if !is_adapter_pool(handle(p)) {
            // The application's arguments, forwarded under their cuda.h contract.
            return call!(driver()?, cuMemPoolSetAttribute(p, attr, value));
        }
        // SAFETY: `value` points at an int or a cuuint64_t by attribute (cuda.h); null is refused.
        let v = unsafe { read_attribute(attr, value) }?;
        pool::set_attribute(handle(p), attr, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(p: usize, attr: c_uint, value: *mut c_void) -> u32 {
    entry(id::cuMemPoolGetAttribute, || {
        if !is_adapter_pool(handle(p)) {
            // The application's arguments, forwarded under their cuda.h contract.
            return call!(driver()?, cuMemPoolGetAttribute(p, attr, value));
        }
        non_null(value)?;
        let v = pool::get_attribute(handle(p), attr)?;
        if pool::is_int_attribute(attr) {
            // SAFETY: an int output for the reuse flags (cuda.h), checked non-null.
            unsafe { write(value.cast::<c_int>(), v as c_int) }
        } else {
            // SAFETY: a cuuint64_t output for the other attributes (cuda.h), checked non-null.
            unsafe { write(value.cast::<u64>(), v) }
        }
    })
}

/// # Safety
/// `value` is null or points at the attribute's C type.
unsafe fn read_attribute(attr: c_uint, value: *mut c_void) -> CuResult<u64> {
    if pool::is_int_attribute(attr) {
        // SAFETY: per the caller, an int.
        unsafe { read(value.cast::<c_int>().cast_const()) }.map(|v| v as u64)
    } else {
        // SAFETY: per the caller, a cuuint64_t.
        unsafe { read(value.cast::<u64>().cast_const()) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    p: usize,
    map: *const RawAccessDesc,
    count: usize,
) -> u32 {
    entry(id::cuMemPoolSetAccess, || {
        if !is_adapter_pool(handle(p)) {
            // The application's arguments, forwarded under their cuda.h contract.
            return call!(driver()?, cuMemPoolSetAccess(p, map, count));
        }
        if count == 0 {
            return Ok(());
        }
        if map.is_null() || count > cuinterpose_protocol::MAX_ACCESS {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: `map` points at `count` descriptors (cuda.h), checked non-null and bounded.
        let grants = unsafe { std::slice::from_raw_parts(map, count) }.to_vec();
        pool::set_access(handle(p), &grants)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut c_uint,
    p: usize,
    location: *mut RawLocation,
) -> u32 {
    entry(id::cuMemPoolGetAccess, || {
        if !is_adapter_pool(handle(p)) {
            // The application's arguments, forwarded under their cuda.h contract.
            return call!(driver()?, cuMemPoolGetAccess(flags, p, location));
        }
        non_null(flags)?;
        // SAFETY: `location` is null (refused) or a CUmemLocation (cuda.h).
        let at = unsafe { read(location.cast_const()) }?;
        let granted = pool::get_access(handle(p), at)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(flags, granted) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(p: usize, keep: usize) -> u32 {
    entry(id::cuMemPoolTrimTo, || {
        if is_adapter_pool(handle(p)) {
            // The adapter keeps nothing back: freed memory is already released.
            return pool::get_attribute(handle(p), consts::POOL_ATTR_USED_MEM_CURRENT).map(drop);
        }
        call!(driver()?, cuMemPoolTrimTo(p, keep))
    })
}

/// An adapter pool's export is a ticket; the driver's own pool exports are recorded so
/// inspection refuses while the pool is shared.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    out: *mut c_void,
    p: usize,
    handle_type: c_uint,
    flags: u64,
) -> u32 {
    entry(id::cuMemPoolExportToShareableHandle, || {
        if is_adapter_pool(handle(p)) {
            non_null(out)?;
            let fd = pool::export(handle(p), handle_type, flags)?;
            // SAFETY: for POSIX FD exports `out` points at an int (cuda.h); non-null (checked
            // above), so the write cannot fail and the descriptor is never lost.
            return unsafe { write(out.cast::<c_int>(), fd.into_raw_fd()) };
        }
        // The application's output pointer, forwarded under its cuda.h contract.
        call!(
            driver()?,
            cuMemPoolExportToShareableHandle(out, p, handle_type, flags)
        )?;
        crate::state::process::note_pool_share(p, false);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    out: *mut usize,
    os_handle: *mut c_void,
    handle_type: c_uint,
    flags: u64,
) -> u32 {
    entry(id::cuMemPoolImportFromShareableHandle, || {
        non_null(out)?;
        if handle_type == consts::HANDLE_TYPE_POSIX_FD {
            // For POSIX FDs the handle is the descriptor number cast to a pointer.
            let number = os_handle as usize as c_int;
            // SAFETY: F_GETFD only asks whether the number is an open descriptor.
            if number >= 0 && unsafe { libc::fcntl(number, libc::F_GETFD) } >= 0 {
                // SAFETY: the number is open (checked above) and the application lends it for
                // the call, which the borrow does not outlive.
                let fd = unsafe { BorrowedFd::borrow_raw(number) };
                if let Some(h) = pool::import(fd)? {
                    // SAFETY: the caller's output, checked non-null.
                    return unsafe { write(out, h as usize) };
                }
            }
        }
        // The application's arguments, forwarded under their cuda.h contract.
        call!(
            driver()?,
            cuMemPoolImportFromShareableHandle(out, os_handle, handle_type, flags)
        )?;
        // SAFETY: the driver just wrote the pool handle through `out` (checked non-null).
        let imported = unsafe { out.read() };
        crate::state::process::note_pool_share(imported, true);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolExportPointer(out: *mut c_void, ptr: u64) -> u32 {
    entry(id::cuMemPoolExportPointer, || {
        non_null(out)?;
        match pool::export_pointer(ptr)? {
            // SAFETY: `out` is a CUmemPoolPtrExportData, 64 bytes (cuda.h), checked non-null.
            Some(bytes) => unsafe { write(out.cast::<[u8; 64]>(), bytes) },
            // The application's arguments, forwarded under their cuda.h contract.
            None => call!(driver()?, cuMemPoolExportPointer(out, ptr)),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolImportPointer(out: *mut u64, p: usize, data: *mut c_void) -> u32 {
    entry(id::cuMemPoolImportPointer, || {
        if !is_adapter_pool(handle(p)) {
            // The application's arguments, forwarded under their cuda.h contract.
            return call!(driver()?, cuMemPoolImportPointer(out, p, data));
        }
        non_null(out)?;
        // SAFETY: `data` is null (refused) or a CUmemPoolPtrExportData, 64 bytes (cuda.h).
        let bytes = unsafe { read(data.cast::<[u8; 64]>().cast_const()) }?;
        let address = pool::import_pointer(handle(p), &bytes)?.ok_or(CuError::UNKNOWN)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(out, address) }
    })
}

/// The adapter's allocation from `p`, or the driver's (`native`).
fn alloc_from_pool(
    out: *mut u64,
    size: usize,
    p: usize,
    native: impl FnOnce() -> CuResult<()>,
) -> CuResult<()> {
    if !is_adapter_pool(handle(p)) {
        return native();
    }
    non_null(out)?;
    let address = pool::alloc(handle(p), size as u64)?;
    // SAFETY: the caller's output, checked non-null.
    unsafe { write(out, address) }
}

/// An allocation entry point and its per-thread-default-stream (`_ptsz`) twin: the same
/// `$logic`, given the driver's own call of each as the fallback.
macro_rules! alloc_entries {
    ($($name:ident)+, $params:tt => $logic:ident $used:tt) => {
        $(alloc_entries!(@one $name, $params => $logic $used);)+
    };
    (@one $name:ident, ($($arg:ident: $ty:ty),*) => $logic:ident($($used:ident),*)) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> u32 {
            entry(id::$name, || {
                $logic($($used,)* || {
                    // The application's arguments, forwarded under their cuda.h contract.
                    call!(driver()?, $name($($arg),*))
                })
            })
        }
    };
}

alloc_entries!(
    cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz,
    (out: *mut u64, size: usize, p: usize, stream: usize) => alloc_from_pool(out, size, p)
);

/// From the device's current pool: the adapter's when one is current, else the driver's.
fn alloc_async(out: *mut u64, size: usize, native: impl FnOnce() -> CuResult<()>) -> CuResult<()> {
    non_null(out)?;
    match pool::alloc_async(size as u64)? {
        // SAFETY: the caller's output, checked non-null.
        Some(address) => unsafe { write(out, address) },
        None => native(),
    }
}

alloc_entries!(
    cuMemAllocAsync cuMemAllocAsync_ptsz,
    (out: *mut u64, size: usize, stream: usize) => alloc_async(out, size)
);

/// The driver's own call (`native`) unless the adapter has answered (`adapted`).
fn unless_adapted(adapted: bool, native: impl FnOnce() -> CuResult<()>) -> CuResult<()> {
    if adapted { Ok(()) } else { native() }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(ptr: u64, stream: usize) -> u32 {
    entry(id::cuMemFreeAsync, || {
        let freed = pool::free_async(ptr, stream)?;
        unless_adapted(freed, || call!(driver()?, cuMemFreeAsync(ptr, stream)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(ptr: u64, stream: usize) -> u32 {
    entry(id::cuMemFreeAsync_ptsz, || {
        // Stream 0 of a per-thread-stream caller is its thread's default stream.
        let waits_on = if stream == 0 {
            consts::STREAM_PER_THREAD
        } else {
            stream
        };
        let freed = pool::free_async(ptr, waits_on)?;
        unless_adapted(freed, || call!(driver()?, cuMemFreeAsync_ptsz(ptr, stream)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceSetMemPool(device: c_int, p: usize) -> u32 {
    entry(id::cuDeviceSetMemPool, || {
        let set = pool::set_current_pool(device, handle(p))?;
        unless_adapted(set, || call!(driver()?, cuDeviceSetMemPool(device, p)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(out: *mut usize, device: c_int) -> u32 {
    entry(id::cuDeviceGetMemPool, || {
        if let Some(h) = pool::current_pool(device)? {
            // SAFETY: the caller's output (null refused).
            return unsafe { write(out, h as usize) };
        }
        // The application's arguments, forwarded under their cuda.h contract.
        call!(driver()?, cuDeviceGetMemPool(out, device))
    })
}

/// The device a `CUmemLocation` names, when it names one.
///
/// # Safety
/// `location` is null or points at a CUmemLocation.
unsafe fn device_of(location: *mut RawLocation) -> CuResult<Option<i32>> {
    // SAFETY: per the caller; null is refused.
    let at = unsafe { read(location.cast_const()) }?;
    Ok((at.type_ == consts::LOCATION_TYPE_DEVICE).then_some(at.id))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetMemPool(
    location: *mut RawLocation,
    alloc_type: c_uint,
    p: usize,
) -> u32 {
    entry(id::cuMemSetMemPool, || {
        // SAFETY: `location` is a CUmemLocation (cuda.h); null is refused.
        let device = unsafe { device_of(location) }?;
        match device {
            Some(device)
                if alloc_type == consts::ALLOCATION_TYPE_PINNED
                    && pool::set_current_pool(device, handle(p))? =>
            {
                return Ok(());
            }
            _ if is_adapter_pool(handle(p)) => return Err(CuError::INVALID_VALUE),
            _ => {}
        }
        // The application's arguments, forwarded under their cuda.h contract.
        call!(driver()?, cuMemSetMemPool(location, alloc_type, p))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetMemPool(
    out: *mut usize,
    location: *mut RawLocation,
    alloc_type: c_uint,
) -> u32 {
    entry(id::cuMemGetMemPool, || {
        // SAFETY: `location` is a CUmemLocation (cuda.h); null is refused.
        if let Some(device) = unsafe { device_of(location) }?
            && alloc_type == consts::ALLOCATION_TYPE_PINNED
            && let Some(h) = pool::current_pool(device)?
        {
            // SAFETY: the caller's output (null refused).
            return unsafe { write(out, h as usize) };
        }
        // The application's arguments, forwarded under their cuda.h contract.
        call!(driver()?, cuMemGetMemPool(out, location, alloc_type))
    })
}

/// The driver answers every attribute (the adapter's regions are VMM mappings it knows);
/// the pool a region came from is the adapter's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attr: c_uint, ptr: u64) -> u32 {
    entry(id::cuPointerGetAttribute, || {
        if attr == consts::POINTER_ATTRIBUTE_MEMPOOL_HANDLE
            && let Some(h) = pool::pool_of(ptr)?
        {
            // SAFETY: a CUmemoryPool output for this attribute (cuda.h); null is refused.
            return unsafe { write(data.cast::<usize>(), h as usize) };
        }
        // The application's arguments, forwarded under their cuda.h contract.
        call!(driver()?, cuPointerGetAttribute(data, attr, ptr))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attrs: *mut c_uint,
    data: *mut *mut c_void,
    ptr: u64,
) -> u32 {
    entry(id::cuPointerGetAttributes, || {
        // The application's arguments, forwarded under their cuda.h contract.
        call!(driver()?, cuPointerGetAttributes(count, attrs, data, ptr))?;
        if attrs.is_null() || data.is_null() {
            return Ok(());
        }
        let Some(h) = pool::pool_of(ptr)? else {
            return Ok(());
        };
        for i in 0..count as usize {
            // SAFETY: `attrs` and `data` hold `count` entries (cuda.h), checked non-null; the
            // driver accepted them just now.
            let (attr, out) = unsafe { (attrs.add(i).read(), data.add(i).read()) };
            if attr == consts::POINTER_ATTRIBUTE_MEMPOOL_HANDLE && !out.is_null() {
                // SAFETY: a CUmemoryPool output for this attribute (cuda.h), non-null.
                unsafe { write(out.cast::<usize>(), h as usize) }?;
            }
        }
        Ok(())
    })
}
