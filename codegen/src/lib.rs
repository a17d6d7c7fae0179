//! `cuinterpose-codegen`: compiles `schema/protocol.ron` into Rust and a Markdown reference.
//!
//! The compiler is a pipeline: [`parse`] (RON, with `file:line:column` errors) →
//! [`lower`](lower::lower) (semantic validation into the [`ir`]) → emitters ([`rust`],
//! [`markdown`]). [`compat`] compares two schemas for wire-visible changes. Nothing here knows
//! about sockets or CUDA calls.

pub mod ast;
pub mod compat;
pub mod diag;
pub mod emit_doc;
pub mod emit_rust;
pub mod ir;
pub mod lower;
pub mod source;

use diag::{Diagnostic, Diagnostics, Position};
use source::SourceMap;

/// Parses RON into the syntax tree; a syntax error points at its line and column.
pub fn parse(path: &str, text: &str) -> Result<ast::Schema, Diagnostics> {
    ron::Options::default()
        .from_str::<ast::Schema>(text)
        .map_err(|error| {
            Diagnostics(vec![Diagnostic {
                path: path.to_owned(),
                position: Position {
                    line: error.span.start.line,
                    column: error.span.start.col,
                },
                message: error.code.to_string(),
            }])
        })
}

/// Parses and validates a schema.
pub fn compile(path: &str, text: &str) -> Result<ir::Ir, Diagnostics> {
    let schema = parse(path, text)?;
    lower::lower(&schema, &SourceMap::new(path, text))
}

/// Reads and compiles a schema file.
pub fn compile_file(path: &std::path::Path) -> Result<ir::Ir, Diagnostics> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| {
        Diagnostics(vec![Diagnostic {
            path: display.clone(),
            position: Position { line: 1, column: 1 },
            message: format!("cannot read schema: {error}"),
        }])
    })?;
    compile(&display, &text)
}

pub use compat::compat;
pub use emit_doc::markdown;
pub use emit_rust::rust;
