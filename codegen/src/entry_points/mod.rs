//! The shim's driver entry-point table: every function of cudarc's driver bindings (read with
//! syn) classified by `schema/entry_points.ron` (hand-written or generated pass-through, open
//! or gated during a checkpoint, per-thread-stream variants), emitted as two Rust modules of
//! the shim; and cudarc's `CUresult` values, emitted as the results table of `cuinterpose-abi`.
//!
//! Pipeline: [`read_bindings`] (syn over cudarc's `driver/sys/mod.rs`) → [`plan`] (the policy
//! checked against the bindings, errors at `file:line:column`) → [`emit`](emit::emit), and
//! [`emit_results`].

mod bindings;
mod emit;
mod results;

pub use bindings::{Abi, Bindings, Function, read_bindings};
pub use emit::emit;
pub use results::emit_results;

use crate::diag::Diagnostics;
use crate::source::SourceMap;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// `schema/entry_points.ron`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub tracked: Vec<String>,
    pub extra: Vec<String>,
    pub open: Vec<String>,
    pub ptds: Vec<String>,
    pub ptsz: Vec<String>,
}

/// How the shim answers one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wrapper {
    /// A hand-written function of the same name in the shim's FFI layer.
    HandWritten,
    /// A generated pass-through with this C prototype.
    PassThrough(Vec<Abi>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub open: bool,
    pub wrapper: Wrapper,
}

/// The table, sorted by name (so the output is deterministic).
#[derive(Debug)]
pub struct Table {
    pub entries: Vec<Entry>,
    /// Where the prototypes came from, for the generated header.
    pub source: String,
}

/// Parses the policy; a syntax error points at its line and column.
pub fn parse_policy(path: &str, text: &str) -> Result<Policy, Diagnostics> {
    crate::input::parse_ron(path, text)
}

/// Checks the policy against the bindings and builds the table. Every name the policy
/// mentions must exist (in the bindings or in `extra`), appear once per list, and a
/// per-thread variant's base must be a pass-through.
pub fn plan(
    policy_path: &str,
    policy_text: &str,
    bindings: &Bindings,
) -> Result<Table, Diagnostics> {
    let policy = parse_policy(policy_path, policy_text)?;
    let map = SourceMap::new(policy_path, policy_text);
    let mut problems = Vec::new();
    let at = |list: &str, name: &str| {
        let from = map.key(list).unwrap_or(0);
        map.literal_after(from, name).unwrap_or(from)
    };
    let lists: [(&str, &Vec<String>); 5] = [
        ("tracked", &policy.tracked),
        ("extra", &policy.extra),
        ("open", &policy.open),
        ("ptds", &policy.ptds),
        ("ptsz", &policy.ptsz),
    ];
    for (list, names) in lists {
        let mut seen = BTreeSet::new();
        for name in names {
            if !seen.insert(name.as_str()) {
                problems.push(map.diagnostic(
                    at(list, name),
                    format!("`{name}` appears twice in `{list}`"),
                ));
            }
        }
    }
    let known = |name: &str| {
        bindings.functions.contains_key(name) || policy.extra.iter().any(|e| e == name)
    };
    for name in &policy.extra {
        if bindings.functions.contains_key(name) {
            problems.push(map.diagnostic(
                at("extra", name),
                format!(
                    "`{name}` is declared by the driver bindings; list it in `tracked`, not `extra`"
                ),
            ));
        }
    }
    for name in policy.tracked.iter().chain(&policy.open) {
        if !known(name) {
            problems.push(map.diagnostic(
                at(
                    if policy.tracked.contains(name) {
                        "tracked"
                    } else {
                        "open"
                    },
                    name,
                ),
                format!(
                    "`{name}` is not a driver function of the bindings ({}) nor listed in `extra`",
                    bindings.source
                ),
            ));
        }
    }
    for (list, names) in [("ptds", &policy.ptds), ("ptsz", &policy.ptsz)] {
        for name in names {
            if !bindings.functions.contains_key(name) {
                problems.push(map.diagnostic(
                    at(list, name),
                    format!("per-thread base `{name}` is not a driver function of the bindings"),
                ));
            } else if policy.tracked.contains(name) {
                problems.push(map.diagnostic(
                    at(list, name),
                    format!("per-thread base `{name}` is hand-written; its variant would bypass the tracking"),
                ));
            }
        }
    }
    if !problems.is_empty() {
        return Err(Diagnostics(problems));
    }

    let open: BTreeSet<&str> = policy.open.iter().map(String::as_str).collect();
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    for (name, function) in &bindings.functions {
        let wrapper = if policy.tracked.contains(name) {
            Wrapper::HandWritten
        } else {
            Wrapper::PassThrough(function.args.clone())
        };
        entries.insert(
            name.clone(),
            Entry {
                name: name.clone(),
                open: open.contains(name.as_str()),
                wrapper,
            },
        );
    }
    for name in &policy.extra {
        entries.insert(
            name.clone(),
            Entry {
                name: name.clone(),
                open: open.contains(name.as_str()),
                wrapper: Wrapper::HandWritten,
            },
        );
    }
    for (suffix, names) in [("_ptds", &policy.ptds), ("_ptsz", &policy.ptsz)] {
        for base in names {
            let variant = format!("{base}{suffix}");
            let args = bindings.functions[base].args.clone();
            // A per-thread variant is gated exactly like its base.
            let open = open.contains(base.as_str());
            entries.insert(
                variant.clone(),
                Entry {
                    name: variant,
                    open,
                    wrapper: Wrapper::PassThrough(args),
                },
            );
        }
    }
    Ok(Table {
        entries: entries.into_values().collect(),
        source: bindings.source.clone(),
    })
}
