//! Unit tests of a capture's rollback when a participant is slow: one that times out in
//! `begin_checkpoint` and again on its `roll_back` is frozen and busy, not gone, and thaws on
//! its own, so the rollback is not fail-stop; a timeout anywhere else still is. And a save
//! whose checksums cannot check the carried bytes rolls back too.

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

/// A save whose checksums do not cover exactly the carried bytes is refused before anything
/// is released, and the capture rolls back: the state could not check those bytes.
#[test]
fn a_save_without_usable_checksums_is_rolled_back() {
    use cuinterpose_protocol::{CarrierChecksum, CompletedReply, Operation};
    let save = Stage::Execute(Operation::SaveAllocations);
    let (fakes, _) = shared_capture();
    let creator = &fakes[&pid(101)];
    let good = creator.checksums();
    let id = good[0].allocation;
    let reply = |bytes: u64, checksums: Vec<CarrierChecksum>| -> Outcome {
        Ok(CompletedReply {
            operation: Operation::SaveAllocations,
            bytes,
            copy_ns: 0,
            peak_carrier_bytes: bytes,
            checksums: checksums.try_into().expect("bounded"),
        }
        .into())
    };
    let mut short = good.clone();
    short[0].chunks = Vec::<u64>::new().try_into().expect("bounded");
    let mut unchunked = good.clone();
    unchunked[0].chunk_bytes = 0;
    let carried = creator.carried_bytes();
    let cases = [
        (
            101,
            reply(carried, Vec::new()),
            format!("allocation {id}: no checksum of its bytes was reported"),
        ),
        (
            101,
            reply(carried, short),
            format!("allocation {id}: the checksums cover another size or chunking than its bytes"),
        ),
        (
            101,
            reply(carried, unchunked),
            format!("allocation {id}: the checksums cover another size or chunking than its bytes"),
        ),
        (
            102,
            reply(0, good.clone()),
            format!("allocation {id}: a checksum was reported for bytes it does not carry"),
        ),
    ];
    for (who, answer, why) in cases {
        let (mut fakes, mut run) = shared_capture();
        let mut tamper = answer_at(save, Some(who), || answer.clone());
        let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        assert!(
            stages.ends_with(&[save, Stage::RollBack, Stage::Verify]),
            "{stages:?}"
        );
        check_failed(
            &run,
            save,
            Some(who),
            &format!("save_allocations reported unusable checksums: {why}"),
            true,
        );
    }
}
