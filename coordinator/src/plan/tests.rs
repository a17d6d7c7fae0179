//! Unit tests of the plan: capture and restore run in order against fake participants, and
//! each way a stage can fail names its phase, participants and reasons.

use std::collections::BTreeMap;
use std::time::Duration;

use cuinterpose_protocol::{
    CompletedReply, NamespacePid, Operation, Phase, Record, RefusalCode, Reply,
};

use super::*;
use cuinterpose_testkit::fixtures::*;

mod restore;
mod rollback;
mod settle;
mod support;

use support::*;
use support::{drive, drive_publishing, drive_to_end};

/// The stages of a capture stopped at `begin_checkpoint` and rolled back.
const BEGIN_ROLLED_BACK: [Stage; 4] = [
    Stage::Inspect,
    Stage::BeginCheckpoint,
    Stage::RollBack,
    Stage::Verify,
];

#[test]
fn a_busy_refusal_of_begin_checkpoint_is_not_fail_stop_while_others_froze() {
    let topology = shared_topology(101);
    let mut fakes = fake_participants(&topology);
    let mut run = Run::capture(fakes.keys().copied());
    let mut busy = |stage: Stage, p: NamespacePid, outcome: Outcome| {
        if stage == Stage::BeginCheckpoint && p == pid(102) {
            refused(
                RefusalCode::Busy,
                "thread 7 (loader) is inside cuStreamSynchronize",
            )
        } else {
            outcome
        }
    };
    let stages = drive(&mut run, &mut fakes, &mut busy, Ok(()));
    assert_eq!(stages, BEGIN_ROLLED_BACK);
    let error = check_failed(
        &run,
        Stage::BeginCheckpoint,
        Some(102),
        "inside cuStreamSynchronize",
        false,
    );
    assert!(
        error
            .to_string()
            .contains("those that froze were put back at once"),
        "{error}"
    );
    assert!(fakes.values().all(|fake| fake.phase == Phase::Active));
    // A refusal that means destructive work failed, or a participant that did not answer,
    // stays fail-stop.
    for outcome in [
        refused(RefusalCode::DriverError, "cuCtxSynchronize failed"),
        lost("the peer closed the connection while receiving the reply"),
    ] {
        let mut fakes = fake_participants(&topology);
        let mut run = Run::capture(fakes.keys().copied());
        let mut once = Some(outcome);
        let mut fault = |stage: Stage, p: NamespacePid, outcome: Outcome| {
            if stage == Stage::BeginCheckpoint && p == pid(102) {
                once.take().expect("one fault")
            } else {
                outcome
            }
        };
        drive(&mut run, &mut fakes, &mut fault, Ok(()));
        let Instruction::Failed(error) = run.step() else {
            panic!("{:?}", run.step())
        };
        assert!(error.mutated, "{error}");
    }
}

#[test]
fn capture_runs_every_phase_in_order_and_publishes_the_frozen_records() {
    let topology = shared_topology(101);
    let mut fakes = fake_participants(&topology);
    let mut run = Run::capture([pid(103), pid(101), pid(102), pid(101)]);
    assert_eq!(run.participants(), [pid(101), pid(102), pid(103)]);
    let (stages, published) = drive_publishing(&mut run, &mut fakes);
    assert_eq!(stages, capture_stages());
    assert_eq!(published, Some(state_file(&topology)));
    assert!(
        fakes
            .values()
            .all(|fake| fake.phase == Phase::Released && fake.held)
    );
    let Instruction::Done(report) = run.step() else {
        panic!("{:?}", run.step());
    };
    assert_eq!(report.command, "prepare");
    let names: Vec<&str> = report
        .phases
        .iter()
        .map(|phase| phase.name.as_str())
        .collect();
    assert_eq!(names, capture_phases());
    assert_eq!(report.phases[3].bytes, SIZE);
    assert_eq!(report.bytes(), SIZE);
    // Five broadcasts of 2 ms each, the publication's 1 ms, then the hold's 2 ms.
    assert_eq!(report.duration(), Duration::from_millis(13));
    assert_eq!((report.shared_allocations, report.multicast_groups), (1, 1));
    assert_eq!(run.topology().bytes_of(pid(101)), SIZE);
}

#[test]
fn restore_runs_every_phase_and_verifies() {
    let (mut fakes, state) = captured();
    let mut run = Run::restore(&state, fakes.keys().copied());
    let stages = drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
    assert_eq!(stages, restore_stages());
    let Instruction::Done(report) = run.step() else {
        panic!("{:?}", run.step());
    };
    assert_eq!(report.command, "restore");
    assert_eq!(report.phases[1].name, "load_allocations");
    assert_eq!(report.phases[1].bytes, SIZE);
    assert_eq!(
        report.phases.last().map(|phase| phase.name.as_str()),
        Some("verify")
    );
    assert!(fakes.values().all(|fake| fake.phase == Phase::Active));
}

#[test]
fn invalid_topology_stops_before_any_mutation() {
    let mut topology = shared_topology(101);
    topology
        .get_mut(&pid(102))
        .expect("102")
        .push(mapping(7, 101, 0x1000, SIZE, 0).into());
    let mut fakes = fake_participants(&topology);
    let mut run = Run::capture(fakes.keys().copied());
    check_refused_at_inspect(
        &mut run,
        &mut fakes,
        Some(102),
        "refers to no allocation record",
    );
    assert!(fakes.values().all(|fake| fake.phase == Phase::Active));

    let mut fakes = fake_participants(&shared_topology(101));
    fakes.get_mut(&pid(103)).expect("103").raw_imports = 1;
    let mut run = Run::capture(fakes.keys().copied());
    check_refused_at_inspect(&mut run, &mut fakes, Some(103), "1 live imports");

    let run = Run::capture([]);
    check_failed(&run, Stage::Inspect, None, "no participants", false);
}

#[test]
fn records_that_change_at_begin_checkpoint_are_validated_again() {
    let (mut fakes, mut run) = shared_capture();
    let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| match (stage, outcome) {
        (Stage::BeginCheckpoint, Ok(Reply::Inspection(mut inspection))) if pid.get() == 103 => {
            inspection.records = Vec::new().try_into().expect("bounded");
            Ok(inspection.into())
        }
        (_, outcome) => outcome,
    };
    let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    assert_eq!(stages, BEGIN_ROLLED_BACK);
    // 103 dropped its records: the creator's allocation is no longer imported by it, and
    // the multicast group lacks a device.
    check_failed(
        &run,
        Stage::BeginCheckpoint,
        None,
        "2 (participant, device) pairs",
        true,
    );
}

#[test]
fn refusal_in_a_phase_names_participant_and_phase() {
    let (mut fakes, mut run) = shared_capture();
    let mut tamper = answer_at(
        Stage::Execute(Operation::SaveAllocations),
        Some(102),
        || {
            refused(
                RefusalCode::DriverError,
                "cuMemcpyDtoH failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)",
            )
        },
    );
    let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    assert_eq!(
        stages.last(),
        Some(&Stage::Execute(Operation::SaveAllocations))
    );
    let error = check_failed(
        &run,
        Stage::Execute(Operation::SaveAllocations),
        Some(102),
        "refused (driver_error): cuMemcpyDtoH failed",
        true,
    );
    assert_eq!(error.fail_stopped, [pid(102)]);
    assert_eq!(error.participant(), Some(pid(102)));
    // Changed and not restorable: every participant is to be told to fail-stop.
    assert_eq!(
        run.fail_stop_targets(),
        Some(&[pid(101), pid(102), pid(103)][..])
    );
    assert!(
        error
            .to_string()
            .contains("Participants reporting fail-stop: 102")
    );
}

#[test]
fn refusals_without_mutation_are_not_fail_stop() {
    // Everyone refuses begin_checkpoint: nobody froze.
    let mut fakes = fake_participants(&shared_topology(101));
    for fake in fakes.values_mut() {
        fake.phase = Phase::Frozen;
    }
    let mut run = Run::capture(fakes.keys().copied());
    check_refused_at_inspect(
        &mut run,
        &mut fakes,
        Some(101),
        "in phase frozen, expected phase active",
    );

    // Everyone refuses begin_checkpoint; then one refuses and the others froze: not fail-stop
    // either (freezing destroys nothing and the frozen ones go back to active on their own).
    for (refusing, code, message, reason) in [
        (
            None,
            RefusalCode::Busy,
            "control queue full",
            "refused (busy)",
        ),
        (
            Some(101),
            RefusalCode::OutOfOrder,
            "begin_checkpoint in phase frozen",
            "refused (out_of_order)",
        ),
    ] {
        let (mut fakes, mut run) = shared_capture();
        let mut tamper = answer_at(Stage::BeginCheckpoint, refusing, || refused(code, message));
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        let error = check_failed(&run, Stage::BeginCheckpoint, Some(101), reason, false);
        if refusing.is_none() {
            assert_eq!(error.participants(), [pid(101), pid(102), pid(103)]);
        } else {
            assert!(error.fail_stopped.is_empty());
            // Nothing was changed: nobody is told to fail-stop.
            assert_eq!(run.fail_stop_targets(), None);
        }
    }
}

/// The one loop tells every participant of a run that failed after changing them, and nobody
/// of one that changed nothing.
#[test]
fn the_loop_tells_the_participants_of_a_fail_stop() {
    for (stage, told) in [
        (Stage::Execute(Operation::PrepareUnicast), true),
        (Stage::Inspect, false),
    ] {
        let (mut fakes, mut run) = shared_capture();
        let mut tamper = answer_at(stage, Some(103), || {
            closed("the peer closed the connection")
        });
        let error = drive_to_end(&mut run, &mut fakes, &mut tamper).expect_err("failed");
        let everyone: Vec<NamespacePid> = fakes.keys().copied().collect();
        assert_eq!(
            error.told,
            if told { everyone } else { Vec::new() },
            "{error}"
        );
    }
}

#[test]
fn transport_error_names_the_participant() {
    let prepare_unicast = Stage::Execute(Operation::PrepareUnicast);
    let (mut fakes, mut run) = shared_capture();
    let mut tamper = answer_at(prepare_unicast, Some(103), || {
        closed(
            "socket /tmp/x/cuinterpose-103.sock: the peer closed the connection while \
                 receiving the reply",
        )
    });
    drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    check_failed(
        &run,
        prepare_unicast,
        Some(103),
        "no reply: socket /tmp/x/cuinterpose-103.sock: the peer closed",
        true,
    );

    // A lost inspect changes nothing.
    let (mut fakes, mut run) = shared_capture();
    let mut tamper = |_: Stage, pid: NamespacePid, outcome: Outcome| {
        if pid.get() == 101 {
            return lost("timed out");
        }
        outcome
    };
    drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    check_failed(
        &run,
        Stage::Inspect,
        Some(101),
        "no reply: timed out",
        false,
    );
}

#[test]
fn replies_of_the_wrong_kind_fail_the_phase() {
    let completed = |operation, bytes| -> Outcome {
        Ok(CompletedReply {
            operation,
            bytes,
            copy_ns: bytes,
            peak_carrier_bytes: 0,
            checksums: Default::default(),
        }
        .into())
    };
    let cases: Vec<(Stage, Outcome, &str)> = vec![
        (
            Stage::Inspect,
            completed(Operation::PrepareMulticast, 0),
            "replied `completed`, expected `inspection`",
        ),
        (
            Stage::BeginCheckpoint,
            completed(Operation::PrepareMulticast, 0),
            "replied `completed`, expected `inspection`",
        ),
        (
            Stage::Execute(Operation::PrepareMulticast),
            Ok(inspection(102, Phase::Frozen, Vec::new()).into()),
            "replied `inspection`, expected `completed`",
        ),
        (
            Stage::Execute(Operation::PrepareMulticast),
            completed(Operation::SaveAllocations, 0),
            "completed `save_allocations`, expected `prepare_multicast`",
        ),
        (
            Stage::Execute(Operation::SaveAllocations),
            completed(Operation::SaveAllocations, 5),
            "save_allocations moved 5 bytes, expected 0",
        ),
        (
            Stage::Execute(Operation::PrepareUnicast),
            completed(Operation::PrepareUnicast, 1),
            "prepare_unicast moved 1 bytes, expected 0",
        ),
        (
            Stage::Inspect,
            Ok(inspection(7, Phase::Active, Vec::new()).into()),
            "answered as namespace pid 7",
        ),
    ];
    for (target, replacement, reason) in cases {
        let (mut fakes, mut run) = shared_capture();
        let mut tamper = answer_at(target, Some(102), || replacement.clone());
        let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        let rolled_back: &[Stage] = if target.rolls_back() {
            &[Stage::RollBack, Stage::Verify]
        } else {
            &[]
        };
        assert!(
            stages.ends_with(&[&[target][..], rolled_back].concat()),
            "{stages:?}"
        );
        check_failed(&run, target, Some(102), reason, target.mutates());
    }
}

#[test]
fn every_participant_must_have_exactly_one_outcome() {
    let mut run = Run::capture([pid(1), pid(2)]);
    let mut outcomes = BTreeMap::new();
    outcomes.insert(pid(1), Ok(inspection(1, Phase::Active, Vec::new()).into()));
    outcomes.insert(pid(3), Ok(inspection(3, Phase::Active, Vec::new()).into()));
    run.feed(outcomes, Duration::ZERO);
    check_failed(
        &run,
        Stage::Inspect,
        Some(2),
        "no outcome was collected",
        false,
    );
    check_failed(
        &run,
        Stage::Inspect,
        Some(3),
        "answered but is not a participant",
        false,
    );
}

#[test]
fn feeding_the_wrong_step_changes_nothing() {
    let mut run = Run::capture([pid(1)]);
    let before = run.step().clone();
    run.feed_publish(Ok(()), Duration::ZERO);
    assert_eq!(run.step(), &before);

    let failed = Run::capture([]);
    let mut failed_run = failed;
    let before = failed_run.step().clone();
    failed_run.feed(BTreeMap::new(), Duration::ZERO);
    assert_eq!(failed_run.step(), &before);
    assert!(failed_run.is_finished());
}

#[test]
fn publish_failure_is_fail_stop() {
    let (mut fakes, mut run) = shared_capture();
    let stages = drive(
        &mut run,
        &mut fakes,
        &mut untouched(),
        Err("disk full".into()),
    );
    assert_eq!(stages, capture_stages()[..capture_stages().len() - 1]);
    check_failed(
        &run,
        Stage::PublishState,
        None,
        "coordinator: cannot publish the state: disk full",
        true,
    );
    // The state is in memory: the caller puts the workload back instead of a fail-stop.
    assert!(run.state().is_some());
    assert_eq!(run.fail_stop_targets(), None);
}

/// A participant that does not take the hold (refused here; lost is the same): the state is
/// published and everyone is released, so the caller puts the workload back from the state in
/// memory, as after a failed publication; nobody is told to fail-stop.
#[test]
fn a_refused_hold_is_put_back_not_fail_stop() {
    let (mut fakes, mut run) = shared_capture();
    let mut tamper = |stage, pid: NamespacePid, outcome| match (stage, pid.get()) {
        (Stage::Hold, 102) => refused(RefusalCode::OutOfOrder, "hold in phase failed"),
        _ => outcome,
    };
    let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    assert_eq!(stages, capture_stages());
    check_failed(&run, Stage::Hold, Some(102), "hold in phase failed", true);
    assert!(run.state().is_some());
    assert_eq!(run.fail_stop_targets(), None);
    assert!(fakes[&pid(101)].held && fakes[&pid(103)].held);
}

#[test]
fn phases_chain() {
    for operations in [&CAPTURE_OPERATIONS[..], &RESTORE_OPERATIONS[..]] {
        for pair in operations.windows(2) {
            assert_eq!(phase_after(pair[0]), phase_before(pair[1]));
        }
    }
    assert_eq!(phase_before(CAPTURE_OPERATIONS[0]), Phase::Frozen);
    assert_eq!(
        phase_after(CAPTURE_OPERATIONS[2]),
        phase_before(RESTORE_OPERATIONS[0])
    );
    assert_eq!(phase_after(RESTORE_OPERATIONS[5]), Phase::Active);
}

/// A capture that stops before prepare_unicast (here 102 does not answer) is rolled back:
/// roll_back to everyone, then a verifying inspect against the frozen records; exit 3, nobody
/// told to fail-stop. A rollback that fails is fail-stop, naming both failures.
#[test]
fn a_capture_stopped_before_prepare_unicast_is_rolled_back() {
    let stalled = |target: Stage| {
        move |stage: Stage, p: NamespacePid, outcome: Outcome| {
            if stage == target && p == pid(102) {
                lost("timed out after 1s")
            } else {
                outcome
            }
        }
    };
    for target in [
        Stage::Execute(Operation::PrepareMulticast),
        Stage::Execute(Operation::SaveAllocations),
    ] {
        let (mut fakes, mut run) = shared_capture();
        let stages = drive(&mut run, &mut fakes, &mut stalled(target), Ok(()));
        assert!(
            stages.ends_with(&[target, Stage::RollBack, Stage::Verify]),
            "{stages:?}"
        );
        let error = check_failed(&run, target, Some(102), "timed out after 1s", true);
        assert!(error.rolled_back && run.fail_stop_targets().is_none());
        assert!(
            error.to_string().contains("the workload resumes"),
            "{error}"
        );
        assert!(fakes.values().all(|fake| fake.phase == Phase::Active));
    }

    // 103 cannot roll back (its creator released the memory): fail-stop, everyone told.
    let (mut fakes, mut run) = shared_capture();
    let target = Stage::Execute(Operation::SaveAllocations);
    let stalled = stalled(target);
    let mut fault = |stage: Stage, p: NamespacePid, outcome: Outcome| {
        if stage == Stage::RollBack && p == pid(103) {
            refused(RefusalCode::FailStopped, "creator 101 is in phase released")
        } else {
            stalled(stage, p, outcome)
        }
    };
    let stages = drive(&mut run, &mut fakes, &mut fault, Ok(()));
    assert_eq!(stages.last(), Some(&Stage::RollBack));
    let error = check_failed(&run, target, Some(103), "phase released", true);
    assert!(!error.rolled_back);
    let text = error.to_string();
    assert!(
        text.contains("participant 102: no reply: timed out after 1s")
            && text.contains(
                "participant 103: then, rolling back (roll_back): refused (fail_stopped): \
                 creator 101 is in phase released"
            )
            && text.contains("FAIL-STOP"),
        "{text}"
    );
    assert_eq!(
        run.fail_stop_targets(),
        Some(&[pid(101), pid(102), pid(103)][..])
    );
}
