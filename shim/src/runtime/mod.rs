//! The shim's runtime, started by the first successful `cuInit`: the control socket, the peer
//! thread that accepts connections, and the control worker that serves the coordinator.

pub mod cache;
pub mod control;
pub mod fork;
pub mod peer;

use crate::error::{CuError, CuResult};
use crate::log;
use crate::process;
use cuinterpose_protocol::transport::{Listener, Timeouts, control_dir};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

/// The pid the running runtime belongs to (0: none). A forked child sees its parent's value
/// until the fork handler clears it.
static STARTED_FOR: Mutex<u32> = Mutex::new(0);

/// How long a connection may take to deliver its request (a few hundred bytes, sent at once
/// by every real client). Short, so that idle connections (a same-user flood holds at most
/// `peer::MAX_CONNECTIONS` of them) free their handler slots quickly; replies then get the
/// operation's own timeout.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// The listening socket's descriptor, for the fork handler to close in a child.
pub(crate) static LISTENER_FD: AtomicI32 = AtomicI32::new(-1);

/// Starts the runtime once per process. A failure is logged and reported as
/// `CUDA_ERROR_OPERATING_SYSTEM`: a process that cannot be reached cannot be checkpointed,
/// and the operator should hear so now rather than at checkpoint time.
pub fn start() -> CuResult<()> {
    let mut started = STARTED_FOR.lock().unwrap_or_else(|p| p.into_inner());
    let me = std::process::id();
    if *started == me {
        return Ok(());
    }
    let pid = process::own_pid();
    let fail = |what: String| {
        log!("cannot start: {what}");
        CuError::OPERATING_SYSTEM
    };
    let timeouts = Timeouts::from_env().map_err(|e| fail(e.to_string()))?;
    let dir = control_dir().map_err(|e| fail(e.to_string()))?;
    let listener = Listener::bind(&dir, pid)
        .and_then(|l| l.with_request_timeout(timeouts.control().min(REQUEST_DEADLINE)))
        .map_err(|e| fail(e.to_string()))?;
    // Make sure the registry (and the fork handlers) exist before anyone can connect.
    drop(process::lock());
    LISTENER_FD.store(
        std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&listener)),
        Ordering::SeqCst,
    );
    remember_socket(listener.endpoint().path().to_path_buf());
    let queue = control::spawn(timeouts).map_err(|e| fail(format!("control worker: {e}")))?;
    peer::spawn(listener, queue, timeouts).map_err(|e| fail(format!("peer thread: {e}")))?;
    *started = me;
    Ok(())
}

/// The socket file this process listens on, removed at normal exit so the control directory
/// lists live processes (a killed process leaves its file; the next bind of that pid, or the
/// coordinator's discovery, recognises it as stale).
static SOCKET_PATH: Mutex<Option<(u32, std::path::PathBuf)>> = Mutex::new(None);

extern "C" fn remove_socket_at_exit() {
    if let Ok(guard) = SOCKET_PATH.try_lock()
        && let Some((owner, path)) = guard.as_ref()
        && *owner == std::process::id()
    {
        let _ = std::fs::remove_file(path);
    }
}

fn remember_socket(path: std::path::PathBuf) {
    *SOCKET_PATH.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::process::id(), path));
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that lives as long as the process.
        unsafe { libc::atexit(remove_socket_at_exit) };
    });
}

/// Called in a forked child: the parent's runtime threads do not exist here.
pub(crate) fn forget_in_child() {
    // The fork handler runs with no other thread alive; the lock cannot be held by anyone.
    if let Ok(mut started) = STARTED_FOR.try_lock() {
        *started = 0;
    }
    let fd = LISTENER_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: the inherited listening socket; no object in the child owns it (its owner
        // was the parent's peer thread, which does not exist here).
        unsafe { libc::close(fd) };
    }
}
