//! Regenerates the protocol types from the schema whenever the schema changes.

use std::path::PathBuf;

/// How the schema is named in diagnostics and in the generated header: relative to the
/// repository root, so output does not depend on where the repository is checked out.
const SCHEMA: &str = "schema/protocol.ron";

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let schema = manifest.join("..").join(SCHEMA);
    println!("cargo:rerun-if-changed={}", schema.display());
    let fail = |message: String| -> ! {
        eprintln!("{message}");
        std::process::exit(1);
    };
    let text = std::fs::read_to_string(&schema)
        .unwrap_or_else(|error| fail(format!("cannot read {}: {error}", schema.display())));
    let ir = cuinterpose_codegen::compile(SCHEMA, &text).unwrap_or_else(|diagnostics| {
        for diagnostic in diagnostics.iter() {
            println!("cargo:warning={diagnostic}");
        }
        fail(diagnostics.to_string())
    });
    let rust = cuinterpose_codegen::rust(&ir)
        .unwrap_or_else(|error| fail(format!("code generation failed: {error}")));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("protocol.rs");
    std::fs::write(&out, rust)
        .unwrap_or_else(|error| fail(format!("cannot write {}: {error}", out.display())));
}
