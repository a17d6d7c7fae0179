//! C-layout mirrors of the CUDA structs the shim reads and writes.
//!
//! Every field is a plain integer: a struct read from application memory may hold any value,
//! and decoding happens explicitly (through the schema's generated `TryFrom<u32>`).

use std::ffi::c_void;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawLocation {
    pub type_: u32,
    pub id: i32,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawAllocProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: RawLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

impl RawAllocProp {
    pub fn new(type_: u32, handle_types: u32, location: RawLocation, alloc_flags: [u8; 8]) -> Self {
        Self {
            type_,
            requested_handle_types: handle_types,
            location,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags,
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawAccessDesc {
    pub location: RawLocation,
    pub flags: u32,
}

/// `CUmulticastObjectProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMulticastProp {
    pub num_devices: u32,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RawLocation>() == 8);
    assert!(size_of::<RawAllocProp>() == 32);
    assert!(offset_of!(RawAllocProp, location) == 8);
    assert!(offset_of!(RawAllocProp, alloc_flags) == 24);
    assert!(size_of::<RawAccessDesc>() == 12);
    assert!(size_of::<RawMulticastProp>() == 32);
};

/// CUDA constants used by the shim.
pub mod consts {
    pub const ALLOCATION_TYPE_PINNED: u32 = 1;
    pub const LOCATION_TYPE_DEVICE: u32 = 1;
    pub const LOCATION_TYPE_HOST_NUMA: u32 = 3;
    pub const HANDLE_TYPE_POSIX_FD: u32 = 1;
    pub const HANDLE_TYPE_FABRIC: u32 = 8;
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`.
    pub const DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: i32 = 128;
    pub const ACCESS_READWRITE: u32 = 3;
    pub const GRANULARITY_MINIMUM: u32 = 0;
    pub const STREAM_NON_BLOCKING: u32 = 1;
    pub const HOST_REGISTER_PORTABLE: u32 = 1;
    pub const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;
    pub const GET_PROC_ADDRESS_SUCCESS: u32 = 0;
    pub const GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: u32 = 1;
}
