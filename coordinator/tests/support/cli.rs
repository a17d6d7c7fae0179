//! Running the `cuinterpose` binary and reading what it printed.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// The `cuinterpose` binary with `args`, inheriting none of its settings (control directory,
/// timeouts) from this process's environment.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cuinterpose"));
    command.args(args);
    for variable in [
        "CUINTERPOSE_CONTROL_DIR",
        "CUINTERPOSE_CONTROL_TIMEOUT_SECONDS",
        "CUINTERPOSE_COPY_TIMEOUT_SECONDS",
    ] {
        command.env_remove(variable);
    }
    command
}

/// Runs [`command`] with `env` set.
pub fn cuinterpose(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args)
        .envs(env.iter().copied())
        .output()
        .expect("run cuinterpose")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The binary exited with `code`; returns (stdout, stderr).
pub fn check_exit(output: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// `text` (an output, `what` naming it) contains each of `parts`.
pub fn check_contains(what: &str, text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} not in {what}: {text}");
    }
}

pub fn path(dir: &Path) -> &str {
    dir.to_str().expect("UTF-8 path")
}

/// Every participant's phase in the output of `cuinterpose inspect --json` (which exits 1
/// unless all are active: that is not checked here).
pub fn participant_phases(inspect: &Output) -> Vec<String> {
    let value: Value = serde_json::from_slice(&inspect.stdout).expect("inspect JSON");
    value["participants"]
        .as_object()
        .expect("participants")
        .values()
        .map(|participant| participant["phase"].as_str().expect("phase").to_string())
        .collect()
}

/// The names of the phases of a JSON report, in order.
pub fn phase_names(report: &Value) -> Vec<&str> {
    report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|phase| phase["phase"].as_str().expect("name"))
        .collect()
}

/// The event lines of a `--json` command's stdout, and its final line (the report, or the
/// failure). Every line before the last is an event: `phase_started`, `progress` or
/// `phase_done`; every phase that was done was started, in order.
pub fn json_lines(stdout: &str) -> (Vec<Value>, Value) {
    let mut lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let last = lines.pop().expect("a final line");
    assert!(last.get("event").is_none(), "final line: {last}");
    let mut started = Vec::new();
    for event in &lines {
        let phase = event["phase"].as_str().expect("an event names its phase");
        match event["event"].as_str() {
            Some("phase_started") => started.push(phase.to_owned()),
            Some("progress") => assert_eq!(started.last().map(String::as_str), Some(phase)),
            Some("phase_done") => {
                assert_eq!(started.last().map(String::as_str), Some(phase), "{stdout}")
            }
            other => panic!("unknown event {other:?}: {event}"),
        }
    }
    (lines, last)
}

/// The final JSON line of a `--json` command (see [`json_lines`]).
pub fn final_json(stdout: &str) -> Value {
    json_lines(stdout).1
}
