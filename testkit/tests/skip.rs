//! A test that cannot run is never a plain pass: it fails unless skips are allowed, fails
//! under `CI=true` even then, and says so on the terminal past libtest's capture and in the
//! skip log.

use std::path::Path;
use std::process::{Command, Output};

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::skip::{self, Verdict};
use cuinterpose_testkit::unavailable;

/// Set in the child this test starts: there the test is the skipping test.
const PROBE: &str = "CUINTERPOSE_TESTKIT_SKIP_PROBE";

#[test]
fn verdicts() {
    for (ci, allow, expected) in [
        (None, None, Verdict::Fail),
        (None, Some("0"), Verdict::Fail),
        (None, Some("yes"), Verdict::Fail),
        (None, Some("1"), Verdict::Skip),
        (Some("true"), None, Verdict::FailUnderCi),
        (Some("true"), Some("1"), Verdict::FailUnderCi),
    ] {
        assert_eq!(
            skip::verdict(ci, allow),
            expected,
            "CI={ci:?} ALLOW={allow:?}"
        );
    }
}

/// This test binary again, running only this test as the skipping probe, with libtest's
/// capture on (no `--nocapture`).
fn probe(log: &Path, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(std::env::current_exe().expect("current_exe"));
    command
        .args(["a_skip_fails_unless_allowed_and_is_seen", "--exact"])
        .env(PROBE, "1")
        .env(skip::LOG, log)
        .env_remove("CI")
        .env_remove(skip::ALLOW);
    command.envs(env.iter().copied());
    command.output().expect("run the probe")
}

fn check(env: &[(&str, &str)], passes: bool, message: &str) {
    let dir = TempDir::new("skip").expect("temp dir");
    let log = dir.path().join("skipped.log");
    let out = probe(&log, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.success(), passes, "{env:?}:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("*** SKIPPED the probe: it needs a thing this machine lacks ***"),
        "the SKIPPED line reaches the terminal through the capture ({env:?}):\n{stderr}"
    );
    assert!(
        stdout.contains(message),
        "{env:?}: no {message:?} in:\n{stdout}"
    );
    let logged = std::fs::read_to_string(&log).expect("the skip log");
    assert_eq!(logged, "the probe\tit needs a thing this machine lacks\n");
}

#[test]
fn a_skip_fails_unless_allowed_and_is_seen() {
    if std::env::var_os(PROBE).is_some() {
        unavailable("the probe", "it needs a thing\tthis machine\nlacks");
        // Allowed: the skip is recorded for a `harness = false` runner to report.
        assert_eq!(
            skip::take_skips(),
            [(
                "the probe".to_owned(),
                "it needs a thing this machine lacks".to_owned()
            )]
        );
        assert!(skip::take_skips().is_empty(), "taken once");
        return;
    }
    check(
        &[],
        false,
        "the probe did not run: it needs a thing this machine lacks. `tests/run`",
    );
    check(&[(skip::ALLOW, "1")], true, "test result: ok. 1 passed");
    check(
        &[("CI", "true"), (skip::ALLOW, "1")],
        false,
        "the probe cannot run under CI: it needs a thing this machine lacks",
    );
}

#[test]
fn an_unwritable_skip_log_fails_the_test() {
    let dir = TempDir::new("skip-log").expect("temp dir");
    let log = dir.path().join("no such directory/skipped.log");
    let out = probe(&log, &[(skip::ALLOW, "1")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("the skip log") && stdout.contains("no such directory"),
        "{stdout}"
    );
}
