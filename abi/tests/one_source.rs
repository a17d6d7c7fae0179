//! Tidy test: the driver ABI's constants and result codes are defined once, here. Any other
//! crate that writes `const INVALID_HANDLE: u32 = 400;` (or a CUDA constant's name with a
//! literal value) has started a second list that can drift; it must name this crate's.

use cuinterpose_abi::results;
use std::path::{Path, PathBuf};

/// Names a second definition would use: every result with and without its `CUDA_ERROR_`
/// prefix, and the constants of `consts`.
fn guarded() -> Vec<String> {
    let mut names: Vec<String> = results::ALL
        .iter()
        .flat_map(|(_, name)| {
            let short = name
                .trim_start_matches("CUDA_ERROR_")
                .trim_start_matches("CUDA_");
            [name.to_string(), short.to_string()]
        })
        .collect();
    let consts = include_str!("../src/consts.rs");
    names.extend(
        consts
            .lines()
            .filter_map(|l| l.strip_prefix("pub const "))
            .filter_map(|l| l.split(':').next())
            .map(str::to_owned),
    );
    names
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !matches!(name, "target" | ".git" | ".cache" | "abi" | "snapshots") {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// `const NAME: <integer type> = <digit>...`, the shape of a second definition.
fn literal_definitions<'a>(text: &'a str, names: &[String]) -> Vec<(usize, &'a str)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let Some(rest) = line
                .trim_start()
                .trim_start_matches("pub ")
                .strip_prefix("const ")
            else {
                return false;
            };
            let Some((name, value)) = rest.split_once(':') else {
                return false;
            };
            let literal = value
                .split_once('=')
                .is_some_and(|(_, v)| v.trim_start().starts_with(|c: char| c.is_ascii_digit()));
            literal && names.iter().any(|n| n == name.trim())
        })
        .map(|(n, line)| (n + 1, line))
        .collect()
}

#[test]
fn no_crate_keeps_its_own_copy_of_the_abi() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let names = guarded();
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 50,
        "found the workspace sources ({})",
        files.len()
    );
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for (line, code) in literal_definitions(&text, &names) {
            found.push(format!("{}:{line}: {}", file.display(), code.trim()));
        }
    }
    assert!(
        found.is_empty(),
        "constants of the driver ABI defined again (use cuinterpose_abi):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_second_definition_is_found() {
    let names = guarded();
    let text = "pub const INVALID_HANDLE: u32 = 400;\nconst HANDLE_TYPE_POSIX_FD: u32 = 1;\nconst POSIX: u32 = HANDLE_TYPE_POSIX_FD;\nconst OTHER: u32 = 3;\n";
    let found: Vec<usize> = literal_definitions(text, &names)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(found, vec![1, 2]);
}
