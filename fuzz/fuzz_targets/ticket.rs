//! Envelope decode of a `Ticket`: never panics, never exceeds the memory bound, and whatever
//! decodes re-encodes to bytes that decode to the same value.
#![no_main]

use cuinterpose_protocol as p;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cuinterpose_fuzz::round_trip::<p::Ticket>(data));
