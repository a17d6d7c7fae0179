//! Command execution inside the worker.

use super::driver::{DriverLibrary, dladdr};
use super::failure;
use crate::cuda::{
    self, RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMulticastProp,
};
use crate::entry::EntryPath;
use crate::pattern;
use crate::proto::{
    AllocationProperties, COPY_CHUNK, Command, DriverObjects, ErrorReply, FdTarget, Group,
    MAX_TRANSFER, Reply, Response,
};
use nix::errno::Errno;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

mod data;
mod memory;
mod objects;

/// A descriptor to attach to the reply; `keep`: the worker keeps it open after sending.
#[derive(Debug)]
pub struct Attach {
    pub fd: OwnedFd,
    pub keep: bool,
}

type Outcome = Result<(Reply, Option<Attach>), ErrorReply>;

/// The worker's state between commands.
#[derive(Debug)]
pub struct State {
    entry: EntryPath,
    library: PathBuf,
    driver: Option<DriverLibrary>,
    /// Host memory `HostRegister` mapped: address → length.
    host_regions: HashMap<u64, usize>,
    traffic: Option<super::traffic::Traffic>,
}

fn usize_of(v: u64, what: &str) -> Result<usize, ErrorReply> {
    usize::try_from(v).map_err(|_| failure::request(format!("{what} {v} does not fit a size_t")))
}

fn ptr_of(v: u64) -> *mut c_void {
    v as usize as *mut c_void
}

/// (`getpid()`, the `NSpid:` line of /proc/self/status).
fn pids() -> (i32, Vec<i32>) {
    let pid = std::process::id() as i32;
    let nspid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|v| {
                v.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_else(|| vec![pid]);
    (pid, nspid)
}

/// The numbers of this process's open descriptors, without the one used to list them.
fn open_fds() -> Result<Vec<RawFd>, ErrorReply> {
    let names: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| {
            failure::errno(
                "read_dir(/proc/self/fd)",
                Errno::from_raw(e.raw_os_error().unwrap_or(0)),
            )
        })?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is closed now: keep only numbers still open.
    Ok(names
        .into_iter()
        .filter(|fd| {
            // SAFETY: F_GETFD on any number only reports whether it is open.
            (unsafe { libc::fcntl(*fd, libc::F_GETFD) }) >= 0
        })
        .collect())
}

fn pidfd_getfd(pid: i32, fd: i32) -> Result<OwnedFd, ErrorReply> {
    // SAFETY: pidfd_open(pid, 0) takes integers and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(failure::errno(&format!("pidfd_open({pid})"), Errno::last()));
    }
    // SAFETY: pidfd_open just returned this new descriptor; nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd(pidfd, fd, 0) takes integers and returns a new descriptor
    // (close-on-exec) or -1.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(failure::errno(
            &format!("pidfd_getfd(pid {pid}, fd {fd})"),
            Errno::last(),
        ));
    }
    // SAFETY: pidfd_getfd just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

/// A fakecuda test hook by name: from the global scope, else from the loaded driver; a driver
/// without it is no fakecuda.
fn fakecuda_symbol(name: &std::ffi::CStr) -> Result<*mut c_void, ErrorReply> {
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    let mut p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        // SAFETY: NOLOAD finds the already-loaded driver without loading anything.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        // SAFETY: a live handle (or null, which dlsym treats as RTLD_DEFAULT).
        p = unsafe { libc::dlsym(h, name.as_ptr()) };
    }
    if p.is_null() {
        return Err(failure::unresolved(
            &name.to_string_lossy(),
            -1,
            "not a fakecuda driver".into(),
        ));
    }
    Ok(p)
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}

/// A descriptor the driver exported: checked open, then sent with the reply (and kept here
/// too when `keep`).
fn exported_fd(raw: RawFd, keep: bool) -> Outcome {
    // SAFETY: F_GETFD only checks that the driver returned an open descriptor.
    if raw < 0 || unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
        return Err(failure::request(format!(
            "cuMemExportToShareableHandle returned success but fd {raw} is not open"
        )));
    }
    // SAFETY: the driver returned a new descriptor the caller owns (cuda.h).
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok((
        Reply::Exported {
            fd: Some(raw),
            shareable: None,
        },
        Some(Attach { fd, keep }),
    ))
}

fn done() -> Outcome {
    Ok((Reply::Done, None))
}

/// Replies with the size a driver query writes to its out-parameter.
fn size_reply(query: impl FnOnce(&mut usize) -> Result<(), ErrorReply>) -> Outcome {
    let mut size = 0usize;
    query(&mut size)?;
    reply(Reply::Size { size: size as u64 })
}

fn reply(r: Reply) -> Outcome {
    Ok((r, None))
}

impl State {
    pub fn new(entry: EntryPath, library: PathBuf) -> State {
        State {
            entry,
            library,
            driver: None,
            host_regions: HashMap::new(),
            traffic: None,
        }
    }

    /// The driver, opened on first use.
    fn driver(&mut self) -> Result<&DriverLibrary, ErrorReply> {
        if self.driver.is_none() {
            self.driver = Some(DriverLibrary::open(&self.entry, &self.library)?);
        }
        Ok(self.driver.as_ref().expect("just opened"))
    }

    /// `ProxyExport`: the export runs on a thread of its own, as on NCCL's proxy thread.
    fn proxy_export(&mut self, handle: u64, context: bool) -> Outcome {
        type Export = unsafe extern "C" fn(*mut c_void, u64, u32, u64) -> u32;
        type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
        let d = self.driver()?;
        // Resolved here: the driver object is not shared with the thread, its pointers are.
        let export = d.function(
            "cuMemExportToShareableHandle",
            "cuMemExportToShareableHandle",
        )? as usize;
        let current = if context {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-parameter.
            unsafe { d.ctx_get_current(&mut ctx)? };
            Some((
                ctx as usize,
                d.function("cuCtxSetCurrent", "cuCtxSetCurrent")? as usize,
            ))
        } else {
            None
        };
        let worker = std::thread::Builder::new()
            .name("proxy".into())
            .spawn(move || -> Result<RawFd, (&'static str, u32)> {
                // SAFETY: each pointer is the driver's entry point of that name, whose cuda.h
                // prototype is the type it is cast to; the context came from the driver; the
                // out-parameter is a valid local.
                unsafe {
                    if let Some((ctx, set)) = current {
                        let set = std::mem::transmute::<usize, SetCurrent>(set);
                        let r = set(ctx as *mut c_void);
                        if r != cuda::SUCCESS {
                            return Err(("cuCtxSetCurrent", r));
                        }
                    }
                    let export = std::mem::transmute::<usize, Export>(export);
                    let mut fd: c_int = -1;
                    let r = export(
                        (&mut fd as *mut c_int).cast(),
                        handle,
                        cuda::HANDLE_TYPE_POSIX_FD,
                        0,
                    );
                    if r != cuda::SUCCESS {
                        return Err(("cuMemExportToShareableHandle", r));
                    }
                    Ok(fd)
                }
            })
            .map_err(|e| {
                failure::errno(
                    "spawning the proxy thread",
                    Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                )
            })?;
        let raw = match worker.join() {
            Ok(Ok(fd)) => fd,
            Ok(Err((function, code))) => return Err(failure::cuda(function, code)),
            Err(p) => return Err(failure::panic(panic_text(p.as_ref()))),
        };
        exported_fd(raw, false)
    }

    /// Runs `cmd`, turning a panic into an error reply.
    pub fn run_guarded(&mut self, cmd: Command, fd: Option<OwnedFd>) -> (Response, Option<Attach>) {
        let (answers, kind, reply_name) = (cmd.answers(), cmd.kind(), cmd.reply_name());
        match catch_unwind(AssertUnwindSafe(|| self.run(cmd, fd))) {
            Ok(Ok((r, _))) if !answers(&r) => {
                let found: String = format!("{r:?}").chars().take(120).collect();
                let message = format!(
                    "{kind} answered {found}, not the {reply_name} its table entry names (a \
                     worker bug)"
                );
                (Err(failure::request(message)), None)
            }
            Ok(Ok((r, a))) => (Ok(r), a),
            Ok(Err(e)) => (Err(e), None),
            Err(p) => (Err(failure::panic(panic_text(p.as_ref()))), None),
        }
    }

    fn run(&mut self, cmd: Command, fd: Option<OwnedFd>) -> Outcome {
        // Only Import uses an attached descriptor; any other is closed when `fd` drops.
        match cmd.group() {
            Group::Memory => self.run_memory(cmd, fd),
            Group::Data => self.run_data(cmd),
            Group::Objects => self.run_objects(cmd),
        }
    }
}
