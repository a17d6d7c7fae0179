//! The lifecycle as a sans-I/O state machine.
//!
//! A [`Run`] says what to do next ([`Step`]): send one request to every participant, publish
//! the state file, or stop. The caller (see [`crate::session`]) does it and feeds back the
//! per-participant outcomes and the elapsed time; the run checks every reply against what the
//! step expects and moves on, or fails naming the phase, the participants and the reasons.
//!
//! Capture: `inspect` → validate → `begin_checkpoint` → validate the frozen records →
//! `prepare_multicast` → `save_allocations` → `prepare_unicast` → publish the state.
//! Restore: check the state and the participant set (before contacting anyone) → `inspect`
//! (every participant `released`, records equal to the saved ones) → `load_allocations` …
//! `restore_multicast_bindings` → `verify` (a fresh inspect: every participant `active`, records
//! equal to the saved ones).
//!
//! Every lifecycle operation goes to every participant and the run waits for all outcomes (a
//! barrier) before the next one. There is no retry and no rollback: a failure after a mutating
//! request is fail-stop, and [`RunError::mutated`] says so.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use cuinterpose_protocol::{
    ExecuteRequest, InspectionReply, NamespacePid, Operation, Phase, Record, RefusalCode, Reply,
    Request, StateFile,
};

use crate::report::{PhaseReport, Report};
use crate::state::{self, RecordDifference};
use crate::validate::{self, Topology, TopologyError};

// The phase chain is declared once, in the schema's lifecycle section; these are its
// generated sequences and phases.
pub use cuinterpose_protocol::{CAPTURE_OPERATIONS, RESTORE_OPERATIONS};

/// The phase each operation leaves a participant in.
pub fn phase_after(operation: Operation) -> Phase {
    operation.to_phase()
}

/// The phase a participant must be in for `operation` (the phase the previous step left).
pub fn phase_before(operation: Operation) -> Phase {
    operation.from_phase()
}

/// Capture or restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Capture,
    Restore,
}

impl RunKind {
    /// The CLI command that runs it.
    pub fn command(self) -> &'static str {
        match self {
            Self::Capture => "prepare",
            Self::Restore => "restore",
        }
    }
}

/// A phase of a run, as reports and errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Restore's checks of the state file and the participant set, before any request.
    CheckState,
    Inspect,
    BeginCheckpoint,
    Execute(Operation),
    PublishState,
    /// Restore's final inspect, compared with the saved records.
    Verify,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckState => "check_state",
            Self::Inspect => "inspect",
            Self::BeginCheckpoint => "begin_checkpoint",
            Self::Execute(operation) => operation.wire_name(),
            Self::PublishState => "publish_state",
            Self::Verify => "verify",
        }
    }

    /// The request this stage broadcasts; `None` for stages that send nothing.
    pub fn request(self) -> Option<Request> {
        match self {
            Self::Inspect | Self::Verify => Some(Request::Inspect),
            Self::BeginCheckpoint => Some(Request::BeginCheckpoint),
            Self::Execute(operation) => Some(Request::Execute(ExecuteRequest { operation })),
            Self::CheckState | Self::PublishState => None,
        }
    }

    /// Whether the request changes the participant (a failure after it is fail-stop).
    pub fn mutates(self) -> bool {
        matches!(self, Self::BeginCheckpoint | Self::Execute(_))
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One participant's exchange: its reply, or why there is none (a transport error).
pub type Outcome = Result<Reply, String>;

/// Why a participant (or the whole run) failed a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A topology rule (its message names the participant itself).
    Topology(TopologyError),
    /// No reply: connect, send or receive failed or timed out.
    Transport(String),
    /// The participant refused the request.
    Refused {
        code: RefusalCode,
        message: String,
    },
    /// A reply of the wrong kind for the request.
    UnexpectedReply {
        expected: &'static str,
        found: &'static str,
    },
    /// `Completed` for another operation.
    WrongOperation {
        expected: Operation,
        found: Operation,
    },
    /// `Completed` with a byte count other than the host-carrier bytes the topology implies.
    WrongBytes {
        operation: Operation,
        expected: u64,
        found: u64,
    },
    /// The reply came from another namespace PID.
    PidMismatch {
        answered: NamespacePid,
    },
    WrongPhase {
        expected: Phase,
        found: Phase,
    },
    /// The caller fed no outcome for this participant.
    NoOutcome,
    /// The caller fed an outcome for a process that is not a participant.
    NotAParticipant,
    /// The live participants are not the saved ones.
    ParticipantsDiffer {
        missing: Vec<NamespacePid>,
        unexpected: Vec<NamespacePid>,
    },
    /// Live records differ from the saved ones.
    RecordsDiffer(Vec<RecordDifference>),
    /// The state file could not be published.
    Publish(String),
    /// The state file cannot describe these participants.
    State(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Topology(error) => write!(f, "{error}"),
            Self::Transport(error) => write!(f, "no reply: {error}"),
            Self::Refused { code, message } => write!(f, "refused ({code}): {message}"),
            Self::UnexpectedReply { expected, found } => {
                write!(f, "replied `{found}`, expected `{expected}`")
            }
            Self::WrongOperation { expected, found } => {
                write!(f, "completed `{found}`, expected `{expected}`")
            }
            Self::WrongBytes {
                operation,
                expected,
                found,
            } => write!(
                f,
                "{operation} moved {found} bytes, expected {expected} (its host-carrier allocations)"
            ),
            Self::PidMismatch { answered } => {
                write!(f, "answered as namespace pid {answered}")
            }
            Self::WrongPhase { expected, found } => {
                write!(f, "in phase {found}, expected phase {expected}")
            }
            Self::NoOutcome => f.write_str("no outcome was collected"),
            Self::NotAParticipant => f.write_str("answered but is not a participant"),
            Self::ParticipantsDiffer {
                missing,
                unexpected,
            } => {
                let list = |pids: &[NamespacePid]| {
                    pids.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                write!(
                    f,
                    "the live participants are not the checkpointed ones (checkpointed but not live: [{}]; live but not checkpointed: [{}])",
                    list(missing),
                    list(unexpected)
                )
            }
            Self::RecordsDiffer(differences) => {
                write!(
                    f,
                    "records differ from the checkpoint ({} differences): ",
                    differences.len()
                )?;
                for (index, difference) in differences.iter().enumerate() {
                    if index > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{difference}")?;
                }
                Ok(())
            }
            Self::Publish(error) => write!(f, "cannot publish the state: {error}"),
            Self::State(error) => write!(f, "{error}"),
        }
    }
}

/// One failure in a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `None` for failures of the whole run (participant set, state file).
    pub participant: Option<NamespacePid>,
    pub reason: Reason,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.reason, self.participant) {
            // Topology errors carry their own scope prefix.
            (Reason::Topology(error), _) => write!(f, "{error}"),
            (reason, Some(pid)) => write!(f, "participant {pid}: {reason}"),
            (reason, None) => write!(f, "coordinator: {reason}"),
        }
    }
}

/// How a run failed: the stage, every failure in it, and whether anything had been changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RunError {
    pub kind: RunKind,
    pub stage: Stage,
    /// Sorted by participant (global failures first).
    pub failures: Vec<Failure>,
    /// A mutating request reached (or may have reached) a participant: the workload cannot
    /// simply continue (fail-stop).
    pub mutated: bool,
    /// Participants that reported a fail-stop (`driver_error` or `fail_stopped`).
    pub fail_stopped: Vec<NamespacePid>,
}

impl RunError {
    /// The first participant named (the one a one-line summary names).
    pub fn participant(&self) -> Option<NamespacePid> {
        self.failures.iter().find_map(|failure| failure.participant)
    }

    /// Every participant named.
    pub fn participants(&self) -> Vec<NamespacePid> {
        self.failures
            .iter()
            .filter_map(|failure| failure.participant)
            .collect()
    }

    /// 1: refused or invalid, nothing changed; 2: failed after mutation.
    pub fn exit_code(&self) -> u8 {
        if self.mutated { 2 } else { 1 }
    }
}

impl RunError {
    /// One line per failure, without the verdict (fail-stop or nothing changed).
    pub fn failures_text(&self) -> String {
        self.failures
            .iter()
            .map(|failure| {
                format!(
                    "{} failed in phase {}: {failure}",
                    self.kind.command(),
                    self.stage
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.failures_text())?;
        if self.mutated {
            write!(
                f,
                "\nFAIL-STOP: {} failed after participants were changed; nothing was rolled back. \
                 The workload must not resume: restart it",
                self.kind.command()
            )?;
            if self.kind == RunKind::Restore {
                f.write_str(" (or restore it again from its process checkpoint)")?;
            }
            if !self.fail_stopped.is_empty() {
                write!(
                    f,
                    ". Participants reporting fail-stop: {}",
                    self.fail_stopped
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )?;
            }
        } else {
            write!(f, "\nnothing was changed in any participant")?;
            if self.stage == Stage::BeginCheckpoint {
                f.write_str(
                    " (any that froze goes back to active on its own after its control timeout)",
                )?;
            }
        }
        Ok(())
    }
}

/// Whether every failure is a participant's refusal that left it unchanged.
fn only_refusals(failures: &[Failure]) -> bool {
    failures.iter().all(|failure| {
        matches!(&failure.reason, Reason::Refused { code, .. }
            if !matches!(code, RefusalCode::DriverError | RefusalCode::FailStopped))
    })
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Send `request` to every participant concurrently and [`Run::feed`] all outcomes.
    Broadcast {
        stage: Stage,
        request: Request,
        participants: Vec<NamespacePid>,
    },
    /// Publish this state file and [`Run::feed_publish`] the result.
    Publish(StateFile),
    Done(Report),
    Failed(RunError),
}

/// A capture or restore in progress.
#[derive(Debug)]
pub struct Run {
    kind: RunKind,
    participants: Vec<NamespacePid>,
    /// Stages after the current one.
    remaining: VecDeque<Stage>,
    step: Step,
    /// Restore: the saved records; capture: the frozen records once known.
    saved: BTreeMap<NamespacePid, Vec<Record>>,
    topology: Topology,
    state: Option<StateFile>,
    phases: Vec<PhaseReport>,
    mutated: bool,
    fail_stopped: BTreeSet<NamespacePid>,
}

impl Run {
    /// A capture of `participants` (their namespace PIDs); starts with `inspect`.
    pub fn capture(participants: impl IntoIterator<Item = NamespacePid>) -> Self {
        let participants: Vec<NamespacePid> = participants
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut remaining = VecDeque::from([Stage::BeginCheckpoint]);
        remaining.extend(CAPTURE_OPERATIONS.map(Stage::Execute));
        remaining.push_back(Stage::PublishState);
        let mut run = Self::new(RunKind::Capture, participants, remaining);
        if run.participants.is_empty() {
            run.fail_global(
                Stage::Inspect,
                Reason::Topology(TopologyError::NoParticipants),
            );
        } else {
            run.step = run.broadcast(Stage::Inspect);
        }
        run
    }

    /// A restore of the participants saved in `state`, whose live processes are `live`. Checks
    /// the state's topology and that `live` is exactly its participants before any request.
    pub fn restore(state: &StateFile, live: impl IntoIterator<Item = NamespacePid>) -> Self {
        let live: BTreeSet<NamespacePid> = live.into_iter().collect();
        let saved: BTreeMap<NamespacePid, Vec<Record>> = state
            .participants
            .iter()
            .map(|(pid, records)| (*pid, records.to_vec()))
            .collect();
        let mut remaining: VecDeque<Stage> = RESTORE_OPERATIONS.map(Stage::Execute).into();
        remaining.push_back(Stage::Verify);
        let mut run = Self::new(RunKind::Restore, live.iter().copied().collect(), remaining);
        let records = saved
            .iter()
            .map(|(pid, records)| (*pid, &records[..]))
            .collect();
        match validate::validate_records(&records) {
            Ok(topology) => run.topology = topology,
            Err(errors) => {
                let failures = errors
                    .into_iter()
                    .map(|error| Failure {
                        participant: error.participant(),
                        reason: Reason::Topology(error),
                    })
                    .collect();
                run.fail(Stage::CheckState, failures);
                return run;
            }
        }
        let saved_pids: BTreeSet<NamespacePid> = saved.keys().copied().collect();
        if saved_pids != live {
            run.fail_global(
                Stage::CheckState,
                Reason::ParticipantsDiffer {
                    missing: saved_pids.difference(&live).copied().collect(),
                    unexpected: live.difference(&saved_pids).copied().collect(),
                },
            );
            return run;
        }
        run.saved = saved;
        run.step = run.broadcast(Stage::Inspect);
        run
    }

    fn new(kind: RunKind, participants: Vec<NamespacePid>, remaining: VecDeque<Stage>) -> Self {
        Self {
            kind,
            participants,
            remaining,
            step: Step::Failed(RunError {
                kind,
                stage: Stage::CheckState,
                failures: Vec::new(),
                mutated: false,
                fail_stopped: Vec::new(),
            }),
            saved: BTreeMap::new(),
            topology: Topology::default(),
            state: None,
            phases: Vec::new(),
            mutated: false,
            fail_stopped: BTreeSet::new(),
        }
    }

    pub fn kind(&self) -> RunKind {
        self.kind
    }

    pub fn participants(&self) -> &[NamespacePid] {
        &self.participants
    }

    /// The validated topology (capture: of the frozen records once `begin_checkpoint` passed;
    /// restore: of the saved state).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Phases completed so far.
    pub fn phases(&self) -> &[PhaseReport] {
        &self.phases
    }

    /// What to do next.
    pub fn step(&self) -> &Step {
        &self.step
    }

    /// Whether the run is over ([`Step::Done`] or [`Step::Failed`]).
    pub fn is_finished(&self) -> bool {
        matches!(self.step, Step::Done(_) | Step::Failed(_))
    }

    fn broadcast(&self, stage: Stage) -> Step {
        Step::Broadcast {
            stage,
            request: stage.request().expect("a broadcast stage"),
            participants: self.participants.clone(),
        }
    }

    fn fail_global(&mut self, stage: Stage, reason: Reason) {
        self.fail(
            stage,
            vec![Failure {
                participant: None,
                reason,
            }],
        );
    }

    fn fail(&mut self, stage: Stage, mut failures: Vec<Failure>) {
        failures.sort_by_key(|failure| failure.participant);
        self.step = Step::Failed(RunError {
            kind: self.kind,
            stage,
            failures,
            mutated: self.mutated,
            fail_stopped: self.fail_stopped.iter().copied().collect(),
        });
    }

    /// Feeds the outcomes of the current [`Step::Broadcast`] (one per participant) and the time
    /// it took. Does nothing unless the current step is a broadcast.
    pub fn feed(
        &mut self,
        mut outcomes: BTreeMap<NamespacePid, Outcome>,
        elapsed: Duration,
    ) -> &Step {
        let Step::Broadcast { stage, .. } = &self.step else {
            return &self.step;
        };
        let stage = *stage;
        let mut failures = Vec::new();
        let mut replies = BTreeMap::new();
        for pid in self.participants.clone() {
            let Some(outcome) = outcomes.remove(&pid) else {
                failures.push(Failure {
                    participant: Some(pid),
                    reason: Reason::NoOutcome,
                });
                continue;
            };
            if stage.mutates() && self.note_mutation(pid, &outcome) {
                self.mutated = true;
            }
            match outcome {
                Ok(reply) => match self.check_reply(stage, pid, reply) {
                    Ok(accepted) => {
                        replies.insert(pid, accepted);
                    }
                    Err(reason) => failures.push(Failure {
                        participant: Some(pid),
                        reason,
                    }),
                },
                Err(error) => failures.push(Failure {
                    participant: Some(pid),
                    reason: Reason::Transport(error),
                }),
            }
        }
        failures.extend(outcomes.into_keys().map(|pid| Failure {
            participant: Some(pid),
            reason: Reason::NotAParticipant,
        }));
        if stage == Stage::BeginCheckpoint && !failures.is_empty() && only_refusals(&failures) {
            // begin_checkpoint is the first mutating request and freezing destroys nothing:
            // when the only failures are refusals, the participants that froze go back to
            // active on their own once no further request comes (the shim's frozen
            // watchdog, after its control timeout). Not fail-stop.
            self.mutated = false;
        }
        if !failures.is_empty() {
            self.fail(stage, failures);
            return &self.step;
        }
        let bytes = replies
            .values()
            .map(Accepted::bytes)
            .fold(0u64, u64::saturating_add);
        if let Err(failures) = self.complete(stage, replies) {
            self.fail(stage, failures);
            return &self.step;
        }
        self.phases.push(PhaseReport {
            name: stage.name().to_string(),
            duration: elapsed,
            bytes,
            participants: self.participants.len(),
        });
        self.advance();
        &self.step
    }

    /// Feeds the result of [`Step::Publish`]. Does nothing unless that is the current step.
    pub fn feed_publish(&mut self, result: Result<(), String>, elapsed: Duration) -> &Step {
        if !matches!(self.step, Step::Publish(_)) {
            return &self.step;
        }
        match result {
            Ok(()) => {
                self.phases.push(PhaseReport {
                    name: Stage::PublishState.name().to_string(),
                    duration: elapsed,
                    bytes: 0,
                    participants: self.participants.len(),
                });
                self.advance();
            }
            Err(error) => self.fail_global(Stage::PublishState, Reason::Publish(error)),
        }
        &self.step
    }

    /// Whether this outcome of a mutating request may have changed the participant. Refusals
    /// change nothing, except the fail-stop codes; a lost reply may have.
    fn note_mutation(&mut self, pid: NamespacePid, outcome: &Outcome) -> bool {
        match outcome {
            Ok(Reply::Refused(refused)) => match refused.code {
                RefusalCode::DriverError | RefusalCode::FailStopped => {
                    self.fail_stopped.insert(pid);
                    true
                }
                _ => false,
            },
            Ok(_) | Err(_) => true,
        }
    }

    fn check_reply(
        &self,
        stage: Stage,
        pid: NamespacePid,
        reply: Reply,
    ) -> Result<Accepted, Reason> {
        let inspection = |reply: Reply| match reply {
            Reply::Inspection(inspection) if inspection.namespace_pid != pid => {
                Err(Reason::PidMismatch {
                    answered: inspection.namespace_pid,
                })
            }
            Reply::Inspection(inspection) => Ok(inspection),
            other => Err(unexpected(&other, "inspection")),
        };
        match stage {
            Stage::Inspect | Stage::BeginCheckpoint | Stage::Verify => {
                let inspection = inspection(reply)?;
                let expected = match (self.kind, stage) {
                    (RunKind::Capture, Stage::Inspect) => None, // validation reports phases
                    (RunKind::Capture, _) => Some(Phase::Frozen),
                    (RunKind::Restore, Stage::Inspect) => Some(Phase::Released),
                    (RunKind::Restore, _) => Some(Phase::Active),
                };
                if let Some(expected) = expected
                    && inspection.phase != expected
                {
                    return Err(Reason::WrongPhase {
                        expected,
                        found: inspection.phase,
                    });
                }
                if self.kind == RunKind::Restore {
                    let saved = self.saved.get(&pid).map_or(&[][..], Vec::as_slice);
                    let differences = state::compare(saved, &inspection.records);
                    if !differences.is_empty() {
                        return Err(Reason::RecordsDiffer(differences));
                    }
                }
                Ok(Accepted::Inspection(inspection))
            }
            Stage::Execute(operation) => match reply {
                Reply::Completed(completed) if completed.operation != operation => {
                    Err(Reason::WrongOperation {
                        expected: operation,
                        found: completed.operation,
                    })
                }
                Reply::Completed(completed) => {
                    let expected = match operation {
                        Operation::SaveAllocations | Operation::LoadAllocations => {
                            self.topology.bytes_of(pid)
                        }
                        _ => 0,
                    };
                    if completed.bytes != expected {
                        return Err(Reason::WrongBytes {
                            operation,
                            expected,
                            found: completed.bytes,
                        });
                    }
                    Ok(Accepted::Completed(completed.bytes))
                }
                other => Err(unexpected(&other, "completed")),
            },
            Stage::CheckState | Stage::PublishState => Err(unexpected(&reply, "nothing")),
        }
    }

    /// Stage-wide checks once every participant answered as expected.
    fn complete(
        &mut self,
        stage: Stage,
        replies: BTreeMap<NamespacePid, Accepted>,
    ) -> Result<(), Vec<Failure>> {
        let topology_failures = |errors: Vec<TopologyError>| {
            errors
                .into_iter()
                .map(|error| Failure {
                    participant: error.participant(),
                    reason: Reason::Topology(error),
                })
                .collect::<Vec<_>>()
        };
        let inspections = || {
            replies
                .iter()
                .filter_map(|(pid, accepted)| match accepted {
                    Accepted::Inspection(inspection) => Some((*pid, inspection.clone())),
                    Accepted::Completed(_) => None,
                })
                .collect::<BTreeMap<_, _>>()
        };
        match (self.kind, stage) {
            (RunKind::Capture, Stage::Inspect) => {
                validate::validate(&inspections()).map_err(topology_failures)?;
            }
            (RunKind::Capture, Stage::BeginCheckpoint) => {
                let frozen = inspections();
                self.topology = validate::validate_in_phase(&frozen, Phase::Frozen)
                    .map_err(topology_failures)?;
                let state = state::state_from_inspections(&frozen).map_err(|error| {
                    vec![Failure {
                        participant: None,
                        reason: Reason::State(error.to_string()),
                    }]
                })?;
                self.saved = frozen
                    .into_iter()
                    .map(|(pid, inspection)| (pid, inspection.records.into_vec()))
                    .collect();
                self.state = Some(state);
            }
            _ => {}
        }
        Ok(())
    }

    fn advance(&mut self) {
        self.step = match self.remaining.pop_front() {
            Some(Stage::PublishState) => {
                Step::Publish(self.state.clone().expect("state built at begin_checkpoint"))
            }
            Some(stage) => self.broadcast(stage),
            None => Step::Done(self.report()),
        };
    }

    fn report(&self) -> Report {
        Report {
            command: self.kind.command().to_string(),
            participants: self.participants.clone(),
            phases: self.phases.clone(),
            shared_allocations: self.topology.shared_allocations.len(),
            multicast_groups: self.topology.multicast_groups.len(),
            checkpoint_dir: None,
        }
    }

    /// The state file a capture publishes (known once `begin_checkpoint` passed).
    pub fn state(&self) -> Option<&StateFile> {
        self.state.as_ref()
    }
}

/// A reply that passed its per-participant checks.
enum Accepted {
    Inspection(InspectionReply),
    Completed(u64),
}

impl Accepted {
    fn bytes(&self) -> u64 {
        match self {
            Self::Inspection(_) => 0,
            Self::Completed(bytes) => *bytes,
        }
    }
}

fn unexpected(reply: &Reply, expected: &'static str) -> Reason {
    match reply {
        Reply::Refused(refused) => Reason::Refused {
            code: refused.code,
            message: refused.message.as_str().to_string(),
        },
        other => Reason::UnexpectedReply {
            expected,
            found: other.kind(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use cuinterpose_protocol::{BoundedString, CompletedReply, RefusedReply};

    type Fakes = BTreeMap<NamespacePid, FakeParticipant>;

    /// Replaces one participant's outcome in one stage.
    type Tamper<'a> = &'a mut dyn FnMut(Stage, NamespacePid, Outcome) -> Outcome;

    /// Runs `run` against `fakes` until it finishes; `tamper` may replace any outcome. Returns
    /// the stages broadcast, in order (`publish_state` included).
    fn drive(
        run: &mut Run,
        fakes: &mut Fakes,
        tamper: Tamper<'_>,
        publish: Result<(), String>,
    ) -> Vec<Stage> {
        let mut stages = Vec::new();
        loop {
            match run.step().clone() {
                Step::Broadcast {
                    stage,
                    request,
                    participants,
                } => {
                    assert_eq!(participants, run.participants());
                    assert_eq!(Some(&request), stage.request().as_ref());
                    stages.push(stage);
                    let outcomes = participants
                        .iter()
                        .map(|pid| {
                            let reply = fakes.get_mut(pid).expect("fake").handle(&request);
                            (*pid, tamper(stage, *pid, Ok(reply)))
                        })
                        .collect();
                    run.feed(outcomes, Duration::from_millis(2));
                }
                Step::Publish(_) => {
                    stages.push(Stage::PublishState);
                    run.feed_publish(publish.clone(), Duration::from_millis(1));
                }
                Step::Done(_) | Step::Failed(_) => return stages,
            }
        }
    }

    fn untouched() -> impl FnMut(Stage, NamespacePid, Outcome) -> Outcome {
        |_, _, outcome| outcome
    }

    fn capture_stages() -> Vec<Stage> {
        let mut stages = vec![Stage::Inspect, Stage::BeginCheckpoint];
        stages.extend(CAPTURE_OPERATIONS.map(Stage::Execute));
        stages.push(Stage::PublishState);
        stages
    }

    fn restore_stages() -> Vec<Stage> {
        let mut stages = vec![Stage::Inspect];
        stages.extend(RESTORE_OPERATIONS.map(Stage::Execute));
        stages.push(Stage::Verify);
        stages
    }

    fn refused(code: RefusalCode, message: &str) -> Outcome {
        Ok(RefusedReply {
            code,
            message: BoundedString::truncating(message),
        }
        .into())
    }

    /// The run failed in `stage`, naming `participant` (None: a global failure) with a reason
    /// whose text contains `reason`; `mutated` as given. Returns the error.
    fn check_failed(
        run: &Run,
        stage: Stage,
        participant: Option<u32>,
        reason: &str,
        mutated: bool,
    ) -> RunError {
        let Step::Failed(error) = run.step() else {
            panic!("expected a failure, got {:?}", run.step());
        };
        assert_eq!(error.stage, stage, "{error}");
        assert_eq!(error.mutated, mutated, "{error}");
        assert_eq!(error.exit_code(), if mutated { 2 } else { 1 });
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
            text.contains(&format!("failed in phase {stage}: {scope}")),
            "{text}"
        );
        assert_eq!(text.contains("FAIL-STOP"), mutated, "{text}");
        error.clone()
    }

    fn captured() -> (Fakes, StateFile) {
        let topology = shared_topology(101);
        let mut fakes = fake_participants(&topology);
        let mut run = Run::capture(fakes.keys().copied());
        drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        assert!(matches!(run.step(), Step::Done(_)), "{:?}", run.step());
        (fakes, state_file(&topology))
    }

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
        assert_eq!(stages, [Stage::Inspect, Stage::BeginCheckpoint]);
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
                .contains("any that froze goes back to active on its own"),
            "{error}"
        );
        // A refusal that means destructive work failed, or a participant that did not answer,
        // stays fail-stop.
        for outcome in [
            refused(RefusalCode::DriverError, "cuCtxSynchronize failed"),
            Err("the peer closed the connection while receiving the reply".to_owned()),
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
            let Step::Failed(error) = run.step() else {
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
        let mut published = None;
        let mut stages = Vec::new();
        loop {
            match run.step().clone() {
                Step::Broadcast {
                    stage,
                    request,
                    participants,
                } => {
                    stages.push(stage);
                    let outcomes = participants
                        .iter()
                        .map(|pid| (*pid, Ok(fakes.get_mut(pid).expect("fake").handle(&request))))
                        .collect();
                    run.feed(outcomes, Duration::from_millis(3));
                }
                Step::Publish(state) => {
                    stages.push(Stage::PublishState);
                    published = Some(state);
                    run.feed_publish(Ok(()), Duration::from_millis(1));
                }
                Step::Done(_) | Step::Failed(_) => break,
            }
        }
        assert_eq!(stages, capture_stages());
        assert_eq!(published, Some(state_file(&topology)));
        assert!(fakes.values().all(|fake| fake.phase == Phase::Released));
        let Step::Done(report) = run.step() else {
            panic!("{:?}", run.step());
        };
        assert_eq!(report.command, "prepare");
        let names: Vec<&str> = report
            .phases
            .iter()
            .map(|phase| phase.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "inspect",
                "begin_checkpoint",
                "prepare_multicast",
                "save_allocations",
                "prepare_unicast",
                "publish_state"
            ]
        );
        assert_eq!(report.phases[3].bytes, SIZE);
        assert_eq!(report.bytes(), SIZE);
        assert_eq!(report.duration(), Duration::from_millis(16));
        assert_eq!((report.shared_allocations, report.multicast_groups), (1, 1));
        assert_eq!(run.topology().bytes_of(pid(101)), SIZE);
    }

    #[test]
    fn restore_runs_every_phase_and_verifies() {
        let (mut fakes, state) = captured();
        let mut run = Run::restore(&state, fakes.keys().copied());
        let stages = drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        assert_eq!(stages, restore_stages());
        let Step::Done(report) = run.step() else {
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
        let stages = drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        assert_eq!(stages, [Stage::Inspect]);
        check_failed(
            &run,
            Stage::Inspect,
            Some(102),
            "refers to no allocation record",
            false,
        );
        assert!(fakes.values().all(|fake| fake.phase == Phase::Active));

        let mut fakes = fake_participants(&shared_topology(101));
        fakes.get_mut(&pid(103)).expect("103").raw_imports = 1;
        let mut run = Run::capture(fakes.keys().copied());
        drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        check_failed(&run, Stage::Inspect, Some(103), "1 live imports", false);

        let run = Run::capture([]);
        check_failed(&run, Stage::Inspect, None, "no participants", false);
    }

    #[test]
    fn records_that_change_at_begin_checkpoint_are_validated_again() {
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| match (stage, outcome)
        {
            (Stage::BeginCheckpoint, Ok(Reply::Inspection(mut inspection))) if pid.get() == 103 => {
                inspection.records = Vec::new().try_into().expect("bounded");
                Ok(inspection.into())
            }
            (_, outcome) => outcome,
        };
        let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        assert_eq!(stages, [Stage::Inspect, Stage::BeginCheckpoint]);
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
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| {
            if stage == Stage::Execute(Operation::SaveAllocations) && pid.get() == 102 {
                return refused(
                    RefusalCode::DriverError,
                    "cuMemcpyDtoH failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)",
                );
            }
            outcome
        };
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
        let stages = drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        assert_eq!(stages, [Stage::Inspect]);
        check_failed(
            &run,
            Stage::Inspect,
            Some(101),
            "in phase frozen, expected phase active",
            false,
        );

        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |stage: Stage, _: NamespacePid, outcome: Outcome| {
            if stage == Stage::BeginCheckpoint {
                return refused(RefusalCode::Busy, "control queue full");
            }
            outcome
        };
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        let error = check_failed(
            &run,
            Stage::BeginCheckpoint,
            Some(101),
            "refused (busy)",
            false,
        );
        assert_eq!(error.participants(), [pid(101), pid(102), pid(103)]);

        // One refuses, the others froze: not fail-stop either (freezing destroys nothing and
        // the frozen ones go back to active on their own).
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| {
            if stage == Stage::BeginCheckpoint && pid.get() == 101 {
                return refused(RefusalCode::OutOfOrder, "begin_checkpoint in phase frozen");
            }
            outcome
        };
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        let error = check_failed(
            &run,
            Stage::BeginCheckpoint,
            Some(101),
            "refused (out_of_order)",
            false,
        );
        assert!(error.fail_stopped.is_empty());
    }

    #[test]
    fn transport_error_names_the_participant() {
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| {
            if stage == Stage::Execute(Operation::PrepareUnicast) && pid.get() == 103 {
                return Err("socket /tmp/x/cuinterpose-103.sock: the peer closed the connection while receiving the reply".into());
            }
            outcome
        };
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        check_failed(
            &run,
            Stage::Execute(Operation::PrepareUnicast),
            Some(103),
            "no reply: socket /tmp/x/cuinterpose-103.sock: the peer closed",
            true,
        );

        // A lost inspect changes nothing.
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let mut tamper = |_: Stage, pid: NamespacePid, outcome: Outcome| {
            if pid.get() == 101 {
                return Err("timed out".into());
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
        let completed =
            |operation, bytes| -> Outcome { Ok(CompletedReply { operation, bytes }.into()) };
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
            let mut fakes = fake_participants(&shared_topology(101));
            let mut run = Run::capture(fakes.keys().copied());
            let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| {
                if stage == target && pid.get() == 102 {
                    return replacement.clone();
                }
                outcome
            };
            let stages = drive(&mut run, &mut fakes, &mut tamper, Ok(()));
            assert_eq!(stages.last(), Some(&target));
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
        let mut fakes = fake_participants(&shared_topology(101));
        let mut run = Run::capture(fakes.keys().copied());
        let stages = drive(
            &mut run,
            &mut fakes,
            &mut untouched(),
            Err("disk full".into()),
        );
        assert_eq!(stages, capture_stages());
        check_failed(
            &run,
            Stage::PublishState,
            None,
            "coordinator: cannot publish the state: disk full",
            true,
        );
    }

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
        let stages = drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        assert_eq!(stages, [Stage::Inspect]);
        check_failed(
            &run,
            Stage::Inspect,
            Some(102),
            "records differ from the checkpoint (1 differences): unexpected mapping",
            false,
        );
        assert!(fakes.values().all(|fake| fake.phase == Phase::Released));

        let (mut fakes, state) = captured();
        fakes.get_mut(&pid(103)).expect("103").phase = Phase::Active;
        let mut run = Run::restore(&state, fakes.keys().copied());
        drive(&mut run, &mut fakes, &mut untouched(), Ok(()));
        check_failed(
            &run,
            Stage::Inspect,
            Some(103),
            "in phase active, expected phase released",
            false,
        );
    }

    #[test]
    fn restore_verifies_the_final_records() {
        let (mut fakes, state) = captured();
        let mut run = Run::restore(&state, fakes.keys().copied());
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| match (stage, outcome)
        {
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
        let mut tamper = |stage: Stage, pid: NamespacePid, outcome: Outcome| {
            if stage == Stage::Execute(Operation::LoadAllocations) && pid.get() == 101 {
                return Ok(CompletedReply {
                    operation: Operation::LoadAllocations,
                    bytes: SIZE - 1,
                }
                .into());
            }
            outcome
        };
        drive(&mut run, &mut fakes, &mut tamper, Ok(()));
        check_failed(
            &run,
            Stage::Execute(Operation::LoadAllocations),
            Some(101),
            "moved 2097151 bytes, expected 2097152",
            true,
        );
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
}
