//! The one loop that runs a [`Run`] to its end, through whatever carries its requests: the
//! session's sockets in the product ([`crate::session::Session::drive`]), fakes in the tests.
//! The loop decides nothing; the run does. It sends what the run asks, feeds back what came,
//! and, when the run failed after changing its participants, has them told.

use std::collections::BTreeMap;
use std::time::Duration;

use cuinterpose_protocol::{NamespacePid, Request, StateFile};

use super::failure::RunError;
use super::run::{Instruction, Outcome, Run};
use super::stage::Stage;
use crate::report::{PhaseReport, Report};

/// One broadcast a run asks for: the request of `stage` to each of `participants`.
#[derive(Clone, Copy, Debug)]
pub struct Broadcast<'a> {
    pub stage: Stage,
    pub request: &'a Request,
    pub participants: &'a [NamespacePid],
}

/// Each addressed participant's outcome of a broadcast, and how long the broadcast took.
pub type Broadcasted = (BTreeMap<NamespacePid, Outcome>, Duration);

/// What a run's requests and its state go through.
pub trait Participants {
    /// Sends `call` (a broadcast `run` asks for): every outcome, and how long it took.
    fn broadcast(&mut self, run: &Run, call: Broadcast<'_>) -> Broadcasted;

    /// Makes `state` durable: whether it is, and how long it took.
    fn publish(&mut self, state: &StateFile) -> (Result<(), String>, Duration);

    /// Tells `pids` that the run failed after changing them, for `reason` (best effort):
    /// those that acknowledged.
    fn declare_fail_stop(&mut self, pids: &[NamespacePid], reason: &str) -> Vec<NamespacePid>;

    /// A phase (`publish_state` included) begins with `participants` addressed.
    fn started(&mut self, _phase: &'static str, _participants: usize) {}

    /// A phase ended.
    fn done(&mut self, _phase: &PhaseReport) {}
}

/// Runs `run` to its end through `through`.
pub fn drive(run: &mut Run, through: &mut dyn Participants) -> Result<Report, RunError> {
    let mut reported = 0;
    // Settling is announced once, however many broadcasts it takes (its end is one phase).
    let mut was_settling = false;
    loop {
        for phase in &run.phases()[reported..] {
            through.done(phase);
        }
        reported = run.phases().len();
        match run.step().clone() {
            Instruction::Broadcast {
                stage,
                request,
                participants,
            } => {
                let settling = run.settling();
                if !settling {
                    through.started(stage.name_in(run.kind()), participants.len());
                } else if !was_settling {
                    through.started(Stage::Settle.name(), run.participants().len());
                }
                was_settling = settling;
                let call = Broadcast {
                    stage,
                    request: &request,
                    participants: &participants,
                };
                let (outcomes, elapsed) = through.broadcast(run, call);
                run.feed(outcomes, elapsed);
            }
            Instruction::Publish(state) => {
                through.started(Stage::PublishState.name(), run.participants().len());
                let (result, elapsed) = through.publish(&state);
                run.feed_publish(result, elapsed);
            }
            Instruction::Done(report) => return Ok(report),
            Instruction::Failed(mut error) => {
                if let Some(pids) = run.fail_stop_targets() {
                    let pids = pids.to_vec();
                    error.told = through.declare_fail_stop(&pids, &error.failures_text());
                }
                return Err(error);
            }
        }
    }
}
