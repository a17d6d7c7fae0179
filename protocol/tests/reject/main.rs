//! Every rejection of the decoders: envelope, strict maps, unions, enums, identities, bounds
//! and layouts. Bad bytes are written by hand with a tiny MessagePack builder.

#[path = "../examples/mod.rs"]
mod examples;

mod bounds;
mod fields;

use cuinterpose_protocol as p;
use p::envelope::{DecodeError, DecodeLimits, decode_with_limits};

/// Hand-written MessagePack.
#[derive(Default)]
struct Mp(Vec<u8>);

impl Mp {
    fn map(mut self, entries: u8) -> Self {
        assert!(entries < 16);
        self.0.push(0x80 | entries);
        self
    }
    fn array(mut self, len: u8) -> Self {
        assert!(len < 16);
        self.0.push(0x90 | len);
        self
    }
    fn str(mut self, text: &str) -> Self {
        assert!(text.len() < 32);
        self.0.push(0xa0 | text.len() as u8);
        self.0.extend_from_slice(text.as_bytes());
        self
    }
    fn uint(mut self, value: u64) -> Self {
        match value {
            0..=0x7f => self.0.push(value as u8),
            _ => {
                self.0.push(0xcf);
                self.0.extend_from_slice(&value.to_be_bytes());
            }
        }
        self
    }
    fn bin(mut self, bytes: &[u8]) -> Self {
        self.0.push(0xc4);
        self.0.push(bytes.len() as u8);
        self.0.extend_from_slice(bytes);
        self
    }
    fn nil(mut self) -> Self {
        self.0.push(0xc0);
        self
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// Wraps the body built so far in an envelope of `version`.
    fn envelope(self, version: u8) -> Vec<u8> {
        let mut out = vec![0x82, 0xa7];
        out.extend_from_slice(b"version");
        out.push(version);
        out.push(0xa4);
        out.extend_from_slice(b"body");
        out.extend_from_slice(&self.0);
        out
    }
    fn wrap(self) -> Vec<u8> {
        self.envelope(p::VERSION)
    }
}

fn reference() -> Mp {
    reference_with(&[0x11; 16], 100)
}

/// An allocation reference of `id` and `creator_pid`, valid or not.
fn reference_with(id: &[u8], creator_pid: u64) -> Mp {
    Mp::default()
        .map(2)
        .str("id")
        .bin(id)
        .str("creator_pid")
        .uint(creator_pid)
}

/// A map of string keys to string values, in order, in an envelope.
fn str_map(entries: &[(&str, &str)]) -> Vec<u8> {
    let len = u8::try_from(entries.len()).expect("a short map");
    entries
        .iter()
        .fold(Mp::default().map(len), |mp, (key, value)| {
            mp.str(key).str(value)
        })
        .wrap()
}

/// An inspection reply's fields up to its `records` key (namespace pid 1, active, no raw
/// imports); the records array comes next.
fn inspection_until_records() -> Mp {
    Mp::default()
        .map(6)
        .str("kind")
        .str("inspection")
        .str("namespace_pid")
        .uint(1)
        .str("phase")
        .str("active")
        .str("raw_imports")
        .uint(0)
        .str("records")
}

/// Decodes `bytes` as `M` and asserts a malformed-body error whose text contains `needle`.
fn check_malformed<M: p::Message + std::fmt::Debug>(bytes: &[u8], needle: &str) {
    check_malformed_case::<M>("", bytes, needle);
}

/// [`check_malformed`] of one case of a table, its failure messages starting with `case`.
fn check_malformed_case<M: p::Message + std::fmt::Debug>(case: &str, bytes: &[u8], needle: &str) {
    match p::decode::<M>(bytes) {
        Err(DecodeError::Malformed { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "{case}`{reason}` should mention `{needle}`"
            )
        }
        other => {
            panic!("{case}expected a malformed-body error mentioning `{needle}`, got {other:?}")
        }
    }
}

#[test]
fn valid_hand_built_request_decodes() {
    let bytes = str_map(&[("kind", "inspect")]);
    assert_eq!(p::decode::<p::Request>(&bytes), Ok(p::Request::Inspect));
}

#[test]
fn older_and_newer_versions_are_rejected() {
    for version in [p::VERSION - 1, p::VERSION + 1] {
        let bytes = Mp::default()
            .map(1)
            .str("kind")
            .str("inspect")
            .envelope(version);
        assert_eq!(
            p::decode::<p::Request>(&bytes),
            Err(DecodeError::Version {
                message: "Request",
                found: version,
                expected: p::VERSION
            })
        );
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut bytes = p::encode(&p::Request::Inspect).expect("encodes");
    bytes.push(0);
    assert_eq!(
        p::decode::<p::Request>(&bytes),
        Err(DecodeError::Trailing {
            message: "Request",
            count: 1
        })
    );
}

#[test]
fn non_envelopes_are_rejected() {
    for bytes in [
        &[][..],
        &[0xc1],
        &[0x81, 0xa4, b'b', b'o', b'd', b'y', 0x80],
    ] {
        assert_eq!(
            p::decode::<p::Request>(bytes),
            Err(DecodeError::NotEnvelope { message: "Request" })
        );
    }
}

#[test]
fn oversized_input_is_rejected_before_parsing() {
    let bytes = vec![0u8; p::MAX_TICKET_BYTES + 1];
    assert_eq!(
        p::decode::<p::Ticket>(&bytes),
        Err(DecodeError::Oversized {
            message: "Ticket",
            size: p::MAX_TICKET_BYTES + 1,
            limit: p::MAX_TICKET_BYTES
        })
    );
}

#[test]
fn truncated_body_is_rejected() {
    let bytes = p::encode(&examples::replies()[0].1).expect("encodes");
    for cut in [16, bytes.len() / 2, bytes.len() - 1] {
        assert!(matches!(
            p::decode::<p::Reply>(&bytes[..cut]),
            Err(DecodeError::Malformed { .. })
        ));
    }
}
