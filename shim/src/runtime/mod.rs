//! The shim's runtime, started by the first successful `cuInit`: the control socket, the peer
//! thread that accepts connections, and the control worker that serves the coordinator.

pub mod control;
pub mod fork;
pub mod peer;

use crate::driver::os;
use crate::log;
use crate::state::process;
use crate::sys::error::{CuError, CuResult};
use crate::sys::settings;
use cuinterpose_protocol::transport::Listener;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

/// How long a connection may take to deliver its request (a few hundred bytes, sent at once
/// by every real client). Short, so that idle connections (a same-user flood holds at most
/// `peer::MAX_CONNECTIONS` of them) free their handler slots quickly; replies then get the
/// operation's own timeout.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts the runtime once per process. A failure is logged and reported as
/// `CUDA_ERROR_OPERATING_SYSTEM`: a process that cannot be reached cannot be checkpointed,
/// and the operator should hear so now rather than at checkpoint time.
pub fn start() -> CuResult<()> {
    let mut started = fork::STARTED_FOR.lock().unwrap_or_else(|p| p.into_inner());
    let me = std::process::id();
    if *started == me {
        return Ok(());
    }
    let pid = process::own_pid();
    let fail = |what: String| {
        log!("cannot start: {what}");
        CuError::OPERATING_SYSTEM
    };
    let settings = settings::current().map_err(|e| fail(e.to_string()))?;
    let timeouts = settings.timeouts;
    let listener = Listener::bind(&settings.control_dir, pid)
        .and_then(|l| l.with_request_timeout(timeouts.control().min(REQUEST_DEADLINE)))
        .map_err(|e| fail(e.to_string()))?;
    // Make sure the registry (and the fork handlers) exist before anyone can connect.
    drop(process::lock());
    fork::LISTENER_FD.store(
        std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&listener)),
        Ordering::SeqCst,
    );
    remember_socket(listener.endpoint().path().to_path_buf());
    let queue = control::spawn(settings).map_err(|e| fail(format!("control worker: {e}")))?;
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
        os::at_exit(remove_socket_at_exit);
    });
}
