//! A creator that dies under its importers: they fail-stop, say so to every later request,
//! and the coordinator refuses to start anything with them.

use std::time::Duration;

use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::plan::{Reason, Run, Stage};
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{ExecuteRequest, Operation, Phase, RefusalCode, Request};

use crate::faults::workload::{A, B, C, Workload, drive, no_publish, prepare};
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
