//! The coordinator gone between capture phases (killed, or it gave up without a word): each
//! shim hears nothing for its quiet window and puts itself back, multicast team included,
//! without any coordinator: after `prepare_unicast` too, from the host carrier, as long as the
//! state was not published (no `hold`). Once held, a process waits, released, for a restore
//! from the published state, and so does an importer whose creator is held.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuinterpose_protocol::transport::{Endpoint, call};
use cuinterpose_protocol::{
    ExecuteRequest, NamespacePid, Operation, Phase, RESTORE_OPERATIONS, Reply, Request,
};
use cuinterpose_workload::proto::Reply as WorkerReply;

use super::support::cli::check_exit;
use super::support::sandbox::{Sandbox, check_writes_cross};
use super::{
    GRAN, SHARED, Workload, build_each, check_restored, cuinterpose, root, send_gated_alloc,
};

/// A control timeout of 1 s: a quiet window of 3 s.
const QUICK: [(&str, &str); 1] = [("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "1")];
const ROLLED_BACK: &str = "rolled back on its own";

pub fn coordinator_gone(sandbox: &Sandbox) {
    let capture = [
        Request::BeginCheckpoint,
        execute(Operation::PrepareMulticast),
        execute(Operation::SaveAllocations),
        execute(Operation::PrepareUnicast),
    ];
    for steps in 1..=capture.len() {
        let label = format!("gone after {}", request_name(&capture[steps - 1]));
        let (mut workload, logs) = start(sandbox, &format!("gone-{steps}"));
        for request in &capture[..steps] {
            for index in 0..3 {
                ask(sandbox, &workload, index, request);
            }
        }
        check_rolls_back(sandbox, &mut workload, &logs, &label);
    }

    // prepare_unicast reached the creator A alone: A rebuilds its memory from its carrier,
    // and its importers B and C, still saved, give up their imports of the memory A released
    // and import A's new memory.
    let (mut workload, logs) = start(sandbox, "gone-mixed");
    for request in &capture[..3] {
        for index in 0..3 {
            ask(sandbox, &workload, index, request);
        }
    }
    ask(sandbox, &workload, 0, &capture[3]);
    check_rolls_back(sandbox, &mut workload, &logs, "gone with only A released");

    // The same, A's quiet window (3 s) shorter than its importers' (9 s): A has recreated its
    // memory (phase loaded; its multicast binding then waits for B's device) before B and C
    // look. They still import its new memory: A's last copy is a load, which in their saved
    // phase only a rollback from released does.
    let slow: [(&str, &str); 1] = [("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "3")];
    let (mut workload, logs) = start_each(sandbox, "gone-mixed-late", [&QUICK, &slow, &slow]);
    for request in &capture[..3] {
        for index in 0..3 {
            ask(sandbox, &workload, index, request);
        }
    }
    ask(sandbox, &workload, 0, &capture[3]);
    check_rolls_back(
        sandbox,
        &mut workload,
        &logs,
        "gone with only A released, A rebuilt first",
    );
    for log in &logs[1..] {
        assert!(
            log_text(log).contains(&format!(
                "shared allocation(s) of creator {} again",
                workload.workers[0].worker_pid()
            )),
            "{}",
            log_text(log)
        );
    }

    // The state was published and the hold reached A alone: A stays released for a restore
    // from that state; B and C, finding their creator held, stay released with it. The
    // restore's phases, sent as `cuinterpose restore` would, then put everyone back.
    let (mut workload, logs) = start(sandbox, "gone-held");
    for request in &capture {
        for index in 0..3 {
            ask(sandbox, &workload, index, request);
        }
    }
    ask(sandbox, &workload, 0, &Request::Hold);
    for log in &logs[1..] {
        await_log(
            log,
            "is held by a published state: this process stays released too",
            "importers of a held creator",
        );
    }
    std::thread::sleep(Duration::from_secs(4)); // past A's quiet window once more
    for (index, log) in logs.iter().enumerate() {
        assert_eq!(
            phase(sandbox, &workload, index),
            Phase::Released,
            "held {index}"
        );
        assert!(!log_text(log).contains(ROLLED_BACK), "held {index}");
    }
    for operation in RESTORE_OPERATIONS {
        for index in 0..3 {
            ask(sandbox, &workload, index, &execute(operation));
        }
    }
    for index in 0..3 {
        ask(sandbox, &workload, index, &Request::Inspect);
    }
    check_restored(&mut workload, 11);
    check_writes_cross(&mut workload.workers, &workload.shared, SHARED, 301);
    drop(workload);

    // A hold outside phase released is refused and changes nothing.
    let (workload, _) = start(sandbox, "hold-refused");
    let endpoint = endpoint(sandbox, &workload, 0);
    match call(&endpoint, &Request::Hold, None, Duration::from_secs(5)) {
        Ok((Reply::Refused(refused), _)) => assert!(
            refused
                .message
                .as_str()
                .contains("hold needs phase released; this process is in phase active"),
            "{refused:?}"
        ),
        other => panic!("hold while active: {other:?}"),
    }
    assert_eq!(phase(sandbox, &workload, 0), Phase::Active);
}

/// With no further request, every participant rolls back on its own: a call waiting at the
/// gate completes afterwards, the bytes are verified, and a later toggle works.
fn check_rolls_back(sandbox: &Sandbox, workload: &mut Workload, logs: &[PathBuf], what: &str) {
    let _shown = ShowLogs(logs);
    // Gated: a call waits for the coordinator, then for the rollback.
    send_gated_alloc(&mut workload.workers[1], what);
    let started = Instant::now();
    for log in logs {
        await_log(log, ROLLED_BACK, what);
    }
    let took = started.elapsed();
    let (reply, _) = workload.workers[1]
        .receive()
        .expect("cuMemAlloc after the rollback");
    assert!(matches!(reply, WorkerReply::Address { .. }), "{reply:?}");
    for index in 0..3 {
        assert_eq!(phase(sandbox, workload, index), Phase::Active, "{what}");
    }
    check_restored(workload, 11);
    check_writes_cross(&mut workload.workers, &workload.shared, SHARED, 299);
    // A later checkpoint is not disturbed by the rollback.
    check_exit(&cuinterpose(sandbox, &["toggle", "--pid", &root()]), 0);
    check_writes_cross(&mut workload.workers, &workload.shared, SHARED, 300);
    workload.workers[0]
        .verify(workload.multicast_view, GRAN, 14)
        .expect("multicast view after the toggle");
    println!("  {what}: every participant rolled back within {took:?} of the last request");
}

fn execute(operation: Operation) -> Request {
    Request::Execute(ExecuteRequest::host(operation))
}

fn request_name(request: &Request) -> &'static str {
    match request {
        Request::Execute(execute) => execute.operation.wire_name(),
        other => other.kind(),
    }
}

/// The multicast workload of [`build_with`] with the quick timeout, each worker logging to a
/// file of its own.
fn start(sandbox: &Sandbox, label: &str) -> (Workload, Vec<PathBuf>) {
    start_each(sandbox, label, [&QUICK; 3])
}

/// [`start`], each worker with its own environment (its own quiet window).
fn start_each(
    sandbox: &Sandbox,
    label: &str,
    envs: [&[(&str, &str)]; 3],
) -> (Workload, Vec<PathBuf>) {
    let dir = sandbox.dir.path().join(label);
    std::fs::create_dir_all(&dir).expect("log dir");
    let logs: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|name| dir.join(format!("{name}.log")))
        .collect();
    let workload = build_each(
        sandbox,
        envs,
        &[Some(&logs[0]), Some(&logs[1]), Some(&logs[2])],
    );
    (workload, logs)
}

fn endpoint(sandbox: &Sandbox, workload: &Workload, index: usize) -> Endpoint {
    let pid = NamespacePid::new(workload.workers[index].worker_pid() as u32).expect("pid");
    Endpoint::for_pid(&Sandbox::control_dir(sandbox.dir.path()), pid).expect("endpoint")
}

/// Sends `request` to worker `index` as the coordinator would, and checks it was done.
fn ask(sandbox: &Sandbox, workload: &Workload, index: usize, request: &Request) {
    let endpoint = endpoint(sandbox, workload, index);
    let (reply, _) = call(&endpoint, request, None, Duration::from_secs(10)).expect("reply");
    assert!(
        matches!(
            reply,
            Reply::Inspection(_) | Reply::Completed(_) | Reply::Held(_)
        ),
        "{}: {reply:?}",
        request_name(request)
    );
}

/// Worker `index`'s phase, from its progress answer (read without waiting for its worker).
fn phase(sandbox: &Sandbox, workload: &Workload, index: usize) -> Phase {
    let endpoint = endpoint(sandbox, workload, index);
    match call(&endpoint, &Request::Progress, None, Duration::from_secs(5)) {
        Ok((Reply::Progress(progress), _)) => progress.phase,
        other => panic!("progress: {other:?}"),
    }
}

/// Prints the shims' logs when a check fails while it lives: what each did on its own.
struct ShowLogs<'a>(&'a [PathBuf]);

impl Drop for ShowLogs<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for log in self.0 {
                eprintln!("--- {}:\n{}", log.display(), log_text(log));
            }
        }
    }
}

fn log_text(log: &PathBuf) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn await_log(log: &PathBuf, text: &str, what: &str) {
    let started = Instant::now();
    while !log_text(log).contains(text) {
        assert!(
            started.elapsed() < cuinterpose_testkit::slack(Duration::from_secs(30)),
            "{what}: no {text:?} in {}:\n{}",
            log.display(),
            log_text(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
