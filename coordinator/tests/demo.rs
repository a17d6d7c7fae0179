//! `cuinterpose demo`, the README's first command: in place, and with CRIU where it works
//! (a loud SKIPPED line where `criu check` fails, never a silent pass).

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use cuinterpose_workload::{build_shim, build_worker, fakecuda_lib_dir};
use serde_json::Value;
use support::cli::{self, check_exit};

/// The binary, with the worker, the shim and fakecuda built next to it (as after
/// `cargo build --workspace`).
fn demo() -> Command {
    build_worker();
    build_shim();
    fakecuda_lib_dir();
    cli::command(&["demo"])
}

/// The demo succeeded: its stdout.
fn check_success(output: &Output) -> String {
    check_exit(output, 0).0
}

fn check_report(json: &Value, processes: u64) {
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(json["processes"], processes);
    // Every process holds S0, its private and untracked memory; S1 and the IPC pair add more.
    assert!(
        json["regions_verified"].as_u64().unwrap() >= 3 * processes,
        "{json}"
    );
    assert!(json["bytes_verified"].as_u64().unwrap() > 0);
    // Each importer of S0 and the IPC consumer wrote through its mapping after restore.
    assert_eq!(json["sharing_checks"].as_u64().unwrap(), processes);
    let phases = json["report"]["phases"].as_array().unwrap();
    let saved = phases
        .iter()
        .find(|p| p["phase"] == "save_allocations")
        .expect("a save phase");
    assert!(saved["bytes"].as_u64().unwrap() > 0, "{saved}");
}

#[test]
fn demo_toggles_and_verifies_every_byte() {
    let output = demo().output().unwrap();
    let text = check_success(&output);
    assert!(text.contains("VERIFIED: "), "{text}");
    assert!(text.contains("sharing links live after restore"), "{text}");
    let output = demo()
        .args(["--processes", "4", "--json"])
        .output()
        .unwrap();
    let json: Value = serde_json::from_str(&check_success(&output)).unwrap();
    check_report(&json, 4);
}

#[test]
fn demo_refuses_a_single_process() {
    let output = demo().args(["--processes", "1"]).output().unwrap();
    let (_, stderr) = check_exit(&output, 1);
    assert!(
        stderr.contains("--processes must be at least 2"),
        "{stderr}"
    );
}

/// CRIU ≥ 4.1: `$CUINTERPOSE_CRIU`, else the one `.ci/install-criu` caches.
fn criu() -> Result<PathBuf, String> {
    let binary = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/criu/criu"));
    let out = Command::new(&binary)
        .arg("check")
        .output()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    if out.status.success() {
        Ok(binary)
    } else {
        Err(format!(
            "`{} check` failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn demo_survives_a_criu_dump_kill_and_restore() {
    let binary = match criu() {
        Ok(binary) => binary,
        Err(why) => {
            eprintln!(
                "\n*** SKIPPED demo_survives_a_criu_dump_kill_and_restore: CRIU is not usable here: {why} ***\n"
            );
            return;
        }
    };
    let output = demo()
        .args(["--criu", "--json", "--criu-binary"])
        .arg(&binary)
        .output()
        .unwrap();
    let json: Value = serde_json::from_str(&check_success(&output)).unwrap();
    check_report(&json, 3);
    let phases = cli::phase_names(&json["report"]);
    assert!(
        phases.contains(&"criu_dump") && phases.contains(&"criu_restore"),
        "{phases:?}"
    );
}
