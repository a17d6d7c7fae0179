//! The run itself: the [`Step`] to take next, and the [`Run`] that checks every outcome fed
//! back against what its stage expects, then advances, publishes, finishes or fails.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use cuinterpose_protocol::{
    CAPTURE_OPERATIONS, InspectionReply, NamespacePid, Operation, Phase, RESTORE_OPERATIONS,
    Record, RefusalCode, Reply, Request, StateFile,
};

use super::failure::{Failure, Reason, RunError, only_refusals, topology_failures};
use super::stage::{RunKind, Stage};
use crate::report::{PhaseReport, Report};
use crate::state;
use crate::validate::{self, Topology, TopologyError};

/// One participant's exchange: its reply, or why there is none (a transport error).
pub type Outcome = Result<Reply, String>;

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
    /// The failure a rollback is undoing (capture stopped before `prepare_unicast`).
    stopped: Option<RunError>,
    /// Restore: each participant's phase, from its inspection and the steps since. A restore
    /// interrupted earlier (its coordinator killed, a reply lost) picks up where each
    /// participant stands: every operation goes to those still in the phase it starts from.
    at: BTreeMap<NamespacePid, Phase>,
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
        Self::against_state(RunKind::Restore, state, live)
    }

    /// Restore's checks alone, read-only: the state's topology, the participant set, and one
    /// inspect whose records must equal the saved ones (phase released). `restore --dir` runs
    /// it before the native restore, so a state that does not describe these processes is
    /// refused while they are still checkpointed and nothing has been changed.
    pub fn check(state: &StateFile, live: impl IntoIterator<Item = NamespacePid>) -> Self {
        Self::against_state(RunKind::Check, state, live)
    }

    fn against_state(
        kind: RunKind,
        state: &StateFile,
        live: impl IntoIterator<Item = NamespacePid>,
    ) -> Self {
        let live: BTreeSet<NamespacePid> = live.into_iter().collect();
        let saved: BTreeMap<NamespacePid, Vec<Record>> = state
            .participants
            .iter()
            .map(|(pid, records)| (*pid, records.to_vec()))
            .collect();
        let remaining: VecDeque<Stage> = match kind {
            RunKind::Check => VecDeque::new(),
            _ => RESTORE_OPERATIONS
                .map(Stage::Execute)
                .into_iter()
                .chain([Stage::Verify])
                .collect(),
        };
        let mut run = Self::new(kind, live.iter().copied().collect(), remaining);
        let records = saved
            .iter()
            .map(|(pid, records)| (*pid, &records[..]))
            .collect();
        match validate::validate_records(&records) {
            Ok(topology) => run.topology = topology,
            Err(errors) => {
                run.fail(Stage::CheckState, topology_failures(errors));
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
                told: Vec::new(),
                rolled_back: false,
            }),
            saved: BTreeMap::new(),
            topology: Topology::default(),
            state: None,
            phases: Vec::new(),
            mutated: false,
            fail_stopped: BTreeSet::new(),
            stopped: None,
            at: BTreeMap::new(),
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

    /// Who must be told that the coordinator declared a fail-stop: every participant, once the
    /// run failed after changing them (nothing will restore them; unless told, their
    /// application threads wait at the gate for good). `None` while the run goes on, after
    /// success, after a failure that changed nothing, and after a failed publication, which
    /// the caller puts back from the state in memory ([`Run::state`]).
    pub fn fail_stop_targets(&self) -> Option<&[NamespacePid]> {
        match &self.step {
            Step::Failed(error)
                if error.mutated && !error.rolled_back && error.stage != Stage::PublishState =>
            {
                Some(&self.participants)
            }
            _ => None,
        }
    }

    /// Whether the run is over ([`Step::Done`] or [`Step::Failed`]).
    pub fn is_finished(&self) -> bool {
        matches!(self.step, Step::Done(_) | Step::Failed(_))
    }

    fn broadcast(&self, stage: Stage) -> Step {
        Step::Broadcast {
            stage,
            request: stage.request().expect("a broadcast stage"),
            participants: self.addressees(stage),
        }
    }

    /// Who `stage` goes to: everyone, except that a restore's operation goes to those in the
    /// phase it starts from (the others did it before the restore was interrupted).
    fn addressees(&self, stage: Stage) -> Vec<NamespacePid> {
        match (self.kind, stage) {
            (RunKind::Restore, Stage::Execute(operation)) => self
                .participants
                .iter()
                .copied()
                .filter(|pid| self.at.get(pid) == Some(&operation.from_phase()))
                .collect(),
            _ => self.participants.clone(),
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
            told: Vec::new(),
            rolled_back: false,
        });
    }

    /// `stage` failed: a capture stopped before `prepare_unicast` with nobody fail-stopped is
    /// rolled back (`roll_back`, then a verifying inspect); anything else fails the run. A
    /// failed rollback fails it in the stage that stopped it, its own failures added.
    fn stop(&mut self, stage: Stage, failures: Vec<Failure>) {
        if let Some(mut original) = self.stopped.take() {
            original
                .failures
                .extend(failures.into_iter().map(|failure| Failure {
                    participant: failure.participant,
                    reason: Reason::RollingBack {
                        stage,
                        reason: Box::new(failure.reason),
                    },
                }));
            original.failures.sort_by_key(|failure| failure.participant);
            original.mutated = true;
            original.fail_stopped = self.fail_stopped.iter().copied().collect();
            self.step = Step::Failed(original);
            return;
        }
        self.fail(stage, failures);
        if self.kind == RunKind::Capture && stage.rolls_back() && self.fail_stopped.is_empty() {
            let Step::Failed(error) = &self.step else {
                unreachable!("failed just now")
            };
            self.stopped = Some(error.clone());
            self.remaining = VecDeque::from([Stage::Verify]);
            self.step = self.broadcast(Stage::RollBack);
        }
    }

    /// Feeds the outcomes of the current [`Step::Broadcast`] (one per participant) and the time
    /// it took. Does nothing unless the current step is a broadcast.
    pub fn feed(
        &mut self,
        mut outcomes: BTreeMap<NamespacePid, Outcome>,
        elapsed: Duration,
    ) -> &Step {
        let Step::Broadcast {
            stage,
            participants,
            ..
        } = &self.step
        else {
            return &self.step;
        };
        let (stage, addressed) = (*stage, participants.clone());
        let mut failures = Vec::new();
        let mut replies = BTreeMap::new();
        for pid in addressed.clone() {
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
            self.stop(stage, failures);
            return &self.step;
        }
        let bytes = replies
            .values()
            .map(Accepted::bytes)
            .fold(0u64, u64::saturating_add);
        if let Err(failures) = self.complete(stage, replies) {
            self.stop(stage, failures);
            return &self.step;
        }
        if let Stage::Execute(operation) = stage {
            for pid in &addressed {
                self.at.insert(*pid, operation.to_phase());
            }
        }
        self.phases.push(PhaseReport {
            name: stage.name_in(self.kind).to_string(),
            duration: elapsed,
            bytes,
            participants: addressed.len(),
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
                    (RunKind::Capture, Stage::Verify) => Some(Phase::Active), // rolled back
                    (RunKind::Capture, _) => Some(Phase::Frozen),
                    (RunKind::Restore | RunKind::Check, Stage::Inspect) => Some(Phase::Released),
                    (RunKind::Restore | RunKind::Check, _) => Some(Phase::Active),
                };
                let resuming = matches!(self.kind, RunKind::Restore | RunKind::Check)
                    && stage == Stage::Inspect
                    && resumable(inspection.phase);
                if let Some(expected) = expected
                    && inspection.phase != expected
                    && !resuming
                {
                    return Err(Reason::WrongPhase {
                        expected,
                        found: inspection.phase,
                    });
                }
                // A rollback's verification compares with the frozen records, once known.
                if self.kind != RunKind::Capture || (stage == Stage::Verify && self.state.is_some())
                {
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
            Stage::RollBack => match reply {
                Reply::RolledBack(rolled) if rolled.namespace_pid != pid => {
                    Err(Reason::PidMismatch {
                        answered: rolled.namespace_pid,
                    })
                }
                Reply::RolledBack(_) => Ok(Accepted::Completed(0)),
                other => Err(unexpected(&other, "rolled_back")),
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
            (RunKind::Restore | RunKind::Check, Stage::Inspect) => {
                let found = inspections();
                // Phases an interrupted restore leaves: at most one step apart (each step is a
                // barrier), and not all active (that is no checkpoint at all).
                let steps: Vec<usize> = found.values().map(|i| restore_step(i.phase)).collect();
                let (first, last) = (steps.iter().min(), steps.iter().max());
                let all_active = found.values().all(|i| i.phase == Phase::Active);
                if all_active || last.zip(first).is_some_and(|(l, f)| l - f > 1) {
                    return Err(found
                        .iter()
                        .filter(|(_, i)| i.phase != Phase::Released)
                        .map(|(pid, i)| Failure {
                            participant: Some(*pid),
                            reason: Reason::WrongPhase {
                                expected: Phase::Released,
                                found: i.phase,
                            },
                        })
                        .collect());
                }
                self.at = found.into_iter().map(|(pid, i)| (pid, i.phase)).collect();
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
        // Operations every participant did before an interrupted restore are skipped.
        while let Some(&stage) = self.remaining.front() {
            if stage.request().is_some() && self.addressees(stage).is_empty() {
                self.remaining.pop_front();
            } else {
                break;
            }
        }
        self.step = match self.remaining.pop_front() {
            Some(Stage::PublishState) => {
                Step::Publish(self.state.clone().expect("state built at begin_checkpoint"))
            }
            Some(stage) => self.broadcast(stage),
            None => match self.stopped.take() {
                // Rolled back and verified: the run still failed, but the workload resumes.
                Some(mut error) => {
                    error.rolled_back = true;
                    Step::Failed(error)
                }
                None => Step::Done(self.report()),
            },
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
            host_pids: Default::default(),
            copies: Vec::new(),
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

/// The phases a restore may find a participant in: released, or further along an earlier
/// restore that was interrupted (each operation's starting phase, or active at its end).
fn resumable(phase: Phase) -> bool {
    phase == Phase::Active || RESTORE_OPERATIONS.iter().any(|op| op.from_phase() == phase)
}

/// How many restore operations a participant in `phase` has done (`resumable` phases only).
fn restore_step(phase: Phase) -> usize {
    RESTORE_OPERATIONS
        .iter()
        .position(|op| op.from_phase() == phase)
        .unwrap_or(RESTORE_OPERATIONS.len())
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
