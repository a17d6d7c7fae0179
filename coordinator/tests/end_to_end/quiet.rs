//! The coordinator gone between capture phases (killed, or it gave up without a word): each
//! shim hears nothing for its quiet window and puts itself back, multicast team included,
//! without any coordinator. Where a creator has already released its memory, its importers
//! cannot, and fail-stop instead of keeping memory nobody shares any more.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuinterpose_protocol::transport::{Endpoint, call};
use cuinterpose_protocol::{ExecuteRequest, NamespacePid, Operation, Phase, Reply, Request};
use cuinterpose_workload::proto::{Command, Reply as WorkerReply};

use super::support::cli::check_exit;
use super::support::sandbox::{Sandbox, check_writes_cross};
use super::{GRAN, SHARED, Workload, build_with, check_restored, cuinterpose, root};

/// A control timeout of 1 s: a quiet window of 3 s.
const QUICK: [(&str, &str); 1] = [("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "1")];
const ROLLED_BACK: &str = "rolled back on its own";

pub fn coordinator_gone(sandbox: &Sandbox) {
    let capture = [
        Request::BeginCheckpoint,
        execute(Operation::PrepareMulticast),
        execute(Operation::SaveAllocations),
    ];
    for steps in 1..=capture.len() {
        let (mut workload, logs) = start(sandbox, &format!("gone-{steps}"));
        for request in &capture[..steps] {
            for index in 0..3 {
                ask(sandbox, &workload, index, request);
            }
        }
        let what = format!("gone after {}", request_name(&capture[steps - 1]));
        // Gated: a call waits for the coordinator, then for the rollback.
        workload.workers[1]
            .send(&Command::MemAlloc { size: GRAN }, None)
            .expect("send cuMemAlloc");
        assert!(
            !workload.workers[1].reply_ready(Duration::from_millis(500)),
            "{what}: cuMemAlloc passed the closed gate"
        );
        let started = Instant::now();
        for log in &logs {
            await_log(log, ROLLED_BACK, &what);
        }
        let took = started.elapsed();
        let (reply, _) = workload.workers[1]
            .receive()
            .expect("cuMemAlloc after the rollback");
        assert!(matches!(reply, WorkerReply::Address { .. }), "{reply:?}");
        for index in 0..3 {
            assert_eq!(phase(sandbox, &workload, index), Phase::Active, "{what}");
        }
        check_restored(&mut workload, 11);
        // A later checkpoint is not disturbed by the rollback.
        check_exit(&cuinterpose(sandbox, &["toggle", "--pid", &root()]), 0);
        check_writes_cross(&mut workload.workers, &workload.shared, SHARED, 300);
        workload.workers[0]
            .verify(workload.multicast_view, GRAN, 14)
            .expect("multicast view after the toggle");
        println!("  {what}: every participant rolled back within {took:?} of the last request");
        drop(workload);
    }

    // prepare_unicast reached the creator A alone: A released the memory B and C map, so they
    // cannot roll back and fail-stop; A, released, waits (a process cannot tell a vanished
    // coordinator from a native checkpoint in progress).
    let (mut workload, logs) = start(sandbox, "gone-mixed");
    for request in &capture {
        for index in 0..3 {
            ask(sandbox, &workload, index, request);
        }
    }
    ask(sandbox, &workload, 0, &execute(Operation::PrepareUnicast));
    let a = workload.workers[0].worker_pid();
    for log in &logs[1..] {
        await_log(
            log,
            &format!("cannot roll back: creator {a} is in phase released"),
            "importers of a released creator",
        );
    }
    for index in [1, 2] {
        assert_eq!(phase(sandbox, &workload, index), Phase::Failed);
        let error = workload.workers[index]
            .memset(workload.shared[index], 1, GRAN)
            .expect_err("a fail-stopped importer's calls fail");
        assert!(error.to_string().contains("ILLEGAL_STATE"), "{error}");
    }
    assert_eq!(phase(sandbox, &workload, 0), Phase::Released);
    assert!(!log_text(&logs[0]).contains(ROLLED_BACK));
    drop(workload);
}

fn execute(operation: Operation) -> Request {
    Request::Execute(ExecuteRequest { operation })
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
    let dir = sandbox.dir.path().join(label);
    std::fs::create_dir_all(&dir).expect("log dir");
    let logs: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|name| dir.join(format!("{name}.log")))
        .collect();
    let workload = build_with(
        sandbox,
        &QUICK,
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
        matches!(reply, Reply::Inspection(_) | Reply::Completed(_)),
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

fn log_text(log: &PathBuf) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

fn await_log(log: &PathBuf, text: &str, what: &str) {
    let started = Instant::now();
    while !log_text(log).contains(text) {
        assert!(
            started.elapsed() < cuinterpose_testkit::slack(Duration::from_secs(20)),
            "{what}: no {text:?} in {}:\n{}",
            log.display(),
            log_text(log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
