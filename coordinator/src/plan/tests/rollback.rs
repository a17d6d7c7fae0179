//! Unit tests of a capture's rollback when a participant is slow: one that times out in
//! `begin_checkpoint` and again on its `roll_back` is frozen and busy, not gone, and thaws on
//! its own, so the rollback is not fail-stop; a timeout anywhere else still is.

use super::*;

/// Times out 102's exchanges in `stages` (its fake still acts on the request, as a slow
/// process does later), and records who was asked to verify.
fn slow_in<'a>(
    stages: &'a [Stage],
    verified: &'a mut Vec<NamespacePid>,
) -> impl FnMut(Stage, NamespacePid, Outcome) -> Outcome + 'a {
    move |stage, p, outcome| {
        if stage == Stage::Verify {
            verified.push(p);
        }
        if stages.contains(&stage) && p == pid(102) {
            lost("timed out after 2s")
        } else {
            outcome
        }
    }
}

#[test]
fn a_participant_slow_in_begin_checkpoint_is_rolled_back_unconfirmed() {
    let mut fakes = fake_participants(&shared_topology(101));
    let mut run = Run::capture(fakes.keys().copied());
    let mut verified = Vec::new();
    let slow = [Stage::BeginCheckpoint, Stage::RollBack];
    let stages = drive(
        &mut run,
        &mut fakes,
        &mut slow_in(&slow, &mut verified),
        Ok(()),
    );
    assert!(
        stages.ends_with(&[Stage::BeginCheckpoint, Stage::RollBack, Stage::Verify]),
        "{stages:?}"
    );
    let error = check_failed(
        &run,
        Stage::BeginCheckpoint,
        Some(102),
        "timed out after 2s",
        true,
    );
    assert!(error.rolled_back, "{error}");
    assert_eq!(error.unconfirmed, [pid(102)]);
    assert_eq!(
        error.failures.len(),
        1,
        "the rollback failed nobody: {error}"
    );
    assert_eq!(
        verified,
        [pid(101), pid(103)],
        "the slow one is not verified"
    );
    assert!(
        run.fail_stop_targets().is_none(),
        "nobody told to fail-stop"
    );
    let text = error.to_string();
    assert!(
        text.contains("verified except 102") && text.contains("on its own"),
        "{text}"
    );
}

#[test]
fn other_slow_rollbacks_stay_fail_stop() {
    // Slow in save_allocations and on its roll_back: a process in `saved` cannot thaw on its
    // own, so the rollback failed.
    let target = Stage::Execute(Operation::SaveAllocations);
    let mut fakes = fake_participants(&shared_topology(101));
    let mut run = Run::capture(fakes.keys().copied());
    let mut verified = Vec::new();
    let slow = [target, Stage::RollBack];
    drive(
        &mut run,
        &mut fakes,
        &mut slow_in(&slow, &mut verified),
        Ok(()),
    );
    let error = check_failed(&run, target, Some(102), "timed out after 2s", true);
    assert!(
        !error.rolled_back && error.unconfirmed.is_empty(),
        "{error}"
    );
    assert!(
        error.to_string().contains("rolling back (roll_back)"),
        "{error}"
    );
    assert!(run.fail_stop_targets().is_some());

    // Slow in begin_checkpoint, but its roll_back refused: that is an answer, and a failure.
    let mut fakes = fake_participants(&shared_topology(101));
    let mut run = Run::capture(fakes.keys().copied());
    let mut fault = |stage: Stage, p: NamespacePid, outcome: Outcome| match (stage, p.get()) {
        (Stage::BeginCheckpoint, 102) => lost("timed out after 2s"),
        (Stage::RollBack, 102) => refused(RefusalCode::Invalid, "not now"),
        _ => outcome,
    };
    drive(&mut run, &mut fakes, &mut fault, Ok(()));
    let error = check_failed(
        &run,
        Stage::BeginCheckpoint,
        Some(102),
        "timed out after 2s",
        true,
    );
    assert!(
        !error.rolled_back && error.unconfirmed.is_empty(),
        "{error}"
    );

    // Another participant's timeout on roll_back is no excuse: only a slow one's own.
    let mut fakes = fake_participants(&shared_topology(101));
    let mut run = Run::capture(fakes.keys().copied());
    let mut fault = |stage: Stage, p: NamespacePid, outcome: Outcome| match (stage, p.get()) {
        (Stage::BeginCheckpoint, 102) | (Stage::RollBack, 102 | 103) => lost("timed out after 2s"),
        _ => outcome,
    };
    drive(&mut run, &mut fakes, &mut fault, Ok(()));
    let error = check_failed(
        &run,
        Stage::BeginCheckpoint,
        Some(102),
        "timed out after 2s",
        true,
    );
    assert!(!error.rolled_back, "{error}");
    assert!(
        error
            .failures
            .iter()
            .any(|f| f.participant == Some(pid(103))),
        "{error}"
    );
}
