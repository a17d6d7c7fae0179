//! `cuinterpose` as CRIU's action script, run the way CRIU runs it (no arguments, the action
//! in the environment): what each action does without a workload, and the errors for
//! environments CRIU would never set up. The hook with a real workload under plain CRIU is
//! tested through the demo (`tests/demo.rs`).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use cuinterpose_coordinator::fixtures::TempDir;
use serde_json::Value;
use support::cli::{check_exit, path, text};

/// `cuinterpose` with no arguments and `vars` as CRIU sets them.
fn hook(vars: &[(&str, &str)], control: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .env_remove("CRTOOLS_IMAGE_DIR")
        .env_remove("CRTOOLS_INIT_PID")
        .env("CUINTERPOSE_CONTROL_DIR", control)
        .env("CUINTERPOSE_DRIVER", "/nonexistent/libcuda.so.1")
        .envs(vars.iter().copied())
        .output()
        .expect("run cuinterpose")
}

fn status(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("cuinterpose-hook.status"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// One action: exits with `code`, says `expected` on stderr and records `recorded` as its
/// status in the image directory.
fn check(action: &str, images: &Path, pid: &str, code: i32, expected: &str, recorded: &str) {
    let control = TempDir::new("ctl").expect("control dir");
    let output = hook(
        &[
            ("CRTOOLS_SCRIPT_ACTION", action),
            ("CRTOOLS_IMAGE_DIR", path(images)),
            ("CRTOOLS_INIT_PID", pid),
        ],
        control.path(),
    );
    let (_, stderr) = check_exit(&output, code);
    assert!(
        stderr.contains(&format!("cuinterpose criu-hook: {action}: ")) && stderr.contains(expected),
        "{action}: {stderr}"
    );
    let last = status(images).pop().expect("a status line");
    assert_eq!(last["action"], action, "{last}");
    assert_eq!(last["status"], recorded, "{last}");
}

#[test]
fn without_participants_every_action_does_nothing() {
    let images = TempDir::new("images").expect("images");
    let me = std::process::id().to_string();
    check(
        "pre-dump",
        images.path(),
        &me,
        0,
        "no cuinterpose participant in the tree of",
        "skipped",
    );
    check(
        "post-dump",
        images.path(),
        &me,
        0,
        "the dump completed",
        "ok",
    );
    for action in ["pre-restore", "pre-resume"] {
        check(
            action,
            images.path(),
            &me,
            0,
            "no cuinterpose state in these images",
            "skipped",
        );
    }
    check(
        "network-lock",
        images.path(),
        &me,
        0,
        "nothing to do at network-lock",
        "skipped",
    );
    assert!(
        !images.path().join("cuinterpose.state").exists(),
        "nothing was prepared"
    );
}

#[test]
fn pre_restore_refuses_a_missing_or_corrupt_state() {
    let me = std::process::id().to_string();
    let images = TempDir::new("images").expect("images");
    std::fs::write(images.path().join("cuinterpose.processes"), "{}").unwrap();
    check(
        "pre-restore",
        images.path(),
        &me,
        1,
        "no checkpoint state here",
        "failed",
    );
    std::fs::write(images.path().join("cuinterpose.state"), b"not a state").unwrap();
    check(
        "pre-restore",
        images.path(),
        &me,
        1,
        "corrupt checkpoint state",
        "failed",
    );
}

#[test]
fn environments_criu_never_sets_up_are_named() {
    let control = TempDir::new("ctl").expect("control dir");
    // Not run by CRIU at all.
    let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .arg("criu-hook")
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .output()
        .unwrap();
    let (_, stderr) = check_exit(&output, 64);
    assert!(
        stderr.contains("CRTOOLS_SCRIPT_ACTION is not set") && stderr.contains("action-script"),
        "{stderr}"
    );
    // Without arguments and without CRIU: the usual usage message.
    let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    let images = TempDir::new("images").expect("images");
    for (vars, expected) in [
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "pre-dump"),
                ("CRTOOLS_INIT_PID", "abc"),
            ],
            "CRTOOLS_INIT_PID is \"abc\": not a process ID",
        ),
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "pre-dump"),
                ("CRTOOLS_IMAGE_DIR", "/nonexistent/images"),
            ],
            "CRTOOLS_IMAGE_DIR is \"/nonexistent/images\": not a directory this process can reach",
        ),
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "post-resume"),
                ("CRTOOLS_IMAGE_DIR", path(images.path())),
            ],
            "not a /proc/<criu pid>/fd/<n> path",
        ),
        (
            vec![("CRTOOLS_SCRIPT_ACTION", "pre-dump")],
            "CRTOOLS_IMAGE_DIR is \"\": not set",
        ),
    ] {
        let output = hook(&vars, control.path());
        let (_, stderr) = check_exit(&output, 64);
        assert!(stderr.contains(expected), "{vars:?}: {stderr}");
    }
}
