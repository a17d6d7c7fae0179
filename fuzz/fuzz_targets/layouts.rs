//! The fixed layouts: decode never panics; what decodes encodes back to the same bytes.
#![no_main]

use cuinterpose_protocol as p;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(handle) = p::VirtualShareableHandle::decode(data) {
        assert_eq!(handle.encode().as_slice(), data);
    }
    if let Ok(handle) = p::IpcMemHandle::decode(data) {
        assert_eq!(handle.encode().as_slice(), data);
    }
    if let Ok(handle) = p::PoolPointerHandle::decode(data) {
        assert_eq!(handle.encode().as_slice(), data);
    }
});
