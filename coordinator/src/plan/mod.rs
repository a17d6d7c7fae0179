//! The lifecycle as a sans-I/O state machine.
//!
//! A [`Run`] says what to do next ([`Instruction`]): send one request to every participant, publish
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
//! barrier) before the next one; a restore run after an interrupted one sends each operation
//! only to those still in its starting phase. A capture that fails before `prepare_unicast`
//! (nothing of the unicast sharing given up yet) is rolled back: `roll_back` to everyone, then
//! a verifying inspect ([`RunError::rolled_back`]). Any other failure after a mutating request
//! is fail-stop, and [`RunError::mutated`] says so.
//!
//! Layout: `stage` (run kinds and stages), `failure` (reasons, failures, the run error), `run`
//! (steps and the state machine).

use cuinterpose_protocol::{Operation, Phase};

mod drive;
mod failure;
mod run;
mod stage;
#[cfg(test)]
mod tests;

pub use drive::{Broadcast, Broadcasted, Participants, drive};
pub use failure::{
    EXIT_ABORTED, EXIT_FAIL_STOP, EXIT_REFUSED, EXIT_USAGE, ExchangeError, ExchangeKind, Failure,
    Reason, RunError,
};
pub use run::{Instruction, Outcome, Run};
pub use stage::{Carriage, DEFAULT_STAGING_BYTES, RunKind, Stage};

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
