//! Safe typed methods for the driver calls the shim makes for itself.
//!
//! Each passes only values, pointers to its own locals, or pointers derived from references
//! (which Rust keeps alive and correctly sized for the call). Device addresses are the
//! driver's own virtual addresses: it checks them against its reservations and mappings and
//! answers an error for a bad one; the shim never dereferences them.

use super::os;
use super::table::{Driver, call};
use crate::sys::abi::{RawAccessDesc, RawAllocProp, RawMulticastProp, consts};
use crate::sys::error::{CuError, CuResult};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// A device this process sees, by identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIdentity {
    pub uuid: [u8; 16],
    pub name: String,
    pub memory: u64,
}

/// What every `cuMulticastBind*` call names in the object besides the memory: the device of
/// the `_v2` entry points (`None`: the original ones), the range and the flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRange {
    pub device: Option<i32>,
    pub multicast_offset: usize,
    pub size: usize,
    pub flags: u64,
}

/// What a multicast bind maps into the object: a member allocation's driver handle and an
/// offset into it (`cuMulticastBindMem`), or an address (`cuMulticastBindAddr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Memory { member: u64, offset: usize },
    Address(u64),
}

impl Driver {
    pub fn init(&self, flags: u32) -> CuResult<()> {
        call!(self, cuInit(flags))
    }

    /// Every device this process sees, by ordinal: which GPU each is.
    pub fn devices(&self) -> CuResult<Vec<DeviceIdentity>> {
        let mut count: c_int = 0;
        call!(self, cuDeviceGetCount(&mut count))?;
        (0..count)
            .map(|device| {
                let mut uuid = [0u8; 16];
                call!(self, cuDeviceGetUuid_v2(&mut uuid, device))?;
                let mut name = [0 as std::ffi::c_char; 256];
                call!(
                    self,
                    cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device)
                )?;
                let mut memory = 0usize;
                call!(self, cuDeviceTotalMem_v2(&mut memory, device))?;
                // The driver NUL-terminates within the buffer; the last byte stays 0 anyway.
                let bytes: Vec<u8> = name
                    .iter()
                    .take_while(|c| **c != 0)
                    .map(|c| *c as u8)
                    .collect();
                Ok(DeviceIdentity {
                    uuid,
                    name: String::from_utf8_lossy(&bytes).into_owned(),
                    memory: memory as u64,
                })
            })
            .collect()
    }

    // Contexts.

    /// The calling thread's current context (0: none).
    pub fn ctx_current(&self) -> CuResult<usize> {
        let mut ctx = 0usize;
        call!(self, cuCtxGetCurrent(&mut ctx))?;
        Ok(ctx)
    }

    pub fn ctx_set_current(&self, ctx: usize) -> CuResult<()> {
        call!(self, cuCtxSetCurrent(ctx))
    }

    /// The device of the current context.
    pub fn ctx_device(&self) -> CuResult<i32> {
        let mut device = 0;
        call!(self, cuCtxGetDevice(&mut device))?;
        Ok(device)
    }

    pub fn ctx_synchronize(&self) -> CuResult<()> {
        call!(self, cuCtxSynchronize())
    }

    /// Waits for the work queued on an application's stream (any handle the driver takes,
    /// `CU_STREAM_PER_THREAD` included).
    pub fn stream_synchronize(&self, stream: usize) -> CuResult<()> {
        call!(self, cuStreamSynchronize(stream))
    }

    pub fn ctx_enable_peer_access(&self, peer: usize, flags: u32) -> CuResult<()> {
        call!(self, cuCtxEnablePeerAccess(peer, flags))
    }

    pub fn ctx_disable_peer_access(&self, peer: usize) -> CuResult<()> {
        call!(self, cuCtxDisablePeerAccess(peer))
    }

    pub fn ctx_destroy(&self, ctx: usize) -> CuResult<()> {
        call!(self, cuCtxDestroy_v2(ctx))
    }

    pub fn primary_ctx_retain(&self, device: i32) -> CuResult<usize> {
        let mut primary = 0usize;
        call!(self, cuDevicePrimaryCtxRetain(&mut primary, device))?;
        Ok(primary)
    }

    pub fn primary_ctx_release(&self, device: i32) -> CuResult<()> {
        call!(self, cuDevicePrimaryCtxRelease_v2(device))
    }

    pub fn primary_ctx_reset(&self, device: i32) -> CuResult<()> {
        call!(self, cuDevicePrimaryCtxReset_v2(device))
    }

    // Physical allocations.

    pub fn mem_create(&self, size: usize, prop: &RawAllocProp, flags: u64) -> CuResult<u64> {
        let mut raw = 0;
        call!(self, cuMemCreate(&mut raw, size, prop, flags))?;
        Ok(raw)
    }

    pub fn mem_release(&self, raw: u64) -> CuResult<()> {
        call!(self, cuMemRelease(raw))
    }

    /// The allocation handle mapped at `address` (one more reference).
    pub fn retain_allocation_handle(&self, address: u64) -> CuResult<u64> {
        let mut handle = 0;
        // The driver takes the address as a pointer but only looks it up.
        let address = address as usize as *mut c_void;
        call!(self, cuMemRetainAllocationHandle(&mut handle, address))?;
        Ok(handle)
    }

    pub fn allocation_granularity(&self, prop: &RawAllocProp, option: u32) -> CuResult<usize> {
        let mut granularity = 0usize;
        call!(
            self,
            cuMemGetAllocationGranularity(&mut granularity, prop, option)
        )?;
        Ok(granularity)
    }

    pub fn allocation_properties(&self, raw: u64) -> CuResult<RawAllocProp> {
        let mut prop = RawAllocProp::new(0, 0, Default::default(), [0; 8]);
        call!(self, cuMemGetAllocationPropertiesFromHandle(&mut prop, raw))?;
        Ok(prop)
    }

    /// The driver's POSIX-FD export of `raw`, close-on-exec.
    pub fn export_posix_fd(&self, raw: u64) -> CuResult<OwnedFd> {
        let mut fd: c_int = -1;
        let out = (&mut fd as *mut c_int).cast::<c_void>();
        call!(
            self,
            cuMemExportToShareableHandle(out, raw, consts::HANDLE_TYPE_POSIX_FD, 0)
        )?;
        if fd < 0 {
            return Err(CuError::UNKNOWN);
        }
        Ok(os::adopt_fd(fd))
    }

    /// The driver's import of POSIX FD `fd` (which stays the caller's).
    pub fn import_posix_fd(&self, fd: BorrowedFd<'_>) -> CuResult<u64> {
        let mut raw = 0;
        // For POSIX FDs the driver takes the descriptor number cast to a pointer.
        let handle = fd.as_raw_fd() as usize as *mut c_void;
        call!(
            self,
            cuMemImportFromShareableHandle(&mut raw, handle, consts::HANDLE_TYPE_POSIX_FD)
        )?;
        Ok(raw)
    }

    // Virtual address space.

    pub fn address_reserve(&self, size: usize) -> CuResult<u64> {
        let mut address = 0;
        call!(self, cuMemAddressReserve(&mut address, size, 0, 0, 0))?;
        Ok(address)
    }

    pub fn address_free(&self, address: u64, size: usize) -> CuResult<()> {
        call!(self, cuMemAddressFree(address, size))
    }

    pub fn mem_map(
        &self,
        address: u64,
        size: usize,
        offset: usize,
        raw: u64,
        flags: u64,
    ) -> CuResult<()> {
        call!(self, cuMemMap(address, size, offset, raw, flags))
    }

    pub fn mem_unmap(&self, address: u64, size: usize) -> CuResult<()> {
        call!(self, cuMemUnmap(address, size))
    }

    pub fn mem_set_access(
        &self,
        address: u64,
        size: usize,
        descriptors: &[RawAccessDesc],
    ) -> CuResult<()> {
        call!(
            self,
            cuMemSetAccess(address, size, descriptors.as_ptr(), descriptors.len())
        )
    }

    /// `cuMemFree` of memory the shim does not track (the driver's own `cuMemAlloc` memory).
    pub fn mem_free(&self, address: u64) -> CuResult<()> {
        call!(self, cuMemFree_v2(address))
    }

    // Multicast objects.

    pub fn multicast_create(&self, prop: &RawMulticastProp) -> CuResult<u64> {
        let mut raw = 0;
        call!(self, cuMulticastCreate(&mut raw, prop))?;
        Ok(raw)
    }

    pub fn multicast_add_device(&self, raw: u64, device: i32) -> CuResult<()> {
        call!(self, cuMulticastAddDevice(raw, device))
    }

    /// `cuMulticastBindMem` or `cuMulticastBindAddr` by what is bound, the `_v2` entry point
    /// when `range.device` is given.
    pub fn multicast_bind(&self, raw: u64, range: BindRange, bound: Bound) -> CuResult<()> {
        let BindRange {
            device,
            multicast_offset: offset,
            size,
            flags,
        } = range;
        match (bound, device) {
            (Bound::Memory { member, offset: at }, None) => {
                call!(
                    self,
                    cuMulticastBindMem(raw, offset, member, at, size, flags)
                )
            }
            (Bound::Memory { member, offset: at }, Some(dev)) => {
                call!(
                    self,
                    cuMulticastBindMem_v2(raw, dev, offset, member, at, size, flags)
                )
            }
            (Bound::Address(address), None) => {
                call!(self, cuMulticastBindAddr(raw, offset, address, size, flags))
            }
            (Bound::Address(address), Some(dev)) => {
                call!(
                    self,
                    cuMulticastBindAddr_v2(raw, dev, offset, address, size, flags)
                )
            }
        }
    }

    pub fn multicast_unbind(
        &self,
        raw: u64,
        device: i32,
        multicast_offset: usize,
        size: usize,
    ) -> CuResult<()> {
        call!(self, cuMulticastUnbind(raw, device, multicast_offset, size))
    }
}
