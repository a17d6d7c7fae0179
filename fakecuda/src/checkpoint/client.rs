//! The caller's side of the control socket: `cuCheckpointProcess*` for another pid and the
//! FD fetch behind `cuIpcOpenMemHandle`.

use super::wire::{Op, Reply, Request, socket_path};
use crate::error::{CuError, CuResult};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, getsockopt, sockopt::PeerCredentials};
use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The pid the target sees for itself: the innermost `NSpid:` value of `/proc/<pid>/status`
/// (the caller may sit in an outer PID namespace).
fn ns_pid(pid: i32) -> CuResult<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
    line.split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
}

/// The process a thread id belongs to (its `Tgid:`): a process id names itself, and CRIU's
/// CUDA plugin passes the restore thread's id where the driver expects a process.
fn process_of(pid: i32) -> CuResult<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
}

/// The thread that serves the control socket of process `pid` (the driver's "restore
/// thread": the one a tool must let run while the rest of the process is stopped), found by
/// its name, so this works while the process is frozen.
pub fn restore_thread(pid: i32) -> CuResult<i32> {
    if pid <= 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = process_of(pid)?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == super::wire::THREAD_NAME
            && let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok())
        {
            return Ok(tid);
        }
    }
    // No control thread: the process never initialised the driver.
    Err(CuError::CUDA_ERROR_NOT_INITIALIZED)
}

/// Sends one request to process `pid` and returns its reply (and an FD, if one came).
pub fn call(pid: i32, op: Op, arg: u64) -> CuResult<(Reply, Option<OwnedFd>)> {
    call_with(pid, op, arg, &[])
}

/// `call` with a body after the frame (a restore's devices and pairs).
fn call_with(pid: i32, op: Op, arg: u64, body: &[u8]) -> CuResult<(Reply, Option<OwnedFd>)> {
    if pid <= 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = process_of(pid)?;
    let path = socket_path(ns_pid(pid)?);
    // No socket: the target never initialised the driver.
    let mut conn = UnixStream::connect(&path).map_err(|_| CuError::CUDA_ERROR_NOT_INITIALIZED)?;
    // The name is only a hint; the kernel says who actually listens there.
    let peer =
        getsockopt(&conn, PeerCredentials).map_err(|_| CuError::CUDA_ERROR_OPERATING_SYSTEM)?;
    if peer.pid() != pid {
        return Err(CuError::CUDA_ERROR_NOT_PERMITTED);
    }
    let mut frame = Request { op, arg }.encode().to_vec();
    frame.extend_from_slice(body);
    conn.write_all(&frame)
        .map_err(|_| CuError::CUDA_ERROR_OPERATING_SYSTEM)?;
    let mut buf = [0u8; 16];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = nix::sys::socket::recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|_| CuError::CUDA_ERROR_OPERATING_SYSTEM)?;
        if msg.bytes == 0 {
            return Err(CuError::CUDA_ERROR_OPERATING_SYSTEM);
        }
        for c in msg
            .cmsgs()
            .map_err(|_| CuError::CUDA_ERROR_OPERATING_SYSTEM)?
        {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: SCM_RIGHTS installed `raw` as a new descriptor owned by us.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        got += msg.bytes;
    }
    let reply = Reply::decode(&buf);
    match CuError::from_raw(reply.result) {
        Some(e) => Err(e),
        None => Ok((reply, fd)),
    }
}

pub fn get_state(pid: i32) -> CuResult<u32> {
    call(pid, Op::GetState, 0).map(|(r, _)| r.state)
}

pub fn simple(pid: i32, op: Op, arg: u64) -> CuResult<()> {
    call(pid, op, arg).map(|_| ())
}

/// Native restore of process `pid` onto this process's machine (`Machine::from_env`), with
/// `pairs` remapping its old devices (empty: each must be on this machine as it was).
pub fn restore(pid: i32, pairs: Vec<([u8; 16], [u8; 16])>) -> CuResult<()> {
    let machine = crate::device::Machine::from_env()?;
    let body = super::wire::RestoreBody {
        machine: machine.devices,
        pairs,
    }
    .encode();
    call_with(pid, Op::Restore, body.len() as u64, &body).map(|_| ())
}

pub fn fetch_ipc_fd(pid: u32, alloc: u64) -> CuResult<OwnedFd> {
    let pid = i32::try_from(pid).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
    let (_, fd) = call(pid, Op::IpcFd, alloc).map_err(|e| {
        // A creator that is gone or never initialised cannot serve the handle.
        if e == CuError::CUDA_ERROR_NOT_INITIALIZED {
            CuError::CUDA_ERROR_INVALID_VALUE
        } else {
            e
        }
    })?;
    fd.ok_or(CuError::CUDA_ERROR_OPERATING_SYSTEM)
}
