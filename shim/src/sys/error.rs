//! CUDA result codes as the shim returns them: raw integers at the FFI edge, a newtype inside.

/// A CUDA driver error code (never `CUDA_SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuError(pub u32);

pub type CuResult<T> = Result<T, CuError>;

pub const CUDA_SUCCESS: u32 = 0;

macro_rules! codes {
    ($($name:ident = $value:literal,)*) => {
        impl CuError {
            $(pub const $name: CuError = CuError($value);)*
        }
        /// CUDA's name for a code, for log lines.
        pub fn error_name(raw: u32) -> &'static str {
            match raw {
                0 => "CUDA_SUCCESS",
                $($value => concat!("CUDA_ERROR_", stringify!($name)),)*
                _ => "CUDA_ERROR_(unnamed)",
            }
        }
    };
}

codes! {
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_CONTEXT = 201,
    ALREADY_MAPPED = 208,
    INVALID_SOURCE = 300,
    OPERATING_SYSTEM = 304,
    INVALID_HANDLE = 400,
    ILLEGAL_STATE = 401,
    NOT_FOUND = 500,
    NOT_READY = 600,
    NOT_PERMITTED = 800,
    NOT_SUPPORTED = 801,
    UNKNOWN = 999,
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
