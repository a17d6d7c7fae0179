//! What the plan's unit tests share: driving a run against fake participants, tampering with
//! outcomes, and checking how a run failed.

use std::collections::BTreeMap;
use std::time::Duration;

use cuinterpose_protocol::{BoundedString, NamespacePid, RefusalCode, RefusedReply, StateFile};

use crate::plan::*;
use cuinterpose_testkit::fixtures::*;

pub(super) type Fakes = BTreeMap<NamespacePid, FakeParticipant>;

/// Replaces one participant's outcome in one stage.
pub(super) type Tamper<'a> = &'a mut dyn FnMut(Stage, NamespacePid, Outcome) -> Outcome;

/// Fake participants answering through [`drive`], `tamper` replacing any outcome; records
/// the stages broadcast, in order (`publish_state` included).
struct Faked<'a, 'b> {
    fakes: &'a mut Fakes,
    tamper: Tamper<'b>,
    publish: Result<(), String>,
    stages: Vec<Stage>,
    /// The last state the run published.
    published: Option<StateFile>,
}

impl Participants for Faked<'_, '_> {
    fn broadcast(&mut self, run: &Run, call: Broadcast<'_>) -> Broadcasted {
        assert!(
            call.participants
                .iter()
                .all(|p| run.participants().contains(p)),
            "{:?}",
            call.participants
        );
        assert_eq!(
            Some(call.request),
            call.stage.request_with(run.carriage()).as_ref()
        );
        self.stages.push(call.stage);
        let outcomes = call
            .participants
            .iter()
            .map(|pid| {
                let reply = self.fakes.get_mut(pid).expect("fake").handle(call.request);
                (*pid, (self.tamper)(call.stage, *pid, Ok(reply)))
            })
            .collect();
        (outcomes, Duration::from_millis(2))
    }

    fn publish(&mut self, state: &StateFile) -> (Result<(), String>, Duration) {
        self.stages.push(Stage::PublishState);
        self.published = Some(state.clone());
        (self.publish.clone(), Duration::from_millis(1))
    }

    /// Every fake acknowledges.
    fn declare_fail_stop(&mut self, pids: &[NamespacePid], _: &str) -> Vec<NamespacePid> {
        pids.to_vec()
    }
}

/// Runs `run` against `fakes` until it finishes; `tamper` may replace any outcome. Returns
/// the stages broadcast, in order (`publish_state` included).
pub(super) fn drive(
    run: &mut Run,
    fakes: &mut Fakes,
    tamper: Tamper<'_>,
    publish: Result<(), String>,
) -> Vec<Stage> {
    let mut faked = Faked {
        fakes,
        tamper,
        publish,
        stages: Vec::new(),
        published: None,
    };
    // The outcome is the run's final step, which the tests inspect.
    let _ = crate::plan::drive(run, &mut faked);
    faked.stages
}

/// [`drive`], returning what the loop returned (a failed run's `told` filled in).
pub(super) fn drive_to_end(
    run: &mut Run,
    fakes: &mut Fakes,
    tamper: Tamper<'_>,
) -> Result<crate::report::Report, RunError> {
    let mut faked = Faked {
        fakes,
        tamper,
        publish: Ok(()),
        stages: Vec::new(),
        published: None,
    };
    crate::plan::drive(run, &mut faked)
}

pub(super) fn untouched() -> impl FnMut(Stage, NamespacePid, Outcome) -> Outcome {
    |_, _, outcome| outcome
}

/// The fakes of the shared topology (creator 101) and a capture of them, not yet driven.
pub(super) fn shared_capture() -> (Fakes, Run) {
    let fakes = fake_participants(&shared_topology(101));
    let run = Run::capture(fakes.keys().copied());
    (fakes, run)
}

/// Replaces participant `who`'s outcome at `stage` (everyone's when `None`) by `answer()`.
pub(super) fn answer_at(
    stage: Stage,
    who: Option<u32>,
    answer: impl Fn() -> Outcome,
) -> impl FnMut(Stage, NamespacePid, Outcome) -> Outcome {
    move |at, pid, outcome| {
        if at == stage && who.is_none_or(|who| pid.get() == who) {
            answer()
        } else {
            outcome
        }
    }
}

pub(super) fn capture_stages() -> Vec<Stage> {
    let mut stages = vec![Stage::Inspect, Stage::BeginCheckpoint];
    stages.extend(CAPTURE_OPERATIONS.map(Stage::Execute));
    stages.extend([Stage::PublishState, Stage::Hold]);
    stages
}

pub(super) fn restore_stages() -> Vec<Stage> {
    let mut stages = vec![Stage::Inspect];
    stages.extend(RESTORE_OPERATIONS.map(Stage::Execute));
    stages.push(Stage::Verify);
    stages
}

/// An exchange whose request was sent and never answered (a timeout, a closed connection).
pub(super) fn lost(message: &str) -> Outcome {
    Err(ExchangeError::Lost {
        kind: ExchangeKind::Timeout,
        message: message.to_owned(),
    })
}

/// An exchange whose participant hung up after the request was sent (it died, or its peer
/// thread did): gone, not busy.
pub(super) fn closed(message: &str) -> Outcome {
    Err(ExchangeError::Lost {
        kind: ExchangeKind::Transport,
        message: message.to_owned(),
    })
}

/// An exchange that never sent its request (the participant's socket refused it).
pub(super) fn unsent(message: &str) -> Outcome {
    Err(ExchangeError::Unsent {
        kind: ExchangeKind::Transport,
        message: message.to_owned(),
    })
}

pub(super) fn refused(code: RefusalCode, message: &str) -> Outcome {
    Ok(RefusedReply {
        code,
        message: BoundedString::truncating(message),
    }
    .into())
}

/// The run failed in `stage`, naming `participant` (None: a global failure) with a reason
/// whose text contains `reason`; `mutated` as given. A capture that failed before
/// `prepare_unicast` with nobody fail-stopped was rolled back (exit 3 where it had changed something, and no
/// fail-stop). Returns the error.
pub(super) fn check_failed(
    run: &Run,
    stage: Stage,
    participant: Option<u32>,
    reason: &str,
    mutated: bool,
) -> RunError {
    let Instruction::Failed(error) = run.step() else {
        panic!("expected a failure, got {:?}", run.step());
    };
    assert_eq!(error.stage, stage, "{error}");
    assert_eq!(error.mutated, mutated, "{error}");
    let rolled_back = error.rolled_back;
    if run.kind() == RunKind::Capture && stage.rolls_back() && error.fail_stopped.is_empty() {
        // Every participant answered the rollback (none of these tests stalls it).
        assert!(
            rolled_back || error.to_string().contains("rolling back"),
            "{error}"
        );
    } else {
        assert!(!rolled_back, "{error}");
    }
    assert_eq!(
        error.exit_code(),
        match (mutated, rolled_back) {
            (false, _) => 1,
            (true, false) => 2,
            (true, true) => 3,
        }
    );
    let text = error.to_string();
    let named = error.failures.iter().any(|failure| {
        failure.participant.map(NamespacePid::get) == participant
            && failure.to_string().contains(reason)
    });
    assert!(
        named,
        "expected {participant:?} with `{reason}` in:\n{text}"
    );
    let scope = match participant {
        Some(p) => format!("participant {p}: "),
        None => String::new(),
    };
    assert!(
        text.contains(&format!(
            "failed in phase {}: {scope}",
            stage.name_in(run.kind())
        )),
        "{text}"
    );
    assert_eq!(
        text.contains("FAIL-STOP"),
        mutated && !rolled_back,
        "{text}"
    );
    assert_eq!(text.contains("ABORTED"), mutated && rolled_back, "{text}");
    error.clone()
}

/// Driven untouched, `run` stops at inspect having changed nothing, naming `participant` with
/// `reason` ([`check_failed`]).
pub(super) fn check_refused_at_inspect(
    run: &mut Run,
    fakes: &mut Fakes,
    participant: Option<u32>,
    reason: &str,
) {
    let stages = drive(run, fakes, &mut untouched(), Ok(()));
    assert_eq!(stages, [Stage::Inspect]);
    check_failed(run, Stage::Inspect, participant, reason, false);
}

pub(super) fn captured() -> (Fakes, StateFile) {
    let topology = shared_topology(101);
    let mut fakes = fake_participants(&topology);
    let mut run = Run::capture(fakes.keys().copied());
    drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
    assert!(
        matches!(run.step(), Instruction::Done(_)),
        "{:?}",
        run.step()
    );
    (fakes, state_file(&topology))
}

/// [`drive`] untouched, publishing successfully: the stages and the state published.
pub(super) fn drive_publishing(
    run: &mut Run,
    fakes: &mut Fakes,
) -> (Vec<Stage>, Option<StateFile>) {
    let mut untouched = untouched();
    let mut faked = Faked {
        fakes,
        tamper: &mut untouched,
        publish: Ok(()),
        stages: Vec::new(),
        published: None,
    };
    let _ = crate::plan::drive(run, &mut faked);
    (faked.stages, faked.published)
}
