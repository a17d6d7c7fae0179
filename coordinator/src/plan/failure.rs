//! How a run fails: the [`Reason`] a participant (or the run) failed a stage, the
//! [`Failure`] that scopes it, and the [`RunError`] that sums up a failed run and whether it
//! is fail-stop.

use std::fmt;

use cuinterpose_protocol::transport::TransportError;
use cuinterpose_protocol::{DeviceUuid, NamespacePid, Operation, Phase, RefusalCode};

use super::stage::{RunKind, Stage};
use crate::state::{ChecksumDifference, RecordDifference};
use crate::validate::TopologyError;

/// Exit status: refused or invalid, nothing changed.
pub const EXIT_REFUSED: u8 = 1;
/// Exit status: failed after mutation (fail-stop).
pub const EXIT_FAIL_STOP: u8 = 2;
/// Exit status: aborted after mutation; the workload was put back in place and resumed.
pub const EXIT_ABORTED: u8 = 3;
/// Exit status: usage error (`EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

/// What went wrong in an exchange that gave no reply, for the plan to decide by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Not answered within the exchange's timeout.
    Timeout,
    /// The transport failed otherwise: refused, closed, malformed, oversized, ….
    Transport,
    /// The session knows no endpoint for the participant.
    NoEndpoint,
    /// The session could not start the exchange's thread.
    NoThread,
    /// The exchange's thread panicked.
    Panicked,
    /// The participant's native restore failed, so its load was never sent.
    NativeRestore,
    /// The storage carrier's folder could not be opened for the participant.
    NoFolder,
}

/// Why an exchange with a participant gave no reply, as the plan must know it: whether the
/// request can have reached the participant (and so changed it), what kind of failure it was,
/// and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExchangeError {
    /// Nothing reached the participant (no socket, nothing listening, a bad endpoint or
    /// timeout): it is as it was.
    Unsent { kind: ExchangeKind, message: String },
    /// The request may have reached the participant: sent, then no valid reply.
    Lost { kind: ExchangeKind, message: String },
}

impl ExchangeError {
    /// Whether the participant may have acted on the request.
    pub fn may_have_arrived(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// Sent, and not answered in time: the participant is alive (or stopped) and busy, not
    /// gone.
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            Self::Lost {
                kind: ExchangeKind::Timeout,
                ..
            }
        )
    }

    pub fn kind(&self) -> ExchangeKind {
        match self {
            Self::Unsent { kind, .. } | Self::Lost { kind, .. } => *kind,
        }
    }
}

impl From<&TransportError> for ExchangeError {
    fn from(error: &TransportError) -> Self {
        let kind = match error {
            TransportError::Timeout { .. } => ExchangeKind::Timeout,
            _ => ExchangeKind::Transport,
        };
        let message = error.to_string();
        if error.may_have_arrived() {
            Self::Lost { kind, message }
        } else {
            Self::Unsent { kind, message }
        }
    }
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsent { message, .. } => write!(f, "{message} (nothing was sent)"),
            Self::Lost { message, .. } => f.write_str(message),
        }
    }
}

/// Why a participant (or the whole run) failed a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A topology rule (its message names the participant itself).
    Topology(TopologyError),
    /// No reply: connect, send or receive failed or timed out.
    Transport(ExchangeError),
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
    /// A save's checksums do not cover the carried bytes, or a load's differ from the saved
    /// ones.
    ChecksumsDiffer {
        operation: Operation,
        difference: ChecksumDifference,
    },
    /// The participant's devices (ordinal, GPU) are not the saved ones (after a remap: the
    /// GPUs they were paired with).
    DevicesDiffer {
        expected: Vec<(i32, DeviceUuid)>,
        found: Vec<(i32, DeviceUuid)>,
    },
    /// The state file could not be published.
    Publish(String),
    /// The state file cannot describe these participants.
    State(String),
    /// The rollback of a capture stopped before `prepare_unicast` failed too, in `stage`.
    RollingBack {
        stage: Stage,
        reason: Box<Reason>,
    },
    /// A restore waited for participants that did not answer its step in time, and the wait
    /// failed: the step leads to `phase`, which not every participant reached.
    Settling {
        phase: Phase,
        reason: Box<Reason>,
    },
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
            Self::ChecksumsDiffer {
                operation: Operation::LoadAllocations,
                difference,
            } => write!(
                f,
                "the loaded bytes do not match the checkpoint: {difference}; they were not put \
                 back in service"
            ),
            Self::ChecksumsDiffer {
                operation,
                difference,
            } => write!(f, "{operation} reported unusable checksums: {difference}"),
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
            Self::DevicesDiffer { expected, found } => {
                let list = |devices: &[(i32, DeviceUuid)]| {
                    devices
                        .iter()
                        .map(|(ordinal, uuid)| {
                            format!("{ordinal}: {}", crate::remap::uuid_text(uuid))
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                write!(
                    f,
                    "sees devices [{}], expected [{}]",
                    list(found),
                    list(expected)
                )
            }
            Self::Publish(error) => write!(f, "cannot publish the state: {error}"),
            Self::State(error) => write!(f, "{error}"),
            Self::RollingBack { stage, reason } => {
                let doing = match stage {
                    Stage::RollBack | Stage::Verify => "rolling back",
                    _ => "waiting for every participant to be released",
                };
                write!(f, "then, {doing} ({stage}): {reason}")
            }
            Self::Settling { phase, reason } => write!(
                f,
                "then, waiting for every participant to reach phase {phase} (settle): {reason}"
            ),
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

impl Failure {
    /// Its request was sent and not answered in time: the participant is alive (or stopped)
    /// and busy, so it may still act on it.
    pub fn timed_out(&self) -> bool {
        matches!(&self.reason, Reason::Transport(error) if error.timed_out())
    }
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
    /// Participants that acknowledged the coordinator's `fail_stop` (their CUDA calls now
    /// fail instead of waiting at the gate); filled in by whoever drives the run.
    pub told: Vec<NamespacePid>,
    /// The capture stopped before `prepare_unicast` and every participant was put back
    /// (`roll_back`) and verified: the workload resumes.
    pub rolled_back: bool,
    /// Rolled back, except these: they timed out in `begin_checkpoint` and again on their
    /// `roll_back`. Frozen and busy (draining a long call, or stopped), each applies the
    /// `roll_back` queued behind its work, or else thaws on its own after its quiet window;
    /// they were not verified.
    pub unconfirmed: Vec<NamespacePid>,
    /// A participant did not answer `prepare_unicast` in time, and the run waited until every
    /// participant was released (each holds its host carrier): the caller puts the workload
    /// back from the state in memory, as after a failed publication.
    pub settled: bool,
}

impl RunError {
    /// Whether the caller puts the workload back from the state in memory (every participant
    /// released, holding its carrier) rather than declaring a fail-stop.
    pub fn resumes_from_state(&self) -> bool {
        self.settled || self.stage.resumes_from_state()
    }

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

    /// 1: refused or invalid, nothing changed; 2: failed after mutation; 3: failed after
    /// mutation, rolled back, the workload resumes.
    pub fn exit_code(&self) -> u8 {
        match (self.mutated, self.rolled_back) {
            (false, _) => EXIT_REFUSED,
            (true, false) => EXIT_FAIL_STOP,
            (true, true) => EXIT_ABORTED,
        }
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
                    self.stage.name_in(self.kind)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.failures_text())?;
        if self.rolled_back {
            if self.mutated {
                if self.unconfirmed.is_empty() {
                    write!(
                        f,
                        "\nABORTED: every participant was rolled back to where it was before \
                         the checkpoint and verified; the workload resumes (nothing was \
                         checkpointed)"
                    )?;
                } else {
                    write!(
                        f,
                        "\nABORTED: the workload resumes (nothing was checkpointed). Every \
                         participant was rolled back and verified except {}, which did not \
                         answer begin_checkpoint or roll_back in time: frozen and busy, it \
                         rolls back when it gets to the request, or on its own after its \
                         quiet window",
                        self.unconfirmed
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )?;
                }
            } else {
                write!(
                    f,
                    "\nnothing was changed in any participant (those that froze were put back \
                     at once)"
                )?;
            }
            return Ok(());
        }
        if self.settled {
            return write!(
                f,
                "\nevery participant then reached phase released, each holding its host \
                 carrier: the workload is put back from the state in memory"
            );
        }
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
            let list = |pids: &[NamespacePid]| {
                pids.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if !self.fail_stopped.is_empty() {
                write!(
                    f,
                    ". Participants reporting fail-stop: {}",
                    list(&self.fail_stopped)
                )?;
            }
            if !self.told.is_empty() {
                write!(
                    f,
                    ". Told to fail-stop (their CUDA calls now fail instead of waiting): {}",
                    list(&self.told)
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
pub(super) fn only_refusals(failures: &[Failure]) -> bool {
    failures.iter().all(|failure| {
        matches!(&failure.reason, Reason::Refused { code, .. }
            if !matches!(code, RefusalCode::DriverError | RefusalCode::FailStopped))
    })
}

/// Topology errors as failures, each scoped to the participant it names.
pub(super) fn topology_failures(errors: Vec<TopologyError>) -> Vec<Failure> {
    errors
        .into_iter()
        .map(|error| Failure {
            participant: error.participant(),
            reason: Reason::Topology(error),
        })
        .collect()
}
