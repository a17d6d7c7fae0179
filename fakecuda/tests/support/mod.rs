//! Test support: builds the cdylib, lays out a directory holding `libcuda.so.1`, loads it,
//! and runs child roles by re-executing the test binary.
#![allow(dead_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

#[allow(unused_imports)] // each user takes a few
pub use cuinterpose_abi::consts::{HANDLE_TYPE_FABRIC as FABRIC, HANDLE_TYPE_POSIX_FD as POSIX_FD};
#[allow(unused_imports)]
pub use cuinterpose_abi::results::{
    CUDA_ERROR_ALREADY_MAPPED as ALREADY_MAPPED, CUDA_ERROR_ILLEGAL_ADDRESS as ILLEGAL_ADDRESS,
    CUDA_ERROR_ILLEGAL_STATE as ILLEGAL_STATE, CUDA_ERROR_INVALID_CONTEXT as INVALID_CONTEXT,
    CUDA_ERROR_INVALID_DEVICE as INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE as INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE as INVALID_VALUE, CUDA_ERROR_NOT_FOUND as NOT_FOUND,
    CUDA_ERROR_NOT_INITIALIZED as NOT_INITIALIZED, CUDA_ERROR_NOT_PERMITTED as NOT_PERMITTED,
    CUDA_ERROR_NOT_SUPPORTED as NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY as OUT_OF_MEMORY,
    CUDA_SUCCESS as SUCCESS,
};
pub const GRAN: usize = 2 << 20;

/// `target/<profile>/` of this test executable.
pub fn profile_dir() -> PathBuf {
    cuinterpose_testkit::target_profile_dir()
}

/// fakecuda's `libcuda.so.1` directory (built for this test's profile), for `LD_LIBRARY_PATH`
/// or `dlopen`.
pub fn lib_dir() -> &'static Path {
    cuinterpose_testkit::fakecuda_lib_dir()
}

pub fn lib_path() -> PathBuf {
    lib_dir().join("libcuda.so.1")
}

/// The loaded driver with typed accessors.
pub struct Cuda {
    lib: libloading::Library,
}

pub fn cuda() -> &'static Cuda {
    static CUDA: OnceLock<Cuda> = OnceLock::new();
    CUDA.get_or_init(|| {
        // Children load the library their parent built, without rebuilding.
        let path = std::env::var_os("FAKECUDA_TEST_LIB").map_or_else(lib_path, PathBuf::from);
        // SAFETY: loading fakecuda runs no initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(path) }.expect("dlopen libcuda.so.1");
        Cuda { lib }
    })
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Location {
    pub type_: u32,
    pub id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocProp {
    pub type_: u32,
    pub requested_handle_types: u32,
    pub location: Location,
    pub win32: *mut c_void,
    pub flags: [u8; 8],
}

impl AllocProp {
    pub fn device(dev: i32, types: u32) -> AllocProp {
        AllocProp {
            type_: 1,
            requested_handle_types: types,
            location: Location { type_: 1, id: dev },
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    pub location: Location,
    pub flags: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct McProp {
    pub num_devices: c_uint,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

impl McProp {
    pub fn new(num_devices: u32, size: usize, handle_types: u64) -> McProp {
        McProp {
            num_devices,
            size,
            handle_types,
            flags: 0,
        }
    }
}

pub fn ok(r: u32) {
    assert_eq!(r, SUCCESS, "expected CUDA_SUCCESS, got {r}");
}

macro_rules! api {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) ;)*) => {
        impl Cuda {
            $(
                #[allow(non_snake_case, clippy::too_many_arguments)]
                pub fn $name(&self, $($arg: $ty),*) -> u32 {
                    // SAFETY: the symbol has this C signature (cuda.h); pointer arguments are
                    // the test's own valid buffers or deliberately null.
                    unsafe {
                        let f = self.lib.get::<unsafe extern "C" fn($($ty),*) -> u32>(concat!(stringify!($name), "\0").as_bytes()).expect(stringify!($name));
                        f($($arg),*)
                    }
                }
            )*
        }
    };
}

api! {
    cuInit(flags: c_uint);
    cuDriverGetVersion(v: *mut c_int);
    cuDeviceGet(d: *mut c_int, ordinal: c_int);
    cuDeviceGetCount(n: *mut c_int);
    cuDeviceGetName(name: *mut u8, len: c_int, dev: c_int);
    cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int);
    cuDeviceGetAttribute(v: *mut c_int, attr: c_uint, dev: c_int);
    cuDeviceTotalMem_v2(b: *mut usize, dev: c_int);
    cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: c_int);
    cuDevicePrimaryCtxRelease_v2(dev: c_int);
    cuDevicePrimaryCtxReset_v2(dev: c_int);
    cuCtxCreate_v4(ctx: *mut usize, params: *mut c_void, flags: c_uint, dev: c_int);
    cuCtxDestroy_v2(ctx: usize);
    cuCtxSetCurrent(ctx: usize);
    cuCtxGetCurrent(ctx: *mut usize);
    cuCtxGetDevice(d: *mut c_int);
    cuCtxSynchronize();
    cuDeviceCanAccessPeer(can: *mut c_int, dev: c_int, peer: c_int);
    cuDeviceGetP2PAttribute(v: *mut c_int, attr: c_uint, src: c_int, dst: c_int);
    cuCtxEnablePeerAccess(peer: usize, flags: c_uint);
    cuCtxDisablePeerAccess(peer: usize);
    cuMemcpyPeer(dst: u64, dst_ctx: usize, src: u64, src_ctx: usize, n: usize);
    cuStreamCreate(s: *mut usize, flags: c_uint);
    cuStreamCreateWithPriority(s: *mut usize, flags: c_uint, priority: c_int);
    cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int);
    cuStreamGetPriority(s: usize, priority: *mut c_int);
    cuStreamGetFlags(s: usize, flags: *mut c_uint);
    cuStreamGetCtx(s: usize, ctx: *mut usize);
    cuStreamQuery(s: usize);
    cuStreamSynchronize(s: usize);
    cuStreamDestroy_v2(s: usize);
    cuStreamWaitEvent(s: usize, e: usize, flags: c_uint);
    cuLaunchHostFunc(s: usize, f: Option<unsafe extern "C" fn(*mut c_void)>, user: *mut c_void);
    cuEventCreate(e: *mut usize, flags: c_uint);
    cuEventDestroy_v2(e: usize);
    cuEventRecord(e: usize, s: usize);
    cuEventQuery(e: usize);
    cuEventSynchronize(e: usize);
    cuEventElapsedTime(ms: *mut f32, start: usize, end: usize);
    cuMemAddressReserve(p: *mut u64, size: usize, align: usize, addr: u64, flags: u64);
    cuMemAddressFree(p: u64, size: usize);
    cuMemCreate(h: *mut u64, size: usize, prop: *const AllocProp, flags: u64);
    cuMemRelease(h: u64);
    cuMemMap(p: u64, size: usize, offset: usize, h: u64, flags: u64);
    cuMemUnmap(p: u64, size: usize);
    cuMemSetAccess(p: u64, size: usize, desc: *const AccessDesc, count: usize);
    cuMemGetAccess(flags: *mut u64, loc: *const Location, p: u64);
    cuMemRetainAllocationHandle(h: *mut u64, addr: *mut c_void);
    cuMemGetAllocationPropertiesFromHandle(prop: *mut AllocProp, h: u64);
    cuMemGetAllocationGranularity(g: *mut usize, prop: *const AllocProp, option: c_uint);
    cuMemExportToShareableHandle(out: *mut c_void, h: u64, t: c_uint, flags: u64);
    cuMemImportFromShareableHandle(h: *mut u64, os: *mut c_void, t: c_uint);
    cuMemAlloc_v2(p: *mut u64, size: usize);
    cuMemFree_v2(p: u64);
    cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, p: u64);
    cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize);
    cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize);
    cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, n: usize, s: usize);
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, n: usize, s: usize);
    cuMemsetD8_v2(dst: u64, v: u8, n: usize);
    cuMemsetD16_v2(dst: u64, v: u16, n: usize);
    cuMemsetD32Async(dst: u64, v: u32, n: usize, s: usize);
    cuMemcpyAsync(dst: u64, src: u64, n: usize, s: usize);
    cuMemHostRegister_v2(p: *mut c_void, n: usize, flags: c_uint);
    cuMemHostAlloc(pp: *mut *mut c_void, n: usize, flags: c_uint);
    cuMemFreeHost(p: *mut c_void);
    cuMemHostGetDevicePointer_v2(d: *mut u64, p: *mut c_void, flags: c_uint);
    cuMemHostGetFlags(f: *mut c_uint, p: *mut c_void);
    cuMemAllocManaged(d: *mut u64, n: usize, flags: c_uint);
    cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, p: u64);
    cuDeviceGetDefaultMemPool(pool: *mut usize, dev: c_int);
    cuDeviceGetMemPool(pool: *mut usize, dev: c_int);
    cuDeviceSetMemPool(dev: c_int, pool: usize);
    cuMemPoolCreate(pool: *mut usize, props: *const [u64; 11]);
    cuMemPoolDestroy(pool: usize);
    cuMemPoolGetAttribute(pool: usize, attr: c_uint, value: *mut c_void);
    cuMemPoolSetAttribute(pool: usize, attr: c_uint, value: *mut c_void);
    cuMemPoolSetAccess(pool: usize, desc: *const AccessDesc, count: usize);
    cuMemPoolGetAccess(flags: *mut c_uint, pool: usize, loc: *mut Location);
    cuMemGetMemPool(pool: *mut usize, loc: *mut Location, alloc_type: c_uint);
    cuMemAllocFromPoolAsync(p: *mut u64, n: usize, pool: usize, s: usize);
    cuMemAllocAsync(p: *mut u64, n: usize, s: usize);
    cuMemFreeAsync(p: u64, s: usize);
    cuMemPoolExportToShareableHandle(out: *mut c_void, pool: usize, t: c_uint, flags: u64);
    cuMemPoolImportFromShareableHandle(pool: *mut usize, handle: *mut c_void, t: c_uint, flags: u64);
    cuMemPoolExportPointer(data: *mut [u8; 64], p: u64);
    cuMemPoolImportPointer(p: *mut u64, pool: usize, data: *const [u8; 64]);
    cuPointerGetAttributes(n: c_uint, attributes: *const c_uint, data: *mut *mut c_void, p: u64);
    cuMemHostUnregister(p: *mut c_void);
    cuIpcGetMemHandle(h: *mut [u8; 64], p: u64);
    cuIpcOpenMemHandle_v2(p: *mut u64, h: [u8; 64], flags: c_uint);
    cuIpcCloseMemHandle(p: u64);
    cuMulticastCreate(h: *mut u64, prop: *const McProp);
    cuMulticastAddDevice(h: u64, dev: c_int);
    cuMulticastBindMem(mc: u64, mc_off: usize, mem: u64, mem_off: usize, size: usize, flags: u64);
    cuMulticastBindMem_v2(mc: u64, dev: c_int, mc_off: usize, mem: u64, mem_off: usize, size: usize, flags: u64);
    cuMulticastBindAddr(mc: u64, mc_off: usize, p: u64, size: usize, flags: u64);
    cuMulticastUnbind(mc: u64, dev: c_int, mc_off: usize, size: usize);
    cuMulticastGetGranularity(g: *mut usize, prop: *const McProp, option: c_uint);
    cuGetProcAddress_v2(sym: *const std::ffi::c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64, status: *mut c_uint);
    cuGetErrorName(e: c_uint, s: *mut *const u8);
    cuGetErrorString(e: c_uint, s: *mut *const u8);
    cuCheckpointProcessGetState(pid: c_int, s: *mut c_uint);
    cuCheckpointProcessLock(pid: c_int, args: *mut [u64; 8]);
    cuCheckpointProcessCheckpoint(pid: c_int, args: *mut [u64; 8]);
    cuCheckpointProcessRestore(pid: c_int, args: *mut [u64; 8]);
    cuCheckpointProcessUnlock(pid: c_int, args: *mut [u64; 8]);
}

impl Cuda {
    pub fn native_ipc_calls(&self) -> u64 {
        // SAFETY: fakecuda's counter export, `u64 fakecuda_native_ipc_calls(void)`.
        unsafe {
            self.lib
                .get::<unsafe extern "C" fn() -> u64>(b"fakecuda_native_ipc_calls\0")
                .expect("counter")()
        }
    }

    /// cuInit plus the primary context of `dev` made current on this thread.
    pub fn setup(&self, dev: i32) -> usize {
        ok(self.cuInit(0));
        let mut ctx = 0usize;
        ok(self.cuDevicePrimaryCtxRetain(&mut ctx, dev));
        ok(self.cuCtxSetCurrent(ctx));
        ctx
    }

    pub fn create(&self, size: usize, dev: i32, types: u32) -> u64 {
        let mut h = 0;
        ok(self.cuMemCreate(&mut h, size, &AllocProp::device(dev, types), 0));
        h
    }

    pub fn reserve(&self, size: usize) -> u64 {
        let mut p = 0;
        ok(self.cuMemAddressReserve(&mut p, size, 0, 0, 0));
        p
    }

    pub fn grant(&self, p: u64, size: usize, dev: i32, flags: u32) -> u32 {
        let d = AccessDesc {
            location: Location { type_: 1, id: dev },
            flags,
        };
        self.cuMemSetAccess(p, size, &d, 1)
    }

    /// Reserve + map + read-write access for `dev`.
    pub fn map_rw(&self, h: u64, size: usize, dev: i32) -> u64 {
        let p = self.reserve(size);
        ok(self.cuMemMap(p, size, 0, h, 0));
        ok(self.grant(p, size, dev, 3));
        p
    }

    /// Unmap + free the reservation + release the allocation: undoes [`Cuda::create`] and
    /// [`Cuda::map_rw`].
    pub fn unmap_free(&self, p: u64, size: usize, h: u64) {
        ok(self.cuMemUnmap(p, size));
        ok(self.cuMemAddressFree(p, size));
        ok(self.cuMemRelease(h));
    }

    /// A multicast object of `num_devices` devices and `size` bytes, exportable as `types`.
    pub fn mc_create(&self, num_devices: u32, size: usize, types: u64) -> u64 {
        let mut h = 0;
        ok(self.cuMulticastCreate(&mut h, &McProp::new(num_devices, size, types)));
        h
    }

    pub fn write(&self, p: u64, bytes: &[u8]) {
        ok(self.cuMemcpyHtoD_v2(p, bytes.as_ptr().cast(), bytes.len()));
    }

    pub fn read(&self, p: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        ok(self.cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), p, n));
        v
    }
}

/// A deterministic byte pattern.
pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Fails unless this process holds at most `limit` descriptors within 5 s. At most, not
/// exactly: the driver's and the test harness's own threads may close a descriptor they held
/// when the count was taken; a leak only ever adds one. Polled, because a descriptor handed to
/// a child or a worker thread is closed a moment after the call that let go of it.
pub fn check_fds_at_most(limit: usize, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = fd_count();
        if now <= limit {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {now} descriptors open, expected at most {limit}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A command re-executing this test binary in `role` (dispatched by `child_main`).
pub fn role_command(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.env("FAKECUDA_TEST_ROLE", role)
        .env("FAKECUDA_TEST_LIB", lib_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// The role this process was started for, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var("FAKECUDA_TEST_ROLE").ok()
}

/// The body of each test binary's `child_roles` constructor. In a child started for one of
/// `roles` (by [`role_command`]) it runs that role and exits (101 when the role panicked,
/// after the panic message) before the test harness starts, so the roles are no test
/// functions: a test binary run on its own runs only tests. In the test run itself it returns.
///
/// Life before `main`: glibc is initialized; std's runtime is not, and the roles need none of
/// it (they read the environment and stdin, print to stdout, spawn threads, and leave through
/// `process::exit`, which flushes stdout).
pub fn run_role(roles: &[(&str, fn())]) {
    let Some(role) = child_role() else { return };
    let code = match roles.iter().find(|(name, _)| *name == role) {
        Some((_, run)) => match std::panic::catch_unwind(run) {
            Ok(()) => 0,
            Err(_) => 101,
        },
        None => {
            eprintln!("unknown role {role}");
            101
        }
    };
    std::process::exit(code);
}

/// Line-oriented conversation with a child over its stdin/stdout.
pub struct Child {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Child {
    pub fn spawn(mut cmd: Command) -> Child {
        let mut child = cmd.spawn().expect("spawn child");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Child { child, lines: rx }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next line the child printed that starts with `prefix`, within `secs`.
    pub fn expect(&self, prefix: &str, secs: u64) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l[prefix.len()..].trim().to_owned(),
                Ok(_) => {}
                Err(e) => panic!("child did not print {prefix:?}: {e}"),
            }
        }
    }

    pub fn try_line(&self, prefix: &str, ms: u64) -> Option<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(ms);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Some(l[prefix.len()..].trim().to_owned()),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to child");
        stdin.flush().expect("flush");
    }

    /// Tells the child to exit and checks that it exits cleanly.
    #[track_caller]
    pub fn finish(mut self) {
        self.send("exit");
        assert!(self.wait().success());
    }

    pub fn wait(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        self.child.wait().expect("wait child")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a child: prints a tagged line for the parent.
pub fn say(tag: &str, msg: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{tag} {msg}");
    let _ = out.flush();
}

/// In a child: waits for the next line from the parent.
pub fn hear() -> String {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
    s.trim().to_owned()
}

/// Tests in one binary share one driver and one descriptor table: descriptor counts and
/// process-wide state are only meaningful one test at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// How most tests begin: the [`serial`] lock, and fakecuda with device `dev`'s primary
/// context current.
pub fn begin(dev: i32) -> (std::sync::MutexGuard<'static, ()>, &'static Cuda) {
    let serial = serial();
    let cu = cuda();
    cu.setup(dev);
    (serial, cu)
}
