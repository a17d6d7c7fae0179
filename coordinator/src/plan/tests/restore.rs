//! Unit tests of the plan's restore and check runs: the state and the participant set checked
//! before any request, live records compared with the saved ones, the final verification.

use super::*;

#[test]
fn restore_checks_state_and_participants_before_any_request() {
    let (_, state) = captured();
    let run = Run::restore(&state, [pid(101), pid(102), pid(104)]);
    let error = check_failed(
        &run,
        Stage::CheckState,
        None,
        "checkpointed but not live: [103]; live but not checkpointed: [104]",
        false,
    );
    assert!(matches!(
        error.failures[0].reason,
        Reason::ParticipantsDiffer { .. }
    ));

    let mut topology = shared_topology(101);
    topology
        .get_mut(&pid(102))
        .expect("102")
        .push(allocation(5, 999, SIZE, false, 1).into());
    let run = Run::restore(&state_file(&topology), [pid(101), pid(102), pid(103)]);
    check_failed(
        &run,
        Stage::CheckState,
        Some(102),
        "imported from participant 999",
        false,
    );
}

#[test]
fn restore_refuses_live_records_that_differ_from_the_saved_ones() {
    let (mut fakes, state) = captured();
    fakes
        .get_mut(&pid(102))
        .expect("102")
        .records
        .push(mapping(1, 101, 0x1000, SIZE, 0).into());
    let mut run = Run::restore(&state, fakes.keys().copied());
    check_refused_at_inspect(
        &mut run,
        &mut fakes,
        Some(102),
        "records differ from the checkpoint (1 differences): unexpected mapping",
    );
    assert!(fakes.values().all(|fake| fake.phase == Phase::Released));

    check_found_in(Phase::Active, "in phase active, expected phase released");
}

#[test]
fn restore_verifies_the_final_records() {
    let (mut fakes, state) = captured();
    let mut run = Run::restore(&state, fakes.keys().copied());
    let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| match (stage, outcome) {
        (Stage::Verify, Ok(Reply::Inspection(mut inspection))) if pid.get() == 101 => {
            let mut records = inspection.records.into_vec();
            records.retain(|record| !matches!(record, Record::MulticastMapping(_)));
            inspection.records = records.try_into().expect("bounded");
            Ok(inspection.into())
        }
        (_, outcome) => outcome,
    };
    let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    assert_eq!(stages, restore_stages());
    check_failed(
        &run,
        Stage::Verify,
        Some(101),
        "missing multicast mapping of object",
        true,
    );

    let (mut fakes, state) = captured();
    let mut run = Run::restore(&state, fakes.keys().copied());
    let mut tamper = answer_at(
        Stage::Execute(Operation::LoadAllocations),
        Some(101),
        || {
            Ok(CompletedReply {
                operation: Operation::LoadAllocations,
                bytes: SIZE - 1,
                copy_ns: 1,
                peak_carrier_bytes: 0,
                checksums: Default::default(),
            }
            .into())
        },
    );
    drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    check_failed(
        &run,
        Stage::Execute(Operation::LoadAllocations),
        Some(101),
        "moved 2097151 bytes, expected 2097152",
        true,
    );
}

/// A check is restore's read-only start alone: one inspect compared with the state, reported
/// as `check_state`; a difference fails it with nothing changed, under that name.
#[test]
fn check_compares_the_state_and_changes_nothing() {
    let (mut fakes, state) = captured();
    let mut run = Run::check(&state, fakes.keys().copied());
    let stages = drive(&mut run, &mut fakes, &mut |_, _, outcome| outcome, Ok(()));
    assert_eq!(stages, [Stage::Inspect]);
    let Instruction::Done(report) = run.step() else {
        panic!("{:?}", run.step());
    };
    assert_eq!(report.command, "restore");
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["check_state"]);
    assert!(fakes.values().all(|fake| fake.phase == Phase::Released));

    let (mut fakes, state) = captured();
    let mut run = Run::check(&state, fakes.keys().copied());
    let mut tamper = |_: Stage, pid: NamespacePid, outcome: Outcome| match outcome {
        Ok(Reply::Inspection(mut inspection)) if pid.get() == 101 => {
            let mut records = inspection.records.into_vec();
            records.pop();
            inspection.records = records.try_into().expect("bounded");
            Ok(inspection.into())
        }
        outcome => outcome,
    };
    drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    let error = check_failed(
        &run,
        Stage::Inspect,
        Some(101),
        "records differ from the checkpoint",
        false,
    );
    let text = error.to_string();
    assert!(
        text.starts_with("restore failed in phase check_state: participant 101: ")
            && text.ends_with("nothing was changed in any participant"),
        "{text}"
    );
}

/// A restore interrupted after any of its operations (the coordinator killed) is run again
/// and picks up where each participant stands: the operations already done are skipped, the
/// rest go to those still in their starting phase, and the final records are verified. (After
/// the last operation every participant is active: nothing is left to restore, and a restore
/// refuses as for any active workload.)
#[test]
fn an_interrupted_restore_completes_when_run_again() {
    for done in 1..RESTORE_OPERATIONS.len() {
        let (mut fakes, state) = captured();
        let mut run = Run::restore(&state, fakes.keys().copied());
        // inspect, then `done` operations; then the coordinator is gone.
        for _ in 0..=done {
            let Instruction::Broadcast {
                request,
                participants,
                ..
            } = run.step().clone()
            else {
                panic!("{:?}", run.step());
            };
            let outcomes = participants
                .iter()
                .map(|p| (*p, Ok(fakes.get_mut(p).expect("fake").handle(&request))))
                .collect();
            run.feed(outcomes, Duration::from_millis(1));
        }
        let mut again = Run::restore(&state, fakes.keys().copied());
        let stages = drive(&mut again, &mut fakes, &mut untouched(), Ok(()));
        let mut expected = vec![Stage::Inspect];
        expected.extend(
            RESTORE_OPERATIONS[done..]
                .iter()
                .map(|op| Stage::Execute(*op)),
        );
        expected.push(Stage::Verify);
        assert_eq!(stages, expected, "after {done} operations");
        assert!(
            matches!(again.step(), Instruction::Done(_)),
            "{:?}",
            again.step()
        );
        assert!(fakes.values().all(|fake| fake.phase == Phase::Active));
    }

    // Phases no interrupted restore leaves (two steps apart) are refused, unchanged.
    check_found_in(
        Phase::UnicastRestored,
        "in phase unicast_restored, expected phase released",
    );
}

/// A mutating phase whose requests never left (every participant's socket refused them)
/// changed nothing: not fail-stop, nobody told, exit 1, and the message says nothing was
/// sent. The same phase with requests sent and never answered is fail-stop.
#[test]
fn a_phase_that_reached_nobody_changed_nothing() {
    let load = Stage::Execute(Operation::LoadAllocations);
    for (outcome, mutated) in [
        (
            unsent("connection refused: nothing listens on the socket"),
            false,
        ),
        // Hung up after the request was sent (a timeout settles: `settle.rs`).
        (closed("the peer closed the connection"), true),
    ] {
        let (mut fakes, state) = captured();
        let mut run = Run::restore(&state, fakes.keys().copied());
        let mut tamper = |stage: Stage, _: NamespacePid, given: Outcome| {
            if stage == load {
                outcome.clone()
            } else {
                given
            }
        };
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        let reason = if mutated {
            "no reply: the peer closed the connection"
        } else {
            "no reply: connection refused: nothing listens on the socket (nothing was sent)"
        };
        check_failed(&run, load, Some(101), reason, mutated);
        assert_eq!(run.fail_stop_targets().is_some(), mutated);
    }
}

/// A restore that finds participant 103 in `phase` is refused at inspect, changing nothing,
/// for `reason`.
fn check_found_in(phase: Phase, reason: &str) {
    let (mut fakes, state) = captured();
    fakes.get_mut(&pid(103)).expect("103").phase = phase;
    let mut run = Run::restore(&state, fakes.keys().copied());
    check_refused_at_inspect(&mut run, &mut fakes, Some(103), reason);
}
