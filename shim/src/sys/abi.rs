//! The driver ABI (C-layout structs of plain integers, constants, results), from the
//! workspace's one definition in `cuinterpose-abi`.

pub use cuinterpose_abi::{
    RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMulticastProp, RawPoolProps,
};
pub use cuinterpose_abi::{consts, results};
