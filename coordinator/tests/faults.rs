//! Fault injection during the lifecycle, over the real shim and fakecuda: three
//! `cuinterpose-worker` processes share one VMM allocation (A creates it, B and C import it),
//! and things go wrong at every phase: a participant killed, a participant that stops answering
//! (SIGSTOP), a reply lost after the work was done, the coordinator stopped or killed while it
//! publishes the state, a partial or corrupt state, a creator that dies under its importers.
//!
//! Expected every time: the coordinator fails within its timeout naming the participant and
//! the phase; a state file is complete or absent, never partial; `restore` refuses a partial or
//! corrupt state before touching anyone; a second run refuses clearly instead of repeating
//! work; a fail-stopped participant refuses further lifecycle operations and says why.
//!
//! `harness = false`: the same executable is, with `CUI_FAULTS_ROLE=publish`, the child
//! process that publishes a state and is killed while doing so.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::{Reason, Run, RunError, RunKind, Stage, Step, phase_after};
use cuinterpose_coordinator::report::Report;
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state::{self, PublishHook, PublishStep, StateError};
use cuinterpose_protocol::transport::{Endpoint, Timeouts, call};
use cuinterpose_protocol::{
    ExecuteRequest, NamespacePid, Operation, Phase, RefusalCode, RefusedReply, Reply, Request,
    StateFile,
};
use cuinterpose_workload::Worker;
use support::cli::{cuinterpose, path, text};
use support::harness::Test;
use support::sandbox::{Sandbox, check_writes_cross};

const MIB: u64 = 1 << 20;
const SHARED: u64 = 4 * MIB;
const ROLE: &str = "CUI_FAULTS_ROLE";
const INPUT: &str = "CUI_FAULTS_INPUT";
const DIR: &str = "CUI_FAULTS_DIR";
const KILL_AT: &str = "CUI_FAULTS_KILL_AT";

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("publish") {
        publisher();
        return;
    }
    let tests: [Test<Sandbox>; 7] = [
        ("a_participant_killed_in_each_phase", killed_in_each_phase),
        ("a_participant_that_stops_answering", stops_answering),
        ("a_lost_reply_is_not_repeated", lost_reply),
        (
            "publication_interrupted_at_each_step",
            publication_interrupted,
        ),
        ("the_publisher_killed_at_each_step", publisher_killed),
        ("restore_refuses_partial_or_corrupt_state", corrupt_state),
        (
            "a_fail_stopped_participant_refuses_further_operations",
            fail_stopped,
        ),
    ];
    support::harness::run(&tests, || Sandbox::new("faults"));
}

/// Participant indexes.
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const NAMES: [&str; 3] = ["A (creator)", "B (importer)", "C (importer)"];

struct Workload {
    workers: Vec<Worker>,
    logs: Vec<PathBuf>,
    addresses: Vec<u64>,
    control: PathBuf,
}

impl Workload {
    /// Three workers sharing one allocation, in a directory of their own in `sandbox`.
    fn start(sandbox: &Sandbox, label: &str) -> Self {
        let root = sandbox.fresh(label);
        let spawn = |name: &str| {
            let log = root.join(format!("{name}.log"));
            (sandbox.worker(&root, Some(&log)), log)
        };
        let (mut a, log_a) = spawn("a");
        let (mut b, log_b) = spawn("b");
        let (mut c, log_c) = spawn("c");
        let handle = a.create(SHARED, 0, 1).expect("create");
        let va = a.map_rw(handle, SHARED, 0).expect("map a");
        a.fill(va, SHARED, 7).expect("fill");
        let ticket = a
            .export(handle)
            .expect("export")
            .as_fd()
            .try_clone_to_owned()
            .unwrap();
        let hb = b.import(ticket.as_fd()).expect("import b");
        let vb = b.map_rw(hb, SHARED, 0).expect("map b");
        let hc = c.import(ticket.as_fd()).expect("import c");
        let vc = c.map_rw(hc, SHARED, 0).expect("map c");
        c.release(hc).expect("the mapping keeps it");
        Workload {
            workers: vec![a, b, c],
            logs: vec![log_a, log_b, log_c],
            addresses: vec![va, vb, vc],
            control: Sandbox::control_dir(&root),
        }
    }

    fn pid(&self, index: usize) -> NamespacePid {
        NamespacePid::new(self.workers[index].worker_pid() as u32).expect("pid")
    }

    fn pids(&self) -> Vec<NamespacePid> {
        (0..self.workers.len()).map(|i| self.pid(i)).collect()
    }

    fn session(&self, timeout: Duration) -> Session {
        Session::open(
            &self.control,
            &self.pids(),
            Timeouts::new(timeout, timeout).expect("timeouts"),
        )
        .expect("session")
    }

    fn signal(&self, index: usize, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.workers[index].pid() as i32, signal) };
        assert_eq!(rc, 0, "kill {signal}: {}", std::io::Error::last_os_error());
    }

    /// `cuinterpose COMMAND --checkpoint-dir DIR` on this workload's control directory, with
    /// `env`, which exits 1: its stderr.
    fn refused_by_binary(&self, command: &str, dir: &Path, env: &[(&str, &str)]) -> String {
        let output = cuinterpose(
            &[
                command,
                "--checkpoint-dir",
                path(dir),
                "--control-dir",
                path(&self.control),
            ],
            env,
        );
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        stderr
    }

    /// Asks participant `index` directly (not through the coordinator).
    fn ask(&self, index: usize, request: &Request) -> Result<Reply, String> {
        let endpoint = Endpoint::for_pid(&self.control, self.pid(index)).expect("endpoint");
        call(&endpoint, request, None, Duration::from_secs(5))
            .map(|(reply, _)| reply)
            .map_err(|e| e.to_string())
    }

    /// Participant `index`'s refusal of `request` (anything else fails the test).
    fn refusal(&self, index: usize, request: &Request) -> RefusedReply {
        match self.ask(index, request) {
            Ok(Reply::Refused(refusal)) => refusal,
            other => panic!("{}: {request:?}: {other:?}", NAMES[index]),
        }
    }

    fn phase(&self, index: usize) -> Phase {
        match self.ask(index, &Request::Inspect) {
            Ok(Reply::Inspection(i)) => i.phase,
            other => panic!("inspect {}: {other:?}", NAMES[index]),
        }
    }

    /// Every participant's phase, in index order.
    fn phases(&self) -> Vec<Phase> {
        (0..self.workers.len()).map(|i| self.phase(i)).collect()
    }

    /// Polls until participant `index` is in `phase` (a request it read late takes effect).
    fn await_phase(&self, index: usize, phase: Phase) {
        let started = Instant::now();
        loop {
            let now = self.phase(index);
            if now == phase {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{} stays in phase {now}, expected {phase}",
                NAMES[index]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self, index: usize) -> String {
        std::fs::read_to_string(&self.logs[index]).unwrap_or_default()
    }

    /// Polls until participant `index` logged `text` (the handler thread that failed to send a
    /// reply logs it after the phase changed).
    fn await_log(&self, index: usize, text: &str) {
        let started = Instant::now();
        while !self.log(index).contains(text) {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{}: no {text:?} in its log:\n{}",
                NAMES[index],
                self.log(index)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Same bytes at the same addresses, and still shared: each writes, the others read.
    fn check_shared(&mut self, seed: u64) {
        for (worker, &address) in self.workers.iter_mut().zip(&self.addresses) {
            worker.verify(address, SHARED, seed).expect("bytes kept");
        }
        check_writes_cross(&mut self.workers, &self.addresses, SHARED, 1000 + seed * 10);
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // A stopped worker cannot notice its closed control socket.
        for worker in &self.workers {
            // SAFETY: kill(2) on our own child's pid (possibly already dead: ignored).
            unsafe { libc::kill(worker.pid() as i32, libc::SIGCONT) };
        }
        if !std::thread::panicking() {
            return;
        }
        for (name, log) in NAMES.iter().zip(&self.logs) {
            eprintln!(
                "--- {name} log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

/// Runs `run` through `session`, calling `before` ahead of each broadcast; returns the outcome
/// and the time the last step took.
fn drive(
    session: &Session,
    run: &mut Run,
    publish: &mut dyn FnMut(&StateFile) -> Result<(), String>,
    before: &mut dyn FnMut(Stage),
) -> (Result<Report, RunError>, Duration) {
    let mut last = Duration::ZERO;
    loop {
        match run.step().clone() {
            Step::Broadcast {
                stage,
                request,
                participants,
            } => {
                before(stage);
                let started = Instant::now();
                let outcomes = session.broadcast(&request, &participants);
                last = started.elapsed();
                run.feed(outcomes, last);
            }
            Step::Publish(state) => {
                let started = Instant::now();
                let result = publish(&state);
                last = started.elapsed();
                run.feed_publish(result, last);
            }
            Step::Done(report) => return (Ok(report), last),
            Step::Failed(error) => return (Err(error), last),
        }
    }
}

fn no_publish(_: &StateFile) -> Result<(), String> {
    Ok(())
}

/// prepare through the library into a fresh directory; returns it.
fn prepare(sandbox: &Sandbox, workload: &Workload) -> PathBuf {
    let dir = sandbox.fresh("checkpoint");
    commands::prepare(&workload.session(Duration::from_secs(5)), &dir, &mut |_| {})
        .expect("prepare");
    assert_eq!(workload.phases(), [Phase::Released; 3]);
    dir
}

/// A run of `kind` for `workload` and the checkpoint directory it works in: a fresh one for a
/// capture, a prepared one for a restore.
fn start_run(sandbox: &Sandbox, workload: &Workload, kind: RunKind) -> (PathBuf, Run) {
    match kind {
        RunKind::Capture => (sandbox.fresh("checkpoint"), Run::capture(workload.pids())),
        RunKind::Restore => {
            let dir = prepare(sandbox, workload);
            let run = Run::restore(&state::load(&dir).expect("state"), workload.pids());
            (dir, run)
        }
    }
}

/// The command of `kind` once more, after a failed run: `prepare` into a fresh directory, or
/// `restore` from `dir`.
fn run_again(
    sandbox: &Sandbox,
    session: &Session,
    kind: RunKind,
    dir: &Path,
) -> Result<Report, CommandError> {
    match kind {
        RunKind::Capture => commands::prepare(session, &sandbox.fresh("again"), &mut |_| {}),
        RunKind::Restore => commands::restore(session, dir, &mut |_| {}),
    }
}

/// `error` is `command`'s refusal at inspect, with nothing changed: participant `victim` is in
/// phase `found`, not in phase `expected`.
fn check_refused_out_of_phase(
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
fn stages() -> Vec<(RunKind, Stage)> {
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
fn phase_through(kind: RunKind, stage: Stage) -> Phase {
    match (kind, stage) {
        (RunKind::Capture, Stage::Inspect) => Phase::Active,
        (RunKind::Capture, Stage::BeginCheckpoint) => Phase::Frozen,
        (RunKind::Restore, Stage::Inspect) => Phase::Released,
        (_, Stage::Execute(operation)) => phase_after(operation),
        (_, Stage::Verify) => Phase::Active,
        other => panic!("{other:?}"),
    }
}

/// The run failed in `stage`, naming `victim` first with a reason containing `text`.
fn check_failure(error: &RunError, kind: RunKind, stage: Stage, victim: NamespacePid, text: &str) {
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
    // Anything after the first mutating request is fail-stop, loudly.
    let mutated = stage != Stage::Inspect;
    assert_eq!(error.mutated, mutated, "{error}");
    assert_eq!(error.exit_code(), if mutated { 2 } else { 1 });
    assert_eq!(message.contains("FAIL-STOP"), mutated, "{message}");
}

/// `what` failed `took` after the fault, at least `at_least` (when it was noticed) and in
/// less than 3 s (not at some later timeout); says so.
fn check_failed_after(what: &str, took: Duration, at_least: Duration) {
    assert!(
        took >= at_least && took < Duration::from_secs(3),
        "{what}: failed after {took:?}"
    );
    println!("  {what}: failed after {took:.1?}");
}

/// Who dies in which stage: every participant dies somewhere, the creator during the copy
/// phases and while its importers re-import from it.
fn victim_of(kind: RunKind, stage: Stage) -> usize {
    match (kind, stage) {
        (_, Stage::Execute(Operation::SaveAllocations | Operation::LoadAllocations)) => A,
        (_, Stage::Execute(Operation::RestoreUnicast | Operation::RestoreMulticastBindings)) => A,
        (_, Stage::Execute(Operation::PrepareMulticast | Operation::RestoreMulticastDevices)) => C,
        (RunKind::Capture, Stage::BeginCheckpoint) => C,
        _ => B,
    }
}

fn killed_in_each_phase(sandbox: &Sandbox) {
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
        let what = format!("{} killed in {} {}", NAMES[victim], kind.command(), target);
        let error = result.expect_err(&what);
        check_failure(
            &error,
            kind,
            target,
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
        let survivors = if restoring_from_dead_creator {
            Phase::Failed
        } else {
            phase_through(kind, target)
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

fn stops_answering(sandbox: &Sandbox) {
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
        let workload = Workload::start(sandbox, "silent");
        let (dir, mut run) = start_run(sandbox, &workload, kind);
        let session = workload.session(Duration::from_secs(1));
        let mut before = |stage: Stage| {
            if stage == target {
                workload.signal(victim, libc::SIGSTOP);
            }
        };
        let (result, took) = drive(&session, &mut run, &mut no_publish, &mut before);
        let what = format!("{} silent in {} {}", NAMES[victim], kind.command(), target);
        let error = result.expect_err(&what);
        check_failure(
            &error,
            kind,
            target,
            workload.pid(victim),
            // begin_checkpoint's reply may take twice the control timeout (the drain).
            if target == Stage::BeginCheckpoint {
                "timed out after 2s"
            } else {
                "timed out after 1s"
            },
        );
        assert_eq!(
            error.failures.len(),
            1,
            "{what}: only the silent one: {error}"
        );
        check_failed_after(&what, took, Duration::from_secs(1));
        workload.signal(victim, libc::SIGCONT);
        let done = phase_through(kind, target);
        workload.await_phase(victim, done);
        let operation = match target {
            Stage::Execute(operation) => operation.wire_name(),
            _ => "begin_checkpoint",
        };
        workload.await_log(victim, &format!("could not send the {operation} reply"));
        let phases = workload.phases();
        let second =
            run_again(sandbox, &session, kind, &dir).expect_err(&format!("{what}: a second run"));
        let expected_phase = match kind {
            RunKind::Capture => Phase::Active,
            RunKind::Restore => Phase::Released,
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
fn send_and_vanish(workload: &Workload, index: usize, request: &Request) {
    let socket = workload
        .control
        .join(format!("cuinterpose-{}.sock", workload.pid(index)));
    support::send_and_vanish(&socket, request);
}

fn lost_reply(sandbox: &Sandbox) {
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
    let r = workload.refusal(B, &Request::BeginCheckpoint);
    assert_eq!(r.code, RefusalCode::OutOfOrder, "{r:?}");
    assert!(
        r.message
            .as_str()
            .contains("begin_checkpoint needs phase active; this process is in phase frozen"),
        "{r:?}"
    );
    drop(workload);

    // load_allocations reaches A after a complete prepare, the reply is lost: A loaded and
    // freed its host copy; restore refuses on A's phase before touching B or C.
    let workload = Workload::start(sandbox, "lost");
    let dir = prepare(sandbox, &workload);
    send_and_vanish(
        &workload,
        A,
        &Request::Execute(ExecuteRequest {
            operation: Operation::LoadAllocations,
        }),
    );
    workload.await_phase(A, Phase::Loaded);
    let session = workload.session(Duration::from_secs(5));
    let error = commands::restore(&session, &dir, &mut |_| {}).expect_err("restore");
    check_refused_out_of_phase(
        &error,
        "restore",
        workload.pid(A),
        Phase::Loaded,
        Phase::Released,
    );
    assert_eq!(
        workload.phases(),
        [Phase::Loaded, Phase::Released, Phase::Released]
    );
    workload.await_log(A, "could not send the load_allocations reply");
    workload.await_log(
        A,
        "the coordinator did not receive the load_allocations reply; the host copy is freed",
    );
    // Loading again is refused (out of order), not repeated.
    let r = workload.refusal(
        A,
        &Request::Execute(ExecuteRequest {
            operation: Operation::LoadAllocations,
        }),
    );
    assert_eq!(r.code, RefusalCode::OutOfOrder, "{r:?}");
}

/// Stops publication after one step with an error (the coordinator dying there, as far as the
/// file system can tell), checking the final name after every step.
struct FailAt {
    dir: PathBuf,
    step: PublishStep,
    seen: Vec<(PublishStep, bool)>,
}

impl PublishHook for FailAt {
    fn after(&mut self, step: PublishStep) -> std::io::Result<()> {
        let present = match state::load(&self.dir) {
            Ok(_) => true,
            Err(StateError::Missing { .. }) => false,
            Err(error) => panic!("a partial state after {step:?}: {error}"),
        };
        self.seen.push((step, present));
        if step == self.step {
            return Err(std::io::Error::other("the coordinator stops here"));
        }
        Ok(())
    }
}

/// Names in `dir` other than the state file.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name != state::STATE_FILE_NAME)
        .collect()
}

fn publication_interrupted(sandbox: &Sandbox) {
    for step in PublishStep::ALL {
        let mut workload = Workload::start(sandbox, "publish");
        let session = workload.session(Duration::from_secs(5));
        let dir = sandbox.fresh("checkpoint");
        let mut hook = FailAt {
            dir: dir.clone(),
            step,
            seen: Vec::new(),
        };
        let mut run = Run::capture(workload.pids());
        let mut publish = |state: &StateFile| {
            state::publish_with(&dir, state, &mut hook)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let (result, _) = drive(&session, &mut run, &mut publish, &mut |_| {});
        let error = result.expect_err("publication stopped");
        assert_eq!(error.stage, Stage::PublishState, "{error}");
        assert!(error.mutated && error.exit_code() == 2, "{error}");
        let message = error.to_string();
        assert!(
            message.contains(
                "prepare failed in phase publish_state: coordinator: cannot publish the state:"
            ) && message.contains(&format!("publication stopped after step {step:?}"))
                && message.contains("FAIL-STOP"),
            "{message}"
        );
        let published = step >= PublishStep::Published;
        assert_eq!(
            hook.seen.last(),
            Some(&(step, published)),
            "{:?}",
            hook.seen
        );
        assert!(
            leftovers(&dir).is_empty(),
            "{step:?}: {:?}",
            leftovers(&dir)
        );
        assert_eq!(workload.phases(), [Phase::Released; 3]);
        let restored = commands::restore(&session, &dir, &mut |_| {});
        if published {
            // Complete: restore works from it, and the sharing is back.
            assert_eq!(state::load(&dir).expect("complete"), *run.state().unwrap());
            restored.expect("restore from a state published before the stop");
            workload.check_shared(7);
        } else {
            // Absent: restore says so before contacting anyone.
            let error = restored.expect_err("no state");
            assert!(
                matches!(error, CommandError::State(StateError::Missing { .. })),
                "{error}"
            );
            assert_eq!(error.exit_code(), 1);
            assert_eq!(workload.phases(), [Phase::Released; 3]);
        }
        println!(
            "  stopped after {step:?}: state {}",
            if published { "complete" } else { "absent" }
        );
    }
}

/// The child: publishes the state in `$CUI_FAULTS_INPUT` into `$CUI_FAULTS_DIR`, killing
/// itself with SIGKILL after step `$CUI_FAULTS_KILL_AT`; or, with `ready`, says so on stdout
/// and publishes (the parent kills it at a moment of its choosing).
fn publisher() {
    struct Kill(Option<PublishStep>);
    impl PublishHook for Kill {
        fn after(&mut self, step: PublishStep) -> std::io::Result<()> {
            if self.0 == Some(step) {
                // SAFETY: raise(2) has no preconditions; SIGKILL ends the process here.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            Ok(())
        }
    }
    let input = std::env::var_os(INPUT).expect(INPUT);
    let dir = PathBuf::from(std::env::var_os(DIR).expect(DIR));
    let state = state::load_file(Path::new(&input)).expect("input state");
    let at = std::env::var(KILL_AT).expect(KILL_AT);
    let step = PublishStep::ALL
        .into_iter()
        .find(|step| format!("{step:?}") == at);
    if step.is_none() {
        assert_eq!(at, "ready");
        let mut out = std::io::stdout();
        out.write_all(b"ready\n").unwrap();
        out.flush().unwrap();
    }
    state::publish_with(&dir, &state, &mut Kill(step)).expect("publish");
}

fn publisher_command(input: &Path, dir: &Path, kill_at: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("current exe"));
    command
        .env(ROLE, "publish")
        .env(INPUT, input)
        .env(DIR, dir)
        .env(KILL_AT, kill_at);
    command
}

/// Complete (equal to `expected`) or absent, never partial.
fn complete_or_absent(dir: &Path, expected: &StateFile) -> bool {
    match state::load(dir) {
        Ok(state) => {
            assert_eq!(state, *expected, "{}", dir.display());
            true
        }
        Err(StateError::Missing { .. }) => false,
        Err(error) => panic!("a partial state: {error}"),
    }
}

fn publisher_killed(sandbox: &Sandbox) {
    // The state of a real capture, as the child's input.
    let workload = Workload::start(sandbox, "killed-publisher");
    let input_dir = prepare(sandbox, &workload);
    let expected = state::load(&input_dir).expect("state");
    let input = state::state_path(&input_dir);
    drop(workload);

    for step in PublishStep::ALL {
        let dir = sandbox.fresh("checkpoint");
        let status = publisher_command(&input, &dir, &format!("{step:?}"))
            .status()
            .expect("run the publisher");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{step:?}: {status}");
        let published = complete_or_absent(&dir, &expected);
        assert_eq!(published, step >= PublishStep::Published, "{step:?}");
        // A killed publisher leaves its temp file (no destructor ran) until the next
        // publication in that directory removes it; it is never mistaken for the state, and
        // never blocks a later one.
        let left = leftovers(&dir);
        assert!(
            left.iter()
                .all(|name| name.starts_with(".cuinterpose.state.") && name.ends_with(".tmp")),
            "{step:?}: {left:?}"
        );
        if !published {
            let error = commands::restore(
                &Session::open(&dir, &[NamespacePid::new(1).unwrap()], Timeouts::default())
                    .expect("session"),
                &dir,
                &mut |_| {},
            )
            .expect_err("no state");
            assert!(
                matches!(error, CommandError::State(StateError::Missing { .. })),
                "{error}"
            );
            state::publish(&dir, &expected).expect("a later publication is not blocked");
            assert!(complete_or_absent(&dir, &expected));
            // ... and that publication removed the dead publisher's temp file.
            assert_eq!(leftovers(&dir), Vec::<String>::new(), "{step:?}");
        }
        println!(
            "  killed after {step:?}: state {}, {} temp file(s) left",
            if published { "complete" } else { "absent" },
            left.len()
        );
    }

    // Killed at arbitrary moments of a publication: complete or absent every time.
    let mut seed = 0x5eed_u64;
    let (mut complete, mut absent) = (0, 0);
    for _ in 0..20 {
        let dir = sandbox.fresh("checkpoint");
        let mut child = publisher_command(&input, &dir, "ready")
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the publisher");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("ready");
        assert_eq!(line, "ready\n");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 3000));
        let _ = child.kill();
        let _ = child.wait();
        if complete_or_absent(&dir, &expected) {
            complete += 1;
        } else {
            absent += 1;
        }
    }
    println!("  killed at random moments: {complete} complete, {absent} absent, 0 partial");
}

fn corrupt_state(sandbox: &Sandbox) {
    let mut workload = Workload::start(sandbox, "corrupt");
    let good_dir = prepare(sandbox, &workload);
    let good = std::fs::read(state::state_path(&good_dir)).expect("state bytes");
    let session = workload.session(Duration::from_secs(5));
    let saved = state::load(&good_dir).unwrap();

    // Bytes that are not a state: each refused at loading, before any participant is asked.
    let mut corruptions: Vec<(String, Vec<u8>, &str)> = vec![
        ("an empty file".into(), Vec::new(), "not an envelope"),
        (
            "another version".into(),
            {
                let mut bytes = good.clone();
                bytes[9] = 99;
                bytes
            },
            "unsupported protocol version 99",
        ),
        (
            "trailing garbage".into(),
            {
                let mut bytes = good.clone();
                bytes.extend_from_slice(b"garbage");
                bytes
            },
            "trailing bytes",
        ),
    ];
    for cut in [1, 15, 16, good.len() / 2, good.len() - 1] {
        corruptions.push((
            format!("truncated to {cut} bytes"),
            good[..cut].to_vec(),
            "corrupt checkpoint state",
        ));
    }
    for (what, bytes, text) in &corruptions {
        let dir = sandbox.fresh("corrupt");
        std::fs::write(state::state_path(&dir), bytes).unwrap();
        let error = commands::restore(&session, &dir, &mut |_| {}).expect_err(what);
        assert!(
            matches!(error, CommandError::State(StateError::Corrupt { .. })),
            "{what}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains(text) && message.contains(path(&dir)),
            "{what}: {message}"
        );
        assert_eq!(error.exit_code(), 1);
        assert_eq!(workload.phases(), [Phase::Released; 3], "{what}");
    }
    // One byte replaced, at every 5th position of the body: refused every time, either as
    // corrupt (at loading) or as not matching (at the check of the participants or at the
    // read-only inspect), and never with anyone changed.
    let (mut corrupt, mut mismatched) = (0, 0);
    for at in (15..good.len()).step_by(5) {
        let mut bytes = good.clone();
        // 0xc1 is never used in MessagePack; inside a random 16-byte id it may already be
        // there, and then any other value changes the id.
        bytes[at] = if good[at] == 0xc1 { 0x00 } else { 0xc1 };
        let dir = sandbox.fresh("corrupt");
        std::fs::write(state::state_path(&dir), &bytes).unwrap();
        match commands::restore(&session, &dir, &mut |_| {}) {
            Err(CommandError::State(StateError::Corrupt { .. })) => corrupt += 1,
            Err(CommandError::Run(run)) if !run.mutated => {
                assert!(
                    matches!(run.stage, Stage::CheckState | Stage::Inspect),
                    "byte {at}: {run}"
                );
                mismatched += 1;
            }
            other => panic!("byte {at} replaced: {other:?}"),
        }
    }
    assert_eq!(workload.phases(), [Phase::Released; 3]);
    println!("  one byte replaced: {corrupt} refused as corrupt, {mismatched} as not matching");

    // Through the binary: exit 1, the file named.
    let dir = sandbox.fresh("corrupt");
    std::fs::write(state::state_path(&dir), &good[..good.len() / 2]).unwrap();
    let stderr = workload.refused_by_binary("restore", &dir, &[]);
    assert!(
        stderr.contains("corrupt checkpoint state: StateFile: malformed body"),
        "{stderr}"
    );

    // Well-formed states that do not match: another set of participants (refused before any
    // request), records that differ (refused at the read-only inspect).
    let mut map = saved.participants.clone().into_inner();
    map.remove(&workload.pid(C));
    let fewer = StateFile {
        participants: map.try_into().unwrap(),
    };
    let mut map = saved.participants.clone().into_inner();
    let records = map.remove(&workload.pid(A)).unwrap();
    map.insert(
        NamespacePid::new(workload.pid(A).get() + 100_000).unwrap(),
        records,
    );
    let renamed = StateFile {
        participants: map.try_into().unwrap(),
    };
    let mut map = saved.participants.clone().into_inner();
    let b_records = map.get_mut(&workload.pid(B)).unwrap();
    let mut records = b_records.clone().into_vec();
    records.pop();
    *b_records = records.try_into().unwrap();
    let changed = StateFile {
        participants: map.try_into().unwrap(),
    };
    let live_only = format!(
        "the live participants are not the checkpointed ones (checkpointed but not live: []; \
         live but not checkpointed: [{}])",
        workload.pid(C)
    );
    for (what, state, stage, text) in [
        (
            "a participant fewer",
            fewer,
            Stage::CheckState,
            live_only.as_str(),
        ),
        (
            "the creator renamed",
            renamed,
            Stage::CheckState,
            "which is not a participant of this checkpoint",
        ),
        (
            "a record missing",
            changed,
            Stage::Inspect,
            "records differ from the checkpoint (1 differences): unexpected ",
        ),
    ] {
        let dir = sandbox.fresh("mismatch");
        state::publish(&dir, &state).unwrap();
        let error = commands::restore(&session, &dir, &mut |_| {}).expect_err(what);
        let CommandError::Run(run) = &error else {
            panic!("{what}: {error}");
        };
        assert_eq!(run.stage, stage, "{what}: {error}");
        assert!(!run.mutated, "{what}");
        assert!(error.to_string().contains(text), "{what}: {error}");
        assert_eq!(workload.phases(), [Phase::Released; 3], "{what}");
    }

    // The genuine state still restores, with the bytes and the sharing.
    commands::restore(&session, &good_dir, &mut |_| {}).expect("restore");
    workload.check_shared(7);
}

fn fail_stopped(sandbox: &Sandbox) {
    // The creator dies between load_allocations and restore_unicast: its importers cannot
    // re-import, fail-stop, and say so to every later request.
    let mut workload = Workload::start(sandbox, "fail-stop");
    let dir = prepare(sandbox, &workload);
    let session = workload.session(Duration::from_secs(5));
    let mut run = Run::restore(&state::load(&dir).expect("state"), workload.pids());
    let creator = workload.workers[A].pid() as i32;
    let mut killed = false;
    let (result, took) = drive(&session, &mut run, &mut no_publish, &mut |stage| {
        if stage == Stage::Execute(Operation::RestoreUnicast) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(creator, libc::SIGKILL) };
            killed = true;
        }
    });
    assert!(killed);
    workload.workers[A].kill().expect("reap");
    let error = result.expect_err("restore_unicast without its creator");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(error.stage, Stage::Execute(Operation::RestoreUnicast));
    assert!(error.mutated);
    assert_eq!(error.exit_code(), 2);
    assert_eq!(
        error.fail_stopped,
        [workload.pid(B), workload.pid(C)],
        "{error}"
    );
    let message = error.to_string();
    for importer in [B, C] {
        let failure = error
            .failures
            .iter()
            .find(|f| f.participant == Some(workload.pid(importer)))
            .expect("each importer named");
        match &failure.reason {
            Reason::Refused { code, message } => {
                assert_eq!(*code, RefusalCode::DriverError);
                assert!(
                    message.contains("restore_unicast failed: asking creator")
                        && message.contains("this process is fail-stopped and will not resume"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        message.contains(&format!(
            "Participants reporting fail-stop: {}, {}",
            workload.pid(B),
            workload.pid(C)
        )),
        "{message}"
    );

    // Every later lifecycle operation is refused as fail-stopped, with the first failure.
    for index in [B, C] {
        assert_eq!(workload.phase(index), Phase::Failed);
        let mut requests = vec![Request::BeginCheckpoint];
        requests.extend(
            [
                Operation::RestoreUnicast,
                Operation::LoadAllocations,
                Operation::PrepareMulticast,
                Operation::RestoreMulticastBindings,
            ]
            .map(|operation| Request::Execute(ExecuteRequest { operation })),
        );
        for request in requests {
            let r = workload.refusal(index, &request);
            assert_eq!(r.code, RefusalCode::FailStopped, "{request:?}: {r:?}");
            assert!(
                r.message
                    .as_str()
                    .starts_with("fail-stopped earlier: restore_unicast failed: asking creator"),
                "{r:?}"
            );
        }
        assert!(
            workload
                .log(index)
                .contains("this process is fail-stopped and will not resume"),
            "{}",
            workload.log(index)
        );
    }
    // And the coordinator refuses to start anything with them.
    let error = commands::restore(&session, &dir, &mut |_| {}).expect_err("restore again");
    assert!(
        error.to_string().contains(&format!(
            "restore failed in phase inspect: participant {}: no reply",
            workload.pid(A)
        )) && error.to_string().contains(&format!(
            "participant {}: in phase failed, expected phase released",
            workload.pid(B)
        )),
        "{error}"
    );
    let survivors = Session::open(
        &workload.control,
        &[workload.pid(B), workload.pid(C)],
        Timeouts::default(),
    )
    .unwrap();
    let error = commands::prepare(&survivors, &sandbox.fresh("again"), &mut |_| {})
        .expect_err("prepare the survivors");
    assert!(
        error.to_string().contains(&format!(
            "participant {}: in phase failed, expected phase active",
            workload.pid(B)
        )),
        "{error}"
    );
    assert_eq!(error.exit_code(), 1);
}
