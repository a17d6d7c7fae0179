//! Unit tests of a capture's rollback when a participant is slow: one that times out in
//! `begin_checkpoint` and again on its `roll_back` is frozen and busy, not gone, and thaws on
//! its own, so the rollback is not fail-stop; a timeout anywhere else still is.

use super::*;

const SLOW: &str = "timed out after 2s";

/// Captures the shared topology with `fault` replacing outcomes (the fakes still act on each
/// request, as a slow process does later); the run must fail in `stage`, 102 named first with
/// the timeout. Returns the error and who was asked to verify.
fn check(
    stage: Stage,
    mut fault: impl FnMut(Stage, u32) -> Option<Outcome>,
) -> (RunError, Vec<NamespacePid>, Run) {
    let (mut fakes, mut run) = shared_capture();
    let mut verified = Vec::new();
    let mut tamper = |s: Stage, p: NamespacePid, outcome: Outcome| {
        if s == Stage::Verify {
            verified.push(p);
        }
        fault(s, p.get()).unwrap_or(outcome)
    };
    drive(&mut run, &mut fakes, &mut tamper, Ok(()));
    let error = check_failed(&run, stage, Some(102), SLOW, true);
    (error, verified, run)
}

#[test]
fn a_participant_slow_in_begin_checkpoint_is_rolled_back_unconfirmed() {
    let (error, verified, run) = check(Stage::BeginCheckpoint, |s, p| match (s, p) {
        (Stage::BeginCheckpoint | Stage::RollBack, 102) => Some(lost(SLOW)),
        _ => None,
    });
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
    let (error, _, run) = check(target, |s, p| {
        (p == 102 && (s == target || s == Stage::RollBack)).then(|| lost(SLOW))
    });
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
    let (error, _, _) = check(Stage::BeginCheckpoint, |s, p| match (s, p) {
        (Stage::BeginCheckpoint, 102) => Some(lost(SLOW)),
        (Stage::RollBack, 102) => Some(refused(RefusalCode::Invalid, "not now")),
        _ => None,
    });
    assert!(
        !error.rolled_back && error.unconfirmed.is_empty(),
        "{error}"
    );

    // Another participant's timeout on roll_back is no excuse: only a slow one's own.
    let (error, _, _) = check(Stage::BeginCheckpoint, |s, p| match (s, p) {
        (Stage::BeginCheckpoint, 102) | (Stage::RollBack, 102 | 103) => Some(lost(SLOW)),
        _ => None,
    });
    assert!(!error.rolled_back, "{error}");
    let named_103 = error
        .failures
        .iter()
        .any(|f| f.participant == Some(pid(103)));
    assert!(named_103, "{error}");
}
