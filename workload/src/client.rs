//! The driving side: spawn a worker, send it commands, read replies.

use crate::entry::EntryPath;
use crate::error::WorkloadError;
use crate::proto::{
    AllocationProperties, Command, DriverObjects, FdTarget, Grant, Reply, Response,
};
use crate::wire::{self, WireError};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a worker's stdout or stderr goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Output {
    /// The driving process's own stream.
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
    /// A file, created or appended to.
    File(PathBuf),
}

impl Output {
    fn stdio(&self) -> std::io::Result<Stdio> {
        Ok(match self {
            Output::Inherit => Stdio::inherit(),
            Output::Null => Stdio::null(),
            Output::File(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
        })
    }
}

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The `cuinterpose-worker` binary (see [`crate::worker_program`]).
    pub program: PathBuf,
    /// `--entry`.
    pub entry: EntryPath,
    /// `--driver` (default: `$CUINTERPOSE_WORKER_DRIVER` in the worker, else `libcuda.so.1`).
    pub driver: Option<PathBuf>,
    /// Added to the inherited environment (e.g. `LD_PRELOAD`, `LD_LIBRARY_PATH`,
    /// `FAKECUDA_CONTROL_DIR`, `CUINTERPOSE_CONTROL_DIR`).
    pub env: Vec<(OsString, OsString)>,
    /// Removed from the inherited environment.
    pub env_remove: Vec<OsString>,
    /// Extra worker arguments, after the ones above (a later flag overrides).
    pub args: Vec<OsString>,
    /// A command prefix, e.g. `["unshare", "-fp", "setsid"]`; the control socket survives it.
    pub wrapper: Option<Vec<OsString>>,
    pub stdout: Output,
    pub stderr: Output,
    pub current_dir: Option<PathBuf>,
    /// Per-call timeout (also bounds the start-up handshake and [`Worker::wait`]).
    pub timeout: Duration,
}

impl WorkerConfig {
    /// `program` with the default entry path, no extra environment, inherited output.
    pub fn new(program: impl Into<PathBuf>) -> WorkerConfig {
        WorkerConfig {
            program: program.into(),
            entry: EntryPath::Dlsym,
            driver: None,
            env: Vec::new(),
            env_remove: Vec::new(),
            args: Vec::new(),
            wrapper: None,
            stdout: Output::Inherit,
            stderr: Output::Inherit,
            current_dir: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn entry(mut self, entry: EntryPath) -> WorkerConfig {
        self.entry = entry;
        self
    }

    pub fn driver(mut self, driver: impl Into<PathBuf>) -> WorkerConfig {
        self.driver = Some(driver.into());
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> WorkerConfig {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> WorkerConfig {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> WorkerConfig {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn wrapper<I, S>(mut self, prefix: I) -> WorkerConfig
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.wrapper = Some(prefix.into_iter().map(|s| s.as_ref().to_owned()).collect());
        self
    }

    pub fn stdout(mut self, o: Output) -> WorkerConfig {
        self.stdout = o;
        self
    }

    pub fn stderr(mut self, o: Output) -> WorkerConfig {
        self.stderr = o;
        self
    }

    pub fn timeout(mut self, t: Duration) -> WorkerConfig {
        self.timeout = t;
        self
    }
}

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
        message: format!("unexpected reply {reply:?}"),
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
        let mut w = Worker {
            child: Some(child),
            pid,
            sock: Some(ours),
            timeout: config.timeout,
            identity: WorkerIdentity {
                pid: 0,
                nspid: Vec::new(),
                ppid: 0,
            },
            init: None,
            status: None,
            unusable: None,
            in_flight: None,
        };
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

    // ---- typed helpers ----

    /// `Ping`: the worker's identity.
    pub fn ping(&mut self) -> Result<WorkerIdentity, WorkloadError> {
        expect_reply!(self, Command::Ping,
            Reply::Hello { pid, nspid, ppid } => WorkerIdentity { pid, nspid, ppid })
    }

    /// `Init { device }`.
    pub fn init(&mut self, device: i32) -> Result<InitInfo, WorkloadError> {
        let info = expect_reply!(self, Command::Init { device },
            Reply::Init { pid, nspid, device_count } => InitInfo { pid, nspid, device_count })?;
        self.init = Some(info.clone());
        Ok(info)
    }

    /// `SetDevice { device }`: the primary context made current.
    pub fn set_device(&mut self, device: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::SetDevice { device }, Reply::Context { ctx } => ctx)
    }

    pub fn driver_version(&mut self) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DriverVersion, Reply::Version { version } => version)
    }

    pub fn granularity(
        &mut self,
        device: i32,
        handle_types: u32,
        option: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Granularity { device, handle_types, option },
            Reply::Size { size } => size)
    }

    /// `cuMemCreate` of pinned device memory.
    pub fn create(
        &mut self,
        size: u64,
        device: i32,
        handle_types: u32,
    ) -> Result<u64, WorkloadError> {
        self.create_at(
            size,
            crate::cuda::LOCATION_TYPE_DEVICE,
            device,
            handle_types,
        )
    }

    /// `cuMemCreate` of pinned memory at a location of any type.
    pub fn create_at(
        &mut self,
        size: u64,
        location_type: u32,
        id: i32,
        handle_types: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Create { size, device: id, handle_types, location_type },
            Reply::Handle { handle } => handle)
    }

    pub fn release(&mut self, handle: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Release { handle }, Reply::Done => ())
    }

    /// `cuMemRetainAllocationHandle`.
    pub fn retain(&mut self, address: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Retain { address }, Reply::Handle { handle } => handle)
    }

    pub fn properties(&mut self, handle: u64) -> Result<AllocationProperties, WorkloadError> {
        expect_reply!(self, Command::Properties { handle }, Reply::Properties(p) => p)
    }

    /// `cuMemAddressReserve(size, 0, 0, 0)`.
    pub fn reserve(&mut self, size: u64) -> Result<u64, WorkloadError> {
        self.reserve_at(size, 0, 0)
    }

    /// `cuMemAddressReserve(size, alignment, hint, 0)`.
    pub fn reserve_at(
        &mut self,
        size: u64,
        alignment: u64,
        hint: u64,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Reserve { size, alignment, hint, flags: 0 },
            Reply::Address { address } => address)
    }

    pub fn free_address(&mut self, address: u64, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::FreeAddress { address, size }, Reply::Done => ())
    }

    pub fn map(
        &mut self,
        address: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Map { address, size, offset, handle }, Reply::Done => ())
    }

    pub fn unmap(&mut self, address: u64, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Unmap { address, size }, Reply::Done => ())
    }

    pub fn set_access(
        &mut self,
        address: u64,
        size: u64,
        grants: &[Grant],
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::SetAccess { address, size, grants: grants.to_vec() },
            Reply::Done => ())
    }

    /// Read-write access for `device`.
    pub fn grant_rw(&mut self, address: u64, size: u64, device: i32) -> Result<(), WorkloadError> {
        self.set_access(address, size, &[Grant::readwrite(device)])
    }

    /// `cuMemGetAccess` for device `device`.
    pub fn get_access(&mut self, address: u64, device: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::GetAccess { address, device, location_type: crate::cuda::LOCATION_TYPE_DEVICE },
            Reply::Access { flags } => flags)
    }

    /// Reserve, map the whole of `handle` (`size` bytes) and grant `device` read-write.
    pub fn map_rw(&mut self, handle: u64, size: u64, device: i32) -> Result<u64, WorkloadError> {
        let address = self.reserve(size)?;
        self.map(address, size, 0, handle)?;
        self.grant_rw(address, size, device)?;
        Ok(address)
    }

    /// `cuMemExportToShareableHandle` with any handle type.
    pub fn export_with(
        &mut self,
        handle: u64,
        handle_type: u32,
        keep: bool,
    ) -> Result<Exported, WorkloadError> {
        let cmd = Command::Export {
            handle,
            handle_type,
            keep,
            flags: 0,
        };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Exported { fd, shareable }, attached) => {
                if handle_type == crate::cuda::HANDLE_TYPE_POSIX_FD && attached.is_none() {
                    return Err(WorkloadError::Protocol {
                        pid: self.pid,
                        command: cmd.name(),
                        message: "a POSIX FD export arrived without a descriptor".to_owned(),
                    });
                }
                Ok(Exported {
                    fd: attached,
                    worker_fd: fd,
                    shareable,
                })
            }
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// Exports `handle` as a POSIX FD; the worker closes its copy.
    pub fn export(&mut self, handle: u64) -> Result<OwnedFd, WorkloadError> {
        let e = self.export_with(handle, crate::cuda::HANDLE_TYPE_POSIX_FD, false)?;
        Ok(e.fd.expect("checked by export_with"))
    }

    /// Exports `handle` as a POSIX FD and keeps the worker's copy open: (our copy, the
    /// number in the worker, for `pidfd_getfd`).
    pub fn export_kept(&mut self, handle: u64) -> Result<(OwnedFd, i32), WorkloadError> {
        let e = self.export_with(handle, crate::cuda::HANDLE_TYPE_POSIX_FD, true)?;
        let number = e.worker_fd.unwrap_or(-1);
        Ok((e.fd.expect("checked by export_with"), number))
    }

    /// Imports a POSIX FD sent along (the worker closes its received copy).
    pub fn import(&mut self, fd: BorrowedFd<'_>) -> Result<u64, WorkloadError> {
        let cmd = Command::Import {
            handle_type: crate::cuda::HANDLE_TYPE_POSIX_FD,
            fd: None,
            shareable: None,
            keep: false,
        };
        match self.call_with_fd(&cmd, Some(fd))? {
            (Reply::Imported { handle, .. }, _) => Ok(handle),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `Import` in full: returns (handle, the number the worker kept the FD under).
    pub fn import_with(
        &mut self,
        command: &Command,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(u64, Option<i32>), WorkloadError> {
        match self.call_with_fd(command, fd)? {
            (Reply::Imported { handle, fd }, _) => Ok((handle, fd)),
            (other, _) => Err(unexpected(self.pid, command, &other)),
        }
    }

    /// Takes descriptor `fd` of process `pid` with `pidfd_getfd` and imports it (POSIX FD).
    pub fn import_from_pid(&mut self, pid: i32, fd: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::ImportFromPid { pid, fd, handle_type: crate::cuda::HANDLE_TYPE_POSIX_FD },
            Reply::Imported { handle, .. } => handle)
    }

    /// `pidfd_getfd`: the number of the copy the worker now holds.
    pub fn pid_get_fd(&mut self, pid: i32, fd: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::PidGetFd { pid, fd }, Reply::Fd { fd } => fd)
    }

    pub fn close_fd(&mut self, fd: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::CloseFd { fd }, Reply::Done => ())
    }

    /// Keeps `fd` open in the worker without importing it: the number it has there.
    pub fn hold_fd(&mut self, fd: BorrowedFd<'_>) -> Result<i32, WorkloadError> {
        match self.call_with_fd(&Command::HoldFd, Some(fd))? {
            (Reply::Fd { fd }, _) => Ok(fd),
            (other, _) => Err(unexpected(self.pid, &Command::HoldFd, &other)),
        }
    }

    /// A copy of the worker's descriptor `fd`, sent back by `SCM_RIGHTS`; the worker closes
    /// its own when `close`.
    pub fn send_fd(&mut self, fd: i32, close: bool) -> Result<OwnedFd, WorkloadError> {
        let cmd = Command::SendFd { fd, close };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Fd { .. }, Some(copy)) => Ok(copy),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// Exports `handle` as a POSIX FD on a new thread of the worker (which first makes the
    /// worker's current context current there, if `context`); the worker closes its copy.
    pub fn proxy_export(&mut self, handle: u64, context: bool) -> Result<OwnedFd, WorkloadError> {
        let cmd = Command::ProxyExport { handle, context };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Exported { .. }, Some(fd)) => Ok(fd),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&mut self, attribute: i32, device: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DeviceAttribute { attribute, device },
            Reply::Attribute { value } => value)
    }

    /// `cuDevicePrimaryCtxReset_v2`.
    pub fn primary_ctx_reset(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::PrimaryCtxReset { device }, Reply::Done => ())
    }

    /// What fakecuda holds for the worker.
    pub fn driver_objects(&mut self) -> Result<DriverObjects, WorkloadError> {
        expect_reply!(self, Command::DriverObjects, Reply::DriverObjects(o) => o)
    }

    pub fn dup_fd(&mut self, fd: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DupFd { fd }, Reply::Fd { fd } => fd)
    }

    /// Connects to a worker started with `--listen PATH` (by someone else, e.g. inside a PID
    /// namespace), retrying until `timeout`. Dropping it closes the connection and leaves the
    /// worker running, waiting for the next client.
    pub fn connect(path: &std::path::Path, timeout: Duration) -> Result<Worker, WorkloadError> {
        let mut w = Worker {
            child: None,
            pid: 0,
            sock: None,
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
        };
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

    pub fn native_ipc_calls(&mut self) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::NativeIpcCalls, Reply::Count { count } => count)
    }

    pub fn open_fd_count(&mut self) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::OpenFdCount, Reply::Count { count } => count)
    }

    pub fn fd_targets(&mut self) -> Result<Vec<FdTarget>, WorkloadError> {
        expect_reply!(self, Command::FdTargets, Reply::FdTargets { fds } => fds)
    }

    /// Writes [`crate::pattern()`] for `seed`.
    pub fn fill(&mut self, address: u64, size: u64, seed: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Fill { address, size, seed }, Reply::Done => ())
    }

    /// Checks the range holds the pattern for `seed` (see [`WorkloadError::mismatch`]).
    pub fn verify(&mut self, address: u64, size: u64, seed: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Verify { address, size, seed }, Reply::Done => ())
    }

    pub fn read(&mut self, address: u64, size: u64) -> Result<Vec<u8>, WorkloadError> {
        expect_reply!(self, Command::Read { address, size }, Reply::Bytes { bytes } => bytes)
    }

    pub fn write(&mut self, address: u64, bytes: &[u8]) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Write { address, bytes: bytes.to_vec() }, Reply::Done => ())
    }

    /// FNV-1a of the range ([`crate::checksum`]).
    pub fn checksum(&mut self, address: u64, size: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Checksum { address, size },
            Reply::Checksum { checksum } => checksum)
    }

    pub fn memset(&mut self, address: u64, value: u8, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Memset { address, value, size }, Reply::Done => ())
    }

    /// `cuMemAlloc_v2`.
    pub fn mem_alloc(&mut self, size: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::MemAlloc { size }, Reply::Address { address } => address)
    }

    pub fn mem_free(&mut self, dptr: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::MemFree { dptr }, Reply::Done => ())
    }

    /// `cuMemGetAddressRange_v2`: (base, size).
    pub fn address_range(&mut self, dptr: u64) -> Result<(u64, u64), WorkloadError> {
        expect_reply!(self, Command::AddressRange { dptr }, Reply::Range { base, size } => (base, size))
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get(&mut self, dptr: u64) -> Result<[u8; 64], WorkloadError> {
        let cmd = Command::IpcGet { dptr };
        match self.call(&cmd)? {
            Reply::IpcHandle { handle } => {
                handle
                    .as_slice()
                    .try_into()
                    .map_err(|_| WorkloadError::Protocol {
                        pid: self.pid,
                        command: cmd.name(),
                        message: format!("an IPC handle of {} bytes", handle.len()),
                    })
            }
            other => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
    pub fn ipc_open(&mut self, handle: &[u8; 64]) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::IpcOpen { handle: handle.to_vec(), flags: crate::cuda::IPC_MEM_LAZY_ENABLE_PEER_ACCESS },
            Reply::Address { address } => address)
    }

    pub fn ipc_close(&mut self, dptr: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::IpcClose { dptr }, Reply::Done => ())
    }

    pub fn mc_granularity(
        &mut self,
        device_count: u32,
        size: u64,
        handle_types: u64,
        option: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::McGranularity { device_count, size, handle_types, option },
            Reply::Size { size } => size)
    }

    pub fn mc_create(
        &mut self,
        device_count: u32,
        size: u64,
        handle_types: u64,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::McCreate { device_count, size, handle_types, flags: 0 },
            Reply::Handle { handle } => handle)
    }

    pub fn mc_add_device(&mut self, handle: u64, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::McAddDevice { handle, device }, Reply::Done => ())
    }

    /// `cuMulticastBindMem` (`device: None`) or `cuMulticastBindMem_v2`.
    pub fn mc_bind_mem(
        &mut self,
        mc: u64,
        mc_offset: u64,
        mem_handle: u64,
        mem_offset: u64,
        size: u64,
        device: Option<i32>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self,
            Command::McBindMem { mc, mc_offset, mem_handle, mem_offset, size, flags: 0, device },
            Reply::Done => ())
    }

    /// `cuMulticastBindAddr` (`device: None`) or `cuMulticastBindAddr_v2`.
    pub fn mc_bind_addr(
        &mut self,
        mc: u64,
        mc_offset: u64,
        address: u64,
        size: u64,
        device: Option<i32>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self,
            Command::McBindAddr { mc, mc_offset, address, size, flags: 0, device },
            Reply::Done => ())
    }

    pub fn mc_unbind(
        &mut self,
        mc: u64,
        device: i32,
        mc_offset: u64,
        size: u64,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::McUnbind { mc, device, mc_offset, size }, Reply::Done => ())
    }

    pub fn ctx_create(&mut self, device: i32, flags: u32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::CtxCreate { device, flags }, Reply::Context { ctx } => ctx)
    }

    pub fn ctx_destroy(&mut self, ctx: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::CtxDestroy { ctx }, Reply::Done => ())
    }

    pub fn primary_ctx_release(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::PrimaryCtxRelease { device }, Reply::Done => ())
    }

    /// Maps and registers `size` bytes of host memory: its address.
    pub fn host_register(&mut self, size: u64, flags: u32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::HostRegister { size, flags }, Reply::Address { address } => address)
    }

    pub fn host_unregister(&mut self, address: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::HostUnregister { address }, Reply::Done => ())
    }

    /// Where the worker's entry path finds `name`.
    pub fn resolve(&mut self, name: &str) -> Result<Resolved, WorkloadError> {
        expect_reply!(self, Command::Resolve { name: name.to_owned() },
            Reply::Resolved { address, library, symbol } => Resolved { address, library, symbol })
    }

    pub fn synchronize(&mut self) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Synchronize, Reply::Done => ())
    }

    /// Starts traffic threads (see [`Command::TrafficStart`]).
    pub fn traffic_start(
        &mut self,
        device: i32,
        threads: Vec<crate::proto::TrafficThread>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::TrafficStart { device, threads }, Reply::Done => ())
    }

    /// Stops the traffic threads: what each saw.
    pub fn traffic_stop(&mut self) -> Result<Vec<crate::proto::TrafficReport>, WorkloadError> {
        expect_reply!(self, Command::TrafficStop, Reply::Traffic { threads } => threads)
    }

    /// A `cuStreamSynchronize(0)` on a thread of its own, not waited for.
    pub fn synchronize_in_thread(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::SynchronizeInThread { device }, Reply::Done => ())
    }

    /// Whether the reply to the command [`Worker::send`] sent arrives within `within` (it is
    /// left for [`Worker::receive`]).
    pub fn reply_ready(&self, within: Duration) -> bool {
        let Some(sock) = self.sock.as_ref() else {
            return true;
        };
        let mut fds = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(within.as_millis()).unwrap_or(u16::MAX);
        matches!(nix::poll::poll(&mut fds, ms), Ok(n) if n > 0)
    }

    pub fn sleep(&mut self, ms: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Sleep { ms }, Reply::Done => ())
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
