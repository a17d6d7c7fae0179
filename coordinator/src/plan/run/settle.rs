//! A participant that did not answer a step in time is alive (or stopped) and busy, and may
//! still do the step it read. Failing the run there would strand the others; letting them
//! roll back on their own while it may still act would split the sharing. So the run settles
//! instead:
//!
//! 1. every participant is asked its phase with `progress` (answered without waiting for the
//!    control worker; it is also the coordinator's sign of life, so nobody rolls back on its
//!    own meanwhile), round after round, until the silent ones answer;
//! 2. the step goes again to any still in the phase it starts from (its request was lost, or
//!    is queued behind its work: then it is refused as out of order, and the next round reads
//!    the phase);
//! 3. a restore's step is confirmed by an inspection of those that did not answer it: their
//!    progress reads the phase the step leads to as soon as it starts, while the inspection
//!    runs in their control worker only after the step (time out, and the rounds go on);
//! 4. once every participant is through the step:
//!    - a capture's `prepare_unicast`: every participant is released, each holding its host
//!      carrier, and the run fails with [`RunError::settled`]: the caller puts the workload
//!      back from the state in memory, as after a failed publication (the restore's first
//!      inspect waits, in each control worker, behind any step still running);
//!    - a restore's operation: the step is done, and the restore goes on.
//!
//! Silent past the limit, failed, gone, or in another phase: fail-stop, as before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cuinterpose_protocol::{NamespacePid, Operation, RefusalCode, Reply};

use super::checks::unexpected;
use super::{Failure, Instruction, Outcome, Reason, Run};
use crate::plan::stage::{RunKind, Stage};
use crate::report::PhaseReport;

/// How long a run settles by default: the shims' default quiet window, after which a released
/// participant that heard nothing would roll back on its own.
pub(super) fn default_limit() -> Duration {
    cuinterpose_protocol::transport::Timeouts::default().quiet_window()
}

/// Where settling stands.
#[derive(Debug)]
pub(super) struct Settling {
    /// The step waited for.
    operation: Operation,
    waited: Duration,
    /// Those found still in the phase the step starts from: it goes to them again.
    resend: BTreeSet<NamespacePid>,
    /// A restore's: the step as far as it went (its report, once every participant is
    /// through), and its timeouts (the run fails with them if the wait fails).
    step: PhaseReport,
    timeouts: Vec<Failure>,
    /// A restore's: those that did not answer the step. Their progress reads the phase the
    /// step leads to as soon as it starts; an inspection, which their control worker runs
    /// only after the step, confirms it is done before the next step needs it.
    unsure: BTreeSet<NamespacePid>,
}

impl Settling {
    pub(super) fn resend(&self) -> impl Iterator<Item = NamespacePid> + '_ {
        self.resend.iter().copied()
    }
}

impl Run {
    /// How long settling may wait for a silent participant (the session sets its quiet window).
    pub fn set_settle_limit(&mut self, limit: Duration) {
        self.settle_limit = limit;
    }

    /// Whether a failed step settles instead of failing: a capture's `prepare_unicast` or a
    /// restore's operation, every failure a participant that did not answer in time, nobody
    /// fail-stopped.
    pub(super) fn may_settle(&self, stage: Stage, failures: &[Failure]) -> bool {
        let step = match (self.kind, stage) {
            (RunKind::Capture, Stage::Execute(Operation::PrepareUnicast)) => self.state.is_some(),
            (RunKind::Restore, Stage::Execute(_)) => true,
            _ => false,
        };
        step && self.fail_stopped.is_empty() && failures.iter().all(Failure::timed_out)
    }

    /// `step` is how far the failed step went (its duration, the bytes of those that answered).
    pub(super) fn start_settling(
        &mut self,
        stage: Stage,
        failures: Vec<Failure>,
        step: PhaseReport,
    ) {
        let Stage::Execute(operation) = stage else {
            unreachable!("only operations settle")
        };
        let mut settling = Settling {
            operation,
            waited: Duration::ZERO,
            resend: BTreeSet::new(),
            step,
            timeouts: Vec::new(),
            unsure: BTreeSet::new(),
        };
        if self.kind == RunKind::Capture {
            self.settling = Some(settling);
            self.undo(stage, failures, Stage::Settle);
        } else {
            settling.unsure = failures.iter().filter_map(|f| f.participant).collect();
            settling.timeouts = failures;
            self.settling = Some(settling);
            self.step = self.broadcast(Stage::Settle);
        }
    }

    /// Feeds a settle round, a confirming inspection, or the step sent again.
    pub(super) fn feed_settling(
        &mut self,
        stage: Stage,
        addressed: &[NamespacePid],
        mut outcomes: BTreeMap<NamespacePid, Outcome>,
        elapsed: Duration,
    ) {
        let (operation, waited) = {
            let settling = self.settling.as_mut().expect("settling");
            settling.waited = settling.waited.saturating_add(elapsed);
            (settling.operation, settling.waited)
        };
        let (from, to) = (operation.from_phase(), operation.to_phase());
        let mut failures = Vec::new();
        let mut waiting = Vec::new();
        let mut behind = BTreeSet::new();
        let mut through = BTreeSet::new();
        for &pid in addressed {
            let failure = |reason| Failure {
                participant: Some(pid),
                reason,
            };
            let Some(outcome) = outcomes.remove(&pid) else {
                failures.push(failure(Reason::NoOutcome));
                continue;
            };
            if stage.mutates() && self.note_mutation(pid, &outcome) {
                self.mutated = true;
            }
            let phase = match (stage, outcome) {
                (_, Err(error)) => {
                    let found = failure(Reason::Transport(error));
                    if found.timed_out() {
                        waiting.push(found);
                    } else {
                        failures.push(found);
                    }
                    continue;
                }
                (Stage::Settle, Ok(Reply::Progress(p))) => (p.namespace_pid, p.phase),
                (Stage::Settle, Ok(other)) => {
                    failures.push(failure(unexpected(&other, "progress")));
                    continue;
                }
                (Stage::Confirm, Ok(Reply::Inspection(i))) => (i.namespace_pid, i.phase),
                (Stage::Confirm, Ok(other)) => {
                    failures.push(failure(unexpected(&other, "inspection")));
                    continue;
                }
                (_, Ok(reply)) => {
                    match self.check_reply(stage, pid, reply) {
                        // Done, and said so: no need to confirm it.
                        Ok(_) => {
                            through.insert(pid);
                        }
                        // Its first request got there first: the next round reads its phase.
                        Err(Reason::Refused {
                            code: RefusalCode::OutOfOrder,
                            ..
                        }) => {}
                        Err(reason) => failures.push(failure(reason)),
                    }
                    continue;
                }
            };
            match phase {
                (answered, _) if answered != pid => {
                    failures.push(failure(Reason::PidMismatch { answered }))
                }
                (_, phase) if phase == to => {
                    // A confirming inspection ran behind the step in the control worker.
                    if stage == Stage::Confirm {
                        through.insert(pid);
                    }
                }
                (_, phase) if phase == from => {
                    behind.insert(pid);
                }
                (_, found) => failures.push(failure(Reason::WrongPhase {
                    expected: to,
                    found,
                })),
            }
        }
        failures.extend(outcomes.into_keys().map(|pid| Failure {
            participant: Some(pid),
            reason: Reason::NotAParticipant,
        }));
        if !failures.is_empty() || (!waiting.is_empty() && waited >= self.settle_limit) {
            failures.extend(waiting);
            self.settle_failed(stage, failures);
            return;
        }
        let settling = self.settling.as_mut().expect("settling");
        settling.unsure.retain(|pid| !through.contains(pid));
        let next = if !waiting.is_empty() || matches!(stage, Stage::Execute(_)) {
            // Wait, or read the phases again after the step went again.
            Stage::Settle
        } else if !behind.is_empty() {
            settling.resend = behind;
            Stage::Execute(operation)
        } else if !settling.unsure.is_empty() {
            Stage::Confirm
        } else {
            self.settled(waited);
            return;
        };
        self.step = self.broadcast(next);
    }

    /// Who a confirming inspection goes to.
    pub(super) fn unsure(&self) -> impl Iterator<Item = NamespacePid> + '_ {
        self.settling.iter().flat_map(|s| s.unsure.iter().copied())
    }

    /// The wait failed: a capture fails in `prepare_unicast` with its rollback's failures
    /// added ([`Run::stop`]); a restore fails in its step, the step's timeouts first.
    fn settle_failed(&mut self, stage: Stage, failures: Vec<Failure>) {
        let settling = self.settling.take().expect("settling");
        if self.kind == RunKind::Capture {
            self.stop(stage, failures);
            return;
        }
        let phase = settling.operation.to_phase();
        let mut all = settling.timeouts;
        all.extend(failures.into_iter().map(|failure| Failure {
            participant: failure.participant,
            reason: Reason::Settling {
                phase,
                reason: Box::new(failure.reason),
            },
        }));
        self.mutated = true;
        self.fail(Stage::Execute(settling.operation), all);
    }

    /// Every participant is through the step. A restore goes on; a capture (everyone
    /// released) fails, and the caller puts it back.
    fn settled(&mut self, waited: Duration) {
        let settling = self.settling.take().expect("settling");
        let settle = PhaseReport {
            name: Stage::Settle.name().to_string(),
            duration: waited,
            bytes: 0,
            participants: self.participants.len(),
        };
        if self.kind == RunKind::Restore {
            let to = settling.operation.to_phase();
            for pid in &self.participants {
                self.at.insert(*pid, to);
            }
            self.phases.extend([settling.step, settle]);
            self.advance();
            return;
        }
        self.phases.push(settle);
        let mut error = self.stopped.take().expect("settling keeps the failure");
        error.mutated = true;
        error.settled = true;
        error.fail_stopped = self.fail_stopped.iter().copied().collect();
        self.step = Instruction::Failed(error);
    }
}
