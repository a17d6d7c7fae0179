//! The driving side: spawn a worker, send it commands, read replies.

use crate::error::WorkloadError;
use crate::proto::{
    AllocationProperties, Command, DriverObjects, FdTarget, Grant, Reply, Response,
};
use crate::wire::{self, WireError};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod config;
pub use config::{Output, WorkerConfig};

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The worker's identity as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// `getpid()` in the worker: its PID in its own PID namespace.
    pub pid: i32,
    /// The `NSpid:` line of the worker's `/proc/self/status`, outermost namespace (visible to
    /// the `/proc` the worker sees) first: `[host, ..., own]` when `/proc` is the host's.
    pub nspid: Vec<i32>,
    /// `getppid()` in the worker.
    pub ppid: i32,
}

/// What `Init` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitInfo {
    pub pid: i32,
    pub nspid: Vec<i32>,
    pub device_count: i32,
}

/// What `Export` gives back.
#[derive(Debug)]
pub struct Exported {
    /// The POSIX FD, received through `SCM_RIGHTS` (ours to own).
    pub fd: Option<OwnedFd>,
    /// The descriptor's number in the worker (still open there only if it was kept).
    pub worker_fd: Option<i32>,
    /// The bytes of a non-FD shareable handle.
    pub shareable: Option<Vec<u8>>,
}

/// Where `Resolve` found a symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub address: u64,
    /// The containing library's file name, as `dladdr` reports it.
    pub library: Option<String>,
    /// The nearest symbol's name, as `dladdr` reports it.
    pub symbol: Option<String>,
}

/// A running `cuinterpose-worker` and its control socket. Dropping it closes the socket
/// (the worker exits), then kills and reaps the process if it lingers.
#[derive(Debug)]
pub struct Worker {
    /// `None` for a worker this process connected to rather than spawned.
    child: Option<Child>,
    pid: u32,
    sock: Option<OwnedFd>,
    timeout: Duration,
    identity: WorkerIdentity,
    init: Option<InitInfo>,
    status: Option<ExitStatus>,
    unusable: Option<String>,
    /// The command sent whose reply is still to be read.
    in_flight: Option<String>,
}

fn unexpected(pid: u32, command: &Command, reply: &Reply) -> WorkloadError {
    WorkloadError::Protocol {
        pid,
        command: command.name(),
        message: format!(
            "unexpected reply {reply:?} (the command answers {})",
            command.reply_name()
        ),
    }
}

macro_rules! expect_reply {
    ($self:ident, $cmd:expr, $pat:pat => $val:expr) => {{
        let cmd = $cmd;
        match $self.call(&cmd)? {
            $pat => Ok($val),
            other => Err(unexpected($self.pid, &cmd, &other)),
        }
    }};
}

// After the macro, which they use.
mod data;
mod memory;

impl Worker {
    /// Starts a worker and waits for its first answer (a `Ping`).
    pub fn spawn(config: &WorkerConfig) -> Result<Worker, WorkloadError> {
        let spawn_err = |source| WorkloadError::Spawn {
            program: config.program.clone(),
            source,
        };
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| spawn_err(e.into()))?;
        // Keep the child's end clear of 0..=2, which the stdio set-up overwrites in the child
        // (possible when this process runs with a standard stream closed).
        let theirs = if theirs.as_raw_fd() < 3 {
            nix::fcntl::fcntl(&theirs, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))
                .map_err(|e| spawn_err(e.into()))
                // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor; nothing else
                // owns it.
                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })?
        } else {
            theirs
        };
        let child_fd = theirs.as_raw_fd();
        let mut cmd = match &config.wrapper {
            Some(w) if !w.is_empty() => {
                let mut c = std::process::Command::new(&w[0]);
                c.args(&w[1..]).arg(&config.program);
                c
            }
            _ => std::process::Command::new(&config.program),
        };
        cmd.arg("--control-fd")
            .arg(child_fd.to_string())
            .arg("--entry")
            .arg(config.entry.to_string());
        if let Some(d) = &config.driver {
            cmd.arg("--driver").arg(d);
        }
        cmd.args(&config.args);
        for k in &config.env_remove {
            cmd.env_remove(k);
        }
        cmd.envs(config.env.iter().map(|(k, v)| (k, v)));
        if let Some(d) = &config.current_dir {
            cmd.current_dir(d);
        }
        cmd.stdin(Stdio::null())
            .stdout(config.stdout.stdio().map_err(spawn_err)?)
            .stderr(config.stderr.stdio().map_err(spawn_err)?);
        // SAFETY: the closure runs in the forked child before exec and only calls fcntl,
        // which is async-signal-safe; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // The child's end crosses exec; every other process keeps it close-on-exec.
                if libc::fcntl(child_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(spawn_err)?;
        drop(theirs);
        let pid = child.id();
        let mut w = Worker::fresh(Some(child), pid, Some(ours), config.timeout);
        w.identity = w.ping()?;
        Ok(w)
    }

    /// The host PID of the spawned process (the wrapper's, when there is one).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The worker's own identity from the start-up handshake.
    pub fn identity(&self) -> &WorkerIdentity {
        &self.identity
    }

    /// `getpid()` inside the worker (its PID in its own namespace).
    pub fn worker_pid(&self) -> i32 {
        self.identity.pid
    }

    /// The worker's PID in the outermost namespace its `/proc` shows (the host PID when the
    /// worker sees the host's `/proc`).
    pub fn worker_host_pid(&self) -> i32 {
        self.identity
            .nspid
            .first()
            .copied()
            .unwrap_or(self.identity.pid)
    }

    /// What the last successful `Init` reported.
    pub fn init_info(&self) -> Option<&InitInfo> {
        self.init.as_ref()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// The control socket, e.g. to poll it.
    pub fn control_socket(&self) -> Option<BorrowedFd<'_>> {
        self.sock.as_ref().map(AsFd::as_fd)
    }

    /// Sends `command` and returns the worker's reply.
    pub fn call(&mut self, command: &Command) -> Result<Reply, WorkloadError> {
        self.call_with_fd(command, None).map(|(r, _)| r)
    }

    /// Sends `command` with `fd` attached and returns the reply and any descriptor attached
    /// to it.
    pub fn call_with_fd(
        &mut self,
        command: &Command,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Reply, Option<OwnedFd>), WorkloadError> {
        self.send(command, fd)?;
        self.receive()
    }

    /// Sends `command` without waiting for the reply (e.g. a call that blocks until another
    /// worker acts); [`Worker::receive`] collects it. One command may be in flight.
    pub fn send(
        &mut self,
        command: &Command,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), WorkloadError> {
        let pid = self.pid;
        self.usable()?;
        if let Some(p) = &self.in_flight {
            return Err(WorkloadError::Protocol {
                pid,
                command: command.name(),
                message: format!("{p} is still in flight"),
            });
        }
        let payload = serde_json::to_vec(command).map_err(|e| WorkloadError::Protocol {
            pid,
            command: command.name(),
            message: format!("cannot encode: {e}"),
        })?;
        let deadline = Instant::now() + self.timeout;
        let sent = match self.sock.as_ref() {
            Some(sock) => wire::send_frame(sock.as_fd(), &payload, fd, Some(deadline)),
            None => Err(WireError::Closed),
        };
        match sent {
            Ok(()) => {
                self.in_flight = Some(command.name());
                Ok(())
            }
            Err(e) => Err(self.transport_failure(&command.name(), e)),
        }
    }

    /// The reply to the command [`Worker::send`] sent, within the timeout.
    pub fn receive(&mut self) -> Result<(Reply, Option<OwnedFd>), WorkloadError> {
        let pid = self.pid;
        self.usable()?;
        let Some(name) = self.in_flight.take() else {
            return Err(WorkloadError::Protocol {
                pid,
                command: "receive".to_owned(),
                message: "no command in flight".to_owned(),
            });
        };
        let deadline = Instant::now() + self.timeout;
        let received = match self.sock.as_ref() {
            Some(sock) => wire::recv_frame(sock.as_fd(), Some(deadline)),
            None => Err(WireError::Closed),
        };
        let (text, attached) = match received {
            Ok(x) => x,
            Err(e) => return Err(self.transport_failure(&name, e)),
        };
        let response: Response = serde_json::from_slice(&text).map_err(|e| {
            self.unusable = Some(format!("undecodable reply to {name}"));
            WorkloadError::Protocol {
                pid,
                command: name.clone(),
                message: format!("undecodable reply: {e}"),
            }
        })?;
        match response {
            Ok(r) => Ok((r, attached)),
            Err(e) => Err(WorkloadError::from_reply(pid, name, e)),
        }
    }

    fn usable(&self) -> Result<(), WorkloadError> {
        match (&self.unusable, &self.sock) {
            (Some(reason), _) => Err(WorkloadError::Unusable {
                pid: self.pid,
                reason: reason.clone(),
            }),
            (None, None) => Err(WorkloadError::Unusable {
                pid: self.pid,
                reason: "the control socket was closed".to_owned(),
            }),
            (None, Some(_)) => Ok(()),
        }
    }

    fn transport_failure(&mut self, name: &str, e: WireError) -> WorkloadError {
        let pid = self.pid;
        let name = name.to_owned();
        if e.peer_gone() {
            self.unusable = Some(format!("died during {name}"));
            let status = self.reap_within(Duration::from_secs(5));
            return WorkloadError::Died {
                pid,
                command: name,
                status,
            };
        }
        if let WireError::Timeout = e {
            if let Ok(Some(s)) = self.try_status() {
                self.unusable = Some(format!("died during {name}"));
                return WorkloadError::Died {
                    pid,
                    command: name,
                    status: Some(s),
                };
            }
            self.unusable = Some(format!("{name} timed out after {:?}", self.timeout));
            return WorkloadError::Timeout {
                pid,
                command: name,
                after: self.timeout,
            };
        }
        self.unusable = Some(format!("control socket failed during {name}: {e}"));
        WorkloadError::Protocol {
            pid,
            command: name,
            message: e.to_string(),
        }
    }

    /// The exit status if the process has exited (reaping it).
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>, WorkloadError> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let Some(child) = self.child.as_mut() else {
            // Not our child: gone (or a zombie its own parent has yet to reap) counts as
            // exited; its status is not ours to know.
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            let gone = matches!(state, None | Some('Z' | 'X'));
            use std::os::unix::process::ExitStatusExt;
            return Ok(gone.then(|| ExitStatus::from_raw(0)));
        };
        let s = child.try_wait().map_err(|e| WorkloadError::Process {
            pid: self.pid,
            context: "waitpid".to_owned(),
            source: e,
        })?;
        self.status = s;
        Ok(s)
    }

    /// Polls for the exit status for up to `limit`.
    fn reap_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            match self.try_status() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                _ => return None,
            }
        }
    }

    /// Closes the control socket (the worker exits when it notices) and waits up to the
    /// timeout for the process to exit.
    pub fn wait(&mut self) -> Result<ExitStatus, WorkloadError> {
        self.sock = None;
        self.unusable.get_or_insert_with(|| "stopped".to_owned());
        let timeout = self.timeout;
        self.reap_within(timeout).ok_or(WorkloadError::Timeout {
            pid: self.pid,
            command: "wait".to_owned(),
            after: timeout,
        })
    }

    /// `SIGKILL`s the spawned process, closes the control socket and reaps it.
    pub fn kill(&mut self) -> Result<ExitStatus, WorkloadError> {
        self.sock = None;
        self.unusable.get_or_insert_with(|| "killed".to_owned());
        if let Some(s) = self.try_status()? {
            return Ok(s);
        }
        let pid = self.pid;
        let proc_err = |context: &str, source| WorkloadError::Process {
            pid,
            context: context.to_owned(),
            source,
        };
        let Some(child) = self.child.as_mut() else {
            // SAFETY: kill(2) on the worker's host pid; no memory is involved.
            if unsafe { libc::kill(pid as i32, libc::SIGKILL) } != 0 {
                return Err(proc_err("kill", std::io::Error::last_os_error()));
            }
            let timeout = self.timeout;
            return self.reap_within(timeout).ok_or(WorkloadError::Timeout {
                pid,
                command: "kill".to_owned(),
                after: timeout,
            });
        };
        child.kill().map_err(|e| proc_err("kill", e))?;
        let s = child.wait().map_err(|e| proc_err("waitpid", e))?;
        self.status = Some(s);
        Ok(s)
    }

    /// Sends `Exit { code }` and waits for the process to end.
    pub fn exit(&mut self, code: i32) -> Result<ExitStatus, WorkloadError> {
        self.call(&Command::Exit { code })?;
        self.wait()
    }

    /// A worker handle before its first exchange (its identity unknown yet).
    fn fresh(
        child: Option<std::process::Child>,
        pid: u32,
        sock: Option<std::os::fd::OwnedFd>,
        timeout: Duration,
    ) -> Worker {
        Worker {
            child,
            pid,
            sock,
            timeout,
            identity: WorkerIdentity {
                pid: 0,
                nspid: Vec::new(),
                ppid: 0,
            },
            init: None,
            status: None,
            unusable: None,
            in_flight: None,
        }
    }

    /// Connects to a worker started with `--listen PATH` (by someone else, e.g. inside a PID
    /// namespace), retrying until `timeout`. Dropping it closes the connection and leaves the
    /// worker running, waiting for the next client.
    pub fn connect(path: &std::path::Path, timeout: Duration) -> Result<Worker, WorkloadError> {
        let mut w = Worker::fresh(None, 0, None, timeout);
        w.attach(path)?;
        w.identity = w.ping()?;
        w.pid = w
            .identity
            .nspid
            .first()
            .copied()
            .unwrap_or(w.identity.pid)
            .max(0) as u32;
        Ok(w)
    }

    /// Hands the worker's control channel over to a listening socket at `path` and closes
    /// this end: until [`Worker::attach`], the worker is connected to nobody (CRIU can dump
    /// it). Process-related calls (`wait`, `kill`) still refer to the spawned process.
    pub fn detach(&mut self, path: &std::path::Path) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Detach { path: path.to_path_buf() }, Reply::Done => ())?;
        self.sock = None;
        Ok(())
    }

    /// Reconnects to a worker detached at `path` (also one restored by CRIU, which is no
    /// longer this process's child), retrying until the worker's timeout.
    pub fn attach(&mut self, path: &std::path::Path) -> Result<(), WorkloadError> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(stream) => {
                    self.sock = Some(OwnedFd::from(stream));
                    self.unusable = None;
                    return Ok(());
                }
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(WorkloadError::Timeout {
                        pid: self.pid,
                        command: format!("attach to {}: {e}", path.display()),
                        after: self.timeout,
                    });
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // Closing the socket ends a healthy worker (and one behind a wrapper); kill what
        // lingers.
        self.sock = None;
        if self.child.is_none() {
            // Connected, not spawned: the worker goes back to waiting for a client.
            return;
        }
        if self.reap_within(Duration::from_millis(500)).is_none()
            && let Some(child) = self.child.as_mut()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
