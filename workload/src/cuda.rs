//! The little of cuda.h the worker needs, from the workspace's one definition of the driver
//! ABI (`cuinterpose-abi`): result codes, constants and `#[repr(C)]` structs. Enum-typed values
//! (results, handle types, location types) are plain integers: a value a newer driver invents
//! must never be undefined behaviour.

pub use cuinterpose_abi::consts::*;
pub use cuinterpose_abi::results::{
    CUDA_ERROR_ALREADY_MAPPED as ALREADY_MAPPED, CUDA_ERROR_ILLEGAL_ADDRESS as ILLEGAL_ADDRESS,
    CUDA_ERROR_ILLEGAL_STATE as ILLEGAL_STATE, CUDA_ERROR_INVALID_CONTEXT as INVALID_CONTEXT,
    CUDA_ERROR_INVALID_DEVICE as INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE as INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE as INVALID_VALUE, CUDA_ERROR_NOT_FOUND as NOT_FOUND,
    CUDA_ERROR_NOT_INITIALIZED as NOT_INITIALIZED, CUDA_ERROR_NOT_PERMITTED as NOT_PERMITTED,
    CUDA_ERROR_NOT_READY as NOT_READY, CUDA_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY as OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN as UNKNOWN,
    CUDA_SUCCESS as SUCCESS,
};
pub use cuinterpose_abi::{
    RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMulticastProp,
};

/// The CUDA name of a driver result, for every code the headers declare.
pub fn error_name(code: u32) -> Option<&'static str> {
    cuinterpose_abi::results::name(code)
}

/// [`error_name`], or `CUDA_ERROR_<code>` for a value outside the table.
pub fn error_name_or_code(code: u32) -> String {
    error_name(code).map_or_else(|| format!("CUDA_ERROR_{code}"), str::to_owned)
}
