//! The control worker: serves the coordinator's requests (inspect, begin_checkpoint and the
//! lifecycle operations) one at a time, in the order they were queued.

use crate::lifecycle;
use cuinterpose_protocol::Request;
use cuinterpose_protocol::transport::{Connection, Timeouts};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Requests waiting for the worker; one more is refused as busy, without mutation.
pub const QUEUE_CAPACITY: usize = 8;

#[derive(Debug)]
pub struct Job {
    pub connection: Connection,
    pub request: Request,
}

pub fn spawn(_timeouts: Timeouts) -> std::io::Result<SyncSender<Job>> {
    let (sender, receiver) = sync_channel(QUEUE_CAPACITY);
    std::thread::Builder::new()
        .name("cuinterpose-control".into())
        .spawn(move || serve(receiver))?;
    Ok(sender)
}

fn serve(receiver: Receiver<Job>) {
    while let Ok(mut job) = receiver.recv() {
        let outcome = lifecycle::handle(&job.request);
        let sent = job.connection.send_reply(&outcome.reply, None);
        if let Err(e) = &sent {
            crate::log!("could not send the {} reply: {e}", job.request.kind());
        }
        lifecycle::after_reply(outcome.after, sent.is_ok());
    }
}
