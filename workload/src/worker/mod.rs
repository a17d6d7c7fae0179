//! The worker process: reads commands from its control socket, runs them against the driver
//! and answers each one. `cuinterpose-worker` is a thin `main` around [`main_with_args`].

mod driver;
mod exec;
mod traffic;

use crate::entry::EntryPath;
use crate::proto::{Command, Reply, Response};
use crate::wire::{self, WireError};
use std::ffi::OsString;
use std::os::fd::{AsFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

pub use driver::default_library;

/// Constructors of the worker's error replies.
pub(crate) mod failure {
    use crate::proto::{ErrorKind, ErrorReply, Mismatch};
    use nix::errno::Errno;

    pub fn cuda(function: &str, code: u32) -> ErrorReply {
        let name = crate::cuda::error_name_or_code(code);
        ErrorReply {
            kind: ErrorKind::Cuda,
            code: i64::from(code),
            message: format!("{function} returned {name} ({code})"),
            name,
            mismatch: None,
        }
    }

    pub fn errno(op: &str, errno: Errno) -> ErrorReply {
        ErrorReply {
            kind: ErrorKind::Errno,
            code: i64::from(errno as i32),
            name: format!("{errno:?}"),
            message: format!("{op}: {}", errno.desc()),
            mismatch: None,
        }
    }

    pub fn request(message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            kind: ErrorKind::Request,
            code: -1,
            name: "BAD_REQUEST".to_owned(),
            message: message.into(),
            mismatch: None,
        }
    }

    pub fn unresolved(symbol: &str, code: i64, message: String) -> ErrorReply {
        ErrorReply {
            kind: ErrorKind::Unresolved,
            code,
            name: symbol.to_owned(),
            message,
            mismatch: None,
        }
    }

    pub fn mismatch(address: u64, offset: u64, expected: u8, found: u8) -> ErrorReply {
        ErrorReply {
            kind: ErrorKind::Mismatch,
            code: -1,
            name: "MISMATCH".to_owned(),
            message: format!(
                "byte at offset {offset} (address {:#x}) is {found:#04x}, expected {expected:#04x}",
                address + offset
            ),
            mismatch: Some(Mismatch {
                offset,
                expected,
                found,
            }),
        }
    }

    pub fn panic(message: String) -> ErrorReply {
        ErrorReply {
            kind: ErrorKind::Panic,
            code: -1,
            name: "PANIC".to_owned(),
            message,
            mismatch: None,
        }
    }
}

/// The worker's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    /// The inherited control socket (`--control-fd N`), or `None` with `--listen`.
    pub control_fd: Option<RawFd>,
    /// `--listen PATH`: serve whoever connects to a socket at PATH, one connection at a time,
    /// instead of an inherited channel (for workloads started apart from their driver, e.g.
    /// inside a PID namespace that CRIU dumps).
    pub listen: Option<PathBuf>,
    /// `--entry` (default `dlsym`).
    pub entry: EntryPath,
    /// `--driver PATH` (default: `$CUINTERPOSE_WORKER_DRIVER`, else `libcuda.so.1`).
    pub driver: Option<PathBuf>,
}

pub const USAGE: &str = "usage: cuinterpose-worker (--control-fd N | --listen PATH) [--entry dlsym|default|next|\
proc-address:VERSION|proc-address-v1:VERSION|runtime:LIBPATH] [--driver PATH]";

impl WorkerArgs {
    /// Parses `--name value` and `--name=value`; a later flag overrides an earlier one.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<WorkerArgs, String> {
        let mut control_fd = None;
        let mut listen = None;
        let mut entry = EntryPath::Dlsym;
        let mut driver = None;
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let arg = arg
                .into_string()
                .map_err(|a| format!("argument {a:?} is not UTF-8"))?;
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
                _ => (arg.clone(), None),
            };
            let mut value = || -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => it
                        .next()
                        .and_then(|v| v.into_string().ok())
                        .ok_or_else(|| format!("{name} needs a value")),
                }
            };
            match name.as_str() {
                "--control-fd" => {
                    let v = value()?;
                    control_fd = Some(
                        v.parse::<RawFd>()
                            .map_err(|_| format!("bad --control-fd {v:?}"))?,
                    );
                }
                "--listen" => listen = Some(PathBuf::from(value()?)),
                "--entry" => entry = value()?.parse().map_err(|e| format!("{e}"))?,
                "--driver" => driver = Some(PathBuf::from(value()?)),
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
            }
        }
        if control_fd.is_none() == listen.is_none() {
            return Err(format!(
                "exactly one of --control-fd and --listen is required\n{USAGE}"
            ));
        }
        Ok(WorkerArgs {
            control_fd,
            listen,
            entry,
            driver,
        })
    }
}

/// Takes ownership of the inherited control socket after checking it is one.
fn adopt_control_fd(fd: RawFd) -> Result<OwnedFd, String> {
    // SAFETY: fstat on any number is harmless; `st` is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("--control-fd {fd} is not open"));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("--control-fd {fd} is not a socket"));
    }
    // SAFETY: the descriptor is open (fstat succeeded) and was handed to this process to own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Anything the worker might start must not hold the control socket open.
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| format!("fcntl(--control-fd {fd}): {e}"))?;
    Ok(owned)
}

fn log_enabled() -> bool {
    std::env::var_os("CUINTERPOSE_WORKER_LOG").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The worker's `main`: parses `args` (without the program name), serves the control socket
/// until it closes or an `Exit` command, and returns the exit code.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> i32 {
    let args = match WorkerArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cuinterpose-worker: {e}");
            return 2;
        }
    };
    let (sock, listener) = match (args.control_fd, &args.listen) {
        (Some(fd), _) => match adopt_control_fd(fd) {
            Ok(s) => (s, None),
            Err(e) => {
                eprintln!("cuinterpose-worker: {e}");
                return 2;
            }
        },
        (None, Some(path)) => match listen_at(path).and_then(|l| {
            let (stream, _) = l
                .accept()
                .map_err(|e| format!("accept on {}: {e}", path.display()))?;
            Ok((OwnedFd::from(stream), Some(l)))
        }) {
            Ok(pair) => pair,
            Err(e) => {
                eprintln!("cuinterpose-worker: {e}");
                return 2;
            }
        },
        (None, None) => unreachable!("parse requires one of them"),
    };
    let mut state = exec::State::new(args.entry, default_library(args.driver));
    serve(sock, listener, &mut state)
}

/// Binds a listening socket at `path` (mode 0600) for [`Command::Detach`].
fn listen_at(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, String> {
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("bind {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    Ok(listener)
}

/// Serves requests on `sock` until it closes (exit code 0), an `Exit` command (its code), or a
/// transport failure (1).
fn serve(
    mut sock: OwnedFd,
    listener: Option<std::os::unix::net::UnixListener>,
    state: &mut exec::State,
) -> i32 {
    let log = log_enabled();
    let pid = std::process::id();
    let mut detached: Option<std::os::unix::net::UnixListener> = None;
    loop {
        if let Some(listener) = detached.take() {
            // Nothing may stay connected to the old peer while detached.
            drop(sock);
            sock = match listener.accept() {
                Ok((stream, _)) => OwnedFd::from(stream),
                Err(e) => {
                    eprintln!("cuinterpose-worker[{pid}]: waiting to be reattached: {e}");
                    return 1;
                }
            };
            if let Ok(address) = listener.local_addr()
                && let Some(path) = address.as_pathname()
            {
                let _ = std::fs::remove_file(path);
            }
        }
        let (payload, fd) = match wire::recv_frame(sock.as_fd(), None) {
            Ok(x) => x,
            Err(WireError::Closed) => match &listener {
                // Listening: the next client gets the channel.
                Some(l) => match l.accept() {
                    Ok((stream, _)) => {
                        sock = OwnedFd::from(stream);
                        continue;
                    }
                    Err(e) => {
                        eprintln!("cuinterpose-worker[{pid}]: accept: {e}");
                        return 1;
                    }
                },
                None => return 0,
            },
            Err(e) => {
                eprintln!("cuinterpose-worker[{pid}]: control socket: {e}");
                return 1;
            }
        };
        let (response, attach, exit): (Response, Option<exec::Attach>, Option<i32>) =
            match serde_json::from_slice::<Command>(&payload) {
                Err(e) => (
                    Err(failure::request(format!("bad command: {e}"))),
                    None,
                    None,
                ),
                Ok(Command::Detach { path }) => match listen_at(&path) {
                    Ok(listener) => {
                        detached = Some(listener);
                        (Ok(Reply::Done), None, None)
                    }
                    Err(e) => (Err(failure::request(e)), None, None),
                },
                Ok(cmd) => {
                    if log {
                        eprintln!("cuinterpose-worker[{pid}]: {cmd:?}");
                    }
                    let exit = match &cmd {
                        Command::Exit { code } => Some(*code),
                        _ => None,
                    };
                    let (r, a) = state.run_guarded(cmd, fd);
                    (r, a, exit)
                }
            };
        if log {
            eprintln!("cuinterpose-worker[{pid}]: -> {response:?}");
        }
        let text = match serde_json::to_vec(&response) {
            Ok(t) => t,
            Err(e) => serde_json::to_vec(&Response::Err(failure::request(format!(
                "cannot encode the reply: {e}"
            ))))
            .unwrap_or_default(),
        };
        let sent = wire::send_frame(
            sock.as_fd(),
            &text,
            attach.as_ref().map(|a| a.fd.as_fd()),
            None,
        );
        if let Some(a) = attach
            && a.keep
        {
            // The worker keeps its copy under the number the reply reported.
            let _ = a.fd.into_raw_fd();
        }
        if let Err(e) = sent {
            if e.peer_gone() {
                return 0;
            }
            eprintln!("cuinterpose-worker[{pid}]: control socket: {e}");
            return 1;
        }
        if let Some(code) = exit {
            return code;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flags() {
        let a = WorkerArgs::parse(
            [
                "--control-fd",
                "5",
                "--entry=proc-address:12030",
                "--driver",
                "/x/libcuda.so.1",
            ]
            .map(OsString::from),
        )
        .expect("parse");
        assert_eq!(a.control_fd, Some(5));
        assert_eq!(a.entry, EntryPath::ProcAddress(12030));
        assert_eq!(a.driver, Some(PathBuf::from("/x/libcuda.so.1")));
        assert!(WorkerArgs::parse(["--entry", "next"].map(OsString::from)).is_err());
        assert!(WorkerArgs::parse(["--control-fd", "3", "--bogus"].map(OsString::from)).is_err());
    }
}
