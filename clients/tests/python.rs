//! NVIDIA's own Python bindings (`cuda-bindings`, `cuda-core`) drive fakecuda through the
//! suite in `tests/python/`, once on fakecuda alone and once with the shim preloaded; both runs
//! must pass, with the same tests passing. The suite in `tests/python-checkpoint/` (memory-pool
//! IPC through cuda.core and raw cuda.bindings, across `cuinterpose toggle` and through CRIU)
//! runs with the shim only: without it the native checkpoint refuses shared pools. It also
//! holds peer access across a toggle. Its CRIU
//! test needs `$CUINTERPOSE_CRIU` or the CRIU `tests/setup/criu` caches (required under
//! `CI=true`).
//!
//! The interpreter is `$CUINTERPOSE_PYTHON`, else `.venv/bin/python` at the workspace root
//! (`tests/run` creates it from `tests/python/requirements.txt`). Without one the test fails
//! naming what is missing, or is reported as skipped with `CUINTERPOSE_ALLOW_SKIPS=1`
//! (never under `CI=true`): `testkit::unavailable`.

use cuinterpose_testkit::{build_cli, build_shim, fakecuda_lib_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn python() -> Option<PathBuf> {
    let explicit = std::env::var_os("CUINTERPOSE_PYTHON").map(PathBuf::from);
    let found = explicit.or_else(|| Some(workspace().join(".venv/bin/python")))?;
    found.exists().then_some(found)
}

/// One pytest run of the suite in `tests/<suite>`; returns the names of the tests that passed.
/// `args` go to pytest, `env` to its environment.
fn run(
    python: &Path,
    suite: &str,
    preload: Option<&Path>,
    args: &[&str],
    env: &[(&str, &Path)],
) -> Vec<String> {
    let fakecuda_control = tempfile::tempdir().expect("tempdir");
    let shim_control = tempfile::tempdir().expect("tempdir");
    let dir = workspace().join("tests").join(suite);
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"])
        .args(["--timeout", "120"])
        .arg(&dir)
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", fakecuda_lib_dir())
        .env("FAKECUDA_CONTROL_DIR", fakecuda_control.path())
        .env("CUINTERPOSE_CONTROL_DIR", shim_control.path())
        .env("CUINTERPOSE_BIN", build_cli())
        .args(args)
        .envs(env.iter().copied())
        .env_remove("LD_PRELOAD");
    if let Some(shim) = preload {
        cmd.env("LD_PRELOAD", shim);
    }
    let out = cmd.output().expect("run pytest");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let label = if preload.is_some() {
        "with the shim"
    } else {
        "on fakecuda alone"
    };
    assert!(
        out.status.success(),
        "the cuda-python suite {suite} failed {label}:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let passed: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("PASSED "))
        .map(str::to_owned)
        .collect();
    assert!(!passed.is_empty(), "no test passed {label}:\n{text}");
    passed
}

/// The interpreter for test `test`, or why there is none (`testkit::unavailable`).
fn python_or_skip(test: &str) -> Option<PathBuf> {
    let found = python();
    if found.is_none() {
        cuinterpose_testkit::unavailable(
            test,
            "no Python environment (.venv/bin/python or $CUINTERPOSE_PYTHON; tests/run creates \
             .venv from tests/python/requirements.txt)",
        );
    }
    found
}

#[test]
fn nvidia_bindings_run_on_fakecuda_with_and_without_the_shim() {
    let Some(python) = python_or_skip("nvidia_bindings_run_on_fakecuda_with_and_without_the_shim")
    else {
        return;
    };
    let alone = run(&python, "python", None, &[], &[]);
    let shim = build_shim();
    let preloaded = run(&python, "python", Some(shim), &[], &[]);
    assert_eq!(alone, preloaded, "the same tests pass with the shim");
    assert!(alone.len() >= 8, "the whole suite ran: {alone:?}");
}

/// CRIU ≥ 4.1 for the suite's CRIU test: `$CUINTERPOSE_CRIU`, else the one
/// `tests/setup/criu` caches, if `criu check` passes.
fn criu() -> Option<PathBuf> {
    let binary = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".cache/criu/criu"));
    let ok = Command::new(&binary)
        .arg("check")
        .output()
        .is_ok_and(|out| out.status.success());
    ok.then_some(binary)
}

#[test]
fn memory_pool_ipc_is_checkpointed_under_the_shim() {
    let Some(python) = python_or_skip("memory_pool_ipc_is_checkpointed_under_the_shim") else {
        return;
    };
    let mut expected = vec![
        "test_peer_toggle.py::test_peer_access_survives_a_toggle",
        "test_pool_criu.py::test_pool_sharing_survives_criu_dump_and_restore",
        "test_pool_driver.py::test_pools_of_two_creators_shared_with_one_importer_survive_toggles",
        "test_pool_driver.py::test_an_async_free_waits_for_the_work_queued_before_it",
        "test_pool_driver.py::test_a_current_ipc_pool_serves_alloc_async",
        "test_pool_driver.py::test_an_imported_pool_takes_its_gpu_by_the_importers_ordinal[no_context]",
        "test_pool_driver.py::test_an_imported_pool_takes_its_gpu_by_the_importers_ordinal[other_gpu_current]",
        "test_pool_driver.py::test_a_pointer_imported_after_set_access_gets_the_pools_access",
        "test_pool_sharing.py::test_pool_buffers_survive_toggles_shared[2]",
        "test_pool_sharing.py::test_pool_buffers_survive_toggles_shared[4]",
    ];
    let shim = build_shim();
    let passed = match criu() {
        Some(criu) => run(
            &python,
            "python-checkpoint",
            Some(shim),
            &[],
            &[("CUINTERPOSE_CRIU", &criu)],
        ),
        None => {
            cuinterpose_testkit::unavailable(
                "memory_pool_ipc_is_checkpointed_under_the_shim: test_pool_criu.py",
                "CRIU is not usable here (tests/setup/criu builds it)",
            );
            expected.retain(|name| !name.starts_with("test_pool_criu.py"));
            run(
                &python,
                "python-checkpoint",
                Some(shim),
                &["-k", "not criu"],
                &[],
            )
        }
    };
    assert_eq!(passed, expected);
}
