//! The libc calls the shim makes for itself, each behind a safe function that says why the
//! call is sound: glibc's own `dlsym` and `dlopen`, thread identity, `membarrier`, random
//! bytes, process hooks (`atexit`, `pthread_atfork`), descriptors and `_exit`.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicPtr, Ordering};

/// glibc's `dlsym`, fetched with `dlvsym` (never through the shim's hook). The hook's naked
/// trampoline (`ffi::dlsym`) jumps through it, so it is a plain pointer-sized static.
pub static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`; aborts when glibc offers none (nothing of the shim can work then).
pub fn glibc_dlsym() -> DlsymFn {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        // Several threads may race here; each finds the same pointer.
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names has no other
            // precondition; it is not hooked, so this cannot recurse.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            crate::log!("cannot find glibc's dlsym (GLIBC_2.34 or GLIBC_2.2.5); aborting");
            std::process::abort();
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose prototype is `DlsymFn`.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) }
}

/// A library opened with `dlopen`, kept open for the life of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library(usize);

impl Library {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`, or dlerror's message.
    pub fn open(path: &CStr) -> Result<Library, String> {
        // SAFETY: a NUL-terminated path; dlopen has no other precondition.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Ok(Library(handle as usize));
        }
        // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
        let reason = unsafe { libc::dlerror() };
        Err(if reason.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { CStr::from_ptr(reason) }
                .to_string_lossy()
                .into_owned()
        })
    }

    /// The raw `dlopen` handle.
    pub fn handle(self) -> *mut c_void {
        self.0 as *mut c_void
    }

    /// The address of symbol `name` in this library (glibc's lookup, never the hook's), or
    /// null.
    pub fn symbol(self, name: &CStr) -> *mut c_void {
        // SAFETY: a live dlopen handle and a NUL-terminated name.
        unsafe { glibc_dlsym()(self.handle(), name.as_ptr()) }
    }
}

/// `path` as a C string, or an error naming the NUL byte.
pub fn c_path(path: Vec<u8>) -> Result<CString, String> {
    CString::new(path).map_err(|e| format!("contains a NUL byte at {}", e.nul_position()))
}

/// The calling thread's kernel id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// The kernel's name of the calling thread (what `pthread_setname_np` set, whichever runtime
/// started the thread: the application's std is not the shim's).
pub fn thread_name() -> String {
    let mut buf = [0u8; 32];
    // SAFETY: the buffer is writable for its length; glibc NUL-terminates within it.
    let rc = unsafe {
        libc::pthread_getname_np(libc::pthread_self(), buf.as_mut_ptr().cast(), buf.len())
    };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `membarrier(command, 0, 0)`; whether it succeeded.
pub fn membarrier(command: c_int) -> bool {
    // SAFETY: membarrier takes a command and flags and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, command, 0, 0) == 0 }
}

/// Fills `bytes` from the kernel's random source.
pub fn fill_random(bytes: &mut [u8]) {
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the remaining bytes of the caller's slice.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n > 0 {
            filled += n as usize;
        }
    }
}

/// Registers `hook` to run at normal process exit.
pub fn at_exit(hook: extern "C" fn()) {
    // SAFETY: registers a plain `extern "C" fn()`, which lives as long as the process.
    unsafe { libc::atexit(hook) };
}

/// Registers fork handlers; returns pthread_atfork's error number (0: registered).
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) -> i32 {
    // SAFETY: the three handlers are `extern "C" fn()`, which live for the whole process.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) }
}

/// Closes a descriptor inherited across fork that no object in this process owns (its owner
/// was a thread of the parent).
pub fn close_inherited(fd: RawFd) {
    // SAFETY: the caller names a descriptor nothing in this process image owns or uses; closing
    // it cannot invalidate a live `OwnedFd`.
    unsafe { libc::close(fd) };
}

/// Takes ownership of a descriptor the driver just created for the shim, close-on-exec.
///
/// Only the driver's output of an export call may come here: nobody else owns it yet.
pub(super) fn adopt_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: a descriptor the driver created for us a moment ago; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::F_SETFD,
            libc::FD_CLOEXEC,
        )
    };
    fd
}

/// Ends the process at once, running no destructors and no exit hooks.
pub fn exit_now(code: c_int) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}
