//! The peer thread: accepts connections on the control socket and gives each its own
//! short-lived handler thread, so a slow or hostile client holds up nobody else. Export
//! requests are answered right there from the export cache; everything else goes to the
//! control worker through its bounded queue.

use super::cache;
use super::control::Job;
use crate::log;
use cuinterpose_protocol::transport::{Connection, Listener, Timeouts, TransportError};
use cuinterpose_protocol::{RefusalCode, Request};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

/// Connections served at once; more are closed at once (a flood cannot exhaust threads).
pub const MAX_CONNECTIONS: usize = 64;

pub fn spawn(
    listener: Listener,
    queue: SyncSender<Job>,
    timeouts: Timeouts,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("cuinterpose-peer".into())
        .spawn(move || accept_loop(listener, queue, timeouts))
        .map(drop)
}

fn accept_loop(listener: Listener, queue: SyncSender<Job>, timeouts: Timeouts) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let connection = match listener.accept() {
            Ok(c) => c,
            // Another user's peer: logged and closed by `accept`.
            Err(TransportError::Refused { .. }) => continue,
            Err(e) => {
                log!("accepting on the control socket: {e}");
                // Out of descriptors or memory: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            continue; // dropping the connection closes it
        }
        let queue = queue.clone();
        let counter = Arc::clone(&active);
        let spawned = std::thread::Builder::new()
            .name("cuinterpose-conn".into())
            .spawn(move || {
                handle(connection, &queue, timeouts);
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn handle(mut connection: Connection, queue: &SyncSender<Job>, timeouts: Timeouts) {
    let request = match connection.read_request() {
        Ok((request, _)) => request,
        Err(e) => {
            // Best effort: tell a confused client why, then close.
            let reply = cache::refused(RefusalCode::Invalid, e.to_string());
            let _ = connection.send_reply(&reply, None);
            return;
        }
    };
    match request {
        Request::Export(export) => {
            let (reply, fd) = cache::serve(&export, connection.credentials().pid);
            let _ = connection.send_reply(&reply, fd.as_ref().map(std::os::fd::AsFd::as_fd));
        }
        request => {
            let timeout = timeouts.for_request(&request);
            if connection.set_timeout(timeout).is_err() {
                return;
            }
            match queue.try_send(Job {
                connection,
                request,
            }) {
                Ok(()) => {}
                Err(TrySendError::Full(mut job)) => {
                    let reply = cache::refused(
                        RefusalCode::Busy,
                        "control queue full; refused without mutation".into(),
                    );
                    let _ = job.connection.send_reply(&reply, None);
                }
                Err(TrySendError::Disconnected(mut job)) => {
                    let reply = cache::refused(
                        RefusalCode::Busy,
                        "control worker unavailable; refused without mutation".into(),
                    );
                    let _ = job.connection.send_reply(&reply, None);
                }
            }
        }
    }
}
