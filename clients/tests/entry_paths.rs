//! Every way a client reaches the driver lands in the shim (clients.md §6, scenario 17): the
//! entry points a scenario uses resolve to the shim's wrappers through `dlsym` on the driver's
//! handle, `RTLD_DEFAULT`, `RTLD_NEXT`, `cuGetProcAddress_v2` at 10.2 / 12.0 / 12.3, the
//! legacy `cuGetProcAddress`, `cudaGetDriverEntryPointByVersion`, `cudaGetDriverEntryPoint`
//! and direct symbols, also with another interposer preloaded ahead of the shim. (Each
//! scenario's plain half runs through all of these paths.)

use cuinterpose_clients::scenario::{Mode, run_preloaded};
use cuinterpose_clients::{Ctx, direct_library, entry_name, entry_paths};
use cuinterpose_workload::EntryPath;

/// (exact name, cuda.h name, CUDA version that introduced it).
const WRAPPED: &[(&str, &str, u32)] = &[
    ("cuMemCreate", "cuMemCreate", 10020),
    (
        "cuMemExportToShareableHandle",
        "cuMemExportToShareableHandle",
        10020,
    ),
    (
        "cuMemImportFromShareableHandle",
        "cuMemImportFromShareableHandle",
        10020,
    ),
    ("cuMemMap", "cuMemMap", 10020),
    ("cuMemRelease", "cuMemRelease", 10020),
    ("cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000),
    (
        "cuMemRetainAllocationHandle",
        "cuMemRetainAllocationHandle",
        11000,
    ),
    ("cuMemAlloc_v2", "cuMemAlloc", 3020),
    ("cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010),
    // The unsuffixed names resolve (to the v1 ABI) before the _v2 arrived in 11.0.
    ("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 4010),
    (
        "cuDevicePrimaryCtxReset_v2",
        "cuDevicePrimaryCtxReset",
        7000,
    ),
    ("cuMulticastCreate", "cuMulticastCreate", 12010),
    ("cuMulticastBindMem", "cuMulticastBindMem", 12010),
];

/// Where each wrapped entry point resolves for one worker on the entry path under test.
fn check_resolution(ctx: &mut Ctx) {
    let mut w = ctx.worker();
    let shimmed = ctx.shimmed();
    let version = ENTRY.with(|e| e.borrow().api_version());
    for &(exact, unsuffixed, since) in WRAPPED {
        let name = if version.is_some() { unsuffixed } else { exact };
        if version.is_some_and(|v| v < since) {
            assert!(w.resolve(name).is_err(), "{name} resolves at {version:?}");
            continue;
        }
        let found = w.resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let library = found.library.unwrap_or_default();
        let file = library.rsplit('/').next().unwrap_or_default();
        let expected = if shimmed {
            "libcuinterpose.so"
        } else {
            "libcuda.so"
        };
        assert!(
            file.starts_with(expected),
            "{name} through {}: found in {library}, expected {expected}",
            ENTRY.with(|e| entry_name(&e.borrow()))
        );
    }
}

thread_local! {
    static ENTRY: std::cell::RefCell<EntryPath> = const { std::cell::RefCell::new(EntryPath::Dlsym) };
}

fn resolve_everywhere(preload: &[std::path::PathBuf]) {
    for entry in entry_paths() {
        ENTRY.with(|e| *e.borrow_mut() = entry.clone());
        for mode in [Mode::Bare, Mode::Shim] {
            run_preloaded(
                "entry_paths",
                mode,
                vec![entry.clone()],
                preload,
                check_resolution,
            );
        }
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
