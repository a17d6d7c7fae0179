//! Tidy test (in the style of rust-analyzer's): the shim's modules are floors, and the code
//! keeps to them.
//!
//! - each floor imports only from the floors below it;
//! - below the FFI edge, no two files of one floor import each other in a circle;
//! - `unsafe` (and the driver's `call!` macro, which hides an unsafe block) appear only in the
//!   FFI and driver floors;
//! - `lib.rs` lists the floors, top to bottom, and nothing else;
//! - no hand-written source file passes 600 lines.
//!
//! The rules run on the real tree and on small made-up trees that break each one, so the test
//! cannot pass by finding nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top to bottom.
const FLOORS: [&str; 7] = [
    "ffi",
    "runtime",
    "lifecycle",
    "calls",
    "state",
    "driver",
    "sys",
];

fn floors() -> Vec<&'static str> {
    FLOORS.to_vec()
}

/// Floors where `unsafe` may appear.
const UNSAFE_FLOORS: [&str; 2] = ["ffi", "driver"];
/// Macros exported at the crate root, by the floor that defines them.
const ROOT_MACROS: [(&str, &str); 1] = [("log", "sys")];
/// Generated files, exempt from the length limit (they are checked for staleness instead).
const GENERATED: [&str; 3] = ["ffi/generated.rs", "ffi/pass_throughs.rs", "sys/entries.rs"];
const MAX_LINES: usize = 600;
/// The one file that reads the process environment (see `sys/settings.rs`).
const SETTINGS_FILE: &str = "sys/settings.rs";

/// The text with comments, string and character literals blanked out (so a word in a comment
/// or a message is not code), keeping line structure.
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if chars.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn words(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut word = String::new();
        for c in line.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() || c == '_' || c == ':' || c == '$' || c == '!' {
                word.push(c);
            } else if !word.is_empty() {
                out.push((n + 1, std::mem::take(&mut word)));
            }
        }
    }
    out
}

/// Where a file's paths lead: `(line, floor, module within the floor or "")`.
fn targets(file: &str, code: &str) -> Vec<(usize, String, String)> {
    let (floor, module) = split(file);
    let mut out = Vec::new();
    let groups = grouped_crate_imports(code);
    for (line, word) in words(code).into_iter().chain(groups) {
        let word = word.trim_end_matches('!');
        // `pub(crate)`, `pub(super)`: no path. `use super::*` in a file's own test module
        // means the file itself.
        if !word.contains("::") || word.ends_with("::") {
            continue;
        }
        let segments: Vec<&str> = word.split("::").collect();
        let path: Vec<&str> = match segments.first() {
            Some(&"crate") | Some(&"$crate") => segments[1..].to_vec(),
            Some(&"super") if module == "mod" => segments[1..].to_vec(),
            Some(&"super") => std::iter::once(floor)
                .chain(segments[1..].iter().copied())
                .collect(),
            _ => continue,
        };
        let Some(first) = path.first().filter(|s| !s.is_empty()) else {
            continue;
        };
        let target_floor = ROOT_MACROS
            .iter()
            .find(|(m, _)| *m == *first)
            .map(|(_, f)| *f)
            .unwrap_or(first);
        let target_module = if target_floor == *first {
            path.get(1).copied().unwrap_or("")
        } else {
            ""
        };
        out.push((line, target_floor.to_owned(), target_module.to_owned()));
    }
    out
}

/// `use crate::{a, b::c}` names `crate::a` and `crate::b::c` (and the same for `super::{..}`),
/// also when the group spans lines. Nested groups are not followed (the shim has none).
fn grouped_crate_imports(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for root in ["crate", "super"] {
        let open = format!("{root}::{{");
        let mut from = 0;
        while let Some(found) = code[from..].find(&open) {
            let start = from + found + open.len();
            let line = code[..start].matches('\n').count() + 1;
            let inner = code[start..].split('}').next().unwrap_or("");
            for item in inner.split(',') {
                let item = item.split_whitespace().next().unwrap_or("");
                if !item.is_empty() && item != "self" {
                    out.push((line, format!("{root}::{item}")));
                }
            }
            from = start;
        }
    }
    out
}

/// `("calls", "sharing")` for `calls/sharing.rs`; `("calls", "mod")` for `calls/mod.rs`.
fn split(file: &str) -> (&str, &str) {
    let (floor, rest) = file.split_once('/').unwrap_or(("", file));
    (floor, rest.trim_end_matches(".rs"))
}

/// Every rule broken in `files` (path relative to `src/` → text), one line each.
fn violations(files: &BTreeMap<String, String>) -> Vec<String> {
    let floors = floors();
    let rank = |f: &str| floors.iter().position(|x| *x == f);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in files {
        if file == "lib.rs" {
            check_lib(text, &floors, &mut problems);
            continue;
        }
        let (floor, module) = split(file);
        let Some(own) = rank(floor) else {
            problems.push(format!("{file}: not inside a floor ({floors:?})"));
            continue;
        };
        let code = code_only(text);
        for (line, target, target_module) in targets(file, &code) {
            match rank(&target) {
                Some(t) if t < own => problems.push(format!(
                    "{file}:{line}: floor {floor} imports from floor {target}, which is above it"
                )),
                Some(t) if t == own && floor != "ffi" => {
                    let sibling = files.contains_key(&format!("{floor}/{target_module}.rs"))
                        || files.contains_key(&format!("{floor}/{target_module}/mod.rs"));
                    let to = if sibling { target_module } else { "mod".into() };
                    if to != module {
                        edges
                            .entry(format!("{floor}/{module}"))
                            .or_default()
                            .insert(format!("{floor}/{to}"));
                    }
                }
                _ => {}
            }
        }
        if module == "mod" {
            // A floor's mod.rs declares (and so reaches) every file of its floor.
            for other in files.keys().filter(|f| f.starts_with(&format!("{floor}/"))) {
                let (_, m) = split(other);
                if m != "mod" {
                    edges
                        .entry(format!("{floor}/mod"))
                        .or_default()
                        .insert(format!("{floor}/{m}"));
                }
            }
        }
        for (line, word) in words(&code) {
            if !UNSAFE_FLOORS.contains(&floor) && (word == "unsafe" || word.ends_with("call!")) {
                problems.push(format!(
                    "{file}:{line}: `{word}` outside the FFI and driver floors"
                ));
            }
        }
        if file != SETTINGS_FILE && (code.contains("env::var") || code.contains("env::set_var")) {
            let line = code.lines().position(|l| l.contains("env::")).unwrap_or(0) + 1;
            problems.push(format!(
                "{file}:{line}: reads the environment; settings are read once, in {SETTINGS_FILE}"
            ));
        }
        if !UNSAFE_FLOORS.contains(&floor) && text.contains("unsafe") {
            // Also in comments: `grep unsafe` outside those floors must find nothing.
            let line = text.lines().position(|l| l.contains("unsafe")).unwrap_or(0) + 1;
            problems.push(format!(
                "{file}:{line}: the word `unsafe` outside the FFI and driver floors"
            ));
        }
        let lines = text.lines().count();
        if lines > MAX_LINES && !GENERATED.contains(&file.as_str()) {
            problems.push(format!("{file}: {lines} lines (at most {MAX_LINES})"));
        }
    }
    problems.extend(cycles(&edges));
    problems.sort();
    problems.dedup();
    problems
}

fn check_lib(text: &str, floors: &[&str], problems: &mut Vec<String>) {
    let declared: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    if declared != floors {
        problems.push(format!(
            "lib.rs: declares {declared:?}; the floors, top to bottom, are {floors:?}"
        ));
    }
}

/// One line per circle among the files of a floor.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((node, path)) = stack.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if *next == *start {
                    let mut circle = path.clone();
                    circle.sort();
                    if done.insert(circle) {
                        problems.push(format!(
                            "{}: files import each other in a circle: {} -> {start}",
                            start,
                            path.join(" -> ")
                        ));
                    }
                } else if !path.contains(next) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    problems
}

fn read_tree(root: &Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source tree") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).expect("under root");
                let text = std::fs::read_to_string(&path).expect("UTF-8 source");
                files.insert(relative.to_string_lossy().replace('\\', "/"), text);
            }
        }
    }
    files
}

fn check(files: &[(&str, &str)], expected: &[&str]) {
    let mut tree: BTreeMap<String, String> = files
        .iter()
        .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
        .collect();
    tree.entry("lib.rs".into())
        .or_insert_with(|| floors().iter().map(|f| format!("pub mod {f};\n")).collect());
    let found = violations(&tree);
    for want in expected {
        assert!(
            found.iter().any(|p| p.contains(want)),
            "expected a problem containing {want:?}, found {found:#?}"
        );
    }
    if expected.is_empty() {
        assert!(found.is_empty(), "{found:#?}");
    }
}

#[test]
fn the_shim_keeps_to_its_floors() {
    let tree = read_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(tree.len() > 20, "found the sources ({} files)", tree.len());
    let problems = violations(&tree);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_import_that_runs_up_a_floor_is_named() {
    check(
        &[
            (
                "state/registry.rs",
                "use crate::lifecycle::carrier::Arena;\n",
            ),
            ("lifecycle/carrier.rs", "pub struct Arena;\n"),
        ],
        &["state/registry.rs:1: floor state imports from floor lifecycle"],
    );
    check(
        &[("sys/log.rs", "fn f() { crate::state::process::lock(); }\n")],
        &["sys/log.rs:1: floor sys imports from floor state"],
    );
    check(
        &[(
            "driver/mod.rs",
            "use crate::{state, sys::abi};\nfn f() { super::calls::x(); }\n",
        )],
        &[
            "driver/mod.rs:1: floor driver imports from floor state",
            "driver/mod.rs:2: floor driver imports from floor calls",
        ],
    );
}

#[test]
fn imports_downward_and_in_comments_are_fine() {
    check(
        &[
            (
                "calls/vmm.rs",
                "// see crate::ffi::exports\nuse crate::state::registry;\nuse super::track;\nfn f() { crate::log!(\"crate::runtime\"); }\n",
            ),
            ("calls/track.rs", "use crate::driver::Driver;\n"),
        ],
        &[],
    );
}

#[test]
fn a_circle_inside_a_floor_is_named() {
    check(
        &[
            ("calls/sharing.rs", "use super::multicast::adopt;\n"),
            ("calls/multicast.rs", "use crate::calls::sharing::import;\n"),
        ],
        &["files import each other in a circle"],
    );
    // A child that reaches back into its floor's mod.rs closes a circle too.
    check(
        &[
            ("lifecycle/mod.rs", "pub mod begin;\nstatic X: u8 = 0;\n"),
            ("lifecycle/begin.rs", "fn f() -> u8 { super::X }\n"),
        ],
        &["lifecycle/begin -> lifecycle/mod"],
    );
}

#[test]
fn unsafe_outside_the_ffi_and_driver_floors_is_named() {
    check(
        &[("calls/vmm.rs", "fn f() { unsafe { g() } }\n")],
        &["calls/vmm.rs:1: `unsafe` outside the FFI and driver floors"],
    );
    check(
        &[("state/gate.rs", "fn f() { call!(d, cuInit(0)); }\n")],
        &["state/gate.rs:1: `call!` outside the FFI and driver floors"],
    );
    check(
        &[("lifecycle/step.rs", "// this is unsafe\n")],
        &["lifecycle/step.rs:1: the word `unsafe` outside"],
    );
    check(
        &[
            ("driver/os.rs", "pub fn f() { unsafe { g() } }\n"),
            ("ffi/exports.rs", "pub unsafe extern \"C\" fn cuInit() {}\n"),
        ],
        &[],
    );
}

#[test]
fn the_environment_is_read_only_by_the_settings() {
    check(
        &[(
            "state/arena.rs",
            "fn f() -> bool { std::env::var_os(\"X\").is_some() }\n",
        )],
        &["state/arena.rs:1: reads the environment; settings are read once, in sys/settings.rs"],
    );
    check(
        &[(
            SETTINGS_FILE,
            "fn f() -> bool { std::env::var_os(\"X\").is_some() }\n",
        )],
        &[],
    );
}

#[test]
fn stray_files_long_files_and_a_wrong_lib_are_named() {
    check(&[("ops.rs", "\n")], &["ops.rs: not inside a floor"]);
    let long = "fn f() {}\n".repeat(MAX_LINES + 1);
    check(
        &[("calls/vmm.rs", long.as_str())],
        &["calls/vmm.rs: 601 lines (at most 600)"],
    );
    check(&[("ffi/generated.rs", long.as_str())], &[]);
    check(
        &[("lib.rs", "pub mod sys;\npub mod ffi;\n")],
        &["lib.rs: declares [\"sys\", \"ffi\"]"],
    );
}
