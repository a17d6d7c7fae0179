//! The run itself: the [`Instruction`] to take next, and the [`Run`] that checks every outcome fed
//! back against what its stage expects, then advances, publishes, finishes or fails.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use cuinterpose_protocol::{
    BoundedVec, CAPTURE_OPERATIONS, CarrierChecksum, Device, MAX_DEVICES, NamespacePid, Phase,
    RESTORE_OPERATIONS, Record, RefusalCode, Reply, Request, StateFile,
};

use super::failure::{ExchangeError, Failure, Reason, RunError, only_refusals, topology_failures};
use super::stage::{Carriage, RunKind, Stage};
use crate::remap::Remap;
use crate::report::{PhaseReport, Report};
use crate::validate::{self, Topology, TopologyError};

mod checks;
mod settle;
use checks::Accepted;
use settle::Settling;

/// One participant's exchange: its reply, or why there is none.
pub type Outcome = Result<Reply, ExchangeError>;

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Instruction {
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
    step: Instruction,
    /// Restore: the saved records; capture: the frozen records once known.
    saved: BTreeMap<NamespacePid, Vec<Record>>,
    /// Each participant's devices as saved (or frozen), where it reported any.
    saved_devices: BTreeMap<NamespacePid, Vec<Device>>,
    /// Capture: the machine's GPUs, for the state file.
    machine: BoundedVec<Device, MAX_DEVICES>,
    /// Restore: where each saved GPU went (the final inspection must show it).
    remap: Remap,
    topology: Topology,
    state: Option<StateFile>,
    /// Restore: the checksums of each creator's saved bytes, which its load must report;
    /// capture: those its save reported, once known (then also in `state`).
    checksums: BTreeMap<NamespacePid, Vec<CarrierChecksum>>,
    phases: Vec<PhaseReport>,
    mutated: bool,
    fail_stopped: BTreeSet<NamespacePid>,
    /// The failure a rollback is undoing (capture stopped before `prepare_unicast`).
    stopped: Option<RunError>,
    /// Participants whose rollback is unconfirmed (see [`RunError::unconfirmed`]): left out
    /// of the verification.
    unconfirmed: BTreeSet<NamespacePid>,
    /// Restore: each participant's phase, from its inspection and the steps since. A restore
    /// interrupted earlier (its coordinator killed, a reply lost) picks up where each
    /// participant stands: every operation goes to those still in the phase it starts from.
    at: BTreeMap<NamespacePid, Phase>,
    /// Waiting for participants that did not answer a step in time to get through it
    /// ([`Stage::Settle`]): a capture's `prepare_unicast`, or a restore's operation.
    settling: Option<Settling>,
    /// How long settling may wait for a silent participant.
    settle_limit: Duration,
    /// How the copies move the bytes (a restore's: the carrier of its state).
    carriage: Carriage,
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
        remaining.extend([Stage::PublishState, Stage::Hold]);
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
        match validate::validate_state(state) {
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
        run.carriage = Carriage::of_state(state.carrier, None);
        run.checksums = state
            .checksums
            .iter()
            .map(|(pid, checksums)| (*pid, checksums.to_vec()))
            .collect();
        run.saved_devices = state
            .devices
            .participants
            .iter()
            .map(|(pid, devices)| (*pid, devices.to_vec()))
            .collect();
        run.step = run.broadcast(Stage::Inspect);
        run
    }

    /// A capture whose copies use `carriage`; a restore (whose carrier is its state's) takes
    /// only the staging window from it.
    pub fn carried(mut self, carriage: Carriage) -> Self {
        self.carriage = match self.kind {
            RunKind::Capture => carriage,
            _ => Carriage::of_state(
                self.carriage.carrier(),
                carriage.staging_bytes().or(self.carriage.staging_bytes()),
            ),
        };
        self
    }

    /// How the copies move the bytes.
    pub fn carriage(&self) -> Carriage {
        self.carriage
    }

    /// A capture that records `machine` (the GPUs the coordinator's driver lists) in its state.
    pub fn on_machine(mut self, machine: BoundedVec<Device, MAX_DEVICES>) -> Self {
        self.machine = machine;
        self
    }

    /// A restore onto other GPUs: the final inspection must show each participant's saved
    /// ordinals on the GPUs `remap` paired them with.
    pub fn remapped(mut self, remap: Remap) -> Self {
        self.remap = remap;
        self
    }

    fn new(kind: RunKind, participants: Vec<NamespacePid>, remaining: VecDeque<Stage>) -> Self {
        Self {
            kind,
            participants,
            remaining,
            step: Instruction::Failed(RunError {
                kind,
                stage: Stage::CheckState,
                failures: Vec::new(),
                mutated: false,
                fail_stopped: Vec::new(),
                told: Vec::new(),
                rolled_back: false,
                unconfirmed: Vec::new(),
                settled: false,
            }),
            saved: BTreeMap::new(),
            saved_devices: BTreeMap::new(),
            machine: BoundedVec::default(),
            remap: Remap::identity(),
            topology: Topology::default(),
            state: None,
            checksums: BTreeMap::new(),
            phases: Vec::new(),
            mutated: false,
            fail_stopped: BTreeSet::new(),
            stopped: None,
            unconfirmed: BTreeSet::new(),
            at: BTreeMap::new(),
            settling: None,
            settle_limit: settle::default_limit(),
            carriage: Carriage::Host,
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

    /// Whether the run is waiting for a participant that did not answer a step in time: its
    /// broadcasts (progress rounds, the step again, confirming inspections) are all one
    /// `settle` phase.
    pub fn settling(&self) -> bool {
        self.settling.is_some()
    }

    /// Phases completed so far.
    pub fn phases(&self) -> &[PhaseReport] {
        &self.phases
    }

    /// What to do next.
    pub fn step(&self) -> &Instruction {
        &self.step
    }

    /// Who must be told that the coordinator declared a fail-stop: every participant, once the
    /// run failed after changing them (nothing will restore them; unless told, their
    /// application threads wait at the gate for good). `None` while the run goes on, after
    /// success, after a failure that changed nothing, and after a failed publication, which
    /// the caller puts back from the state in memory ([`Run::state`]).
    pub fn fail_stop_targets(&self) -> Option<&[NamespacePid]> {
        match &self.step {
            Instruction::Failed(error)
                if error.mutated && !error.rolled_back && !error.resumes_from_state() =>
            {
                Some(&self.participants)
            }
            _ => None,
        }
    }

    /// Whether the run is over ([`Instruction::Done`] or [`Instruction::Failed`]).
    pub fn is_finished(&self) -> bool {
        matches!(self.step, Instruction::Done(_) | Instruction::Failed(_))
    }

    fn broadcast(&self, stage: Stage) -> Instruction {
        Instruction::Broadcast {
            stage,
            request: stage
                .request_with(self.carriage)
                .expect("a broadcast stage"),
            participants: self.addressees(stage),
        }
    }

    /// Who `stage` goes to: everyone, except that a restore's operation goes to those in the
    /// phase it starts from (the others did it before the restore was interrupted).
    fn addressees(&self, stage: Stage) -> Vec<NamespacePid> {
        match (self.kind, stage) {
            // Settling: the step goes again to those found still before it.
            (_, Stage::Execute(_)) if self.settling.is_some() => {
                self.settling.iter().flat_map(Settling::resend).collect()
            }
            (RunKind::Restore, Stage::Execute(operation)) => self
                .participants
                .iter()
                .copied()
                .filter(|pid| self.at.get(pid) == Some(&operation.from_phase()))
                .collect(),
            (_, Stage::Confirm) => self.unsure().collect(),
            (_, Stage::Verify) => self
                .participants
                .iter()
                .copied()
                .filter(|pid| !self.unconfirmed.contains(pid))
                .collect(),
            _ => self.participants.clone(),
        }
    }

    /// Of a `roll_back`'s failures, takes out those of participants that timed out in
    /// `begin_checkpoint` and again now: frozen and busy, not gone. The shim thaws a frozen
    /// process on its own after its quiet window, whichever order its requests reach it in,
    /// so they need not fail the rollback; they become unconfirmed. Later stages keep every
    /// timeout a failure: a process in `saved` cannot roll itself back.
    fn excuse_slow(&mut self, failures: Vec<Failure>) -> Vec<Failure> {
        let Some(stopped) = &self.stopped else {
            return failures;
        };
        if stopped.stage != Stage::BeginCheckpoint {
            return failures;
        }
        let slow_before: BTreeSet<NamespacePid> = stopped
            .failures
            .iter()
            .filter(|f| f.timed_out())
            .filter_map(|f| f.participant)
            .collect();
        let (excused, rest): (Vec<Failure>, Vec<Failure>) = failures.into_iter().partition(|f| {
            f.timed_out() && f.participant.is_some_and(|pid| slow_before.contains(&pid))
        });
        self.unconfirmed
            .extend(excused.iter().filter_map(|f| f.participant));
        rest
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
        self.step = Instruction::Failed(RunError {
            kind: self.kind,
            stage,
            failures,
            mutated: self.mutated,
            fail_stopped: self.fail_stopped.iter().copied().collect(),
            told: Vec::new(),
            rolled_back: false,
            unconfirmed: Vec::new(),
            settled: false,
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
            self.step = Instruction::Failed(original);
            return;
        }
        if self.kind == RunKind::Capture && stage.rolls_back() && self.fail_stopped.is_empty() {
            self.undo(stage, failures, Stage::RollBack);
            self.remaining = VecDeque::from([Stage::Verify]);
        } else {
            self.fail(stage, failures);
        }
    }

    /// `stage` failed, and the run goes on to put the workload back with `next`: the failure
    /// is kept for the end (a failed way back adds its own failures to it, see [`Run::stop`]).
    fn undo(&mut self, stage: Stage, failures: Vec<Failure>, next: Stage) {
        self.fail(stage, failures);
        let Instruction::Failed(error) = &self.step else {
            unreachable!("failed just now")
        };
        self.stopped = Some(error.clone());
        self.step = self.broadcast(next);
    }

    /// Feeds the outcomes of the current [`Instruction::Broadcast`] (one per participant) and the time
    /// it took. Does nothing unless the current step is a broadcast.
    pub fn feed(
        &mut self,
        mut outcomes: BTreeMap<NamespacePid, Outcome>,
        elapsed: Duration,
    ) -> &Instruction {
        let Instruction::Broadcast {
            stage,
            participants,
            ..
        } = &self.step
        else {
            return &self.step;
        };
        let (stage, addressed) = (*stage, participants.clone());
        if self.settling.is_some() {
            self.feed_settling(stage, &addressed, outcomes, elapsed);
            return &self.step;
        }
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
        if stage == Stage::RollBack {
            failures = self.excuse_slow(failures);
        }
        let bytes = replies
            .values()
            .map(Accepted::bytes)
            .fold(0u64, u64::saturating_add);
        let report = PhaseReport {
            name: stage.name_in(self.kind).to_string(),
            duration: elapsed,
            bytes,
            participants: addressed.len(),
        };
        if !failures.is_empty() {
            if self.may_settle(stage, &failures) {
                self.start_settling(stage, failures, report);
            } else {
                self.stop(stage, failures);
            }
            return &self.step;
        }
        if let Err(failures) = self.complete(stage, replies) {
            self.stop(stage, failures);
            return &self.step;
        }
        if let Stage::Execute(operation) = stage {
            for pid in &addressed {
                self.at.insert(*pid, operation.to_phase());
            }
        }
        self.phases.push(report);
        self.advance();
        &self.step
    }

    /// Feeds the result of [`Instruction::Publish`]. Does nothing unless that is the current step.
    pub fn feed_publish(&mut self, result: Result<(), String>, elapsed: Duration) -> &Instruction {
        if !matches!(self.step, Instruction::Publish(_)) {
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
            Ok(_) => true,
            // A request that never left cannot have changed anything.
            Err(error) => error.may_have_arrived(),
        }
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
                Instruction::Publish(self.state.clone().expect("state built at begin_checkpoint"))
            }
            Some(stage) => self.broadcast(stage),
            None => match self.stopped.take() {
                // Rolled back and verified: the run still failed, but the workload resumes.
                Some(mut error) => {
                    error.rolled_back = true;
                    error.unconfirmed = self.unconfirmed.iter().copied().collect();
                    Instruction::Failed(error)
                }
                None => Instruction::Done(self.report()),
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
