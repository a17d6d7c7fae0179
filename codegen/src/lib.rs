//! `cuinterpose-codegen`: compiles `schema/protocol.ron` into Rust and a Markdown reference.
//!
//! The compiler is a pipeline: [`parse`] (RON, with `file:line:column` errors) →
//! [`lower`](lower::lower) (semantic validation into the [`ir`]) → emitters ([`rust`],
//! [`markdown`]). [`compat`] compares two schemas for wire-visible changes. Nothing here knows
//! about sockets or CUDA calls.

#![forbid(unsafe_code)]

// Floors, top to bottom: each module imports only from those below it (the tidy test).
// 1. The driver entry points' generator (its own input, the same diagnostics).
#[cfg(feature = "entry-points")]
pub mod entry_points;
// 2. The emitters.
#[cfg(feature = "markdown")]
pub mod emit_doc;
pub mod emit_rust;
// 3. The schemas' comparison.
pub mod compat;
// 4. Semantic validation into the IR.
pub mod lower;
// 5. The IR.
pub mod ir;
// 6. The syntax tree.
pub mod ast;
// 7. Reading RON input, source positions.
pub mod input;
pub mod source;
// 8. Diagnostics.
pub mod diag;

use diag::{Diagnostic, Diagnostics, Position};
pub use input::parse_ron;
use source::SourceMap;

/// Parses RON into the syntax tree; a syntax error points at its line and column.
pub fn parse(path: &str, text: &str) -> Result<ast::Schema, Diagnostics> {
    parse_ron(path, text)
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
#[cfg(feature = "markdown")]
pub use emit_doc::markdown;
pub use emit_rust::rust;

/// The committed location of the generated pass-throughs, relative to the workspace.
pub const ENTRY_POINTS_OUTPUT: &str = "shim/src/ffi/pass_throughs.rs";
/// The committed location of the generated table of every entry point's function.
pub const ENTRY_WRAPPERS_OUTPUT: &str = "shim/src/ffi/generated.rs";
/// The committed location of the generated entry-point names, relative to the workspace.
pub const ENTRY_NAMES_OUTPUT: &str = "shim/src/sys/entries.rs";
/// The committed location of the generated `CUresult` table, relative to the workspace.
pub const RESULTS_OUTPUT: &str = "abi/src/results.rs";
/// The entry-point policy, relative to the workspace.
pub const ENTRY_POINTS_POLICY: &str = "schema/entry_points.ron";

#[cfg(feature = "entry-points")]
/// cudarc's driver bindings as this workspace locks them: `(path, version)`, found through
/// `cargo metadata` (so the table follows `Cargo.lock`).
pub fn locate_cudarc(workspace: &std::path::Path) -> Result<(std::path::PathBuf, String), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(workspace)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let package = metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "cudarc"))
        .ok_or("cudarc is not in the workspace's dependency graph")?;
    let manifest = package["manifest_path"]
        .as_str()
        .ok_or("cargo metadata gave cudarc no manifest_path")?;
    let version = package["version"].as_str().unwrap_or("?").to_owned();
    let root = std::path::Path::new(manifest)
        .parent()
        .ok_or("cudarc's manifest path has no parent")?;
    Ok((root.join("src/driver/sys/mod.rs"), version))
}

#[cfg(feature = "entry-points")]
/// Generates the entry-point table for the workspace at `workspace`: each committed file
/// (relative path) with its contents.
pub fn entry_points_for(
    workspace: &std::path::Path,
) -> Result<Vec<(&'static str, String)>, String> {
    let (bindings_path, version) = locate_cudarc(workspace)?;
    let text = std::fs::read_to_string(&bindings_path)
        .map_err(|e| format!("cannot read {}: {e}", bindings_path.display()))?;
    let label = format!("cudarc {version} src/driver/sys/mod.rs");
    let bindings = entry_points::read_bindings(&label, &text).map_err(|d| d.to_string())?;
    let policy_path = workspace.join(ENTRY_POINTS_POLICY);
    let policy = std::fs::read_to_string(&policy_path)
        .map_err(|e| format!("cannot read {}: {e}", policy_path.display()))?;
    let table =
        entry_points::plan(ENTRY_POINTS_POLICY, &policy, &bindings).map_err(|d| d.to_string())?;
    let emitted = entry_points::emit(&table, ENTRY_POINTS_POLICY)
        .map_err(|e| format!("emitting the table failed: {e}"))?;
    if bindings.results.is_empty() {
        return Err(format!("{label}: no cudaError_enum (CUresult) found"));
    }
    let results = entry_points::emit_results(&bindings)
        .map_err(|e| format!("emitting the results table failed: {e}"))?;
    Ok(vec![
        (RESULTS_OUTPUT, results),
        (ENTRY_NAMES_OUTPUT, emitted.names),
        (ENTRY_POINTS_OUTPUT, emitted.pass_throughs),
        (ENTRY_WRAPPERS_OUTPUT, emitted.wrappers),
    ])
}
