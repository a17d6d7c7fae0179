//! Errors of the value domains: enums, identities.

/// A CUDA-mirroring or protocol enum value that is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnumError {
    #[error("{domain}: value {value} is rejected ({cuda}): {reason}")]
    Rejected {
        domain: &'static str,
        value: u32,
        cuda: &'static str,
        reason: &'static str,
    },
    #[error("{domain}: unknown value {value}")]
    Unknown { domain: &'static str, value: u32 },
    #[error("{domain}: unknown bits {unknown:#x} in {value:#x}")]
    UnknownBits {
        domain: &'static str,
        value: u32,
        unknown: u32,
    },
    #[error("{domain}: unknown name `{name}` (expected one of: {expected})")]
    UnknownName {
        domain: &'static str,
        name: String,
        expected: String,
    },
}

/// An identity value that names nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("{identity} must not be zero")]
    Zero { identity: &'static str },
    #[error("{identity} must be {expected} bytes, found {found}")]
    Length {
        identity: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{identity}: `{text}` is not {expected}")]
    Text {
        identity: &'static str,
        text: String,
        expected: &'static str,
    },
}
