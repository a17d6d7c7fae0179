//! The driver ABI fakecuda reads and writes (C-layout structs of plain integers, constants),
//! from the workspace's one definition in `cuinterpose-abi`: reading a struct from C memory
//! straight into cudarc's type would be undefined behaviour when a field holds a value the
//! enum lacks, so fakecuda reads these mirrors and decodes every field explicitly.

pub use cuinterpose_abi::consts;
pub use cuinterpose_abi::{
    RawAccessDesc, RawAllocProp, RawLocation, RawMemAllocNodeParams, RawMemcpy3d, RawPoolProps,
};
