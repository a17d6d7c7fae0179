//! C-layout mirrors of the cudarc structs whose fields are Rust enums.
//!
//! Reading a struct from C memory straight into cudarc's type would be undefined behaviour
//! when a field holds a value the enum lacks, so fakecuda reads these mirrors (plain integers)
//! and decodes every field explicitly. The assertions tie each mirror to cudarc's layout.

use cudarc::driver::sys::{CUmemAccessDesc, CUmemAllocationProp, CUmemLocation};
use std::mem::{offset_of, size_of};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawLocation {
    pub type_: u32,
    pub id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawAllocProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: RawLocation,
    pub win32_handle_meta_data: *mut std::ffi::c_void,
    pub alloc_flags: [u8; 8],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawAccessDesc {
    pub location: RawLocation,
    pub flags: u32,
}

const _: () = {
    assert!(size_of::<RawLocation>() == size_of::<CUmemLocation>());
    assert!(size_of::<RawAllocProp>() == size_of::<CUmemAllocationProp>());
    assert!(
        offset_of!(RawAllocProp, requested_handle_types)
            == offset_of!(CUmemAllocationProp, requestedHandleTypes)
    );
    assert!(offset_of!(RawAllocProp, location) == offset_of!(CUmemAllocationProp, location));
    assert!(
        offset_of!(RawAllocProp, win32_handle_meta_data)
            == offset_of!(CUmemAllocationProp, win32HandleMetaData)
    );
    assert!(offset_of!(RawAllocProp, alloc_flags) == offset_of!(CUmemAllocationProp, allocFlags));
    assert!(size_of::<RawAccessDesc>() == size_of::<CUmemAccessDesc>());
    assert!(offset_of!(RawAccessDesc, flags) == offset_of!(CUmemAccessDesc, flags));
};

/// CUDA constants as raw integers, taken from cudarc so they cannot drift from the headers.
pub mod consts {
    use cudarc::driver::sys as s;
    pub const ALLOCATION_TYPE_PINNED: u32 =
        s::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u32;
    pub const LOCATION_TYPE_DEVICE: u32 = s::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;
    pub const LOCATION_TYPE_HOST: u32 = s::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST as u32;
    pub const LOCATION_TYPE_HOST_NUMA: u32 =
        s::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA as u32;
    pub const LOCATION_TYPE_HOST_NUMA_CURRENT: u32 =
        s::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as u32;
    pub const HANDLE_TYPE_POSIX_FD: u32 =
        s::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    pub const HANDLE_TYPE_WIN32: u32 = s::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_WIN32.0;
    pub const HANDLE_TYPE_WIN32_KMT: u32 =
        s::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_WIN32_KMT.0;
    pub const HANDLE_TYPE_FABRIC: u32 = s::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
    pub const HANDLE_TYPES_ALL: u32 =
        HANDLE_TYPE_POSIX_FD | HANDLE_TYPE_WIN32 | HANDLE_TYPE_WIN32_KMT | HANDLE_TYPE_FABRIC;
    pub const ACCESS_NONE: u32 = s::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE as u32;
    pub const ACCESS_READ: u32 = s::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ as u32;
    pub const ACCESS_READWRITE: u32 =
        s::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u32;
    pub const GRANULARITY_MINIMUM: u32 =
        s::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM as u32;
    pub const GRANULARITY_RECOMMENDED: u32 =
        s::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED as u32;
    pub const PROCESS_STATE_RUNNING: u32 = s::CUprocessState::CU_PROCESS_STATE_RUNNING as u32;
    pub const PROCESS_STATE_LOCKED: u32 = s::CUprocessState::CU_PROCESS_STATE_LOCKED as u32;
    pub const PROCESS_STATE_CHECKPOINTED: u32 =
        s::CUprocessState::CU_PROCESS_STATE_CHECKPOINTED as u32;
    pub const PROCESS_STATE_FAILED: u32 = s::CUprocessState::CU_PROCESS_STATE_FAILED as u32;
    pub const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 =
        s::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    pub const PROC_ADDRESS_SUCCESS: u32 =
        s::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS as u32;
    pub const PROC_ADDRESS_SYMBOL_NOT_FOUND: u32 =
        s::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as u32;
    pub const PROC_ADDRESS_VERSION_NOT_SUFFICIENT: u32 =
        s::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u32;
    pub const MEMHOSTREGISTER_ALL: u32 = s::CU_MEMHOSTREGISTER_PORTABLE
        | s::CU_MEMHOSTREGISTER_DEVICEMAP
        | s::CU_MEMHOSTREGISTER_IOMEMORY
        | s::CU_MEMHOSTREGISTER_READ_ONLY;
}
