//! The control socket a process's fakecuda serves from `cuInit` on: native checkpoint
//! requests from a checkpoint tool and IPC FD requests from peers.

use super::wire::{MAX_RESTORE_BODY, Op, Reply, Request, RestoreBody, socket_path};
use crate::error::{CUDA_SUCCESS, CuError, CuResult};
use nix::sys::socket::{ControlMessage, MsgFlags, getsockopt, sockopt::PeerCredentials};
use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// The socket this process serves, removed at normal exit so the control directory lists
/// live processes (a killed process leaves its file; the next process with its pid replaces
/// it).
static SOCKET: std::sync::Mutex<Option<(u32, std::path::PathBuf)>> = std::sync::Mutex::new(None);

extern "C" fn remove_socket() {
    if let Ok(guard) = SOCKET.try_lock()
        && let Some((owner, path)) = guard.as_ref()
        && *owner == std::process::id()
    {
        let _ = std::fs::remove_file(path);
    }
}

fn remove_at_exit(path: std::path::PathBuf) {
    *SOCKET.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::process::id(), path));
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that lives as long as the process.
        unsafe { libc::atexit(remove_socket) };
    });
}

pub fn start() -> std::io::Result<()> {
    let path = socket_path(std::process::id());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A file left by an earlier process with the same pid is stale: that process is gone.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    remove_at_exit(path);
    std::thread::Builder::new()
        .name(super::wire::THREAD_NAME.into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                // One thread per connection: a lock waiting for calls to drain must not stall
                // a peer's IPC request.
                let _ = std::thread::Builder::new()
                    .name("fakecuda-conn".into())
                    .spawn(move || serve(conn));
            }
        })?;
    Ok(())
}

fn serve(mut conn: UnixStream) {
    // Only processes of the same user may drive this process's driver.
    let same_user = getsockopt(&conn, PeerCredentials)
        .map(|c| c.uid() == nix::unistd::geteuid().as_raw())
        .unwrap_or(false);
    if !same_user {
        return;
    }
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = [0u8; 16];
    if conn.read_exact(&mut buf).is_err() {
        return;
    }
    let Some(req) = Request::decode(&buf) else {
        return;
    };
    let body = match req.op {
        Op::Restore => match read_body(&mut conn, req.arg) {
            Some(body) => Some(body),
            None => return,
        },
        _ => None,
    };
    let (result, fd) = match handle(req, body) {
        Ok(fd) => (CUDA_SUCCESS, fd),
        Err(e) => (e.raw(), None),
    };
    let reply = Reply {
        result,
        state: crate::state::gate::state(),
        value: 0,
    }
    .encode();
    let iov = [IoSlice::new(&reply)];
    let raw;
    let cmsgs: Vec<ControlMessage<'_>> = match &fd {
        Some(f) => {
            raw = [f.as_raw_fd()];
            vec![ControlMessage::ScmRights(&raw)]
        }
        None => Vec::new(),
    };
    let _ =
        nix::sys::socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), None);
}

/// A restore's body, `len` bytes after its frame; `None` (the connection is dropped) for one
/// that is too long, cut short or malformed.
fn read_body(conn: &mut UnixStream, len: u64) -> Option<RestoreBody> {
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= MAX_RESTORE_BODY)?;
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).ok()?;
    RestoreBody::decode(&body)
}

fn handle(req: Request, body: Option<RestoreBody>) -> CuResult<Option<OwnedFd>> {
    match req.op {
        Op::GetState => Ok(None),
        Op::Lock => crate::state::gate::lock(
            u32::try_from(req.arg).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?,
        )
        .map(|()| None),
        Op::Checkpoint => super::native::checkpoint().map(|()| None),
        Op::Restore => {
            super::native::restore(body.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?).map(|()| None)
        }
        Op::Unlock => crate::state::gate::unlock().map(|()| None),
        Op::IpcFd => crate::driver::with(|d| d.ipc_fd_for(req.arg)).map(Some),
    }
}
