//! The envelope `{"version": VERSION, "body": BODY}` around every message, and the size- and
//! depth-limited encoder and decoder.
//!
//! The envelope's prefix is fixed bytes (a two-entry map, the key `version`, the version as a
//! positive fixint, the key `body`), so a decoder reads the version before touching the body
//! and reports a version mismatch as such instead of as a confusing body error.

use std::io::{self, Cursor, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::generated::{MAX_DEPTH, VERSION};

/// A generated message body: what may travel in an envelope, and its byte limit.
pub trait Message: Serialize + DeserializeOwned {
    const NAME: &'static str;
    /// Largest encoded envelope (prefix included).
    const MAX_BYTES: usize;
    /// MessagePack nesting of the body at its deepest (checked against MAX_DEPTH by codegen).
    const DEPTH: usize;
}

/// Length of the fixed envelope prefix.
pub const PREFIX_LEN: usize = 15;

fn prefix(version: u8) -> [u8; PREFIX_LEN] {
    let mut bytes = [0u8; PREFIX_LEN];
    bytes[0] = 0x82; // map of two entries
    bytes[1] = 0xa7; // fixstr of 7 bytes
    bytes[2..9].copy_from_slice(b"version");
    bytes[9] = version; // positive fixint (codegen keeps VERSION in 1..=127)
    bytes[10] = 0xa4; // fixstr of 4 bytes
    bytes[11..15].copy_from_slice(b"body");
    bytes
}

/// Whether `bytes` start with an envelope prefix of any version: how a decoder tells our
/// bytes (perhaps of another version) from foreign ones, e.g. a ticket from a driver FD.
pub fn has_envelope_prefix(bytes: &[u8]) -> bool {
    let expected = prefix(VERSION);
    bytes.len() >= PREFIX_LEN
        && bytes[..9] == expected[..9]
        && bytes[10..PREFIX_LEN] == expected[10..]
}

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{message}: encoding exceeds the limit of {limit} bytes")]
    Oversized { message: &'static str, limit: usize },
    #[error("{message}: {reason}")]
    Invalid {
        message: &'static str,
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{message}: {size} bytes exceed the limit of {limit}")]
    Oversized {
        message: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("{message}: not an envelope (expected a map of `version` and `body`)")]
    NotEnvelope { message: &'static str },
    #[error("{message}: unsupported protocol version {found} (this build speaks {expected})")]
    Version {
        message: &'static str,
        found: u8,
        expected: u8,
    },
    #[error("{message}: nesting deeper than {limit} levels")]
    TooDeep { message: &'static str, limit: usize },
    #[error("{message}: {count} trailing bytes after the body")]
    Trailing { message: &'static str, count: usize },
    #[error("{message}: malformed body: {reason}")]
    Malformed {
        message: &'static str,
        reason: String,
    },
}

/// A writer that refuses to grow past a budget: an oversized message fails when it crosses
/// the limit, before a larger buffer exists.
#[derive(Debug)]
pub struct BudgetWriter {
    buffer: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl BudgetWriter {
    pub fn new(limit: usize) -> Self {
        Self {
            buffer: Vec::new(),
            limit,
            exceeded: false,
        }
    }

    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    pub fn into_inner(self) -> Vec<u8> {
        self.buffer
    }
}

impl Write for BudgetWriter {
    // Called for every marker and field rmp-serde writes: worth inlining into the encoders.
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.buffer.len() + bytes.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "message size limit reached",
            ));
        }
        // Grow geometrically but never past the budget.
        if self.buffer.capacity() - self.buffer.len() < bytes.len() {
            let wanted = (self.buffer.len() + bytes.len())
                .max(self.buffer.capacity() * 2)
                .max(256)
                .min(self.limit);
            self.buffer.reserve_exact(wanted - self.buffer.len());
        }
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    // `write` takes everything or fails, so this is `write`, inlined as well.
    #[inline]
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write(bytes).map(drop)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Encodes `body` in an envelope, failing as soon as `M::MAX_BYTES` is crossed.
pub fn encode<M: Message>(body: &M) -> Result<Vec<u8>, EncodeError> {
    encode_with_limit(body, M::MAX_BYTES)
}

/// Like [`encode`] with an explicit byte budget (tests and transports with smaller frames).
pub fn encode_with_limit<M: Message>(body: &M, limit: usize) -> Result<Vec<u8>, EncodeError> {
    let mut writer = BudgetWriter::new(limit);
    let oversized = EncodeError::Oversized {
        message: M::NAME,
        limit,
    };
    if writer.write_all(&prefix(VERSION)).is_err() {
        return Err(oversized);
    }
    let mut serializer = rmp_serde::Serializer::new(&mut writer).with_struct_map();
    match body.serialize(&mut serializer) {
        Ok(()) => Ok(writer.into_inner()),
        Err(_) if writer.exceeded() => Err(oversized),
        Err(error) => Err(EncodeError::Invalid {
            message: M::NAME,
            reason: error.to_string(),
        }),
    }
}

/// Decoder settings; [`decode`] uses the schema's limits.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    pub max_bytes: usize,
    /// Nesting levels of maps and arrays allowed in the body.
    pub max_depth: usize,
}

/// Decodes an envelope holding an `M`: size, version, depth and trailing bytes are checked.
pub fn decode<M: Message>(bytes: &[u8]) -> Result<M, DecodeError> {
    decode_with_limits(
        bytes,
        DecodeLimits {
            max_bytes: M::MAX_BYTES,
            max_depth: MAX_DEPTH,
        },
    )
}

pub fn decode_with_limits<M: Message>(
    bytes: &[u8],
    limits: DecodeLimits,
) -> Result<M, DecodeError> {
    let message = M::NAME;
    if bytes.len() > limits.max_bytes {
        return Err(DecodeError::Oversized {
            message,
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    if !has_envelope_prefix(bytes) {
        return Err(DecodeError::NotEnvelope { message });
    }
    if bytes[9] != VERSION {
        return Err(DecodeError::Version {
            message,
            found: bytes[9],
            expected: VERSION,
        });
    }
    let body = &bytes[PREFIX_LEN..];
    // The fast path borrows strings and byte strings from `body` instead of copying each one
    // through a reader; it cannot say where the body ended, so a value followed by anything
    // is decoded again through a cursor, which counts the trailing bytes for the error.
    let mut borrowed = rmp_serde::Deserializer::from_read_ref(body);
    borrowed.set_max_depth(limits.max_depth + 1);
    if let Ok(value) = M::deserialize(&mut borrowed)
        && matches!(
            <serde::de::IgnoredAny as serde::Deserialize>::deserialize(&mut borrowed),
            Err(rmp_serde::decode::Error::InvalidMarkerRead(ref e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof
        )
    {
        return Ok(value);
    }
    let mut deserializer = rmp_serde::Deserializer::new(Cursor::new(body));
    // rmp-serde fails when its counter reaches zero, so allow one more than the levels.
    deserializer.set_max_depth(limits.max_depth + 1);
    let value = match M::deserialize(&mut deserializer) {
        Ok(value) => value,
        Err(rmp_serde::decode::Error::DepthLimitExceeded) => {
            return Err(DecodeError::TooDeep {
                message,
                limit: limits.max_depth,
            });
        }
        Err(error) => {
            return Err(DecodeError::Malformed {
                message,
                reason: error.to_string(),
            });
        }
    };
    let consumed = deserializer.position() as usize;
    if consumed != body.len() {
        return Err(DecodeError::Trailing {
            message,
            count: body.len() - consumed,
        });
    }
    Ok(value)
}
