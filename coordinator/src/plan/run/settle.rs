//! A participant that did not answer `prepare_unicast` in time is alive (or stopped) and busy,
//! and may still do the step it read. Failing the run there would strand the others, released;
//! letting them roll back on their own while it may still release its memory would split the
//! sharing. So the run settles instead:
//!
//! 1. every participant is asked its phase with `progress` (answered without waiting for the
//!    control worker; it is also the coordinator's sign of life, so nobody rolls back on its
//!    own meanwhile), round after round, until the silent ones answer;
//! 2. `prepare_unicast` goes again to any still `saved` (its request was lost, or is queued
//!    behind its work: then it is refused as out of order, and the next round reads the phase);
//! 3. once every participant is `released`, each holding its host carrier, the run fails with
//!    [`RunError::settled`]: the caller puts the workload back from the state in memory, as
//!    after a failed publication (the restore's first inspect waits, in each control worker,
//!    behind any step still running).
//!
//! Silent past the limit, failed, gone, or in another phase: fail-stop, as before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cuinterpose_protocol::{NamespacePid, Operation, Phase, RefusalCode, Reply};

use super::checks::unexpected;
use super::{Failure, Outcome, Reason, Run, Step};
use crate::plan::stage::Stage;
use crate::report::PhaseReport;

/// How long a run settles by default: the shims' default quiet window, after which a released
/// participant that heard nothing would roll back on its own.
pub(super) fn default_limit() -> Duration {
    cuinterpose_protocol::transport::Timeouts::default().quiet_window()
}

const PREPARE_UNICAST: Stage = Stage::Execute(Operation::PrepareUnicast);

/// Where settling stands.
#[derive(Debug, Default)]
pub(super) struct Settling {
    waited: Duration,
    /// Those found still `saved`: `prepare_unicast` goes to them again.
    resend: BTreeSet<NamespacePid>,
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

    /// Whether a capture's failed `prepare_unicast` settles instead of failing: every failure
    /// a participant that did not answer in time, nobody fail-stopped.
    pub(super) fn may_settle(&self, stage: Stage, failures: &[Failure]) -> bool {
        self.kind == super::RunKind::Capture
            && stage == PREPARE_UNICAST
            && self.fail_stopped.is_empty()
            && self.state.is_some()
            && failures.iter().all(Failure::timed_out)
    }

    pub(super) fn start_settling(&mut self, stage: Stage, failures: Vec<Failure>) {
        self.settling = Some(Settling::default());
        self.undo(stage, failures, Stage::Settle);
    }

    /// Feeds a settle round, or a `prepare_unicast` sent again.
    pub(super) fn feed_settling(
        &mut self,
        stage: Stage,
        addressed: &[NamespacePid],
        mut outcomes: BTreeMap<NamespacePid, Outcome>,
        elapsed: Duration,
    ) {
        let waited = {
            let settling = self.settling.as_mut().expect("settling");
            settling.waited = settling.waited.saturating_add(elapsed);
            settling.waited
        };
        let mut failures = Vec::new();
        let mut waiting = Vec::new();
        let mut saved = BTreeSet::new();
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
            match (stage, outcome) {
                (_, Err(error)) => {
                    let found = failure(Reason::Transport(error));
                    if found.timed_out() {
                        waiting.push(found);
                    } else {
                        failures.push(found);
                    }
                }
                (Stage::Settle, Ok(Reply::Progress(p))) if p.namespace_pid != pid => {
                    failures.push(failure(Reason::PidMismatch {
                        answered: p.namespace_pid,
                    }));
                }
                (Stage::Settle, Ok(Reply::Progress(p))) => match p.phase {
                    Phase::Released => {}
                    Phase::Saved => {
                        saved.insert(pid);
                    }
                    found => failures.push(failure(Reason::WrongPhase {
                        expected: Phase::Released,
                        found,
                    })),
                },
                (Stage::Settle, Ok(other)) => {
                    failures.push(failure(unexpected(&other, "progress")))
                }
                (_, Ok(reply)) => match self.check_reply(stage, pid, reply) {
                    Ok(_) => {}
                    // Its first request got there first: the next round reads its phase.
                    Err(Reason::Refused {
                        code: RefusalCode::OutOfOrder,
                        ..
                    }) => {}
                    Err(reason) => failures.push(failure(reason)),
                },
            }
        }
        failures.extend(outcomes.into_keys().map(|pid| Failure {
            participant: Some(pid),
            reason: Reason::NotAParticipant,
        }));
        if !failures.is_empty() || (!waiting.is_empty() && waited >= self.settle_limit) {
            self.settling = None;
            failures.extend(waiting);
            self.stop(stage, failures);
            return;
        }
        if stage == Stage::Settle && waiting.is_empty() && saved.is_empty() {
            self.settled(waited);
            return;
        }
        let next = if stage == Stage::Settle && waiting.is_empty() {
            self.settling.as_mut().expect("settling").resend = saved;
            PREPARE_UNICAST
        } else {
            Stage::Settle
        };
        self.step = self.broadcast(next);
    }

    /// Every participant is released: the run fails, and the caller puts it back.
    fn settled(&mut self, waited: Duration) {
        self.settling = None;
        self.phases.push(PhaseReport {
            name: Stage::Settle.name().to_string(),
            duration: waited,
            bytes: 0,
            participants: self.participants.len(),
        });
        let mut error = self.stopped.take().expect("settling keeps the failure");
        error.mutated = true;
        error.settled = true;
        error.fail_stopped = self.fail_stopped.iter().copied().collect();
        self.step = Step::Failed(error);
    }
}
