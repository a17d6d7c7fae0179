//! The schema compiler on arbitrary text: parse and validate never panic, and a schema that
//! compiles also emits Rust and Markdown.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ir) = cuinterpose_codegen::compile("fuzz.ron", text) {
        let _ = cuinterpose_codegen::rust(&ir);
        let _ = cuinterpose_codegen::markdown(&ir);
    }
});
