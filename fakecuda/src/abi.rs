//! The driver ABI fakecuda reads and writes (C-layout structs of plain integers, constants),
//! from the workspace's one definition in `cuinterpose-abi`: reading a struct from C memory
//! straight into cudarc's type would be undefined behaviour when a field holds a value the
//! enum lacks, so fakecuda reads these mirrors and decodes every field explicitly.

pub use cuinterpose_abi::consts;
pub use cuinterpose_abi::{
    RawAccessDesc, RawAllocProp, RawLocation, RawMemAllocNodeParams, RawMemcpy3d, RawPoolProps,
};

/// What fakecuda holds for the calling process, for leak checks (not a CUDA API).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FakecudaObjects {
    /// Physical allocations (VMM, cuMemAlloc, imported, IPC-opened) still alive.
    pub allocations: u64,
    /// Mappings (of allocations and multicast objects).
    pub mappings: u64,
    /// Address reservations (the application's and fakecuda's own).
    pub reservations: u64,
    /// Multicast objects still alive.
    pub multicast_objects: u64,
    /// Native IPC handles of peers open here.
    pub ipc_opened: u64,
}
