//! The one way a test skips, and why a skip is never a plain pass.
//!
//! libtest has no runtime "skipped" result and hides a passing test's output, so a test that
//! could not run would show as `ok`. [`unavailable`] therefore fails the test unless the user
//! asked to allow skips ([`ALLOW`]); under `CI=true` it fails even then. Either way it writes
//! a `SKIPPED` line straight to the terminal (past the harness's capture) and appends it to
//! the skip log ([`LOG`]) from which `tests/run` prints its closing summary. The
//! `harness = false` binaries ask [`take_skips`] after each test and report `skipped` in their
//! own result line.

use std::io::Write as _;
use std::sync::Mutex;

/// Environment variable: `1` lets a test that cannot run here be reported as skipped instead
/// of failing (never under `CI=true`).
pub const ALLOW: &str = "CUINTERPOSE_ALLOW_SKIPS";

/// Environment variable: a file every skip is appended to, one `test<TAB>why` line each
/// (`tests/run` sets it and lists the file's lines when the suite ends).
pub const LOG: &str = "CUINTERPOSE_SKIP_LOG";

/// What a test that cannot run does, given the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `CI` is set: CI installs and allows everything the tests need, so a skip is a bug.
    FailUnderCi,
    /// Skips were not allowed: the test fails, naming what it needs.
    Fail,
    /// [`ALLOW`] is `1`: the test returns, reported as skipped.
    Skip,
}

/// The verdict for an environment where `CI` is `ci` and [`ALLOW`] is `allow`.
pub fn verdict(ci: Option<&str>, allow: Option<&str>) -> Verdict {
    match (ci, allow) {
        (Some(_), _) => Verdict::FailUnderCi,
        (None, Some("1")) => Verdict::Skip,
        (None, _) => Verdict::Fail,
    }
}

/// Skips recorded in this process since the last [`take_skips`]: `(test, why)`.
static SKIPS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// The skips recorded since the last call (for a `harness = false` runner, after each test).
pub fn take_skips() -> Vec<(String, String)> {
    std::mem::take(
        &mut *SKIPS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

/// Test `test` cannot run here, because `why`. Says so on the terminal and in the skip log,
/// then fails the test (under `CI=true`, or unless [`ALLOW`] is `1`) or returns, recorded as
/// skipped. The one way a test skips.
pub fn unavailable(test: &str, why: &str) {
    let why = why.replace(['\n', '\t'], " ");
    let ci = std::env::var("CI").ok();
    let allow = std::env::var(ALLOW).ok();
    let verdict = verdict(ci.as_deref(), allow.as_deref());
    // Straight to the file descriptor: libtest captures `eprintln!`, not `io::stderr()`.
    let _ = std::io::stderr().write_all(format!("\n*** SKIPPED {test}: {why} ***\n").as_bytes());
    if let Some(log) = std::env::var_os(LOG) {
        // One `write` of one line with O_APPEND: lines of tests running at once stay whole.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut file| file.write_all(format!("{test}\t{why}\n").as_bytes()));
        if let Err(error) = appended {
            panic!(
                "{test} cannot run ({why}), and the skip log {} cannot be written: {error}",
                std::path::Path::new(&log).display()
            );
        }
    }
    match verdict {
        Verdict::FailUnderCi => panic!("{test} cannot run under CI: {why}"),
        Verdict::Fail => panic!(
            "{test} did not run: {why}. `tests/run` (the README's test command) sets up what \
             it needs; {ALLOW}=1 reports it as skipped instead of failing"
        ),
        Verdict::Skip => SKIPS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push((test.to_owned(), why)),
    }
}
