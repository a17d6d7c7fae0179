//! Command execution inside the worker.

use super::driver::{Driver, dladdr};
use super::failure;
use crate::cuda::{
    self, RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMulticastProp,
};
use crate::entry::EntryPath;
use crate::pattern;
use crate::proto::{
    AllocationProperties, COPY_CHUNK, Command, DriverObjects, ErrorReply, FdTarget, MAX_TRANSFER,
    Reply, Response,
};
use nix::errno::Errno;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;

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
    driver: Option<Driver>,
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

/// A fakecuda test hook by name: from the global scope, else from the loaded driver.
fn fakecuda_symbol(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: NOLOAD finds the already-loaded driver without loading anything.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    // SAFETY: a live handle (or null, which dlsym treats as RTLD_DEFAULT).
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}

fn done() -> Outcome {
    Ok((Reply::Done, None))
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
    fn driver(&mut self) -> Result<&Driver, ErrorReply> {
        if self.driver.is_none() {
            self.driver = Some(Driver::open(&self.entry, &self.library)?);
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
            Some(Attach { fd, keep: false }),
        ))
    }

    /// Runs `cmd`, turning a panic into an error reply.
    pub fn run_guarded(&mut self, cmd: Command, fd: Option<OwnedFd>) -> (Response, Option<Attach>) {
        match catch_unwind(AssertUnwindSafe(|| self.run(cmd, fd))) {
            Ok(Ok((r, a))) => (Ok(r), a),
            Ok(Err(e)) => (Err(e), None),
            Err(p) => (Err(failure::panic(panic_text(p.as_ref()))), None),
        }
    }

    fn run(&mut self, cmd: Command, fd: Option<OwnedFd>) -> Outcome {
        // Only Import uses an attached descriptor; any other is closed when `fd` drops.
        match cmd {
            Command::Ping => {
                let (pid, nspid) = pids();
                reply(Reply::Hello {
                    pid,
                    nspid,
                    // SAFETY: getppid has no preconditions.
                    ppid: unsafe { libc::getppid() },
                })
            }
            Command::Init { device } => {
                let d = self.driver()?;
                let mut count: c_int = 0;
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: cuInit takes flags only; the out-parameters are valid locals.
                unsafe {
                    d.init(0)?;
                    d.device_get_count(&mut count)?;
                    d.primary_ctx_retain(&mut ctx, device)?;
                    d.ctx_set_current(ctx)?;
                }
                let (pid, nspid) = pids();
                reply(Reply::Init {
                    pid,
                    nspid,
                    device_count: count,
                })
            }
            Command::SetDevice { device } => {
                let d = self.driver()?;
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: `ctx` is a valid out-parameter; the context comes from the driver.
                unsafe {
                    d.primary_ctx_retain(&mut ctx, device)?;
                    d.ctx_set_current(ctx)?;
                }
                reply(Reply::Context {
                    ctx: ctx as usize as u64,
                })
            }
            Command::DriverVersion => {
                let mut v: c_int = 0;
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.driver_get_version(&mut v)? };
                reply(Reply::Version { version: v })
            }
            Command::Granularity {
                device,
                handle_types,
                option,
            } => {
                let prop = RawAllocProp::pinned(cuda::LOCATION_TYPE_DEVICE, device, handle_types);
                let mut g = 0usize;
                // SAFETY: valid property input and out-parameter.
                unsafe {
                    self.driver()?
                        .mem_get_allocation_granularity(&mut g, &prop, option)?
                };
                reply(Reply::Size { size: g as u64 })
            }
            Command::Create {
                size,
                device,
                handle_types,
                location_type,
            } => {
                let prop = RawAllocProp::pinned(location_type, device, handle_types);
                let size = usize_of(size, "size")?;
                let mut h = 0u64;
                // SAFETY: valid property input and out-parameter.
                unsafe { self.driver()?.mem_create(&mut h, size, &prop, 0)? };
                reply(Reply::Handle { handle: h })
            }
            Command::Release { handle } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_release(handle)? };
                done()
            }
            Command::Retain { address } => {
                let mut h = 0u64;
                // SAFETY: valid out-parameter; the address is only looked up.
                unsafe {
                    self.driver()?
                        .mem_retain_allocation_handle(&mut h, ptr_of(address))?
                };
                reply(Reply::Handle { handle: h })
            }
            Command::Properties { handle } => {
                let mut p = RawAllocProp::zeroed();
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .mem_get_allocation_properties(&mut p, handle)?
                };
                let f = p.alloc_flags;
                reply(Reply::Properties(AllocationProperties {
                    allocation_type: p.type_,
                    requested_handle_types: p.requested_handle_types,
                    location_type: p.location.type_,
                    location_id: p.location.id,
                    win32_handle_meta_data: p.win32_handle_meta_data as usize as u64,
                    compression_type: f[0],
                    gpu_direct_rdma_capable: f[1],
                    usage: u16::from_ne_bytes([f[2], f[3]]),
                }))
            }
            Command::Reserve {
                size,
                alignment,
                hint,
                flags,
            } => {
                let mut p = 0u64;
                let (size, alignment) =
                    (usize_of(size, "size")?, usize_of(alignment, "alignment")?);
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .mem_address_reserve(&mut p, size, alignment, hint, flags)?
                };
                reply(Reply::Address { address: p })
            }
            Command::FreeAddress { address, size } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_address_free(address, size)? };
                done()
            }
            Command::Map {
                address,
                size,
                offset,
                handle,
            } => {
                let (size, offset) = (usize_of(size, "size")?, usize_of(offset, "offset")?);
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_map(address, size, offset, handle, 0)? };
                done()
            }
            Command::Unmap { address, size } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_unmap(address, size)? };
                done()
            }
            Command::SetAccess {
                address,
                size,
                grants,
            } => {
                let descs: Vec<RawAccessDesc> = grants
                    .iter()
                    .map(|g| RawAccessDesc {
                        location: RawLocation {
                            type_: g.location_type,
                            id: g.id,
                        },
                        flags: g.flags,
                    })
                    .collect();
                let size = usize_of(size, "size")?;
                let ptr = if descs.is_empty() {
                    std::ptr::null()
                } else {
                    descs.as_ptr()
                };
                // SAFETY: `ptr` points at `descs.len()` descriptors (or is null for none).
                unsafe {
                    self.driver()?
                        .mem_set_access(address, size, ptr, descs.len())?
                };
                done()
            }
            Command::GetAccess {
                address,
                device,
                location_type,
            } => {
                let loc = RawLocation {
                    type_: location_type,
                    id: device,
                };
                let mut flags = 0u64;
                // SAFETY: valid location input and out-parameter.
                unsafe { self.driver()?.mem_get_access(&mut flags, &loc, address)? };
                reply(Reply::Access { flags })
            }
            Command::Export {
                handle,
                handle_type,
                keep,
                flags,
            } => {
                // Room for any shareable handle (an int, or a 64-byte fabric handle), aligned.
                let mut buf = [0u64; 8];
                // SAFETY: `buf` is 64 writable, aligned bytes: enough for every handle type.
                unsafe {
                    self.driver()?.mem_export(
                        buf.as_mut_ptr().cast(),
                        handle,
                        handle_type,
                        flags,
                    )?
                };
                let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                if handle_type == cuda::HANDLE_TYPE_POSIX_FD {
                    let raw = i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
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
                } else {
                    reply(Reply::Exported {
                        fd: None,
                        shareable: Some(bytes),
                    })
                }
            }
            Command::Import {
                handle_type,
                fd: number,
                shareable,
                keep,
            } => {
                let mut h = 0u64;
                let mut bytes = [0u8; 64];
                let os_handle: *mut c_void = match (&fd, number, &shareable) {
                    (Some(f), _, _) => f.as_raw_fd() as usize as *mut c_void,
                    (None, Some(n), _) => n as usize as *mut c_void,
                    (None, None, Some(s)) => {
                        if s.len() > bytes.len() {
                            return Err(failure::request("shareable handle over 64 bytes"));
                        }
                        bytes[..s.len()].copy_from_slice(s);
                        bytes.as_mut_ptr().cast()
                    }
                    (None, None, None) => {
                        return Err(failure::request(
                            "import needs an attached descriptor, an fd number or shareable bytes",
                        ));
                    }
                };
                // SAFETY: a POSIX FD travels as the pointer's value; other types point at
                // `bytes`, which outlives the call.
                unsafe { self.driver()?.mem_import(&mut h, os_handle, handle_type)? };
                let kept = match fd {
                    Some(f) if keep => Some(f.into_raw_fd()),
                    _ => None,
                };
                reply(Reply::Imported {
                    handle: h,
                    fd: kept,
                })
            }
            Command::ImportFromPid {
                pid,
                fd,
                handle_type,
            } => {
                let got = pidfd_getfd(pid, fd)?;
                let mut h = 0u64;
                // SAFETY: a POSIX FD travels as the pointer's value; `got` stays open for the
                // call.
                unsafe {
                    self.driver()?.mem_import(
                        &mut h,
                        got.as_raw_fd() as usize as *mut c_void,
                        handle_type,
                    )?
                };
                reply(Reply::Imported {
                    handle: h,
                    fd: None,
                })
            }
            Command::PidGetFd { pid, fd } => {
                let got = pidfd_getfd(pid, fd)?;
                reply(Reply::Fd {
                    fd: got.into_raw_fd(),
                })
            }
            Command::CloseFd { fd } => {
                // SAFETY: closing a number the driving side names; the worker holds no Rust
                // owner for descriptors it reports (kept exports/imports, PidGetFd, DupFd).
                if unsafe { libc::close(fd) } != 0 {
                    return Err(failure::errno(&format!("close({fd})"), Errno::last()));
                }
                done()
            }
            Command::HoldFd => {
                let Some(fd) = fd else {
                    return Err(failure::request("hold_fd needs an attached descriptor"));
                };
                reply(Reply::Fd {
                    fd: fd.into_raw_fd(),
                })
            }
            Command::SendFd { fd: number, close } => {
                // SAFETY: F_DUPFD_CLOEXEC on any number returns a new descriptor or -1.
                let copy = unsafe { libc::fcntl(number, libc::F_DUPFD_CLOEXEC, 0) };
                if copy < 0 {
                    return Err(failure::errno(&format!("dup({number})"), Errno::last()));
                }
                // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
                let copy = unsafe { OwnedFd::from_raw_fd(copy) };
                // SAFETY: closing a number the driving side names and gave up (see CloseFd).
                if close && unsafe { libc::close(number) } != 0 {
                    return Err(failure::errno(&format!("close({number})"), Errno::last()));
                }
                Ok((
                    Reply::Fd { fd: number },
                    Some(Attach {
                        fd: copy,
                        keep: false,
                    }),
                ))
            }
            Command::ProxyExport { handle, context } => self.proxy_export(handle, context),
            Command::DeviceAttribute { attribute, device } => {
                let mut value: c_int = 0;
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .device_get_attribute(&mut value, attribute, device)?
                };
                reply(Reply::Attribute { value })
            }
            Command::PrimaryCtxReset { device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.primary_ctx_reset(device)? };
                done()
            }
            Command::DriverObjects => {
                #[repr(C)]
                #[derive(Default)]
                struct Objects {
                    allocations: u64,
                    mappings: u64,
                    reservations: u64,
                    multicast_objects: u64,
                    ipc_opened: u64,
                }
                let p = fakecuda_symbol(c"fakecuda_objects");
                if p.is_null() {
                    return Err(failure::unresolved(
                        "fakecuda_objects",
                        -1,
                        "not a fakecuda driver".into(),
                    ));
                }
                let mut o = Objects::default();
                // SAFETY: fakecuda exports `CUresult fakecuda_objects(FakecudaObjects *)`, whose
                // layout `Objects` repeats; `o` is a valid out-parameter.
                let r = unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Objects) -> u32>(p)(
                        &mut o,
                    )
                };
                if r != cuda::SUCCESS {
                    return Err(failure::cuda("fakecuda_objects", r));
                }
                reply(Reply::DriverObjects(DriverObjects {
                    allocations: o.allocations,
                    mappings: o.mappings,
                    reservations: o.reservations,
                    multicast_objects: o.multicast_objects,
                    ipc_opened: o.ipc_opened,
                }))
            }
            Command::DupFd { fd } => {
                // SAFETY: F_DUPFD_CLOEXEC on any number returns a new descriptor or -1.
                let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                if n < 0 {
                    return Err(failure::errno(&format!("dup({fd})"), Errno::last()));
                }
                reply(Reply::Fd { fd: n })
            }
            Command::NativeIpcCalls => {
                let p = fakecuda_symbol(c"fakecuda_native_ipc_calls");
                if p.is_null() {
                    return Err(failure::unresolved(
                        "fakecuda_native_ipc_calls",
                        -1,
                        "not a fakecuda driver".into(),
                    ));
                }
                // SAFETY: fakecuda exports `uint64_t fakecuda_native_ipc_calls(void)`.
                let count = unsafe {
                    std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn() -> u64>(p)()
                };
                reply(Reply::Count { count })
            }
            Command::OpenFdCount => reply(Reply::Count {
                count: open_fds()?.len() as u64,
            }),
            Command::FdTargets => {
                let fds = open_fds()?
                    .into_iter()
                    .map(|fd| FdTarget {
                        fd,
                        target: std::fs::read_link(format!("/proc/self/fd/{fd}"))
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|e| format!("<{e}>")),
                    })
                    .collect();
                reply(Reply::FdTargets { fds })
            }
            Command::Fill {
                address,
                size,
                seed,
            } => {
                let d = self.driver()?;
                let mut buf = vec![0u8; size.min(COPY_CHUNK) as usize];
                let mut at = 0u64;
                while at < size {
                    let n = (size - at).min(COPY_CHUNK) as usize;
                    pattern::fill_pattern(seed, at, &mut buf[..n]);
                    // SAFETY: `buf` holds `n` readable bytes.
                    unsafe { d.memcpy_htod(address + at, buf.as_ptr().cast(), n)? };
                    at += n as u64;
                }
                done()
            }
            Command::Verify {
                address,
                size,
                seed,
            } => {
                let d = self.driver()?;
                let mut buf = vec![0u8; size.min(COPY_CHUNK) as usize];
                let mut at = 0u64;
                while at < size {
                    let n = (size - at).min(COPY_CHUNK) as usize;
                    // SAFETY: `buf` holds `n` writable bytes.
                    unsafe { d.memcpy_dtoh(buf.as_mut_ptr().cast(), address + at, n)? };
                    if let Some((off, want, found)) = pattern::first_mismatch(seed, at, &buf[..n]) {
                        return Err(failure::mismatch(address, at + off, want, found));
                    }
                    at += n as u64;
                }
                done()
            }
            Command::Read { address, size } => {
                if size > MAX_TRANSFER {
                    return Err(failure::request(format!(
                        "read of {size} bytes exceeds the {MAX_TRANSFER}-byte limit"
                    )));
                }
                let mut buf = vec![0u8; size as usize];
                // SAFETY: `buf` holds `size` writable bytes.
                unsafe {
                    self.driver()?
                        .memcpy_dtoh(buf.as_mut_ptr().cast(), address, buf.len())?
                };
                reply(Reply::Bytes { bytes: buf })
            }
            Command::Write { address, bytes } => {
                if bytes.len() as u64 > MAX_TRANSFER {
                    return Err(failure::request(format!(
                        "write of {} bytes exceeds the {MAX_TRANSFER}-byte limit",
                        bytes.len()
                    )));
                }
                // SAFETY: `bytes` holds `bytes.len()` readable bytes.
                unsafe {
                    self.driver()?
                        .memcpy_htod(address, bytes.as_ptr().cast(), bytes.len())?
                };
                done()
            }
            Command::Checksum { address, size } => {
                let d = self.driver()?;
                let mut buf = vec![0u8; size.min(COPY_CHUNK) as usize];
                let mut h = pattern::Fnv1a::new();
                let mut at = 0u64;
                while at < size {
                    let n = (size - at).min(COPY_CHUNK) as usize;
                    // SAFETY: `buf` holds `n` writable bytes.
                    unsafe { d.memcpy_dtoh(buf.as_mut_ptr().cast(), address + at, n)? };
                    h.update(&buf[..n]);
                    at += n as u64;
                }
                reply(Reply::Checksum {
                    checksum: h.finish(),
                })
            }
            Command::Memset {
                address,
                value,
                size,
            } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.memset_d8(address, value, size)? };
                done()
            }
            Command::MemAlloc { size } => {
                let size = usize_of(size, "size")?;
                let mut p = 0u64;
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.mem_alloc(&mut p, size)? };
                reply(Reply::Address { address: p })
            }
            Command::MemFree { dptr } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_free(dptr)? };
                done()
            }
            Command::AddressRange { dptr } => {
                let (mut base, mut size) = (0u64, 0usize);
                // SAFETY: valid out-parameters.
                unsafe {
                    self.driver()?
                        .mem_get_address_range(&mut base, &mut size, dptr)?
                };
                reply(Reply::Range {
                    base,
                    size: size as u64,
                })
            }
            Command::IpcGet { dptr } => {
                let mut h = RawIpcMemHandle { reserved: [0; 64] };
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.ipc_get_mem_handle(&mut h, dptr)? };
                reply(Reply::IpcHandle {
                    handle: h.reserved.to_vec(),
                })
            }
            Command::IpcOpen { handle, flags } => {
                let reserved: [u8; 64] = handle.as_slice().try_into().map_err(|_| {
                    failure::request(format!("an IPC handle is 64 bytes, not {}", handle.len()))
                })?;
                let mut p = 0u64;
                // SAFETY: valid out-parameter; the handle is passed by value.
                unsafe {
                    self.driver()?.ipc_open_mem_handle(
                        &mut p,
                        RawIpcMemHandle { reserved },
                        flags,
                    )?
                };
                reply(Reply::Address { address: p })
            }
            Command::IpcClose { dptr } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.ipc_close_mem_handle(dptr)? };
                done()
            }
            Command::McGranularity {
                device_count,
                size,
                handle_types,
                option,
            } => {
                let prop = RawMulticastProp {
                    num_devices: device_count,
                    size: usize_of(size, "size")?,
                    handle_types,
                    flags: 0,
                };
                let mut g = 0usize;
                // SAFETY: valid property input and out-parameter.
                unsafe {
                    self.driver()?
                        .multicast_get_granularity(&mut g, &prop, option)?
                };
                reply(Reply::Size { size: g as u64 })
            }
            Command::McCreate {
                device_count,
                size,
                handle_types,
                flags,
            } => {
                let prop = RawMulticastProp {
                    num_devices: device_count,
                    size: usize_of(size, "size")?,
                    handle_types,
                    flags,
                };
                let mut h = 0u64;
                // SAFETY: valid property input and out-parameter.
                unsafe { self.driver()?.multicast_create(&mut h, &prop)? };
                reply(Reply::Handle { handle: h })
            }
            Command::McAddDevice { handle, device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.multicast_add_device(handle, device)? };
                done()
            }
            Command::McBindMem {
                mc,
                mc_offset,
                mem_handle,
                mem_offset,
                size,
                flags,
                device,
            } => {
                let (mc_offset, mem_offset, size) = (
                    usize_of(mc_offset, "mc_offset")?,
                    usize_of(mem_offset, "mem_offset")?,
                    usize_of(size, "size")?,
                );
                let d = self.driver()?;
                // SAFETY: integers only.
                unsafe {
                    match device {
                        None => d.multicast_bind_mem(
                            mc, mc_offset, mem_handle, mem_offset, size, flags,
                        )?,
                        Some(dev) => d.multicast_bind_mem_v2(
                            mc, dev, mc_offset, mem_handle, mem_offset, size, flags,
                        )?,
                    }
                };
                done()
            }
            Command::McBindAddr {
                mc,
                mc_offset,
                address,
                size,
                flags,
                device,
            } => {
                let (mc_offset, size) =
                    (usize_of(mc_offset, "mc_offset")?, usize_of(size, "size")?);
                let d = self.driver()?;
                // SAFETY: integers only.
                unsafe {
                    match device {
                        None => d.multicast_bind_addr(mc, mc_offset, address, size, flags)?,
                        Some(dev) => {
                            d.multicast_bind_addr_v2(mc, dev, mc_offset, address, size, flags)?
                        }
                    }
                };
                done()
            }
            Command::McUnbind {
                mc,
                device,
                mc_offset,
                size,
            } => {
                let (mc_offset, size) =
                    (usize_of(mc_offset, "mc_offset")?, usize_of(size, "size")?);
                // SAFETY: integers only.
                unsafe {
                    self.driver()?
                        .multicast_unbind(mc, device, mc_offset, size)?
                };
                done()
            }
            Command::CtxCreate { device, flags } => {
                let d = self.driver()?;
                let v = d.ctx_create_version();
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: valid out-parameter; no creation parameters (null, 0).
                unsafe {
                    if v >= 12050 {
                        d.ctx_create_v4(&mut ctx, std::ptr::null_mut(), flags, device)?;
                    } else if v >= 11040 {
                        d.ctx_create_v3(&mut ctx, std::ptr::null_mut(), 0, flags, device)?;
                    } else {
                        d.ctx_create_v2(&mut ctx, flags, device)?;
                    }
                }
                reply(Reply::Context {
                    ctx: ctx as usize as u64,
                })
            }
            Command::CtxDestroy { ctx } => {
                // SAFETY: the context value comes from the driver (CtxCreate); the driver
                // validates it.
                unsafe { self.driver()?.ctx_destroy(ptr_of(ctx))? };
                done()
            }
            Command::PrimaryCtxRelease { device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.primary_ctx_release(device)? };
                done()
            }
            Command::HostRegister { size, flags } => {
                let len = usize_of(size, "size")?;
                if len == 0 {
                    return Err(failure::request("host register of 0 bytes"));
                }
                self.driver()?;
                // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(failure::errno("mmap", Errno::last()));
                }
                // SAFETY: `p..p+len` is the mapping just made.
                if let Err(e) = unsafe { self.driver()?.mem_host_register(p, len, flags) } {
                    // SAFETY: unmapping the mapping just made, which nothing else uses.
                    unsafe { libc::munmap(p, len) };
                    return Err(e);
                }
                self.host_regions.insert(p as usize as u64, len);
                reply(Reply::Address {
                    address: p as usize as u64,
                })
            }
            Command::HostUnregister { address } => {
                // SAFETY: the driver validates the address.
                unsafe { self.driver()?.mem_host_unregister(ptr_of(address))? };
                if let Some(len) = self.host_regions.remove(&address) {
                    // SAFETY: HostRegister mapped exactly this range, now unregistered.
                    unsafe { libc::munmap(ptr_of(address), len) };
                }
                done()
            }
            Command::Resolve { name } => {
                let p = self
                    .driver()?
                    .lookup(&name)
                    .map_err(|(code, msg)| failure::unresolved(&name, code, msg))?;
                let (library, symbol) = dladdr(p);
                reply(Reply::Resolved {
                    address: p as usize as u64,
                    library,
                    symbol,
                })
            }
            Command::Synchronize => {
                // SAFETY: no arguments.
                unsafe { self.driver()?.ctx_synchronize()? };
                done()
            }
            Command::TrafficStart { device, threads } => {
                if self.traffic.is_some() {
                    return Err(failure::request("traffic is already running"));
                }
                let traffic = super::traffic::Traffic::start(self.driver()?, device, threads)?;
                self.traffic = Some(traffic);
                done()
            }
            Command::TrafficStop => match self.traffic.take() {
                Some(traffic) => reply(Reply::Traffic {
                    threads: traffic.stop()?,
                }),
                None => Err(failure::request("no traffic is running")),
            },
            Command::SynchronizeInThread { device } => {
                super::traffic::synchronize_in_thread(self.driver()?, device)?;
                done()
            }
            Command::Sleep { ms } => {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                done()
            }
            Command::Panic { message } => panic!("{message}"),
            Command::Exit { .. } => done(),
            Command::Detach { .. } => Err(failure::request(
                "detach is handled by the control loop, not as a command",
            )),
        }
    }
}
