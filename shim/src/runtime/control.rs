//! The control worker: executes the coordinator's requests (inspect, begin_checkpoint and the
//! lifecycle operations) one at a time, in the order they were queued.
//!
//! It only executes: the outcome goes back to the connection's own handler thread, which sends
//! the reply. A client that never reads its reply (a large inspection fills the socket buffer)
//! then holds up its own handler thread until the send times out, not every later request.

use crate::lifecycle::{self, Outcome};
use crate::sys::settings::Settings;
use cuinterpose_protocol::Request;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Requests waiting for the worker; one more is refused as busy, without mutation.
pub const QUEUE_CAPACITY: usize = 8;

#[derive(Debug)]
pub struct Job {
    pub request: Request,
    /// The descriptor the request carried (the storage carrier's folder), if any.
    pub fd: Option<std::os::fd::OwnedFd>,
    /// Where the outcome goes: the handler thread of the connection that asked.
    pub done: SyncSender<Outcome>,
}

pub fn spawn(settings: &'static Settings) -> std::io::Result<SyncSender<Job>> {
    let (sender, receiver) = sync_channel(QUEUE_CAPACITY);
    std::thread::Builder::new()
        .name("cuinterpose-control".into())
        .spawn(move || serve(receiver, settings))?;
    Ok(sender)
}

fn serve(receiver: Receiver<Job>, settings: &Settings) {
    while let Ok(job) = receiver.recv() {
        let outcome = lifecycle::handle(&job.request, job.fd, settings);
        // The handler waits for it; if it is gone, nobody can be told (the outcome's
        // follow-up runs as for a lost reply).
        if let Err(unsent) = job.done.send(outcome) {
            crate::log!(
                "no handler for the {} outcome; treated as a lost reply",
                name(&job.request)
            );
            lifecycle::after_reply(unsent.0.after, false);
        }
    }
}

/// The request's name in logs: the operation for `execute`.
pub fn name(request: &Request) -> &'static str {
    match request {
        Request::Execute(execute) => execute.operation.wire_name(),
        other => other.kind(),
    }
}
