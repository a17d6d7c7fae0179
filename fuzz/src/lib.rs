//! What the envelope targets share: the round trip every decoded message must survive.

use cuinterpose_protocol as p;

/// Decodes `data` as an `M`; whatever decodes must re-encode to bytes that decode to the same
/// value. Decoding itself must never panic nor exceed the memory bound (libFuzzer checks both).
pub fn round_trip<M: p::Message + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(value) = p::decode::<M>(data) {
        let bytes = p::encode(&value).expect("a decoded value re-encodes");
        let again = p::decode::<M>(&bytes).expect("re-encoded bytes decode");
        assert_eq!(again, value);
    }
}
