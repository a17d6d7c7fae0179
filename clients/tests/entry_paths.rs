//! Every way a client reaches the driver lands in the shim (clients.md §6, scenario 17): the
//! entry points a scenario uses resolve to the shim's wrappers through `dlsym` on the driver's
//! handle, `RTLD_DEFAULT`, `RTLD_NEXT`, `cuGetProcAddress_v2` at 10.2 / 12.0 / 12.3, the
//! legacy `cuGetProcAddress`, `cudaGetDriverEntryPointByVersion`, `cudaGetDriverEntryPoint`
//! and direct symbols, also with another interposer preloaded ahead of the shim. (Each
//! scenario's plain half runs through all of these paths.) The names are every hand-written
//! entry point of `schema/entry_points.ron`, the one list the shim is generated from; which of
//! them a path hands out at its CUDA version is the bare driver's answer, not a list here.

use std::collections::BTreeSet;

use cuinterpose_clients::scenario::{Mode, run_preloaded};
use cuinterpose_clients::{Ctx, direct_library, entry_name, entry_paths};
use cuinterpose_workload::EntryPath;

/// Every hand-written entry point, from the one list the shim's exports are generated from.
fn tracked() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/entry_points.ron");
    let text = std::fs::read_to_string(path).expect("schema/entry_points.ron is readable");
    cuinterpose_codegen::entry_points::parse_policy(path, &text)
        .unwrap_or_else(|e| panic!("{e}"))
        .tracked
}

/// The name a caller asks for on a lookup that takes a CUDA version: the cuda.h name, without
/// the ABI version suffix (`cuMemAlloc_v2` → `cuMemAlloc`); the per-thread-stream variants are
/// chosen by a flag, not by name.
fn unversioned(name: &str) -> Option<&str> {
    if name.ends_with("_ptsz") || name.ends_with("_ptds") {
        return None;
    }
    let base = name
        .rsplit_once("_v")
        .filter(|(_, n)| n.chars().all(|c| c.is_ascii_digit()))
        .map_or(name, |(base, _)| base);
    Some(base)
}

/// Looks up every tracked entry point on the entry path under test and notes which resolve
/// (the bare driver's answers are the reference: a name the driver does not hand out at that
/// version must not resolve under the shim either); under the shim every one that resolves
/// must be the shim's.
fn check_resolution(ctx: &mut Ctx) {
    let mut w = ctx.worker();
    let shimmed = ctx.shimmed();
    let entry = ENTRY.with(|e| e.borrow().clone());
    let names: BTreeSet<String> = tracked()
        .iter()
        .filter_map(|name| match entry.api_version() {
            Some(_) => unversioned(name),
            None => Some(name.as_str()),
        })
        .map(str::to_owned)
        .collect();
    let expected = if shimmed {
        "libcuinterpose.so"
    } else {
        "libcuda.so"
    };
    for name in names {
        let Ok(found) = w.resolve(&name) else {
            ctx.note(format!("{name}: not resolved"));
            continue;
        };
        let library = found.library.unwrap_or_default();
        let file = library.rsplit('/').next().unwrap_or_default();
        assert!(
            file.starts_with(expected),
            "{name} through {}: found in {library}, expected {expected}",
            entry_name(&entry)
        );
        ctx.note(format!("{name}: resolved"));
    }
}

thread_local! {
    static ENTRY: std::cell::RefCell<EntryPath> = const { std::cell::RefCell::new(EntryPath::Dlsym) };
}

fn resolve_everywhere(preload: &[std::path::PathBuf]) {
    for entry in entry_paths() {
        ENTRY.with(|e| *e.borrow_mut() = entry.clone());
        let [bare, shim] = [Mode::Bare, Mode::Shim].map(|mode| {
            run_preloaded(
                "entry_paths",
                mode,
                vec![entry.clone()],
                preload,
                check_resolution,
            )
        });
        let what = entry_name(&entry);
        if !preload.is_empty() {
            // The interposer ahead of the shim answers runtime lookups from its own table
            // (c/direct.c), so the bare driver is no reference here: every name it hands out
            // must be the shim's (checked above), and enough of them resolve.
            let resolved = shim.iter().filter(|n| n.ends_with(": resolved")).count();
            assert!(resolved >= 20, "{what}: only {resolved} resolve: {shim:?}");
            continue;
        }
        if matches!(entry, EntryPath::Default | EntryPath::Next) {
            // A lookup in the global symbol table finds the shim's own export even for a name
            // this driver lacks (calling it returns CUDA_ERROR_NOT_SUPPORTED, logged): every
            // name the driver has must resolve, to the shim.
            let missing: Vec<&String> = bare
                .iter()
                .filter(|n| n.ends_with(": resolved") && !shim.contains(n))
                .collect();
            assert!(missing.is_empty(), "{what}: not the shim's: {missing:?}");
        } else {
            // Same answers, name for name: also the names this driver does not hand out at
            // the requested version.
            assert_eq!(shim, bare, "{what}: the shim answers as the driver");
        }
        // Not vacuous: most tracked entry points resolve on every path that asks for a recent
        // enough version.
        let resolved = bare.iter().filter(|n| n.ends_with(": resolved")).count();
        let recent = entry.api_version().is_none_or(|v| v >= 12010);
        assert!(
            !recent || resolved >= 20,
            "{what}: only {resolved} of the tracked entry points resolve: {bare:?}"
        );
    }
}

#[test]
fn every_entry_path_lands_in_the_shim() {
    resolve_everywhere(&[]);
}

#[test]
fn every_entry_path_lands_in_the_shim_behind_another_interposer() {
    resolve_everywhere(&[direct_library().to_path_buf()]);
}
