//! What the run accepts from its participants: each reply checked against its stage (kind,
//! pid, phase, operation, byte count, records), and the stage-wide checks once all answered
//! (the topology, the frozen records, the phases an interrupted restore left).

use std::collections::BTreeMap;

use cuinterpose_protocol::{
    CarrierChecksum, InspectionReply, NamespacePid, Operation, Phase, RESTORE_OPERATIONS, Reply,
    StateFile,
};

use super::Run;
use crate::plan::failure::{Failure, Reason, topology_failures};
use crate::plan::stage::{RunKind, Stage};
use crate::remap::Remap;
use crate::state;
use crate::validate;

impl Run {
    pub(super) fn check_reply(
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
                    let differences = if self.kind == RunKind::Restore
                        && stage == Stage::Verify
                        && self.remap.moves()
                    {
                        // Restored onto other GPUs, the records name the new ones.
                        state::compare(&self.remap.records(saved), &inspection.records)
                    } else {
                        state::compare(saved, &inspection.records)
                    };
                    if !differences.is_empty() {
                        return Err(Reason::RecordsDiffer(differences));
                    }
                    self.check_devices(stage, pid, &inspection)?;
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
                    let checksums = completed.checksums.into_vec();
                    let difference = match operation {
                        // Before anything is released: the state must be able to check every
                        // carried byte.
                        Operation::SaveAllocations => {
                            state::check_coverage(&self.carried_by(pid), &checksums)
                        }
                        // The bytes back in device memory against the checkpoint's record of
                        // them, before any step lets the process use them.
                        Operation::LoadAllocations => state::compare_checksums(
                            self.checksums.get(&pid).map_or(&[][..], Vec::as_slice),
                            &checksums,
                        ),
                        _ => None,
                    };
                    if let Some(difference) = difference {
                        return Err(Reason::ChecksumsDiffer {
                            operation,
                            difference,
                        });
                    }
                    Ok(Accepted::Completed {
                        bytes: completed.bytes,
                        checksums,
                    })
                }
                other => Err(unexpected(&other, "completed")),
            },
            Stage::RollBack => match reply {
                Reply::RolledBack(rolled) if rolled.namespace_pid != pid => {
                    Err(Reason::PidMismatch {
                        answered: rolled.namespace_pid,
                    })
                }
                Reply::RolledBack(_) => Ok(Accepted::nothing()),
                other => Err(unexpected(&other, "rolled_back")),
            },
            Stage::Hold => match reply {
                Reply::Held(held) if held.namespace_pid != pid => Err(Reason::PidMismatch {
                    answered: held.namespace_pid,
                }),
                Reply::Held(_) => Ok(Accepted::nothing()),
                other => Err(unexpected(&other, "held")),
            },
            // Settle rounds are checked where they are fed (`settle.rs`).
            Stage::CheckState | Stage::PublishState | Stage::Settle | Stage::Confirm => {
                Err(unexpected(&reply, "nothing"))
            }
        }
    }

    /// The allocations `pid` created for the host carrier, by its saved (or frozen) records:
    /// id and size.
    fn carried_by(&self, pid: NamespacePid) -> Vec<(cuinterpose_protocol::AllocationId, u64)> {
        self.saved
            .get(&pid)
            .into_iter()
            .flatten()
            .filter_map(|record| match record {
                cuinterpose_protocol::Record::Allocation(a)
                    if a.host_carrier && a.allocation.creator_pid == pid =>
                {
                    Some((a.allocation.id, a.size))
                }
                _ => None,
            })
            .collect()
    }

    /// A participant's devices against the saved ones: the same until the restore's final
    /// inspection (a shim reports the devices it saw when frozen until it is active again),
    /// where each saved GPU must be the one the remap paired it with.
    fn check_devices(
        &self,
        stage: Stage,
        pid: NamespacePid,
        inspection: &InspectionReply,
    ) -> Result<(), Reason> {
        let Some(saved) = self.saved_devices.get(&pid) else {
            return Ok(());
        };
        let expected = if self.kind == RunKind::Restore && stage == Stage::Verify {
            self.remap.expected(saved)
        } else {
            Remap::identity().expected(saved)
        };
        let found: Vec<_> = inspection
            .devices
            .iter()
            .map(|d| (d.ordinal, d.uuid))
            .collect();
        if found != expected {
            return Err(Reason::DevicesDiffer { expected, found });
        }
        Ok(())
    }

    /// Stage-wide checks once every participant answered as expected.
    pub(super) fn complete(
        &mut self,
        stage: Stage,
        replies: BTreeMap<NamespacePid, Accepted>,
    ) -> Result<(), Vec<Failure>> {
        let inspections = || {
            replies
                .iter()
                .filter_map(|(pid, accepted)| match accepted {
                    Accepted::Inspection(inspection) => Some((*pid, inspection.clone())),
                    Accepted::Completed { .. } => None,
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
                let state = state::state_from_inspections(&frozen, self.machine.clone()).map_err(
                    |error| {
                        vec![Failure {
                            participant: None,
                            reason: Reason::State(error.to_string()),
                        }]
                    },
                )?;
                self.saved_devices = frozen
                    .iter()
                    .filter(|(_, inspection)| !inspection.devices.is_empty())
                    .map(|(pid, inspection)| (*pid, inspection.devices.to_vec()))
                    .collect();
                self.saved = frozen
                    .into_iter()
                    .map(|(pid, inspection)| (pid, inspection.records.into_vec()))
                    .collect();
                self.state = Some(state);
            }
            (RunKind::Capture, Stage::Execute(Operation::SaveAllocations)) => {
                self.checksums = replies
                    .into_iter()
                    .filter_map(|(pid, accepted)| match accepted {
                        Accepted::Completed { checksums, .. } if !checksums.is_empty() => {
                            Some((pid, checksums))
                        }
                        _ => None,
                    })
                    .collect();
                let sealed = self.state.take().map(|state| {
                    let checksums = self
                        .checksums
                        .iter()
                        .map(|(pid, list)| Ok((*pid, list.clone().try_into()?)))
                        .collect::<Result<BTreeMap<_, _>, cuinterpose_protocol::BoundError>>()
                        .and_then(|map| map.try_into())
                        .map(|checksums| {
                            StateFile::seal(
                                state.participants,
                                state.devices,
                                checksums,
                                self.carriage.carrier(),
                            )
                        });
                    checksums.map_err(|error| {
                        vec![Failure {
                            participant: None,
                            reason: Reason::State(format!("the saved checksums: {error}")),
                        }]
                    })
                });
                self.state = sealed.transpose()?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// A reply that passed its per-participant checks.
pub(super) enum Accepted {
    Inspection(InspectionReply),
    Completed {
        bytes: u64,
        checksums: Vec<CarrierChecksum>,
    },
}

impl Accepted {
    /// A completion that moved nothing (a rollback, a hold).
    fn nothing() -> Self {
        Self::Completed {
            bytes: 0,
            checksums: Vec::new(),
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        match self {
            Self::Inspection(_) => 0,
            Self::Completed { bytes, .. } => *bytes,
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

pub(super) fn unexpected(reply: &Reply, expected: &'static str) -> Reason {
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
