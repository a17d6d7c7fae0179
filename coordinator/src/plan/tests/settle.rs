//! Unit tests of settling: a participant that does not answer `prepare_unicast` in time is
//! waited for (`progress` rounds) until every participant is released, then the workload is
//! put back from the state in memory; one that does not answer a restore's step in time is
//! waited for until every participant is through it, and the restore goes on; one silent past
//! the limit, failed or gone is fail-stop.

use super::*;
use cuinterpose_protocol::{ProgressReply, StateFile};

const SLOW: &str = "timed out after 1s";
const PREPARE_UNICAST: Stage = Stage::Execute(Operation::PrepareUnicast);

/// What becomes of one request to one participant.
enum Fate {
    /// The fake acts and answers.
    Answers,
    /// The fake acts; its reply never comes (a timeout).
    ActsSilently,
    /// The request never reaches the fake (lost or still queued): a timeout.
    Unheard,
    /// The fake acts; this outcome replaces its reply.
    Instead(Outcome),
}

/// Fake participants whose requests meet the fate `fate` gives them.
struct Fated<F> {
    fakes: Fakes,
    fate: F,
    stages: Vec<Stage>,
    rounds: usize,
    /// The phases announced as started, in order.
    started: Vec<&'static str>,
}

impl<F: FnMut(Stage, u32, usize) -> Fate> Participants for Fated<F> {
    fn broadcast(&mut self, _: &Run, call: Broadcast<'_>) -> Broadcasted {
        self.stages.push(call.stage);
        let mut outcomes = BTreeMap::new();
        for p in call.participants {
            let fate = (self.fate)(call.stage, p.get(), self.rounds);
            let outcome = if matches!(fate, Fate::Unheard) {
                lost(SLOW)
            } else {
                let reply = Ok(self.fakes.get_mut(p).expect("fake").handle(call.request));
                match fate {
                    Fate::Answers => reply,
                    Fate::Instead(outcome) => outcome,
                    Fate::ActsSilently | Fate::Unheard => lost(SLOW),
                }
            };
            outcomes.insert(*p, outcome);
        }
        if call.stage == Stage::Settle {
            self.rounds += 1;
        }
        (outcomes, Duration::from_millis(400))
    }

    fn publish(&mut self, _: &StateFile) -> (Result<(), String>, Duration) {
        (Ok(()), Duration::from_millis(1))
    }

    fn declare_fail_stop(&mut self, pids: &[NamespacePid], _: &str) -> Vec<NamespacePid> {
        pids.to_vec()
    }

    fn started(&mut self, phase: &'static str, _: usize) {
        self.started.push(phase);
    }
}

/// Captures the shared topology (101 creates, 102 and 103 import) through the one loop,
/// `fate` deciding each request's fate from the stage, the participant and how many settle
/// rounds went before. Returns the stages broadcast and the fakes.
fn check(run: &mut Run, fate: impl FnMut(Stage, u32, usize) -> Fate) -> (Vec<Stage>, Fakes) {
    check_with(run, fake_participants(&shared_topology(101)), fate)
}

/// [`check`] of a run over `fakes` (a restore's: released by a capture).
fn check_with(
    run: &mut Run,
    fakes: Fakes,
    fate: impl FnMut(Stage, u32, usize) -> Fate,
) -> (Vec<Stage>, Fakes) {
    let fated = drive_fated(run, fakes, fate);
    (fated.stages, fated.fakes)
}

/// Runs `run` through the one loop over `fakes`, `fate` deciding each request's fate; the
/// fakes afterwards, with what they were sent and what was announced.
fn drive_fated<F: FnMut(Stage, u32, usize) -> Fate>(
    run: &mut Run,
    fakes: Fakes,
    fate: F,
) -> Fated<F> {
    let mut fated = Fated {
        fakes,
        fate,
        stages: Vec::new(),
        rounds: 0,
        started: Vec::new(),
    };
    // The outcome is the run's final step, which the tests inspect.
    let _ = crate::plan::drive(run, &mut fated);
    fated
}

fn failed(run: &Run) -> &RunError {
    match run.step() {
        Instruction::Failed(error) => error,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn until_prepare_unicast() -> Vec<Stage> {
    let mut stages = capture_stages();
    stages.truncate(stages.iter().position(|s| *s == PREPARE_UNICAST).unwrap() + 1);
    stages
}

#[test]
fn a_participant_silent_in_prepare_unicast_is_waited_for_then_put_back() {
    let mut run = Run::capture((101..104).map(pid));
    // 102 did the step (the fake acts) but answers nothing for two settle rounds.
    let (stages, fakes) = check(&mut run, |stage, p, rounds| match (stage, p) {
        (PREPARE_UNICAST, 102) => Fate::ActsSilently,
        (Stage::Settle, 102) if rounds < 2 => Fate::Unheard,
        _ => Fate::Answers,
    });
    let mut expected = until_prepare_unicast();
    expected.extend([Stage::Settle; 3]);
    assert_eq!(stages, expected);
    let error = failed(&run);
    assert!(
        error.settled && error.mutated && error.resumes_from_state(),
        "{error}"
    );
    assert_eq!(error.stage, PREPARE_UNICAST);
    assert_eq!(run.fail_stop_targets(), None, "nobody is told to fail-stop");
    assert!(run.state().is_some(), "the state to put it back from");
    assert!(fakes.values().all(|f| f.phase == Phase::Released));
    let settle = run.phases().last().expect("a settle phase");
    assert_eq!(
        (settle.name.as_str(), settle.duration),
        ("settle", Duration::from_millis(1200))
    );
    assert!(
        error
            .to_string()
            .contains("put back from the state in memory"),
        "{error}"
    );
}

/// 102's `prepare_unicast` never arrived: found still `saved`, it gets the step again (and
/// only it), then every participant is released.
#[test]
fn a_participant_still_saved_gets_prepare_unicast_again() {
    let mut run = Run::capture((101..104).map(pid));
    let mut sent_again = 0;
    let (stages, fakes) = check(&mut run, |stage, p, rounds| match (stage, p) {
        (PREPARE_UNICAST, 102) if rounds == 0 => Fate::Unheard,
        (PREPARE_UNICAST, _) if rounds > 0 => {
            sent_again += 1;
            assert_eq!(p, 102, "only the one still saved");
            Fate::Answers
        }
        _ => Fate::Answers,
    });
    assert_eq!(sent_again, 1);
    let mut expected = until_prepare_unicast();
    expected.extend([Stage::Settle, PREPARE_UNICAST, Stage::Settle]);
    assert_eq!(stages, expected);
    assert!(failed(&run).settled, "{}", failed(&run));
    assert!(fakes.values().all(|f| f.phase == Phase::Released));
}

/// Settling is one phase, announced once: its progress rounds and the step sent again in it
/// start nothing more.
#[test]
fn settling_is_announced_once() {
    let mut run = Run::capture((101..104).map(pid));
    let fakes = fake_participants(&shared_topology(101));
    let fated = drive_fated(&mut run, fakes, |stage, p, rounds| {
        match (stage, p, rounds) {
            // Never arrived, and 102 silent for the first round: two rounds, the step again, a
            // third round.
            (PREPARE_UNICAST | Stage::Settle, 102, 0) => Fate::Unheard,
            _ => Fate::Answers,
        }
    });
    let mut expected = until_prepare_unicast();
    expected.extend([Stage::Settle, Stage::Settle, PREPARE_UNICAST, Stage::Settle]);
    assert_eq!(fated.stages, expected);
    let mut announced: Vec<&str> = until_prepare_unicast()
        .iter()
        .map(|stage| stage.name_in(RunKind::Capture))
        .collect();
    announced.push("settle");
    assert_eq!(fated.started, announced);
    assert!(failed(&run).settled, "{}", failed(&run));
    assert_eq!(run.phases().last().map(|p| p.name.as_str()), Some("settle"));
}

/// Sent again while its first `prepare_unicast` still runs, it refuses the second as out of
/// order; the next round finds it released.
#[test]
fn a_second_prepare_unicast_refused_as_out_of_order_is_not_a_failure() {
    let mut run = Run::capture((101..104).map(pid));
    let (stages, _) = check(&mut run, |stage, p, rounds| match (stage, p, rounds) {
        (PREPARE_UNICAST, 102, 0) => Fate::Unheard,
        // Its progress said saved: the first request had not started yet.
        (Stage::Settle, 102, 0) => progress_of(102, Some(Operation::SaveAllocations), Phase::Saved),
        (PREPARE_UNICAST, 102, 1) => Fate::Instead(refused(
            RefusalCode::OutOfOrder,
            "prepare_unicast needs phase saved; this process is in phase released",
        )),
        _ => Fate::Answers,
    });
    let mut expected = until_prepare_unicast();
    expected.extend([Stage::Settle, PREPARE_UNICAST, Stage::Settle]);
    assert_eq!(stages, expected);
    assert!(failed(&run).settled, "{}", failed(&run));
}

/// Silent past the limit: fail-stop, naming the timeouts of both the step and the wait.
#[test]
fn a_participant_silent_past_the_limit_is_fail_stop() {
    let mut run = Run::capture((101..104).map(pid));
    run.set_settle_limit(Duration::from_secs(1));
    let (stages, _) = check(&mut run, |stage, p, _| match (stage, p) {
        (PREPARE_UNICAST | Stage::Settle, 102) => Fate::Unheard,
        _ => Fate::Answers,
    });
    // Rounds of 400 ms: the third passes the limit.
    let mut expected = until_prepare_unicast();
    expected.extend([Stage::Settle; 3]);
    assert_eq!(stages, expected);
    let error = failed(&run);
    assert!(!error.settled && error.mutated && !error.resumes_from_state());
    assert_eq!(error.stage, PREPARE_UNICAST);
    assert_eq!(run.fail_stop_targets().map(<[_]>::len), Some(3));
    let text = error.to_string();
    for part in [
        "participant 102: no reply: timed out after 1s",
        "then, waiting for every participant to be released (settle)",
        "FAIL-STOP",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
}

/// Participant 103's progress reply: idle, in `phase`.
fn progress(phase: Phase) -> Fate {
    progress_of(103, None, phase)
}

/// Participant `p`'s progress reply: idle after `operation`, in `phase`.
fn progress_of(p: u32, operation: Option<Operation>, phase: Phase) -> Fate {
    Fate::Instead(Ok(ProgressReply {
        namespace_pid: pid(p),
        operation,
        running: false,
        done: 0,
        total: 0,
        phase,
        held: false,
    }
    .into()))
}

/// While it settles, a participant that hung up (died), failed, or reports another phase
/// ends the wait: fail-stop, naming it.
#[test]
fn a_participant_gone_or_failed_while_settling_is_fail_stop() {
    let cases: [(Fate, &str); 3] = [
        (
            Fate::Instead(closed("the peer closed the connection")),
            "the peer closed",
        ),
        (
            progress(Phase::Failed),
            "in phase failed, expected phase released",
        ),
        (
            progress(Phase::Active),
            "in phase active, expected phase released",
        ),
    ];
    for (fate, said) in cases {
        let mut fate = Some(fate);
        let mut run = Run::capture((101..104).map(pid));
        check(&mut run, |stage, p, _| match (stage, p) {
            (PREPARE_UNICAST, 102) => Fate::ActsSilently,
            (Stage::Settle, 103) => fate.take().unwrap_or(Fate::Answers),
            _ => Fate::Answers,
        });
        let error = failed(&run);
        assert!(!error.settled, "{error}");
        assert_eq!(run.fail_stop_targets().map(<[_]>::len), Some(3), "{error}");
        let text = error.to_string();
        assert!(
            text.contains("participant 103") && text.contains(said),
            "{said}: {text}"
        );
    }
}

/// A participant that hung up in `prepare_unicast` itself (died) is not waited for.
#[test]
fn a_participant_gone_in_prepare_unicast_is_not_waited_for() {
    let mut run = Run::capture((101..104).map(pid));
    let (stages, _) = check(&mut run, |stage, p, _| match (stage, p) {
        (PREPARE_UNICAST, 102) => Fate::Instead(closed("the peer closed the connection")),
        _ => Fate::Answers,
    });
    assert_eq!(stages, until_prepare_unicast());
    assert!(!failed(&run).settled);
    assert_eq!(run.fail_stop_targets().map(<[_]>::len), Some(3));
}

const LOAD: Stage = Stage::Execute(Operation::LoadAllocations);
const RESTORE_UNICAST: Stage = Stage::Execute(Operation::RestoreUnicast);

/// A restore of what [`captured`] left, `fate` deciding as in [`check`].
fn check_restore(fate: impl FnMut(Stage, u32, usize) -> Fate) -> (Run, Vec<Stage>, Fakes) {
    let (fakes, state) = captured();
    let mut run = Run::restore(&state, fakes.keys().copied());
    let (stages, fakes) = check_with(&mut run, fakes, fate);
    (run, stages, fakes)
}

/// The restore's stages, `waited` after `stage`.
fn restore_waiting(stage: Stage, waited: &[Stage]) -> Vec<Stage> {
    let mut stages = restore_stages();
    let at = stages
        .iter()
        .position(|s| *s == stage)
        .expect("a restore stage")
        + 1;
    stages.splice(at..at, waited.iter().copied());
    stages
}

/// The creator silent in `load_allocations` (it loaded; the reply is lost), then for one
/// more round: the restore waits, and goes on once it reads `loaded`; its report shows the
/// step and the wait.
#[test]
fn a_participant_silent_in_a_restore_step_is_waited_for_and_the_restore_goes_on() {
    let (run, stages, fakes) = check_restore(|stage, p, rounds| match (stage, p) {
        (LOAD, 101) => Fate::ActsSilently,
        (Stage::Settle, 101) if rounds < 1 => Fate::Unheard,
        _ => Fate::Answers,
    });
    // Its progress reads loaded; an inspection confirms the step is done there.
    assert_eq!(
        stages,
        restore_waiting(LOAD, &[Stage::Settle, Stage::Settle, Stage::Confirm])
    );
    let Instruction::Done(report) = run.step() else {
        panic!("{:?}", run.step());
    };
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        &names[..4],
        ["inspect", "load_allocations", "settle", "restore_unicast"]
    );
    assert_eq!(report.phases[2].duration, Duration::from_millis(1200));
    assert!(fakes.values().all(|f| f.phase == Phase::Active));
}

/// Its progress reads the phase the step leads to as soon as the step starts: an inspection
/// that times out (the step still runs in its control worker) means more rounds, not the
/// next step.
#[test]
fn a_restore_step_still_running_is_confirmed_before_the_next() {
    let mut confirms = 0;
    let (run, stages, _) = check_restore(|stage, p, _| match (stage, p) {
        (LOAD, 101) => Fate::ActsSilently,
        (Stage::Confirm, 101) => {
            confirms += 1;
            if confirms == 1 {
                Fate::Unheard
            } else {
                Fate::Answers
            }
        }
        _ => Fate::Answers,
    });
    assert_eq!(
        stages,
        restore_waiting(
            LOAD,
            &[Stage::Settle, Stage::Confirm, Stage::Settle, Stage::Confirm]
        )
    );
    assert!(
        matches!(run.step(), Instruction::Done(_)),
        "{:?}",
        run.step()
    );
}

/// An importer's `restore_unicast` never arrived: found still `loaded`, it gets the step
/// again (it alone); a second request refused as out of order (the first got there first)
/// is no failure either.
#[test]
fn a_participant_behind_in_a_restore_gets_the_step_again() {
    let mut sent_again = Vec::new();
    let (run, stages, fakes) = check_restore(|stage, p, rounds| match (stage, p, rounds) {
        (RESTORE_UNICAST, 102, 0) => Fate::Unheard,
        (RESTORE_UNICAST, _, 1..) => {
            sent_again.push(p);
            Fate::Answers
        }
        _ => Fate::Answers,
    });
    assert_eq!(sent_again, [102]);
    assert_eq!(
        stages,
        restore_waiting(
            RESTORE_UNICAST,
            &[Stage::Settle, RESTORE_UNICAST, Stage::Settle]
        )
    );
    assert!(
        matches!(run.step(), Instruction::Done(_)),
        "{:?}",
        run.step()
    );
    assert!(fakes.values().all(|f| f.phase == Phase::Active));

    let (run, stages, _) = check_restore(|stage, p, rounds| match (stage, p, rounds) {
        (RESTORE_UNICAST, 102, 0) => Fate::Unheard,
        (Stage::Settle, 102, 0) => {
            progress_of(102, Some(Operation::LoadAllocations), Phase::Loaded)
        }
        (RESTORE_UNICAST, 102, 1) => Fate::Instead(refused(
            RefusalCode::OutOfOrder,
            "restore_unicast needs phase loaded; this process is in phase unicast_restored",
        )),
        _ => Fate::Answers,
    });
    // The refusal says nothing of where the first request stands: an inspection confirms.
    assert_eq!(
        stages,
        restore_waiting(
            RESTORE_UNICAST,
            &[
                Stage::Settle,
                RESTORE_UNICAST,
                Stage::Settle,
                Stage::Confirm
            ]
        )
    );
    assert!(
        matches!(run.step(), Instruction::Done(_)),
        "{:?}",
        run.step()
    );
}

/// Silent past the limit, or failed, gone or in another phase while the restore waits:
/// fail-stop in the step, naming its timeout and what the wait found.
#[test]
fn a_restore_wait_that_fails_is_fail_stop_in_the_step() {
    let cases: [(Option<Fate>, &str); 3] = [
        (
            None,
            "participant 102: then, waiting for every participant to reach phase loaded (settle): no reply: timed out after 1s",
        ),
        (
            Some(progress(Phase::Failed)),
            "participant 103: then, waiting for every participant to reach phase loaded (settle): in phase failed, expected phase loaded",
        ),
        (
            Some(Fate::Instead(closed("the peer closed the connection"))),
            "participant 103: then, waiting for every participant to reach phase loaded (settle): no reply: the peer closed",
        ),
    ];
    for (fate, said) in cases {
        let silent_for_good = fate.is_none();
        let mut fate = fate;
        let (fakes, state) = captured();
        let mut run = Run::restore(&state, fakes.keys().copied());
        run.set_settle_limit(Duration::from_secs(1));
        check_with(&mut run, fakes, |stage, p, _| match (stage, p) {
            (LOAD, 102) => Fate::Unheard,
            (Stage::Settle, 102) if silent_for_good => Fate::Unheard,
            (Stage::Settle, 103) => fate.take().unwrap_or(Fate::Answers),
            _ => Fate::Answers,
        });
        let error = failed(&run);
        assert_eq!(error.stage, LOAD, "{said}");
        assert!(error.mutated && !error.settled && !error.resumes_from_state());
        assert_eq!(run.fail_stop_targets().map(<[_]>::len), Some(3), "{error}");
        let text = error.to_string();
        assert!(
            text.contains("participant 102: no reply: timed out after 1s")
                && text.contains(said)
                && text.contains("FAIL-STOP"),
            "{said}: {text}"
        );
    }
}
