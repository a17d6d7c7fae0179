//! C-layout mirrors of `CUmemLocation`, `CUmemAllocationProp`, `CUmemAccessDesc`,
//! `CUmulticastObjectProp`, `CUmemPoolProps`, `CUipcMemHandle`, `CUDA_MEMCPY3D` and
//! `CUDA_MEM_ALLOC_NODE_PARAMS`, with plain-integer fields.

use cudarc::driver::sys::{
    CUDA_MEM_ALLOC_NODE_PARAMS_v1, CUDA_MEMCPY3D, CUipcMemHandle, CUmemAccessDesc,
    CUmemAllocationProp, CUmemLocation, CUmemPoolProps, CUmulticastObjectProp,
};
use std::ffi::c_void;
use std::mem::{offset_of, size_of};

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawLocation {
    pub type_: u32,
    pub id: i32,
}

/// `CUmemAllocationProp` (32 bytes). `alloc_flags` is `{compressionType: u8,
/// gpuDirectRDMACapable: u8, usage: u16, reserved: [u8; 4]}`.
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
        RawAllocProp {
            type_,
            requested_handle_types: handle_types,
            location,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags,
        }
    }

    /// Pinned memory at `location_type`/`id` exportable as `handle_types`.
    pub fn pinned(location_type: u32, id: i32, handle_types: u32) -> Self {
        let location = RawLocation {
            type_: location_type,
            id,
        };
        RawAllocProp::new(
            crate::consts::ALLOCATION_TYPE_PINNED,
            handle_types,
            location,
            [0; 8],
        )
    }

    /// All zero, for out-parameters.
    pub fn zeroed() -> Self {
        RawAllocProp::new(0, 0, RawLocation::default(), [0; 8])
    }
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawAccessDesc {
    pub location: RawLocation,
    pub flags: u32,
}

/// `CUmulticastObjectProp` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawMulticastProp {
    pub num_devices: u32,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

/// `CUmemPoolProps` (88 bytes, CUDA 12.6 and later; older headers had `reserved` where
/// `max_size` and `usage` are, zero there).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location: RawLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawIpcMemHandle {
    pub reserved: [u8; 64],
}

/// `CUDA_MEMCPY3D` (200 bytes): a graph memcpy node's parameters, kept as given so the
/// node's getters hand them back.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMemcpy3d {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: u32,
    pub src_host: usize,
    pub src_device: u64,
    pub src_array: usize,
    pub reserved0: usize,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: u32,
    pub dst_host: usize,
    pub dst_device: u64,
    pub dst_array: usize,
    pub reserved1: usize,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (120 bytes): a graph allocation node's pool properties, the
/// devices granted access, its size, and the address the driver writes back.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawMemAllocNodeParams {
    pub pool_props: RawPoolProps,
    pub access_descs: *const RawAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: u64,
}

/// Each mirror has the size of its CUDA struct (cudarc's bindings), the size in bytes the
/// driver's header gives where one is listed, and each listed field the CUDA field's offset:
/// checked at compile time, so a mirror cannot drift from the header.
macro_rules! mirrors {
    ($(
        $raw:ident = $cuda:ident $([$size:literal])? { $($field:ident = $cuda_field:ident),* }
    )*) => {
        const _: () = {
            $(
                assert!(size_of::<$raw>() == size_of::<$cuda>());
                $(assert!(size_of::<$raw>() == $size);)?
                $(assert!(offset_of!($raw, $field) == offset_of!($cuda, $cuda_field));)*
            )*
        };
    };
}

mirrors! {
    RawMemAllocNodeParams = CUDA_MEM_ALLOC_NODE_PARAMS_v1 [120] {
        bytesize = bytesize, dptr = dptr
    }
    RawMemcpy3d = CUDA_MEMCPY3D [200] {
        src_device = srcDevice, dst_memory_type = dstMemoryType, dst_device = dstDevice,
        width_in_bytes = WidthInBytes
    }
    RawLocation = CUmemLocation [8] {}
    RawAllocProp = CUmemAllocationProp [32] {
        requested_handle_types = requestedHandleTypes, location = location,
        win32_handle_meta_data = win32HandleMetaData, alloc_flags = allocFlags
    }
    RawAccessDesc = CUmemAccessDesc { flags = flags }
    RawMulticastProp = CUmulticastObjectProp {
        size = size, handle_types = handleTypes, flags = flags
    }
    RawIpcMemHandle = CUipcMemHandle {}
    RawPoolProps = CUmemPoolProps [88] { location = location, max_size = maxSize, usage = usage }
}
