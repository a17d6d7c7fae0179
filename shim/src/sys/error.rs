//! CUDA result codes as the shim returns them: raw integers at the FFI edge, a newtype inside.

/// A CUDA driver error code (never `CUDA_SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuError(pub u32);

pub type CuResult<T> = Result<T, CuError>;

use cuinterpose_abi::results as r;

pub const CUDA_SUCCESS: u32 = r::CUDA_SUCCESS;

macro_rules! codes {
    ($($name:ident = $code:ident,)*) => {
        impl CuError {
            $(pub const $name: CuError = CuError(r::$code);)*
        }
    };
}

codes! {
    INVALID_VALUE = CUDA_ERROR_INVALID_VALUE,
    OUT_OF_MEMORY = CUDA_ERROR_OUT_OF_MEMORY,
    NOT_INITIALIZED = CUDA_ERROR_NOT_INITIALIZED,
    INVALID_CONTEXT = CUDA_ERROR_INVALID_CONTEXT,
    ALREADY_MAPPED = CUDA_ERROR_ALREADY_MAPPED,
    INVALID_SOURCE = CUDA_ERROR_INVALID_SOURCE,
    OPERATING_SYSTEM = CUDA_ERROR_OPERATING_SYSTEM,
    INVALID_HANDLE = CUDA_ERROR_INVALID_HANDLE,
    ILLEGAL_STATE = CUDA_ERROR_ILLEGAL_STATE,
    NOT_FOUND = CUDA_ERROR_NOT_FOUND,
    NOT_READY = CUDA_ERROR_NOT_READY,
    NOT_PERMITTED = CUDA_ERROR_NOT_PERMITTED,
    NOT_SUPPORTED = CUDA_ERROR_NOT_SUPPORTED,
    UNKNOWN = CUDA_ERROR_UNKNOWN,
}

/// CUDA's name for a code, for log lines.
pub fn error_name(raw: u32) -> &'static str {
    r::name(raw).unwrap_or("CUDA_ERROR_(unnamed)")
}

impl CuError {
    /// `Err` for a non-success raw code.
    pub fn check(raw: u32) -> CuResult<()> {
        if raw == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CuError(raw))
        }
    }
}

impl std::fmt::Display for CuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", error_name(self.0), self.0)
    }
}

/// The ABI value of a logic result.
pub fn to_raw(result: CuResult<()>) -> u32 {
    match result {
        Ok(()) => CUDA_SUCCESS,
        Err(error) => error.0,
    }
}
