//! Tidy test: the fidelity table of `fakecuda/README.md` names every entry point fakecuda
//! exports (`src/ffi/proc_address.rs`, the list `cuGetProcAddress` answers from) exactly once, and
//! nothing else.

use std::collections::BTreeMap;

/// The symbols of the `entry_points! { name: version => module::symbol, ...; }` list, each once.
fn exported(source: &str) -> Vec<String> {
    let start = source
        .find("entry_points! {\n")
        .expect("the entry_points! list")
        + "entry_points! {\n".len();
    let end = start + source[start..].find("\n}").expect("its end");
    let mut symbols: Vec<String> = source[start..end]
        .split([',', ';'])
        .filter_map(|entry| entry.split_once("=>"))
        // `module::symbol`: the symbol is the last segment.
        .map(|(_, path)| path.rsplit("::").next().unwrap_or(path).trim().to_owned())
        .collect();
    symbols.sort();
    symbols.dedup();
    symbols
}

/// Every `` `cu…` `` in the first column of the fidelity table, with how often it appears.
fn tabled(readme: &str) -> BTreeMap<String, usize> {
    let section = readme
        .split("## Fidelity, function by function")
        .nth(1)
        .expect("the fidelity section");
    let mut names = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap_or_default();
        for name in first.split('`').skip(1).step_by(2) {
            *names.entry(name.to_owned()).or_insert(0) += 1;
        }
    }
    names
}

fn check(source: &str, readme: &str) -> Vec<String> {
    let exported = exported(source);
    let tabled = tabled(readme);
    let mut problems = Vec::new();
    for name in &exported {
        match tabled.get(name) {
            None => problems.push(format!("{name}: exported, not in the fidelity table")),
            Some(&n) if n > 1 => problems.push(format!("{name}: in {n} rows")),
            _ => {}
        }
    }
    for name in tabled.keys() {
        if !exported.contains(name) {
            problems.push(format!("{name}: in the table, not exported"));
        }
    }
    problems
}

#[test]
fn every_exported_function_has_one_row() {
    let source = include_str!("../src/ffi/proc_address.rs");
    let readme = include_str!("../README.md");
    let problems = check(source, readme);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(exported(source).len() > 150, "the whole list was read");
}

#[test]
fn a_missing_duplicate_or_stale_row_is_named() {
    let source = "entry_points! {\n    cuInit: 2000 => init::cuInit;\n    \
                  cuMemCreate: 10020 => vmm::cuMemCreate, 10000 => vmm::cuMemCreate;\n}";
    let readme = "## Fidelity, function by function\n\n| Functions | a | b |\n| --- | --- | --- |\n\
                  | `cuInit`, `cuMemMap` | x | y |\n| `cuInit` | x | y |\n";
    assert_eq!(
        check(source, readme),
        [
            "cuInit: in 2 rows",
            "cuMemCreate: exported, not in the fidelity table",
            "cuMemMap: in the table, not exported",
        ]
    );
}
