//! What the schema tests share: edits of a base schema, the `/*@*/` marker that says where a
//! diagnostic must point, and the assertion that one does.
#![allow(dead_code)]

use cuinterpose_codegen::compile;

/// How every test schema begins: version 1 and the limits the compiler requires (a base schema
/// goes on with more limits or the closing `],`).
#[macro_export]
macro_rules! schema_head {
    () => {
        r#"#![enable(implicit_some)]
Schema(
    version: 1,
    limits: [
        (name: "MAX_MESSAGE_BYTES", value: 1024, doc: "m"),
        (name: "MAX_TICKET_BYTES", value: 64, doc: "t"),
        (name: "MAX_DEPTH", value: 8, doc: "d"),
"#
    };
}

/// `base` with each `(from, to)` applied in turn; each `from` must occur exactly once.
pub fn edit(base: &str, edits: &[(&str, &str)]) -> String {
    let mut text = base.to_owned();
    for (from, to) in edits {
        assert_eq!(
            text.matches(from).count(),
            1,
            "edit anchor `{from}` must be unique"
        );
        text = text.replacen(from, to, 1);
    }
    text
}

/// Line and column (1-based) right after the `/*@*/` marker.
pub fn marker(text: &str) -> (usize, usize) {
    let at = text
        .find("/*@*/")
        .expect("the edited schema marks the error position")
        + 5;
    let line = text[..at].matches('\n').count() + 1;
    let column = text[..at].rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

/// `text` (as `test.ron`) fails to compile, one diagnostic being `message` at `(line, column)`.
pub fn assert_diagnostic(text: &str, (line, column): (usize, usize), message: &str) {
    let expected = format!("test.ron:{line}:{column}: {message}");
    match compile("test.ron", text) {
        Ok(_) => panic!("schema compiled, expected `{expected}`"),
        Err(diagnostics) => {
            let all: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
            assert!(
                all.contains(&expected),
                "expected `{expected}`, got:\n{}",
                all.join("\n")
            );
        }
    }
}
