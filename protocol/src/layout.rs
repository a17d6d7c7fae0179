//! Runtime of the generated fixed byte layouts.

use crate::error::IdentityError;

/// Why bytes are not a valid instance of a fixed layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{layout}: expected {expected} bytes, found {found}")]
    Length {
        layout: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{layout}: wrong magic {found:02x?}")]
    Magic {
        layout: &'static str,
        found: Vec<u8>,
    },
    #[error("{layout}: unsupported protocol version {found} (this build speaks {expected})")]
    Version {
        layout: &'static str,
        found: u8,
        expected: u8,
    },
    #[error("{layout}: reserved field `{field}` has a non-zero byte at offset {offset}")]
    Reserved {
        layout: &'static str,
        field: &'static str,
        offset: usize,
    },
    #[error("{layout}: field `{field}`: {reason}")]
    Field {
        layout: &'static str,
        field: &'static str,
        reason: String,
    },
}

/// A generated layout: fixed size, versioned, self-checking.
pub trait FixedLayout: Sized {
    const NAME: &'static str;
    const SIZE: usize;
    fn encode_vec(&self) -> Vec<u8>;
    fn decode_bytes(bytes: &[u8]) -> Result<Self, LayoutError>;
}

/// A value stored little-endian in a fixed number of bytes.
pub trait FixedField: Sized {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Result<Self, IdentityError>;
    fn write(&self, out: &mut [u8]);
}

macro_rules! fixed_integer {
    ($($ty:ty),*) => {$(
        impl FixedField for $ty {
            const SIZE: usize = size_of::<$ty>();
            fn read(bytes: &[u8]) -> Result<Self, IdentityError> {
                let array = bytes.try_into().map_err(|_| IdentityError::Length {
                    identity: stringify!($ty),
                    expected: Self::SIZE,
                    found: bytes.len(),
                })?;
                Ok(<$ty>::from_le_bytes(array))
            }
            fn write(&self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
fixed_integer!(u8, u16, u32, u64, i32, i64);

macro_rules! fixed_nonzero {
    ($($ty:ty => $raw:ty),*) => {$(
        impl FixedField for $ty {
            const SIZE: usize = size_of::<$raw>();
            fn read(bytes: &[u8]) -> Result<Self, IdentityError> {
                <$ty>::new(<$raw as FixedField>::read(bytes)?)
                    .ok_or(IdentityError::Zero { identity: stringify!($raw) })
            }
            fn write(&self, out: &mut [u8]) {
                self.get().write(out)
            }
        }
    )*};
}
fixed_nonzero!(
    core::num::NonZeroU16 => u16,
    core::num::NonZeroU32 => u32,
    core::num::NonZeroU64 => u64
);

pub fn exact<'a, const N: usize>(
    layout: &'static str,
    bytes: &'a [u8],
) -> Result<&'a [u8; N], LayoutError> {
    bytes.try_into().map_err(|_| LayoutError::Length {
        layout,
        expected: N,
        found: bytes.len(),
    })
}

pub fn check_magic(layout: &'static str, found: &[u8], magic: &[u8]) -> Result<(), LayoutError> {
    if found == magic {
        Ok(())
    } else {
        Err(LayoutError::Magic {
            layout,
            found: found.to_vec(),
        })
    }
}

/// Digits of a `VersionDigit` field: versions 0-9 as `0`-`9`, 10-35 as `A`-`Z` (the
/// generator refuses a larger version).
const VERSION_DIGITS: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The ASCII digit that writes `version` in a fixed layout.
pub const fn version_digit(version: u8) -> u8 {
    VERSION_DIGITS[version as usize]
}

/// The version an ASCII digit writes; `u8::MAX` (never a version) for any other byte.
pub fn digit_version(digit: u8) -> u8 {
    VERSION_DIGITS
        .iter()
        .position(|&d| d == digit)
        .map_or(u8::MAX, |n| n as u8)
}

pub fn check_version(layout: &'static str, found: u8, expected: u8) -> Result<(), LayoutError> {
    if found == expected {
        Ok(())
    } else {
        Err(LayoutError::Version {
            layout,
            found,
            expected,
        })
    }
}

pub fn check_reserved(
    layout: &'static str,
    field: &'static str,
    start: usize,
    bytes: &[u8],
) -> Result<(), LayoutError> {
    match bytes.iter().position(|&byte| byte != 0) {
        None => Ok(()),
        Some(index) => Err(LayoutError::Reserved {
            layout,
            field,
            offset: start + index,
        }),
    }
}

pub fn read_field<T: FixedField>(
    layout: &'static str,
    field: &'static str,
    bytes: &[u8],
) -> Result<T, LayoutError> {
    T::read(bytes).map_err(|error| LayoutError::Field {
        layout,
        field,
        reason: error.to_string(),
    })
}
