//! The generated Rust and Markdown for the project's schema, pinned in `snapshots/`.

use cuinterpose_codegen::{compile, markdown, rust};

fn schema() -> cuinterpose_codegen::ir::Ir {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/protocol.ron"
    ))
    .expect("schema is readable");
    compile("schema/protocol.ron", &text).expect("schema is valid")
}

fn check(name: &str, content: &str) {
    insta::with_settings!({
        snapshot_path => "../../snapshots",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, content);
    });
}

#[test]
fn generated_rust() {
    let ir = schema();
    let first = rust(&ir).expect("emits");
    assert_eq!(first, rust(&ir).expect("emits"), "output is deterministic");
    check("generated_rust", &first);
}

#[test]
fn protocol_reference_markdown() {
    let ir = schema();
    check("protocol_reference", &markdown(&ir).expect("renders"));
}
