//! Reading RON input files (the schema, the entry-point policy) with `file:line:column`
//! syntax errors.

use crate::diag::{Diagnostic, Diagnostics, Position};

/// Parses any RON input file (the schema, the entry-point policy); a syntax error points at
/// its line and column.
pub fn parse_ron<T: serde::de::DeserializeOwned>(path: &str, text: &str) -> Result<T, Diagnostics> {
    ron::Options::default()
        .from_str::<T>(text)
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
