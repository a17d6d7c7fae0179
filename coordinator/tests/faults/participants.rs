//! Participants that fail mid-run: killed in each phase, stopped (no answer), or answering
//! after the coordinator vanished; and the checks of how the run and a second run fail.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::{Reason, Run, RunError, RunKind, Stage, phase_after};
use cuinterpose_coordinator::report::Report;
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state::{self, StateError};
use cuinterpose_protocol::{
    ExecuteRequest, NamespacePid, Operation, Phase, RefusalCode, Request, StateFile,
};

use crate::faults::workload::{A, B, C, NAMES, Workload, drive, no_publish, prepare};
use crate::support::sandbox::Sandbox;

/// A run of `kind` for `workload` and the checkpoint directory it works in: a fresh one for a
/// capture, a prepared one for a restore.
pub(crate) fn start_run(sandbox: &Sandbox, workload: &Workload, kind: RunKind) -> (PathBuf, Run) {
    match kind {
        RunKind::Capture => (sandbox.fresh("checkpoint"), Run::capture(workload.pids())),
        RunKind::Restore => {
            let dir = prepare(sandbox, workload);
            let run = Run::restore(&state::load(&dir).expect("state"), workload.pids());
            (dir, run)
        }
        RunKind::Check => {
            let dir = prepare(sandbox, workload);
            let run = Run::check(&state::load(&dir).expect("state"), workload.pids());
            (dir, run)
        }
    }
}

/// The command of `kind` once more, after a failed run: `prepare` into a fresh directory, or
/// `restore` from `dir`.
pub(crate) fn run_again(
    sandbox: &Sandbox,
    session: &Session,
    kind: RunKind,
    dir: &Path,
) -> Result<Report, CommandError> {
    match kind {
        RunKind::Capture => commands::prepare(session, &sandbox.fresh("again"), &mut |_| {}),
        RunKind::Restore | RunKind::Check => commands::restore(session, dir, &mut |_| {}),
    }
}

/// `error` is `command`'s refusal at inspect, with nothing changed: participant `victim` is in
/// phase `found`, not in phase `expected`.
pub(crate) fn check_refused_out_of_phase(
    error: &CommandError,
    command: &str,
    victim: NamespacePid,
    found: Phase,
    expected: Phase,
) {
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "{command} failed in phase inspect: participant {victim}: in phase {found}, expected \
             phase {expected}"
        )) && message.contains("nothing was changed in any participant"),
        "{message}"
    );
    assert_eq!(error.exit_code(), 1, "{message}");
}

/// Every capture stage, then every restore stage (the publication is tested on its own).
pub(crate) fn stages() -> Vec<(RunKind, Stage)> {
    let mut stages = vec![
        (RunKind::Capture, Stage::Inspect),
        (RunKind::Capture, Stage::BeginCheckpoint),
    ];
    stages.extend(
        cuinterpose_coordinator::plan::CAPTURE_OPERATIONS
            .map(|operation| (RunKind::Capture, Stage::Execute(operation))),
    );
    stages.push((RunKind::Restore, Stage::Inspect));
    stages.extend(
        cuinterpose_coordinator::plan::RESTORE_OPERATIONS
            .map(|operation| (RunKind::Restore, Stage::Execute(operation))),
    );
    stages.push((RunKind::Restore, Stage::Verify));
    stages
}

/// The phase a participant that completed `stage` (and nothing after it) is in.
pub(crate) fn phase_through(kind: RunKind, stage: Stage) -> Phase {
    match (kind, stage) {
        (RunKind::Capture, Stage::Inspect) => Phase::Active,
        (RunKind::Capture, Stage::BeginCheckpoint) => Phase::Frozen,
        (RunKind::Restore, Stage::Inspect) => Phase::Released,
        (_, Stage::Execute(operation)) => phase_after(operation),
        (_, Stage::Verify) => Phase::Active,
        other => panic!("{other:?}"),
    }
}

/// The run `kind` (`result`) failed in `stage`, where worker `index` (namespace PID `victim`)
/// was `happened` ("killed", "silent"), naming it first with a reason containing `text`.
/// Returns the error and what happened, for later messages.
pub(crate) fn check_failure(
    result: Result<Report, RunError>,
    (kind, stage, index): (RunKind, Stage, usize),
    happened: &str,
    victim: NamespacePid,
    text: &str,
) -> (RunError, String) {
    let what = format!(
        "{} {happened} in {} {}",
        NAMES[index],
        kind.command(),
        stage
    );
    let error = result.expect_err(&what);
    check_failure_of(&error, kind, stage, victim, text);
    (error, what)
}

fn check_failure_of(
    error: &RunError,
    kind: RunKind,
    stage: Stage,
    victim: NamespacePid,
    text: &str,
) {
    assert_eq!(error.kind, kind, "{error}");
    assert_eq!(error.stage, stage, "{error}");
    let failure = error
        .failures
        .iter()
        .find(|f| f.participant == Some(victim))
        .unwrap_or_else(|| panic!("{victim} not named: {error}"));
    assert!(
        matches!(failure.reason, Reason::Transport(_)),
        "{victim}: {:?}",
        failure.reason
    );
    let message = error.to_string();
    let expected = format!(
        "{} failed in phase {}: participant {victim}: no reply: ",
        kind.command(),
        stage.name()
    );
    assert!(
        message.contains(&expected) && message.contains(text),
        "expected {expected:?} and {text:?} in:\n{message}"
    );
    assert!(
        message.contains(&format!("cuinterpose-{victim}.sock")),
        "{message}"
    );
    // Anything after the first mutating request is fail-stop, loudly, except a participant
    // that times out in begin_checkpoint and on its roll_back: frozen and busy, it thaws on
    // its own, so the others are rolled back around it (aborted, exit 3).
    let mutated = stage != Stage::Inspect;
    let aborted = !error.unconfirmed.is_empty();
    if aborted {
        assert_eq!(error.unconfirmed, [victim], "{error}");
        assert!(
            stage == Stage::BeginCheckpoint && error.rolled_back,
            "{error}"
        );
    }
    assert_eq!(error.mutated, mutated, "{error}");
    let exit = match (mutated, aborted) {
        (false, _) => 1,
        (true, false) => 2,
        (true, true) => 3,
    };
    assert_eq!(error.exit_code(), exit, "{error}");
    assert_eq!(
        message.contains("FAIL-STOP"),
        mutated && !aborted,
        "{message}"
    );
    assert_eq!(message.contains("ABORTED"), aborted, "{message}");
}

/// `what` failed `took` after the fault, at least `at_least` (when it was noticed) and in
/// less than 3 s (not at some later timeout); says so.
pub(crate) fn check_failed_after(what: &str, took: Duration, at_least: Duration) {
    assert!(
        took >= at_least && took < cuinterpose_testkit::slack(Duration::from_secs(3)),
        "{what}: failed after {took:?}"
    );
    println!("  {what}: failed after {took:.1?}");
}

/// Who dies in which stage: every participant dies somewhere, the creator during the copy
/// phases and while its importers re-import from it.
pub(crate) fn victim_of(kind: RunKind, stage: Stage) -> usize {
    match (kind, stage) {
        (_, Stage::Execute(Operation::SaveAllocations | Operation::LoadAllocations)) => A,
        (_, Stage::Execute(Operation::RestoreUnicast | Operation::RestoreMulticastBindings)) => A,
        (_, Stage::Execute(Operation::PrepareMulticast | Operation::RestoreMulticastDevices)) => C,
        (RunKind::Capture, Stage::BeginCheckpoint) => C,
        _ => B,
    }
}

pub(crate) fn killed_in_each_phase(sandbox: &Sandbox) {
    for (kind, target) in stages() {
        let victim = victim_of(kind, target);
        let mut workload = Workload::start(sandbox, "killed");
        let session = workload.session(Duration::from_secs(5));
        let (dir, mut run) = start_run(sandbox, &workload, kind);
        // Right before the stage: stop the victim (the request waits in its socket), and kill
        // it 300 ms into the stage.
        let victim_pid = workload.workers[victim].pid() as i32;
        let mut killer = None;
        let mut before = |stage: Stage| {
            if stage == target && killer.is_none() {
                workload.signal(victim, libc::SIGSTOP);
                killer = Some(std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(300));
                    // SAFETY: kill(2) on our own child's pid.
                    unsafe { libc::kill(victim_pid, libc::SIGKILL) };
                }));
            }
        };
        let mut publish = |state: &StateFile| {
            state::publish(&dir, state)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let (result, took) = drive(&session, &mut run, &mut publish, &mut before);
        killer.expect("the stage was reached").join().unwrap();
        let (error, what) = check_failure(
            result,
            (kind, target, victim),
            "killed",
            workload.pid(victim),
            "closed the connection",
        );
        // Noticed when it died, not at the timeout.
        check_failed_after(&what, took, Duration::from_millis(250));
        workload.workers[victim].kill().expect("reap");
        // The survivors finished the stage (or, re-importing from a dead creator, fail-stopped)
        // and went no further.
        let restoring_from_dead_creator =
            victim == A && target == Stage::Execute(Operation::RestoreUnicast);
        // A capture stopped before prepare_unicast is rolled back: the survivors are active
        // again, unless the dead one is the creator they import from (they cannot ask it
        // whether it still holds its memory, and fail-stop).
        let rolled_back = kind == RunKind::Capture && target.rolls_back();
        let survivors = match (restoring_from_dead_creator, rolled_back) {
            (true, _) => Phase::Failed,
            (false, true) if victim == A => Phase::Failed,
            (false, true) => Phase::Active,
            (false, false) => phase_through(kind, target),
        };
        let check_survivors = |when: &str| {
            for index in (0..3).filter(|&i| i != victim) {
                assert_eq!(
                    workload.phase(index),
                    survivors,
                    "{what}{when}: {}",
                    NAMES[index]
                );
            }
        };
        check_survivors("");
        if restoring_from_dead_creator {
            assert_eq!(
                error.fail_stopped,
                [workload.pid(B), workload.pid(C)],
                "{error}"
            );
        }
        // The published state (if the capture got that far) is complete; a second run refuses
        // before changing anyone: the dead participant does not answer.
        if kind == RunKind::Capture {
            assert!(matches!(state::load(&dir), Err(StateError::Missing { .. })));
        }
        let second =
            run_again(sandbox, &session, kind, &dir).expect_err(&format!("{what}: a second run"));
        let CommandError::Run(second) = &second else {
            panic!("{what}: {second}");
        };
        assert_eq!(second.stage, Stage::Inspect, "{what}: {second}");
        assert!(!second.mutated, "{what}: {second}");
        assert!(
            second.to_string().contains(&format!(
                "participant {}: no reply: socket {}",
                workload.pid(victim),
                workload
                    .control
                    .join(format!("cuinterpose-{}.sock", workload.pid(victim)))
                    .display()
            )) && second.to_string().contains("nothing listens on the socket"),
            "{what}: {second}"
        );
        check_survivors(", after a second run");
    }
}

pub(crate) fn stops_answering(sandbox: &Sandbox) {
    // Through the binary, with the timeout from the environment: silent at inspect, nothing
    // changed; the request it reads once resumed is read-only, so a second prepare succeeds.
    let mut workload = Workload::start(sandbox, "silent");
    workload.signal(B, libc::SIGSTOP);
    let dir = sandbox.fresh("checkpoint");
    let started = Instant::now();
    let stderr = workload.refused_by_binary(
        "prepare",
        &dir,
        &[
            ("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "1"),
            ("CUINTERPOSE_COPY_TIMEOUT_SECONDS", "1"),
        ],
    );
    let took = started.elapsed();
    assert!(
        stderr.contains(&format!(
            "prepare failed in phase inspect: participant {}: no reply:",
            workload.pid(B)
        )) && stderr.contains("timed out after 1s")
            && stderr.contains("nothing was changed in any participant"),
        "{stderr}"
    );
    check_failed_after(
        "B silent at prepare's inspect (binary)",
        took,
        Duration::from_secs(1),
    );
    workload.signal(B, libc::SIGCONT);
    assert!(matches!(state::load(&dir), Err(StateError::Missing { .. })));
    assert_eq!(workload.phases(), [Phase::Active; 3]);
    let dir = prepare(sandbox, &workload);
    commands::restore(&workload.session(Duration::from_secs(5)), &dir, &mut |_| {})
        .expect("restore after a harmless stall");
    workload.check_shared(7);
    drop(workload);

    // Through the library, silent in a mutating phase: the run fails after the timeout naming
    // it; once resumed it does the work it read (its reply goes nowhere), and a second run
    // refuses on its phase instead of repeating anything.
    let cases = [
        (RunKind::Capture, Stage::BeginCheckpoint, C),
        (
            RunKind::Capture,
            Stage::Execute(Operation::SaveAllocations),
            A,
        ),
        (
            RunKind::Capture,
            Stage::Execute(Operation::PrepareUnicast),
            B,
        ),
        (
            RunKind::Restore,
            Stage::Execute(Operation::LoadAllocations),
            A,
        ),
        (
            RunKind::Restore,
            Stage::Execute(Operation::RestoreMulticastCreators),
            C,
        ),
    ];
    for (kind, target, victim) in cases {
        let mut workload = Workload::start(sandbox, "silent");
        let (dir, mut run) = start_run(sandbox, &workload, kind);
        let session = workload.session(Duration::from_secs(1));
        let mut before = |stage: Stage| {
            if stage == target {
                workload.signal(victim, libc::SIGSTOP);
            }
        };
        let (result, took) = drive(&session, &mut run, &mut no_publish, &mut before);
        // begin_checkpoint's reply may take twice the control timeout (the drain).
        let timed_out = if target == Stage::BeginCheckpoint {
            "timed out after 2s"
        } else {
            "timed out after 1s"
        };
        let (error, what) = check_failure(
            result,
            (kind, target, victim),
            "silent",
            workload.pid(victim),
            timed_out,
        );
        let rolled_back = kind == RunKind::Capture && target.rolls_back();
        // Only the silent one failed the stage. Asked to roll back, it stays silent, and so
        // do its importers, which wait for its phase before they give up their memory.
        let stage_failures: Vec<_> = error
            .failures
            .iter()
            .filter(|f| {
                !matches!(
                    f.reason,
                    Reason::RollingBack { .. } | Reason::Settling { .. }
                )
            })
            .collect();
        assert_eq!(
            stage_failures.len(),
            1,
            "{what}: only the silent one: {error}"
        );
        assert_eq!(stage_failures[0].participant, Some(workload.pid(victim)));
        // Silent in begin_checkpoint, its roll_back is excused (it thaws on its own); in a
        // later stage the failed roll_back is a failure of its own. Silent in prepare_unicast
        // or a restore's step for good, it is waited for (settle) until the quiet window
        // passes: a failure too.
        let excused = target == Stage::BeginCheckpoint;
        let settled =
            target == Stage::Execute(Operation::PrepareUnicast) || kind == RunKind::Restore;
        assert_eq!(
            error.failures.len() > 1,
            (rolled_back && !excused) || settled,
            "{error}"
        );
        assert!(!error.settled, "{error}");
        assert_eq!(
            error.unconfirmed,
            if excused {
                vec![workload.pid(victim)]
            } else {
                Vec::new()
            },
            "{error}"
        );
        check_failed_after(&what, took, Duration::from_secs(1));
        workload.signal(victim, libc::SIGCONT);
        if rolled_back {
            // The others rolled back at once; resumed, the silent one does the work it read,
            // then the roll_back queued behind it: everyone is active, and a second capture
            // goes through.
            for index in 0..3 {
                // Resumed, the silent one reads both waiting requests at once, each on its
                // own connection thread; should the roll_back reach its control worker before
                // begin_checkpoint, it is refused as out of order, and the process, frozen,
                // rolls back on its own after its quiet window (three of the shims' default
                // control timeouts). Seen in about 1 run in 6; either way it ends active.
                let limit = if index == victim {
                    cuinterpose_protocol::transport::Timeouts::DEFAULT_CONTROL * 3
                        + Duration::from_secs(5)
                } else {
                    Duration::from_secs(5)
                };
                workload.await_phase_within(index, Phase::Active, limit);
            }
            let dir = prepare(sandbox, &workload);
            commands::restore(&session, &dir, &mut |_| {}).expect("restore after the rollback");
            workload.check_shared(7);
            continue;
        }
        let done = phase_through(kind, target);
        workload.await_phase(victim, done);
        let operation = match target {
            Stage::Execute(operation) => operation.wire_name(),
            _ => "begin_checkpoint",
        };
        workload.await_log(victim, &format!("could not send the {operation} reply"));
        if kind == RunKind::Restore {
            // Restore again: it picks up where each participant stands and completes.
            run_again(sandbox, &session, kind, &dir)
                .unwrap_or_else(|e| panic!("{what}: a second restore: {e}"));
            assert_eq!(workload.phases(), [Phase::Active; 3], "{what}");
            workload.check_shared(7);
            continue;
        }
        let phases = workload.phases();
        let second =
            run_again(sandbox, &session, kind, &dir).expect_err(&format!("{what}: a second run"));
        let expected_phase = match kind {
            RunKind::Capture => Phase::Active,
            RunKind::Restore | RunKind::Check => Phase::Released,
        };
        check_refused_out_of_phase(
            &second,
            kind.command(),
            workload.pid(victim),
            done,
            expected_phase,
        );
        assert_eq!(
            workload.phases(),
            phases,
            "{what}: the second run changed something"
        );
    }
}

/// Sends `request` to participant `index` and closes the connection without reading the
/// reply, as a coordinator that dies right after sending.
pub(crate) fn send_and_vanish(workload: &Workload, index: usize, request: &Request) {
    let socket = workload
        .control
        .join(format!("cuinterpose-{}.sock", workload.pid(index)));
    crate::support::send_and_vanish(&socket, request);
}

pub(crate) fn lost_reply(sandbox: &Sandbox) {
    // begin_checkpoint reaches B, the coordinator is gone before the reply: B is frozen, and
    // the next prepare refuses on that instead of freezing it again.
    let workload = Workload::start(sandbox, "lost");
    send_and_vanish(&workload, B, &Request::BeginCheckpoint);
    workload.await_phase(B, Phase::Frozen);
    let session = workload.session(Duration::from_secs(5));
    let dir = sandbox.fresh("checkpoint");
    let error = commands::prepare(&session, &dir, &mut |_| {}).expect_err("prepare");
    check_refused_out_of_phase(
        &error,
        "prepare",
        workload.pid(B),
        Phase::Frozen,
        Phase::Active,
    );
    assert_eq!(
        workload.phases(),
        [Phase::Active, Phase::Frozen, Phase::Active]
    );
    // The same through the binary: exit 1, the same words.
    let stderr = workload.refused_by_binary("prepare", &sandbox.fresh("checkpoint"), &[]);
    assert!(
        stderr.contains(&format!(
            "cuinterpose: prepare failed in phase inspect: participant {}: in phase frozen, \
             expected phase active",
            workload.pid(B)
        )),
        "{stderr}"
    );
    workload.await_log(B, "could not send the begin_checkpoint reply");
    // A second begin_checkpoint to the frozen participant is refused, not repeated.
    let r = workload.refused_as(B, &Request::BeginCheckpoint, RefusalCode::OutOfOrder);
    assert!(
        r.message
            .as_str()
            .contains("begin_checkpoint needs phase active; this process is in phase frozen"),
        "{r:?}"
    );
    drop(workload);

    // load_allocations reaches A after a complete prepare, the reply is lost: A loaded and
    // freed its host copy; the restore run again picks up from there (A is not asked to load
    // again) and completes.
    let mut workload = Workload::start(sandbox, "lost");
    let dir = prepare(sandbox, &workload);
    send_and_vanish(
        &workload,
        A,
        &Request::Execute(ExecuteRequest::host(Operation::LoadAllocations)),
    );
    workload.await_phase(A, Phase::Loaded);
    let session = workload.session(Duration::from_secs(5));
    workload.await_log(A, "could not send the load_allocations reply");
    workload.await_log(
        A,
        "the coordinator did not receive the load_allocations reply; the host copy is freed",
    );
    assert_eq!(
        workload.phases(),
        [Phase::Loaded, Phase::Released, Phase::Released]
    );
    let report = commands::restore(&session, &dir, &mut |_| {}).expect("restore picks up");
    let load = report
        .phases
        .iter()
        .find(|p| p.name == "load_allocations")
        .expect("load_allocations ran");
    assert_eq!(load.participants, 2, "B and C only: {report:?}");
    assert_eq!(workload.phases(), [Phase::Active; 3]);
    workload.check_shared(7);
    // Loading again is refused (out of order), not repeated.
    let load = Request::Execute(ExecuteRequest::host(Operation::LoadAllocations));
    workload.refused_as(A, &load, RefusalCode::OutOfOrder);
}
