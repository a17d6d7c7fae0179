//! The little of cuda.h the worker needs: result names, constants and `#[repr(C)]` structs.
//! Enum-typed values (results, handle types, location types) are plain integers here: a value
//! a newer driver invents must never be undefined behaviour.

use std::ffi::c_void;

/// `CUDA_SUCCESS`.
pub const SUCCESS: u32 = 0;
pub const INVALID_VALUE: u32 = 1;
pub const OUT_OF_MEMORY: u32 = 2;
pub const NOT_INITIALIZED: u32 = 3;
pub const INVALID_DEVICE: u32 = 101;
pub const INVALID_CONTEXT: u32 = 201;
pub const ALREADY_MAPPED: u32 = 208;
pub const INVALID_HANDLE: u32 = 400;
pub const ILLEGAL_STATE: u32 = 401;
pub const NOT_FOUND: u32 = 500;
pub const NOT_READY: u32 = 600;
pub const ILLEGAL_ADDRESS: u32 = 700;
pub const NOT_PERMITTED: u32 = 800;
pub const NOT_SUPPORTED: u32 = 801;
pub const UNKNOWN: u32 = 999;

/// `CU_MEM_HANDLE_TYPE_NONE`.
pub const HANDLE_TYPE_NONE: u32 = 0;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
pub const HANDLE_TYPE_FABRIC: u32 = 8;

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
pub const LOCATION_TYPE_HOST_NUMA: u32 = 3;

/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
pub const ACCESS_NONE: u32 = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const ACCESS_READ: u32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const ACCESS_READWRITE: u32 = 3;

/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const GRANULARITY_MINIMUM: u32 = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const GRANULARITY_RECOMMENDED: u32 = 1;

/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
pub const ATTRIBUTE_VMM_SUPPORTED: i32 = 102;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
pub const ATTRIBUTE_POSIX_FD_SUPPORTED: i32 = 103;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`.
pub const ATTRIBUTE_FABRIC_SUPPORTED: i32 = 128;
/// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
pub const ATTRIBUTE_MULTICAST_SUPPORTED: i32 = 132;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
pub const IPC_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CU_GET_PROC_ADDRESS_DEFAULT`.
pub const PROC_ADDRESS_DEFAULT: u64 = 0;

/// The CUDA name of a driver result, for the common ones.
pub fn error_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        208 => "CUDA_ERROR_ALREADY_MAPPED",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        909 => "CUDA_ERROR_TIMEOUT",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// [`error_name`], or `CUDA_ERROR_<code>` for a value outside the table.
pub fn error_name_or_code(code: u32) -> String {
    error_name(code).map_or_else(|| format!("CUDA_ERROR_{code}"), str::to_owned)
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemLocation {
    pub type_: u32,
    pub id: i32,
}

/// `CUmemAllocationProp` (32 bytes). `alloc_flags` is `{compressionType: u8,
/// gpuDirectRDMACapable: u8, usage: u16, reserved: [u8; 4]}`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: MemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: [u8; 8],
}

impl MemAllocationProp {
    /// Pinned memory at `location_type`/`id` exportable as `handle_types`.
    pub fn pinned(location_type: u32, id: i32, handle_types: u32) -> MemAllocationProp {
        MemAllocationProp {
            type_: ALLOCATION_TYPE_PINNED,
            requested_handle_types: handle_types,
            location: MemLocation {
                type_: location_type,
                id,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }

    /// All zero, for out-parameters.
    pub fn zeroed() -> MemAllocationProp {
        MemAllocationProp {
            type_: 0,
            requested_handle_types: 0,
            location: MemLocation::default(),
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: u32,
}

/// `CUmulticastObjectProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MulticastObjectProp {
    pub num_devices: u32,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

/// `CUipcMemHandle`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpcMemHandle {
    pub reserved: [u8; 64],
}

const _: () = {
    assert!(size_of::<MemLocation>() == 8);
    assert!(size_of::<MemAllocationProp>() == 32);
    assert!(size_of::<MemAccessDesc>() == 12);
    assert!(size_of::<MulticastObjectProp>() == 32);
    assert!(size_of::<IpcMemHandle>() == 64);
};
