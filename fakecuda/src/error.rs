//! CUDA result codes as plain integers.
//!
//! cudarc's `CUresult` is a Rust enum: reading a value that came from C into it would be
//! undefined behaviour for an unknown code. Internally fakecuda carries `CuError` (a checked
//! non-success code) and converts to a raw `u32` only at the ABI edge.

use cudarc::driver::sys::CUresult;

/// The raw value an entry point returns.
pub type RawResult = u32;

pub const CUDA_SUCCESS: RawResult = CUresult::CUDA_SUCCESS as u32;

/// A CUDA error code other than `CUDA_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuError(RawResult);

/// Result of every piece of logic behind an entry point.
pub type CuResult<T> = Result<T, CuError>;

macro_rules! codes {
    ($($name:ident),* $(,)?) => {
        // Named here: the codes fakecuda's logic returns.
        impl CuError {
            $(pub const $name: CuError = CuError(CUresult::$name as u32);)*
        }
    };
}

codes!(
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT,
    CUDA_ERROR_MAP_FAILED,
    CUDA_ERROR_UNMAP_FAILED,
    CUDA_ERROR_ALREADY_MAPPED,
    CUDA_ERROR_NOT_MAPPED,
    CUDA_ERROR_OPERATING_SYSTEM,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
    CUDA_ERROR_TIMEOUT,
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_INVALID_RESOURCE_TYPE,
    CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
    CUDA_ERROR_UNKNOWN,
);

impl CuError {
    pub fn raw(self) -> RawResult {
        self.0
    }

    /// Decodes a raw code received from another process; `None` for success.
    pub fn from_raw(raw: RawResult) -> Option<CuError> {
        (raw != CUDA_SUCCESS).then_some(CuError(raw))
    }
}

impl std::fmt::Display for CuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match error_name(self.0) {
            Some(name) => write!(f, "{} ({})", name.to_string_lossy(), self.0),
            None => write!(f, "CUDA error {}", self.0),
        }
    }
}

impl From<nix::Error> for CuError {
    /// Host resource exhaustion reads as the device running out of memory, anything else as
    /// an operating-system failure, as the real driver reports them.
    fn from(e: nix::Error) -> Self {
        match e {
            nix::Error::ENOMEM | nix::Error::ENOSPC | nix::Error::EMFILE | nix::Error::ENFILE => {
                CuError::CUDA_ERROR_OUT_OF_MEMORY
            }
            _ => CuError::CUDA_ERROR_OPERATING_SYSTEM,
        }
    }
}

/// Converts a logic result into the ABI value.
pub fn to_raw(r: CuResult<()>) -> RawResult {
    match r {
        Ok(()) => CUDA_SUCCESS,
        Err(e) => e.0,
    }
}

/// CUDA's name of any result the driver headers declare (the whole table, generated from
/// cudarc's bindings into `cuinterpose-abi`).
pub fn error_name(raw: RawResult) -> Option<&'static std::ffi::CStr> {
    cuinterpose_abi::results::c_name(raw)
}

/// Human-readable descriptions, worded after the driver's own strings.
pub fn error_string(raw: RawResult) -> Option<&'static std::ffi::CStr> {
    let known = error_name(raw)?;
    let s: &'static std::ffi::CStr = match raw {
        CUDA_SUCCESS => c"no error",
        x if x == CuError::CUDA_ERROR_INVALID_VALUE.0 => c"invalid argument",
        x if x == CuError::CUDA_ERROR_OUT_OF_MEMORY.0 => c"out of memory",
        x if x == CuError::CUDA_ERROR_NOT_INITIALIZED.0 => c"initialization error",
        x if x == CuError::CUDA_ERROR_DEINITIALIZED.0 => c"driver shutting down",
        x if x == CuError::CUDA_ERROR_NO_DEVICE.0 => c"no CUDA-capable device is detected",
        x if x == CuError::CUDA_ERROR_INVALID_DEVICE.0 => c"invalid device ordinal",
        x if x == CuError::CUDA_ERROR_INVALID_CONTEXT.0 => c"invalid device context",
        x if x == CuError::CUDA_ERROR_CONTEXT_ALREADY_CURRENT.0 => c"context already current",
        x if x == CuError::CUDA_ERROR_MAP_FAILED.0 => c"mapping of buffer object failed",
        x if x == CuError::CUDA_ERROR_UNMAP_FAILED.0 => c"unmapping of buffer object failed",
        x if x == CuError::CUDA_ERROR_ALREADY_MAPPED.0 => c"resource already mapped",
        x if x == CuError::CUDA_ERROR_NOT_MAPPED.0 => c"resource not mapped",
        x if x == CuError::CUDA_ERROR_OPERATING_SYSTEM.0 => {
            c"OS call failed or operation not supported on this OS"
        }
        x if x == CuError::CUDA_ERROR_INVALID_HANDLE.0 => c"invalid resource handle",
        x if x == CuError::CUDA_ERROR_ILLEGAL_STATE.0 => {
            c"the operation cannot be performed in the present state"
        }
        x if x == CuError::CUDA_ERROR_NOT_FOUND.0 => c"named symbol not found",
        x if x == CuError::CUDA_ERROR_NOT_READY.0 => c"device not ready",
        x if x == CuError::CUDA_ERROR_ILLEGAL_ADDRESS.0 => {
            c"an illegal memory access was encountered"
        }
        x if x == CuError::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.0 => {
            c"part or all of the requested memory range is already mapped"
        }
        x if x == CuError::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED.0 => {
            c"pointer does not correspond to a registered memory region"
        }
        x if x == CuError::CUDA_ERROR_NOT_PERMITTED.0 => c"operation not permitted",
        x if x == CuError::CUDA_ERROR_NOT_SUPPORTED.0 => c"operation not supported",
        x if x == CuError::CUDA_ERROR_TIMEOUT.0 => c"timeout occurred",
        _ => known,
    };
    Some(s)
}
