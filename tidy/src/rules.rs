//! The rules, over a tree of files (paths from the workspace root → text). Each returns its
//! problems as `path:line: what is wrong` lines, sorted.

use std::collections::{BTreeMap, BTreeSet};

use crate::source::{Facts, facts};

/// The files of a tree, by path from the workspace root, with their parsed facts.
#[derive(Debug)]
pub struct Parsed {
    pub files: BTreeMap<String, (String, Result<Facts, String>)>,
}

impl Parsed {
    pub fn new(files: &BTreeMap<String, String>) -> Self {
        Self {
            files: files
                .iter()
                .map(|(path, text)| (path.clone(), (text.clone(), facts(text))))
                .collect(),
        }
    }

    /// Files that did not parse, named with the error's line and column.
    pub fn errors(&self) -> Vec<String> {
        self.files
            .iter()
            .filter_map(|(path, (_, facts))| facts.as_ref().err().map(|e| format!("{path}:{e}")))
            .collect()
    }

    fn facts(&self) -> impl Iterator<Item = (&String, &String, &Facts)> {
        self.files
            .iter()
            .filter_map(|(path, (text, facts))| facts.as_ref().ok().map(|f| (path, text, f)))
    }
}

/// A crate's floors: the child modules of `scope` (the crate root where empty), top to
/// bottom; a floor may hold several modules.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    /// The crate's source root: `shim/src`.
    pub root: &'static str,
    pub scope: &'static [&'static str],
    pub floors: &'static [&'static [&'static str]],
    /// The modules where `unsafe` may appear (and the word, also in comments); `None`: any.
    pub unsafe_in: Option<&'static [&'static str]>,
    /// Macros exported at the crate root, by the module that defines them.
    pub root_macros: &'static [(&'static str, &'static str)],
    /// The only files that may read the process environment; `None`: any.
    pub env_in: Option<&'static [&'static str]>,
    /// Folders (module paths) whose modules may import each other in a circle for now, as
    /// their modules still use their parent's items: a list that may only shrink (a folder on
    /// it without a circle is named).
    pub circles_in: &'static [&'static str],
    /// The FFI edge's folders, whose entry points forward to one another: never checked.
    pub ffi_edge: &'static [&'static str],
}

/// Whether `path` (from the source root) is test code: `tests.rs`, `*_tests.rs`, or in a
/// `tests` folder.
pub fn is_test_file(path: &str) -> bool {
    path.split('/').any(|part| part == "tests")
        || path.ends_with("/tests.rs")
        || path == "tests.rs"
        || path.ends_with("_tests.rs")
}

/// `lifecycle/begin.rs` → `[lifecycle, begin]`; `lifecycle/mod.rs` → `[lifecycle]`; `lib.rs` → `[]`.
fn module_path(relative: &str) -> Vec<String> {
    let trimmed = relative.trim_end_matches(".rs");
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The absolute module path an import of `file` (module `own`) leads to.
fn resolve(own: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut path: Vec<String> = own.to_vec();
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate" | "$crate") => {
            path.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                path.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    path.extend(rest.iter().filter(|s| *s != "*").cloned());
    Some(path)
}

/// Problems with `table` in `tree`.
pub fn floors(tree: &Parsed, table: &Floors) -> Vec<String> {
    let prefix = format!("{}/", table.root);
    let scope: Vec<String> = table.scope.iter().map(|s| s.to_string()).collect();
    let floor_of = |module: &str| table.floors.iter().position(|f| f.contains(&module));
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for path in tree.files.keys() {
        if let Some(relative) = path.strip_prefix(&prefix)
            && !is_test_file(relative)
            && !relative.starts_with("bin/")
            && relative != "main.rs"
        {
            modules.insert(module_path(relative), path.clone());
        }
    }
    let in_scope = |m: &[String]| m.len() > scope.len() && m.starts_with(&scope);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for (own, (path, text, facts)) in modules.iter().filter_map(|(m, path)| {
        let (text, facts) = tree.files.get(path)?;
        Some((m, (path, text, facts.as_ref().ok()?)))
    }) {
        if own.as_slice() == scope.as_slice() {
            check_listing(path, facts, table, &mut problems);
        }
        if !in_scope(own) {
            continue;
        }
        let child = own[scope.len()].as_str();
        let Some(own_floor) = floor_of(child) else {
            problems.push(format!("{path}: not inside a floor ({:?})", table.floors));
            continue;
        };
        for import in &facts.imports {
            let Some(mut target) = resolve(own, &import.segments) else {
                continue;
            };
            if let Some(first) = target.first_mut()
                && let Some((_, defined)) = table.root_macros.iter().find(|(m, _)| m == first)
            {
                *first = defined.to_string();
            }
            if in_scope(&target) {
                let to = target[scope.len()].as_str();
                if floor_of(to).is_some_and(|floor| floor < own_floor) {
                    problems.push(format!(
                        "{path}:{}: {child} imports from {to}, a floor above it",
                        import.line
                    ));
                }
            }
            note_edges(own, &target, &modules, &mut edges);
        }
        if let Some(allowed) = table.unsafe_in
            && !allowed.contains(&child)
        {
            if let Some(line) = facts.unsafe_lines.first() {
                problems.push(format!("{path}:{line}: unsafe code outside {allowed:?}"));
            } else if let Some(line) = text.lines().position(|l| l.contains("unsafe")) {
                // Also in comments: `grep unsafe` outside those floors must find nothing.
                problems.push(format!(
                    "{path}:{}: the word `unsafe` outside {allowed:?}",
                    line + 1
                ));
            }
        }
        if let Some(allowed) = table.env_in {
            let relative = &path[prefix.len()..];
            if let Some(line) = facts
                .env_lines
                .first()
                .filter(|_| !allowed.contains(&relative))
            {
                problems.push(format!(
                    "{path}:{line}: reads the environment; only {allowed:?} may"
                ));
            }
        }
    }
    declarations(&modules, &mut edges);
    for (folder, edges) in edges
        .iter()
        .filter(|(folder, _)| folder.starts_with(&scope))
    {
        let name = folder.join("/");
        let found = circles(table.root, &name, edges);
        if table.ffi_edge.contains(&name.as_str()) {
            continue;
        }
        match (table.circles_in.contains(&name.as_str()), found.is_empty()) {
            (false, _) => problems.extend(found),
            (true, true) => problems.push(format!(
                "{}/{name}: allowed import circles, but has none: remove it from the list",
                table.root
            )),
            (true, false) => {}
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// The edges `own` → `target` makes among the children of each folder that holds both: a
/// folder's own file (`mod.rs`, `lib.rs`, or `x.rs` beside `x/`) is its child `mod`, and an
/// item of it (not a child module) is `mod` too.
fn note_edges(
    own: &[String],
    target: &[String],
    modules: &BTreeMap<Vec<String>, String>,
    edges: &mut BTreeMap<Vec<String>, BTreeSet<(String, String)>>,
) {
    for depth in 0..=own.len() {
        let folder = &own[..depth];
        if !target.starts_with(folder) {
            break;
        }
        let from = own.get(depth).cloned().unwrap_or_else(|| "mod".into());
        let to = match target.get(depth) {
            Some(next) if modules.contains_key(&target[..=depth]) => next.clone(),
            _ => "mod".into(),
        };
        if from != to {
            edges.entry(folder.to_vec()).or_default().insert((from, to));
        }
    }
}

/// Every module is declared by its folder's own file: `mod` → it.
fn declarations(
    modules: &BTreeMap<Vec<String>, String>,
    edges: &mut BTreeMap<Vec<String>, BTreeSet<(String, String)>>,
) {
    for module in modules.keys() {
        if let Some((last, folder)) = module.split_last() {
            edges
                .entry(folder.to_vec())
                .or_default()
                .insert(("mod".into(), last.clone()));
        }
    }
}

/// The circles among one folder's children, each named once.
fn circles(root: &str, folder: &str, edges: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from).or_default().push(to);
    }
    let mut found = BTreeSet::new();
    for &start in graph.keys() {
        // Depth-first from `start`, looking for a way back to it.
        let mut stack = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((node, way)) = stack.pop() {
            for &next in graph.get(node).into_iter().flatten() {
                if next == start {
                    let mut circle: Vec<&str> = way.clone();
                    let least = (0..circle.len()).min_by_key(|&i| circle[i]).unwrap_or(0);
                    circle.rotate_left(least);
                    found.insert(circle.join(" → "));
                } else if seen.insert(next) {
                    let mut longer = way.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
    let at = if folder.is_empty() {
        root.to_owned()
    } else {
        format!("{root}/{folder}")
    };
    found
        .into_iter()
        .map(|circle| format!("{at}: import circle {circle}"))
        .collect()
}

/// The scope's own file declares its floors' modules, top to bottom, and nothing else.
fn check_listing(path: &str, facts: &Facts, table: &Floors, problems: &mut Vec<String>) {
    let declared: Vec<&str> = facts.modules.iter().map(String::as_str).collect();
    let mut rank = Vec::new();
    for module in &declared {
        match table.floors.iter().position(|f| f.contains(module)) {
            Some(floor) => rank.push(floor),
            None => {
                problems.push(format!("{path}: declares `{module}`, which is on no floor"));
            }
        }
    }
    let all: Vec<&str> = table
        .floors
        .iter()
        .flat_map(|f| f.iter().copied())
        .collect();
    if !rank.is_sorted() || declared.len() != all.len() {
        problems.push(format!(
            "{path}: declares {declared:?}; the floors, top to bottom, are {:?}",
            table.floors
        ));
    }
}

/// Crates of `crates` that no table of `tables` covers (a table's root is `CRATE/src`).
pub fn tables_cover(crates: &[&str], tables: &[Floors]) -> Vec<String> {
    crates
        .iter()
        .filter(|name| !tables.iter().any(|t| t.root == format!("{name}/src")))
        .map(|name| format!("{name}: no table of floors"))
        .collect()
}

/// Files over `max` lines, except `generated` ones (checked for staleness instead).
pub fn file_lengths(tree: &Parsed, max: usize, generated: &[&str]) -> Vec<String> {
    tree.files
        .iter()
        .filter(|(path, _)| !generated.contains(&path.as_str()))
        .filter_map(|(path, (text, _))| {
            let lines = text.lines().count();
            (lines > max).then(|| format!("{path}: {lines} lines (at most {max})"))
        })
        .collect()
}

/// Product functions (files under a `src/`, not test code) over `max` lines, except those
/// `allowed` (`path::name`); an allowed one that is no longer over (or gone) is named too, so
/// the list only shrinks.
pub fn function_lengths(tree: &Parsed, max: usize, allowed: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut long = BTreeSet::new();
    for (path, _, facts) in tree.facts() {
        let Some((_, relative)) = path.split_once("/src/") else {
            continue;
        };
        if is_test_file(relative) {
            continue;
        }
        for function in facts.functions.iter().filter(|f| f.lines > max) {
            let name = format!("{path}::{}", function.name);
            if !allowed.contains(&name.as_str()) {
                problems.push(format!(
                    "{path}:{}: fn {} is {} lines (at most {max})",
                    function.line, function.name, function.lines
                ));
            }
            long.insert(name);
        }
    }
    for name in allowed.iter().filter(|name| !long.contains(**name)) {
        problems.push(format!(
            "{name}: allowed to be long, but no longer over {max} lines: remove it from the list"
        ));
    }
    problems.sort();
    problems
}

/// Each crate of `safe` starts every root (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) with
/// `#![forbid(unsafe_code)]`; every crate is in `safe` or `unsafe_ok`.
pub fn forbid_unsafe(
    tree: &Parsed,
    crates: &[&str],
    safe: &[&str],
    unsafe_ok: &[&str],
) -> Vec<String> {
    let mut problems = Vec::new();
    for name in crates {
        if !safe.contains(name) && !unsafe_ok.contains(name) {
            problems.push(format!(
                "{name}: in neither list: forbid unsafe code or say why it needs it"
            ));
        }
    }
    for (path, _, facts) in tree.facts() {
        let Some((name, relative)) = path.split_once("/src/") else {
            continue;
        };
        let root = relative == "lib.rs"
            || relative == "main.rs"
            || (relative.starts_with("bin/") && !relative[4..].contains('/'));
        if root && safe.contains(&name) && !facts.forbids_unsafe {
            problems.push(format!(
                "{path}: crate {name} needs no unsafe code: start with #![forbid(unsafe_code)]"
            ));
        }
    }
    problems.sort();
    problems
}

/// Glob imports and re-exports (`use super::*`, `pub use x::*`) outside test code: each file
/// names what it takes. The files of `allowed` may still have them (a list that may only
/// shrink: one without a glob is named).
pub fn globs(tree: &Parsed, allowed: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (path, _, facts) in tree.facts() {
        let test = path
            .split_once("/src/")
            .is_none_or(|(_, relative)| is_test_file(relative));
        let Some(line) = facts.globs.first().filter(|_| !test) else {
            continue;
        };
        if allowed.contains(&path.as_str()) {
            seen.insert(path.as_str());
        } else {
            problems.push(format!(
                "{path}:{line}: a glob import: name what the file takes"
            ));
        }
    }
    for path in allowed.iter().filter(|path| !seen.contains(**path)) {
        problems.push(format!(
            "{path}: allowed glob imports, but has none: remove it from the list"
        ));
    }
    problems.sort();
    problems
}
