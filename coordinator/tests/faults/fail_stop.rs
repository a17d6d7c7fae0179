//! A creator that dies under its importers: they fail-stop, say so to every later request,
//! and the coordinator refuses to start anything with them.

use std::time::Duration;

use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::events::Event;
use cuinterpose_coordinator::plan::{Reason, Run, Stage};
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{ExecuteRequest, Operation, Phase, RefusalCode, Request};

use crate::faults::workload::{A, B, C, NAMES, Workload, drive, no_publish, prepare};
use crate::support::sandbox::Sandbox;

pub(crate) fn fail_stopped(sandbox: &Sandbox) {
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
    assert!(
        took < cuinterpose_testkit::slack(Duration::from_secs(3)),
        "{took:?}"
    );
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
            .map(|operation| Request::Execute(ExecuteRequest::host(operation))),
        );
        for request in requests {
            let r = workload.refused_as(index, &request, RefusalCode::FailStopped);
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

/// A participant killed in the middle of `prepare_unicast`, through the library's `prepare`
/// (the session's drive loop): nothing can put the workload back, so the coordinator tells the
/// survivors to fail-stop. Their application calls then fail (`CUDA_ERROR_ILLEGAL_STATE`) -
/// also one that was already waiting at the gate - instead of waiting for a restore that
/// never comes, and each says why in its log.
pub(crate) fn survivors_are_told(sandbox: &Sandbox) {
    let mut workload = Workload::start(sandbox, "told");
    let dir = sandbox.fresh("checkpoint");
    let session = workload.session(Duration::from_secs(5));
    let victim = workload.workers[C].pid() as i32;
    let mut killer = None;
    let mut waiting = None;
    let address = workload.addresses[B];
    let result = {
        let workers = &mut workload.workers;
        commands::prepare(&session, &dir, &mut |event| {
            let Event::Started { phase, .. } = event else {
                return;
            };
            if *phase != "prepare_unicast" || killer.is_some() {
                return;
            }
            // B's application thread calls CUDA now: it waits at the gate.
            let command = cuinterpose_workload::Command::Memset {
                address,
                value: 9,
                size: 4096,
            };
            waiting = Some(workers[B].send(&command, None));
            // C stops with the request in its socket, and dies 300 ms into the phase.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(victim, libc::SIGSTOP) };
            killer = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(victim, libc::SIGKILL) };
            }));
        })
    };
    killer.expect("prepare_unicast was reached").join().unwrap();
    workload.workers[C].kill().expect("reap");
    waiting.expect("sent").expect("the memset was sent");
    let error = match result.expect_err("prepare without C") {
        commands::CommandError::Run(error) => error,
        other => panic!("{other}"),
    };
    assert!(error.mutated, "{error}");
    assert_eq!(error.told, [workload.pid(A), workload.pid(B)], "{error}");
    assert!(
        error.to_string().contains(&format!(
            "Told to fail-stop (their CUDA calls now fail instead of waiting): {}, {}",
            workload.pid(A),
            workload.pid(B)
        )),
        "{error}"
    );
    // The call that was waiting at B's gate returned an error when B was told.
    match workload.workers[B].receive() {
        Err(cuinterpose_workload::WorkloadError::Cuda { name, .. }) => {
            assert_eq!(name, "CUDA_ERROR_ILLEGAL_STATE")
        }
        other => panic!("the waiting memset: {other:?}"),
    }
    for index in [A, B] {
        assert_eq!(workload.phase(index), Phase::Failed, "{}", NAMES[index]);
        // Every later call fails at once.
        match workload.workers[index].synchronize() {
            Err(cuinterpose_workload::WorkloadError::Cuda { name, .. }) => {
                assert_eq!(name, "CUDA_ERROR_ILLEGAL_STATE")
            }
            other => panic!("{}: a call after the fail-stop: {other:?}", NAMES[index]),
        }
        let log = std::fs::read_to_string(&workload.logs[index]).unwrap_or_default();
        assert!(
            log.matches("the coordinator declared a fail-stop").count() == 1
                && log.contains("prepare_unicast"),
            "{}: {log}",
            NAMES[index]
        );
    }
}
