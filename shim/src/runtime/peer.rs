//! The peer thread: accepts connections on the control socket and gives each its own
//! short-lived handler thread, so a slow or hostile client holds up nobody else. Export
//! requests are answered right there from the export cache, progress requests from the
//! carrier's progress; everything else is executed by
//! the control worker (through its bounded queue) and answered from here, so a client that
//! does not read its reply holds up only its own thread.

use super::control::{self, Job};
use crate::lifecycle;
use crate::log;
use crate::state::{cache, process, progress};
use crate::sys::log::refusal as log_refusal;
use cuinterpose_protocol::transport::{
    Connection, Listener, RefusalReason, Timeouts, TransportError, socket_name,
};
use cuinterpose_protocol::{NamespacePid, RefusalCode, Request};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
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
            // Another user's peer, already closed by `accept` (which logs through `tracing`,
            // which nobody listens to inside an application: say it here).
            Err(TransportError::Refused { peer, reason }) => {
                let pid = peer.pid.map_or_else(|| "unknown".into(), |p| p.to_string());
                match reason {
                    RefusalReason::ForeignUid { uid } => log_refusal(format_args!(
                        "refused a connection from uid {uid} (pid {pid}): only this process's \
                         user and root may connect"
                    )),
                    other => log_refusal(format_args!("refused a connection (pid {pid}): {other}")),
                }
                continue;
            }
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
    let (request, fd) = match connection.read_request() {
        Ok(received) => received,
        // A peer that connects and goes away (a liveness probe) is no news.
        Err(TransportError::PeerClosed { .. }) => return,
        Err(e) => {
            log_refusal(format_args!("refused a request: {e}"));
            // Best effort: tell a confused client why, then close.
            let reply = cache::refused(RefusalCode::Invalid, e.to_string());
            let _ = connection.send_reply(&reply, None);
            return;
        }
    };
    match request {
        Request::Export(first) => {
            // A series: further exports on this connection, each answered in order, until the
            // peer closes (or stalls past the request timeout).
            let mut export = first;
            loop {
                let (reply, fd) = cache::serve(&export, connection.credentials().pid);
                let fd = fd.as_ref().map(std::os::fd::AsFd::as_fd);
                if connection.send_reply(&reply, fd).is_err() {
                    return;
                }
                match connection.read_request() {
                    Ok((Request::Export(next), _)) => export = next,
                    Ok((other, _)) => {
                        let why = format!(
                            "`{}` after an export: only exports form a series",
                            other.kind()
                        );
                        log_refusal(format_args!("refused a request: {why}"));
                        let _ =
                            connection.send_reply(&cache::refused(RefusalCode::Invalid, why), None);
                        return;
                    }
                    Err(TransportError::PeerClosed { .. }) => return,
                    Err(e) => {
                        log_refusal(format_args!("ended a series of exports: {e}"));
                        return;
                    }
                }
            }
        }
        // Answered here, never queued: the worker may be in the middle of the copy asked about.
        Request::Progress => {
            // The coordinator polls while a copy runs elsewhere: it is alive. Another
            // participant asking for this process's phase before its own rollback is not the
            // coordinator, and must not put this process's rollback off.
            if !is_participant(connection.credentials().pid) {
                lifecycle::rollback::note_activity();
            }
            let reply = progress::reply(process::own_pid()).into();
            let _ = connection.send_reply(&reply, None);
        }
        request => {
            let timeout = timeouts.for_request(&request);
            if connection.set_timeout(timeout).is_err() {
                return;
            }
            let what = control::name(&request);
            let (done, outcome) = sync_channel(1);
            let busy = |why: &str| cache::refused(RefusalCode::Busy, why.into());
            let outcome = match queue.try_send(Job { request, fd, done }) {
                // The worker always answers; only its death (a panic, mid-request) drops the
                // sender: what it did is unknown, so nothing may go on as if it were not.
                Ok(()) => outcome.recv().map_err(|_| {
                    cache::refused(
                        RefusalCode::FailStopped,
                        format!("the control worker stopped during {what}; its outcome is unknown"),
                    )
                }),
                Err(TrySendError::Full(_)) => {
                    Err(busy("control queue full; refused without mutation"))
                }
                Err(TrySendError::Disconnected(_)) => {
                    Err(busy("control worker unavailable; refused without mutation"))
                }
            };
            match outcome {
                Ok(outcome) => {
                    let sent = connection.send_reply(&outcome.reply, None);
                    if let Err(e) = &sent {
                        log!("could not send the {what} reply: {e}");
                    }
                    lifecycle::after_reply(outcome.after, sent.is_ok());
                }
                Err(refusal) => {
                    let _ = connection.send_reply(&refusal, None);
                }
            }
        }
    }
}

/// Whether `pid` (a peer's, in this process's PID namespace; 0 when not visible) is another
/// participant: it has a control socket beside this process's.
fn is_participant(pid: i32) -> bool {
    let Some(pid) = u32::try_from(pid).ok().and_then(NamespacePid::new) else {
        return false;
    };
    pid != process::own_pid()
        && cuinterpose_protocol::transport::control_dir()
            .is_ok_and(|dir| dir.join(socket_name(pid)).exists())
}
