//! Envelope decode of a `Request`: never panics, never exceeds the memory bound, and whatever
//! decodes re-encodes to bytes that decode to the same value.
#![no_main]

use cuinterpose_protocol as p;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = p::decode::<p::Request>(data) {
        let bytes = p::encode(&value).expect("a decoded value re-encodes");
        let again = p::decode::<p::Request>(&bytes).expect("re-encoded bytes decode");
        assert_eq!(again, value);
    }
});
