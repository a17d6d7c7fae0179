//! The driver entry points the shim exports in place of the driver's.

#![allow(non_snake_case, clippy::missing_safety_doc)]
// The safety contract of every function here is the one cuda.h documents for it.

use super::{entry, non_null, read, write};
use crate::calls::sharing::Exported;
use crate::calls::{multicast, sharing, vmm as ops};
use crate::driver::api::BindRange;
use crate::driver::call;
use crate::driver::driver;
use crate::sys::abi::{RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawMulticastProp};
use crate::sys::entries::id;
use crate::sys::error::CuError;
use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};

/// Initializes the driver, then starts the shim's runtime (its socket and threads) once.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> u32 {
    entry(id::cuInit, || {
        driver()?.init(flags)?;
        crate::runtime::start()
    })
}

/// The driver's answer, except that fabric handles are reported unsupported: the shim refuses
/// them (they cannot be checkpointed), so clients that probe this attribute (PyTorch, NCCL,
/// torch symmetric memory) choose POSIX FDs from the start.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    device: c_int,
) -> u32 {
    entry(id::cuDeviceGetAttribute, || {
        call!(driver()?, cuDeviceGetAttribute(value, attribute, device))?;
        if attribute == crate::sys::abi::consts::DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED {
            // SAFETY: the driver just wrote an int there, so it is a valid output.
            unsafe { write(value, 0) }?;
        }
        Ok(())
    })
}

/// A granularity query, answered by the driver (hand-written so both names stay the shim's).
macro_rules! granularity_entry {
    ($name:ident, $prop:ty) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            granularity: *mut usize,
            prop: *const $prop,
            option: c_uint,
        ) -> u32 {
            entry(id::$name, || {
                call!(driver()?, $name(granularity, prop, option))
            })
        }
    };
}

granularity_entry!(cuMemGetAllocationGranularity, RawAllocProp);
granularity_entry!(cuMulticastGetGranularity, RawMulticastProp);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const RawAllocProp,
    flags: u64,
) -> u32 {
    entry(id::cuMemCreate, || {
        non_null(handle)?;
        // SAFETY: `prop` points at a CUmemAllocationProp (cuda.h) or is null.
        let prop = unsafe { read(prop) }?;
        let value = ops::mem_create(size, &prop, flags)?;
        // SAFETY: `handle` is the caller's output (checked non-null above).
        unsafe { write(handle, value) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> u32 {
    entry(id::cuMemRelease, || ops::mem_release(handle))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    address: *mut c_void,
) -> u32 {
    entry(id::cuMemRetainAllocationHandle, || {
        non_null(handle)?;
        let value = ops::retain(address as usize as u64)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(handle, value) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    address: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> u32 {
    entry(id::cuMemMap, || {
        ops::map(address, size, offset, handle, flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(address: u64, size: usize) -> u32 {
    entry(id::cuMemUnmap, || ops::unmap(address, size))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    address: u64,
    size: usize,
    descriptors: *const RawAccessDesc,
    count: usize,
) -> u32 {
    entry(id::cuMemSetAccess, || {
        if descriptors.is_null() {
            // The driver answers this one itself.
            return call!(driver()?, cuMemSetAccess(address, size, descriptors, count));
        }
        if count > isize::MAX as usize / std::mem::size_of::<RawAccessDesc>() {
            return Err(CuError::INVALID_VALUE);
        }
        // SAFETY: cuda.h: `descriptors` points at `count` CUmemAccessDesc; plain integers.
        let list = unsafe { std::slice::from_raw_parts(descriptors, count) };
        ops::set_access(address, size, list)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut RawAllocProp,
    handle: u64,
) -> u32 {
    entry(id::cuMemGetAllocationPropertiesFromHandle, || {
        non_null(prop)?;
        // SAFETY: non-null output struct of the caller; the driver fills it.
        let out = unsafe { &mut *prop };
        ops::properties_from_handle(out, handle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    handle_type: c_uint,
    flags: u64,
) -> u32 {
    entry(id::cuMemExportToShareableHandle, || {
        // A tracked export publishes (marks the allocation shared, caches the driver's FD):
        // refuse a missing output before any of that.
        if crate::state::registry::is_logical(handle) {
            non_null(shareable)?;
        }
        let native = |raw: u64| {
            // The application's output pointer, forwarded under its cuda.h contract.
            call!(
                driver()?,
                cuMemExportToShareableHandle(shareable, raw, handle_type, flags)
            )
        };
        match sharing::export(handle, handle_type, flags, native)? {
            Exported::Native => Ok(()),
            // SAFETY: for POSIX FD exports `shareable` points at an int (cuda.h); non-null
            // (checked above), so the write cannot fail and the descriptor is never lost.
            Exported::Ticket(fd) => unsafe { write(shareable.cast::<c_int>(), fd.into_raw_fd()) },
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> u32 {
    entry(id::cuMemImportFromShareableHandle, || {
        non_null(handle)?;
        let native = || {
            let mut raw = 0;
            // The application's handle argument, forwarded under its cuda.h contract.
            call!(
                driver()?,
                cuMemImportFromShareableHandle(&mut raw, os_handle, handle_type)
            )?;
            Ok(raw)
        };
        let value = if handle_type == crate::sys::abi::consts::HANDLE_TYPE_POSIX_FD {
            // For POSIX FDs the handle is the descriptor number cast to a pointer.
            let number = os_handle as usize as c_int;
            // SAFETY: F_GETFD only asks whether the number is an open descriptor.
            let open = number >= 0 && unsafe { libc::fcntl(number, libc::F_GETFD) } >= 0;
            // SAFETY: the number is open (checked above) and the application lends it for the
            // call, which the borrow does not outlive.
            let fd = open.then(|| unsafe { BorrowedFd::borrow_raw(number) });
            sharing::import(handle_type, fd, native)?
        } else {
            sharing::import(handle_type, None, native)?
        };
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(handle, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastCreate(handle: *mut u64, prop: *const RawMulticastProp) -> u32 {
    entry(id::cuMulticastCreate, || {
        non_null(handle)?;
        // SAFETY: `prop` points at a CUmulticastObjectProp (cuda.h) or is null.
        let prop = unsafe { read(prop) }?;
        let value = multicast::create(&prop)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(handle, value) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastAddDevice(handle: u64, device: c_int) -> u32 {
    entry(id::cuMulticastAddDevice, || {
        multicast::add_device(handle, device)
    })
}

/// A multicast bind entry point and its `_v2`, which adds the device: both call `$logic` with
/// the bind range and the `$arg`s (what is bound).
macro_rules! bind_entries {
    ($v1:ident, $v2:ident, $logic:path, ($($arg:ident: $ty:ty),*)) => {
        bind_entries!(@entry $v1, $logic, None, (), ($($arg: $ty),*));
        bind_entries!(@entry $v2, $logic, Some(device), (device: c_int,), ($($arg: $ty),*));
    };
    (@entry $name:ident, $logic:path, $device:expr, ($($dev:tt)*), ($($arg:ident: $ty:ty),*)) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(
            handle: u64,
            $($dev)*
            multicast_offset: usize,
            $($arg: $ty,)*
            size: usize,
            flags: u64,
        ) -> u32 {
            entry(id::$name, || {
                let range = BindRange { device: $device, multicast_offset, size, flags };
                $logic(handle, range, $($arg),*)
            })
        }
    };
}

bind_entries!(
    cuMulticastBindMem,
    cuMulticastBindMem_v2,
    multicast::bind_mem,
    (member: u64, member_offset: usize)
);
bind_entries!(
    cuMulticastBindAddr,
    cuMulticastBindAddr_v2,
    multicast::bind_addr,
    (address: u64)
);

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastUnbind(
    handle: u64,
    device: c_int,
    multicast_offset: usize,
    size: usize,
) -> u32 {
    entry(id::cuMulticastUnbind, || {
        multicast::unbind(handle, device, multicast_offset, size)
    })
}

/// `cudaDeviceReset`: frees the context's `cuMemAlloc` memory and closes its IPC opens, as
/// the driver does, so the records follow.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> u32 {
    entry(id::cuDevicePrimaryCtxReset_v2, || {
        crate::calls::ipc::primary_ctx_reset(device)
    })
}

/// The pre-11.0 name of the same call (what a caller built for CUDA 7.0–10.x gets).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset(device: c_int) -> u32 {
    entry(id::cuDevicePrimaryCtxReset, || {
        crate::calls::ipc::primary_ctx_reset(device)
    })
}

/// The pre-11.0 name of `cuDevicePrimaryCtxRelease_v2`, forwarded to it (the shim wraps it so
/// every name of a driver function lands here).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(device: c_int) -> u32 {
    entry(id::cuDevicePrimaryCtxRelease, || {
        driver()?.primary_ctx_release(device)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: usize) -> u32 {
    entry(id::cuCtxDestroy_v2, || crate::calls::ipc::ctx_destroy(ctx))
}

/// The driver's peer access, extended to the adapter's `cuMemAlloc` regions (VMM memory,
/// which peer access alone would not reach).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer: usize, flags: c_uint) -> u32 {
    entry(id::cuCtxEnablePeerAccess, || {
        crate::calls::peer::enable(peer, flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer: usize) -> u32 {
    entry(id::cuCtxDisablePeerAccess, || {
        crate::calls::peer::disable(peer)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> u32 {
    entry(id::cuMemAlloc_v2, || {
        non_null(dptr)?;
        let address = crate::calls::ipc::mem_alloc(size)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> u32 {
    entry(id::cuMemFree_v2, || crate::calls::ipc::mem_free(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    dptr: u64,
) -> u32 {
    entry(
        id::cuMemGetAddressRange_v2,
        || match crate::calls::ipc::address_range(dptr)? {
            Some((start, length)) => {
                if !base.is_null() {
                    // SAFETY: non-null output of the caller.
                    unsafe { write(base, start) }?;
                }
                if !size.is_null() {
                    // SAFETY: non-null output of the caller.
                    unsafe { write(size, length as usize) }?;
                }
                Ok(())
            }
            None => call!(driver()?, cuMemGetAddressRange_v2(base, size, dptr)),
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut RawIpcMemHandle, dptr: u64) -> u32 {
    entry(id::cuIpcGetMemHandle, || {
        non_null(handle)?;
        let bytes = crate::calls::ipc::ipc_get(dptr)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(handle, RawIpcMemHandle { reserved: bytes }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut u64,
    handle: RawIpcMemHandle,
    flags: c_uint,
) -> u32 {
    entry(id::cuIpcOpenMemHandle_v2, || {
        non_null(dptr)?;
        let address = crate::calls::ipc::ipc_open(&handle.reserved, flags)?;
        // SAFETY: the caller's output, checked non-null.
        unsafe { write(dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut u64,
    handle: RawIpcMemHandle,
    flags: c_uint,
) -> u32 {
    // SAFETY: same contract; the two names are one function in cuda.h.
    unsafe { cuIpcOpenMemHandle_v2(dptr, handle, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(dptr: u64) -> u32 {
    entry(id::cuIpcCloseMemHandle, || {
        crate::calls::ipc::ipc_close(dptr)
    })
}
