//! How far the current host-carrier copy has got, for `progress` requests. The carrier
//! updates it as chunks complete; the peer thread answers from it at once, without waiting
//! for the control worker that runs the copy.

use cuinterpose_protocol::{NamespacePid, Operation, ProgressReply};
use std::sync::Mutex;

#[derive(Debug, Clone, Copy)]
struct Progress {
    operation: Option<Operation>,
    running: bool,
    done: u64,
    total: u64,
}

static PROGRESS: Mutex<Progress> = Mutex::new(Progress {
    operation: None,
    running: false,
    done: 0,
    total: 0,
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

/// The reply to a `progress` request.
pub fn reply(namespace_pid: NamespacePid) -> ProgressReply {
    let p = *PROGRESS.lock().unwrap_or_else(|p| p.into_inner());
    ProgressReply {
        namespace_pid,
        operation: p.operation,
        running: p.running,
        done: p.done,
        total: p.total,
    }
}
