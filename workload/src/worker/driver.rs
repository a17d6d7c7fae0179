//! The driver as the worker sees it: a library opened with `dlopen`, and entry points
//! resolved through one [`EntryPath`], each function called through a pointer of its cuda.h
//! prototype with results read as raw `u32`.

use super::failure;
use crate::cuda::{RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMulticastProp};
use crate::entry::EntryPath;
use crate::proto::ErrorReply;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> u32;
type GetProcAddressV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> u32;
type RtEntryByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> c_int;
type RtEntry = unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> c_int;

/// How names become pointers.
#[derive(Debug)]
enum Resolver {
    /// `dlsym(handle, name)`.
    Handle(*mut c_void),
    /// `dlsym(RTLD_DEFAULT, name)`.
    Default,
    /// `dlsym(RTLD_NEXT, name)`.
    Next,
    ProcV2 {
        get: GetProcAddressV2,
        version: u32,
    },
    ProcV1 {
        get: GetProcAddressV1,
        version: u32,
    },
    Runtime {
        by_version: Option<RtEntryByVersion>,
        legacy: Option<RtEntry>,
        version: u32,
    },
}

/// The last `dlerror()` text.
fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "no dlerror text".to_owned()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn dlopen(path: &Path, flags: c_int) -> Result<*mut c_void, ErrorReply> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| failure::request(format!("library path {} holds a NUL", path.display())))?;
    // SAFETY: `c` is a NUL-terminated path; loading a CUDA driver or runtime runs only its
    // own initialisers.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    if h.is_null() {
        return Err(failure::unresolved(
            &path.display().to_string(),
            -1,
            format!("dlopen({}) failed: {}", path.display(), dlerror_text()),
        ));
    }
    Ok(h)
}

/// `dlsym` on `handle` (a real handle or `RTLD_DEFAULT`/`RTLD_NEXT`).
fn dlsym(handle: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: clears the thread's pending dlerror state; no arguments.
    unsafe { libc::dlerror() };
    // SAFETY: `handle` is a dlopen handle or a pseudo-handle; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        Err(dlerror_text())
    } else {
        Ok(p)
    }
}

/// The loaded driver (or runtime) and its resolved entry points.
#[derive(Debug)]
pub struct DriverLibrary {
    entry: EntryPath,
    resolver: Resolver,
    /// Resolved pointers by exact (suffixed) name.
    cache: RefCell<HashMap<&'static str, usize>>,
}

impl DriverLibrary {
    /// Opens the driver at `library` (a soname or path) for `entry`. The runtime path opens
    /// the runtime library instead and lets it load the driver.
    pub fn open(entry: &EntryPath, library: &Path) -> Result<DriverLibrary, ErrorReply> {
        let get = |h: *mut c_void, name: &CStr| {
            dlsym(h, name).map_err(|e| {
                failure::unresolved(
                    &name.to_string_lossy(),
                    -1,
                    format!(
                        "{} not found in {} (entry path {entry}): {e}",
                        name.to_string_lossy(),
                        library.display()
                    ),
                )
            })
        };
        let resolver = match entry {
            EntryPath::Dlsym => {
                Resolver::Handle(dlopen(library, libc::RTLD_NOW | libc::RTLD_LOCAL)?)
            }
            EntryPath::Default => {
                dlopen(library, libc::RTLD_NOW | libc::RTLD_GLOBAL)?;
                Resolver::Default
            }
            EntryPath::Next => {
                dlopen(library, libc::RTLD_NOW | libc::RTLD_GLOBAL)?;
                Resolver::Next
            }
            EntryPath::ProcAddress(version) => {
                let h = dlopen(library, libc::RTLD_NOW | libc::RTLD_LOCAL)?;
                let p = get(h, c"cuGetProcAddress_v2")?;
                Resolver::ProcV2 {
                    // SAFETY: cuGetProcAddress_v2 has this prototype (cuda.h, CUDA 12+).
                    get: unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(p) },
                    version: *version,
                }
            }
            EntryPath::ProcAddressV1(version) => {
                let h = dlopen(library, libc::RTLD_NOW | libc::RTLD_LOCAL)?;
                let p = get(h, c"cuGetProcAddress")?;
                Resolver::ProcV1 {
                    // SAFETY: cuGetProcAddress (11.3) has this prototype (cuda.h).
                    get: unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV1>(p) },
                    version: *version,
                }
            }
            EntryPath::Runtime(runtime) => {
                let h = dlopen(runtime, libc::RTLD_NOW | libc::RTLD_LOCAL)?;
                let by_version = dlsym(h, c"cudaGetDriverEntryPointByVersion")
                    .ok()
                    // SAFETY: this prototype is cuda_runtime_api.h's (CUDA 12.5+).
                    .map(|p| unsafe { std::mem::transmute::<*mut c_void, RtEntryByVersion>(p) });
                let legacy = dlsym(h, c"cudaGetDriverEntryPoint")
                    .ok()
                    // SAFETY: this prototype is cuda_runtime_api.h's (CUDA 12.0+, with status).
                    .map(|p| unsafe { std::mem::transmute::<*mut c_void, RtEntry>(p) });
                if by_version.is_none() && legacy.is_none() {
                    return Err(failure::unresolved(
                        "cudaGetDriverEntryPoint",
                        -1,
                        format!(
                            "{} exports neither cudaGetDriverEntryPointByVersion nor \
                             cudaGetDriverEntryPoint",
                            runtime.display()
                        ),
                    ));
                }
                Resolver::Runtime {
                    by_version,
                    legacy,
                    version: crate::entry::RUNTIME_ENTRY_VERSION,
                }
            }
        };
        Ok(DriverLibrary {
            entry: entry.clone(),
            resolver,
            cache: RefCell::new(HashMap::new()),
        })
    }

    /// Resolves `name` as given, without the cache. Errors carry the resolver's result code
    /// (-1 where it has none) and a message.
    pub fn lookup(&self, name: &str) -> Result<*mut c_void, (i64, String)> {
        let c =
            CString::new(name).map_err(|_| (-1, format!("symbol name {name:?} holds a NUL")))?;
        let entry = &self.entry;
        let mut p: *mut c_void = std::ptr::null_mut();
        let fail = |code: i64, what: String| (code, format!("{name} (entry path {entry}): {what}"));
        match &self.resolver {
            Resolver::Handle(h) => return dlsym(*h, &c).map_err(|e| fail(-1, e)),
            Resolver::Default => return dlsym(libc::RTLD_DEFAULT, &c).map_err(|e| fail(-1, e)),
            Resolver::Next => return dlsym(libc::RTLD_NEXT, &c).map_err(|e| fail(-1, e)),
            Resolver::ProcV2 { get, version } => {
                let mut status: c_uint = 0;
                // SAFETY: cuGetProcAddress_v2's contract: NUL-terminated name, valid out
                // pointers for the function pointer and the status.
                let r = unsafe {
                    get(
                        c.as_ptr(),
                        &mut p,
                        *version as c_int,
                        crate::cuda::PROC_ADDRESS_DEFAULT,
                        &mut status,
                    )
                };
                if r != 0 || p.is_null() {
                    return Err(fail(
                        i64::from(r),
                        format!(
                            "cuGetProcAddress_v2(version {version}) returned {} (symbol status {status})",
                            crate::cuda::error_name_or_code(r)
                        ),
                    ));
                }
            }
            Resolver::ProcV1 { get, version } => {
                // SAFETY: cuGetProcAddress's contract: NUL-terminated name, valid out pointer.
                let r = unsafe {
                    get(
                        c.as_ptr(),
                        &mut p,
                        *version as c_int,
                        crate::cuda::PROC_ADDRESS_DEFAULT,
                    )
                };
                if r != 0 || p.is_null() {
                    return Err(fail(
                        i64::from(r),
                        format!(
                            "cuGetProcAddress(version {version}) returned {}",
                            crate::cuda::error_name_or_code(r)
                        ),
                    ));
                }
            }
            Resolver::Runtime {
                by_version,
                legacy,
                version,
            } => {
                let mut status: c_int = 0;
                let (r, via) = match (by_version, legacy) {
                    // SAFETY: cudaGetDriverEntryPointByVersion's contract: NUL-terminated
                    // name, valid out pointers.
                    (Some(f), _) => (
                        unsafe { f(c.as_ptr(), &mut p, *version, 0, &mut status) },
                        "cudaGetDriverEntryPointByVersion",
                    ),
                    // SAFETY: cudaGetDriverEntryPoint's contract, as above.
                    (None, Some(f)) => (
                        unsafe { f(c.as_ptr(), &mut p, 0, &mut status) },
                        "cudaGetDriverEntryPoint",
                    ),
                    (None, None) => (-1, "no runtime entry point"),
                };
                if r != 0 || p.is_null() {
                    return Err(fail(
                        i64::from(r),
                        format!("{via} returned cudaError {r} (driver status {status})"),
                    ));
                }
            }
        }
        Ok(p)
    }

    /// The entry point for a function whose exact name is `exact` and whose cuda.h
    /// (unsuffixed) name is `unsuffixed`: by-version paths ask for the latter.
    pub fn function(
        &self,
        exact: &'static str,
        unsuffixed: &'static str,
    ) -> Result<*mut c_void, ErrorReply> {
        if let Some(p) = self.cache.borrow().get(exact) {
            return Ok(*p as *mut c_void);
        }
        let name = if self.entry.api_version().is_some() {
            unsuffixed
        } else {
            exact
        };
        let p = self
            .lookup(name)
            .map_err(|(code, msg)| failure::unresolved(name, code, msg))?;
        self.cache.borrow_mut().insert(exact, p as usize);
        Ok(p)
    }

    /// The CUDA version whose `cuCtxCreate` signature applies.
    pub fn ctx_create_version(&self) -> u32 {
        self.entry.api_version().unwrap_or(u32::MAX)
    }
}

fn check(function: &'static str, r: u32) -> Result<(), ErrorReply> {
    if r == crate::cuda::SUCCESS {
        Ok(())
    } else {
        Err(failure::cuda(function, r))
    }
}

macro_rules! driver_api {
    ($( fn $method:ident = $exact:literal / $unsuffixed:literal ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        impl DriverLibrary {
            $(
                #[doc = concat!("`", $exact, "` (resolved by version as `", $unsuffixed, "`).")]
                ///
                /// # Safety
                /// Pointer arguments must satisfy cuda.h's contract for this function.
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn $method(&self, $($arg: $ty),*) -> Result<(), ErrorReply> {
                    let p = self.function($exact, $unsuffixed)?;
                    // SAFETY: `p` is the driver's entry point for this name, whose C
                    // prototype (cuda.h) is exactly this function pointer type.
                    let f = unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> u32>(p)
                    };
                    // SAFETY: the caller upholds the function's contract (see # Safety).
                    let r = unsafe { f($($arg),*) };
                    check($exact, r)
                }
            )*
        }
    };
}

driver_api! {
    fn init = "cuInit" / "cuInit"(flags: c_uint);
    fn driver_get_version = "cuDriverGetVersion" / "cuDriverGetVersion"(v: *mut c_int);
    fn device_get_count = "cuDeviceGetCount" / "cuDeviceGetCount"(n: *mut c_int);
    fn primary_ctx_retain = "cuDevicePrimaryCtxRetain" / "cuDevicePrimaryCtxRetain"(ctx: *mut *mut c_void, dev: c_int);
    fn primary_ctx_release = "cuDevicePrimaryCtxRelease_v2" / "cuDevicePrimaryCtxRelease"(dev: c_int);
    fn primary_ctx_reset = "cuDevicePrimaryCtxReset_v2" / "cuDevicePrimaryCtxReset"(dev: c_int);
    fn device_get_attribute = "cuDeviceGetAttribute" / "cuDeviceGetAttribute"(value: *mut c_int, attribute: c_int, dev: c_int);
    fn ctx_set_current = "cuCtxSetCurrent" / "cuCtxSetCurrent"(ctx: *mut c_void);
    fn ctx_get_current = "cuCtxGetCurrent" / "cuCtxGetCurrent"(ctx: *mut *mut c_void);
    fn ctx_create_v4 = "cuCtxCreate_v4" / "cuCtxCreate"(ctx: *mut *mut c_void, params: *mut c_void, flags: c_uint, dev: c_int);
    fn ctx_create_v3 = "cuCtxCreate_v3" / "cuCtxCreate"(ctx: *mut *mut c_void, params: *mut c_void, num_params: c_int, flags: c_uint, dev: c_int);
    fn ctx_create_v2 = "cuCtxCreate_v2" / "cuCtxCreate"(ctx: *mut *mut c_void, flags: c_uint, dev: c_int);
    fn ctx_destroy = "cuCtxDestroy_v2" / "cuCtxDestroy"(ctx: *mut c_void);
    fn ctx_synchronize = "cuCtxSynchronize" / "cuCtxSynchronize"();
    fn mem_get_allocation_granularity = "cuMemGetAllocationGranularity" / "cuMemGetAllocationGranularity"(g: *mut usize, prop: *const RawAllocProp, option: c_uint);
    fn mem_create = "cuMemCreate" / "cuMemCreate"(h: *mut u64, size: usize, prop: *const RawAllocProp, flags: u64);
    fn mem_release = "cuMemRelease" / "cuMemRelease"(h: u64);
    fn mem_retain_allocation_handle = "cuMemRetainAllocationHandle" / "cuMemRetainAllocationHandle"(h: *mut u64, addr: *mut c_void);
    fn mem_get_allocation_properties = "cuMemGetAllocationPropertiesFromHandle" / "cuMemGetAllocationPropertiesFromHandle"(prop: *mut RawAllocProp, h: u64);
    fn mem_address_reserve = "cuMemAddressReserve" / "cuMemAddressReserve"(p: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64);
    fn mem_address_free = "cuMemAddressFree" / "cuMemAddressFree"(p: u64, size: usize);
    fn mem_map = "cuMemMap" / "cuMemMap"(p: u64, size: usize, offset: usize, h: u64, flags: u64);
    fn mem_unmap = "cuMemUnmap" / "cuMemUnmap"(p: u64, size: usize);
    fn mem_set_access = "cuMemSetAccess" / "cuMemSetAccess"(p: u64, size: usize, desc: *const RawAccessDesc, count: usize);
    fn mem_get_access = "cuMemGetAccess" / "cuMemGetAccess"(flags: *mut u64, location: *const RawLocation, p: u64);
    fn mem_export = "cuMemExportToShareableHandle" / "cuMemExportToShareableHandle"(out: *mut c_void, h: u64, handle_type: c_uint, flags: u64);
    fn mem_import = "cuMemImportFromShareableHandle" / "cuMemImportFromShareableHandle"(h: *mut u64, os_handle: *mut c_void, handle_type: c_uint);
    fn memcpy_htod = "cuMemcpyHtoD_v2" / "cuMemcpyHtoD"(dst: u64, src: *const c_void, n: usize);
    fn memcpy_dtoh = "cuMemcpyDtoH_v2" / "cuMemcpyDtoH"(dst: *mut c_void, src: u64, n: usize);
    fn memset_d8 = "cuMemsetD8_v2" / "cuMemsetD8"(dst: u64, value: u8, n: usize);
    fn mem_alloc = "cuMemAlloc_v2" / "cuMemAlloc"(p: *mut u64, size: usize);
    fn mem_free = "cuMemFree_v2" / "cuMemFree"(p: u64);
    fn mem_get_address_range = "cuMemGetAddressRange_v2" / "cuMemGetAddressRange"(base: *mut u64, size: *mut usize, p: u64);
    fn mem_host_register = "cuMemHostRegister_v2" / "cuMemHostRegister"(p: *mut c_void, size: usize, flags: c_uint);
    fn mem_host_unregister = "cuMemHostUnregister" / "cuMemHostUnregister"(p: *mut c_void);
    fn ipc_get_mem_handle = "cuIpcGetMemHandle" / "cuIpcGetMemHandle"(h: *mut RawIpcMemHandle, p: u64);
    fn ipc_open_mem_handle = "cuIpcOpenMemHandle_v2" / "cuIpcOpenMemHandle"(p: *mut u64, h: RawIpcMemHandle, flags: c_uint);
    fn ipc_close_mem_handle = "cuIpcCloseMemHandle" / "cuIpcCloseMemHandle"(p: u64);
    fn multicast_get_granularity = "cuMulticastGetGranularity" / "cuMulticastGetGranularity"(g: *mut usize, prop: *const RawMulticastProp, option: c_uint);
    fn multicast_create = "cuMulticastCreate" / "cuMulticastCreate"(h: *mut u64, prop: *const RawMulticastProp);
    fn multicast_add_device = "cuMulticastAddDevice" / "cuMulticastAddDevice"(h: u64, dev: c_int);
    fn multicast_bind_mem = "cuMulticastBindMem" / "cuMulticastBindMem"(mc: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64);
    fn multicast_bind_mem_v2 = "cuMulticastBindMem_v2" / "cuMulticastBindMem_v2"(mc: u64, dev: c_int, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64);
    fn multicast_bind_addr = "cuMulticastBindAddr" / "cuMulticastBindAddr"(mc: u64, mc_offset: usize, p: u64, size: usize, flags: u64);
    fn multicast_bind_addr_v2 = "cuMulticastBindAddr_v2" / "cuMulticastBindAddr_v2"(mc: u64, dev: c_int, mc_offset: usize, p: u64, size: usize, flags: u64);
    fn multicast_unbind = "cuMulticastUnbind" / "cuMulticastUnbind"(mc: u64, dev: c_int, mc_offset: usize, size: usize);
}

/// Where `p` lives according to `dladdr`: (library file, symbol name).
pub fn dladdr(p: *mut c_void) -> (Option<String>, Option<String>) {
    // SAFETY: Dl_info is plain data; dladdr fills it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects the address; `info` is a valid out-parameter.
    if unsafe { libc::dladdr(p.cast_const(), &mut info) } == 0 {
        return (None, None);
    }
    let text = |s: *const c_char| {
        // SAFETY: dladdr's strings are null or NUL-terminated and owned by the loader.
        (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    };
    (text(info.dli_fname), text(info.dli_sname))
}

/// The driver library the worker opens: `--driver`, else `$CUINTERPOSE_WORKER_DRIVER`, else
/// `libcuda.so.1`.
pub fn default_library(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("CUINTERPOSE_WORKER_DRIVER").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("libcuda.so.1"))
}
