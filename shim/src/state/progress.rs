//! How far the current host-carrier copy has got, and the lifecycle phase, for `progress`
//! requests. The carrier updates the copy as chunks complete, the lifecycle the phase as each
//! step completes; the peer thread answers from here at once, without waiting for the control
//! worker (which may be in the middle of the copy asked about, or of a rollback).

use cuinterpose_protocol::{NamespacePid, Operation, Phase, ProgressReply};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
struct Progress {
    operation: Option<Operation>,
    running: bool,
    done: u64,
    total: u64,
    phase: Phase,
    /// A hold reached this process in its current capture (see [`set_held`]).
    held: bool,
    /// How long the transfers of the current step took so far (their chunks' wall time).
    copying: Duration,
}

static PROGRESS: Mutex<Progress> = Mutex::new(Progress {
    operation: None,
    running: false,
    done: 0,
    total: 0,
    phase: Phase::Active,
    held: false,
    copying: Duration::ZERO,
});

fn update(change: impl FnOnce(&mut Progress)) {
    change(&mut PROGRESS.lock().unwrap_or_else(|p| p.into_inner()));
}

/// A copy of `total` bytes for `operation` begins.
pub fn start(operation: Operation, total: u64) {
    update(|p| {
        *p = Progress {
            operation: Some(operation),
            running: true,
            done: 0,
            total,
            phase: p.phase,
            held: p.held,
            copying: p.copying,
        }
    });
}

/// `bytes` more have been copied (never past the total).
pub fn advance(bytes: u64) {
    update(|p| p.done = p.done.saturating_add(bytes).min(p.total));
}

/// The copy ended (finished or failed: `done` says how far it got).
pub fn finish() {
    update(|p| p.running = false);
}

/// The transfers of the current step took `copying` more (the carrier times its chunks alone).
pub fn add_copy_time(copying: Duration) {
    update(|p| p.copying += copying);
}

/// A lifecycle step begins: its copy time starts from zero.
pub fn reset_copy_time() {
    update(|p| p.copying = Duration::ZERO);
}

/// Nanoseconds the copies of the current step took (for its `completed` reply).
pub fn copy_ns() -> u64 {
    let p = PROGRESS.lock().unwrap_or_else(|p| p.into_inner());
    u64::try_from(p.copying.as_nanos()).unwrap_or(u64::MAX)
}

/// The lifecycle reached `phase` (the registry's phase is the truth; this copy answers
/// peers without its lock). A hold lasts for the capture it came in: a new capture (frozen)
/// or a completed restore or rollback (active) ends it.
pub fn set_phase(phase: Phase) {
    update(|p| {
        p.phase = phase;
        if matches!(phase, Phase::Active | Phase::Frozen) {
            p.held = false;
        }
    });
}

/// The capture's state is published (the coordinator's `hold`, or a creator's seen held):
/// this process stays released until a restore, however quiet its coordinator.
pub fn set_held() {
    update(|p| p.held = true);
}

/// Whether this process is held (see [`set_held`]).
pub fn held() -> bool {
    PROGRESS.lock().unwrap_or_else(|p| p.into_inner()).held
}

/// The lifecycle phase as of the last completed step.
pub fn phase() -> Phase {
    PROGRESS.lock().unwrap_or_else(|p| p.into_inner()).phase
}

/// The reply to a `progress` request.
pub fn reply(namespace_pid: NamespacePid) -> ProgressReply {
    let p = *PROGRESS.lock().unwrap_or_else(|p| p.into_inner());
    ProgressReply {
        namespace_pid,
        operation: p.operation,
        running: p.running,
        done: p.done,
        total: p.total,
        phase: p.phase,
        held: p.held,
    }
}
