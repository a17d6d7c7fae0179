//! `cuinterpose-codegen`: the schema compiler's command line.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Compile, check and compare cuinterpose protocol schemas (schema/protocol.ron).
///
/// Errors point at `FILE:LINE:COLUMN`. `cargo build` already regenerates the Rust types from
/// the schema; this tool prints them, renders the Markdown reference, and checks wire
/// compatibility against a released schema.
#[derive(Debug, Parser)]
#[command(name = "cuinterpose-codegen", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the generated Rust module for SCHEMA.
    Rust {
        /// Schema file.
        #[arg(default_value = "schema/protocol.ron")]
        schema: PathBuf,
    },
    /// Print the Markdown protocol reference for SCHEMA.
    Doc {
        /// Schema file.
        #[arg(default_value = "schema/protocol.ron")]
        schema: PathBuf,
    },
    /// Parse and validate SCHEMA; print every problem with its position.
    Check {
        /// Schema file.
        #[arg(default_value = "schema/protocol.ron")]
        schema: PathBuf,
    },
    /// List every wire-visible change from OLD to NEW; exit 1 when there are changes and the
    /// version was not bumped.
    Compat {
        /// The released schema (e.g. schema/released/v1.ron).
        old: PathBuf,
        /// The candidate schema (e.g. schema/protocol.ron).
        new: PathBuf,
    },
    /// Generate the shim's driver entry-point table (shim/src/sys/entries.rs,
    /// shim/src/ffi/pass_throughs.rs, shim/src/ffi/generated.rs) and the CUresult table
    /// (abi/src/results.rs) from cudarc's driver bindings and schema/entry_points.ron, and
    /// write it; with --check, only compare
    /// and exit 1 when the committed file is stale.
    EntryPoints {
        /// The workspace root.
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Compare with the committed file instead of writing it.
        #[arg(long)]
        check: bool,
    },
}

fn compile(path: &std::path::Path) -> Result<cuinterpose_codegen::ir::Ir, ExitCode> {
    cuinterpose_codegen::compile_file(path).map_err(|diagnostics| {
        eprintln!("{diagnostics}");
        ExitCode::from(2)
    })
}

/// Compiles `schema`, renders it with `render` and prints the text; a failure to render is
/// reported as "`what` failed".
fn print_output<E: std::fmt::Display>(
    schema: &std::path::Path,
    what: &str,
    render: fn(&cuinterpose_codegen::ir::Ir) -> Result<String, E>,
) -> Result<(), ExitCode> {
    let ir = compile(schema)?;
    let text = render(&ir).map_err(|error| {
        eprintln!("{what} failed: {error}");
        ExitCode::FAILURE
    })?;
    print!("{text}");
    Ok(())
}

fn run(cli: Cli) -> Result<(), ExitCode> {
    match cli.command {
        Command::Rust { schema } => {
            print_output(&schema, "code generation", cuinterpose_codegen::rust)?
        }
        Command::Doc { schema } => print_output(
            &schema,
            "rendering the reference",
            cuinterpose_codegen::markdown,
        )?,
        Command::Check { schema } => {
            let ir = compile(&schema)?;
            println!(
                "{}: ok (version {}, {} enums, {} structs, {} unions, {} layouts, {} messages)",
                schema.display(),
                ir.version,
                ir.enums.len(),
                ir.structs.len(),
                ir.unions.len(),
                ir.layouts.len(),
                ir.messages.len()
            );
        }
        Command::Compat { old, new } => {
            let old_ir = compile(&old)?;
            let new_ir = compile(&new)?;
            let report = cuinterpose_codegen::compat(&old_ir, &new_ir);
            print!("{report}");
            if !report.is_compatible() {
                return Err(ExitCode::FAILURE);
            }
        }
        Command::EntryPoints { workspace, check } => {
            let files = cuinterpose_codegen::entry_points_for(&workspace).map_err(|error| {
                eprintln!("{error}");
                ExitCode::from(2)
            })?;
            let mut stale = false;
            for (path, text) in files {
                let output = workspace.join(path);
                let current = std::fs::read_to_string(&output).unwrap_or_default();
                if current == text {
                    continue;
                }
                if check {
                    eprintln!(
                        "{} is stale: run `cargo run -p cuinterpose-codegen -- entry-points`",
                        output.display()
                    );
                    stale = true;
                } else {
                    std::fs::write(&output, text).map_err(|error| {
                        eprintln!("cannot write {}: {error}", output.display());
                        ExitCode::FAILURE
                    })?;
                    eprintln!("wrote {}", output.display());
                }
            }
            if stale {
                return Err(ExitCode::FAILURE);
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}
