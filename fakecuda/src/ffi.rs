//! The C ABI edge: every exported CUDA entry point. Each one is thin: it passes the
//! checkpoint gate, catches panics, reads its pointer arguments (null → invalid value) and
//! calls safe logic; results leave as raw `CUresult` integers.

#![allow(non_snake_case, clippy::missing_safety_doc)]
// The safety contract of every entry point is the one cuda.h documents for it.

use crate::abi::{RawAccessDesc, RawAllocProp, RawLocation};
use crate::checkpoint::{self, wire::Op};
use crate::driver::{self, Driver};
use crate::error::{CUDA_SUCCESS, CuError, CuResult, RawResult, to_raw};
use crate::{device, ipc, memcpy, multicast, proc_address};
use cudarc::driver::sys::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUcontext, CUctx_st, CUctxCreateParams, CUdevice, CUdeviceptr,
    CUexecAffinityParam, CUipcMemHandle, CUmemGenericAllocationHandle, CUmulticastObjectProp,
    CUstream, CUstream_st, CUuuid,
};
use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};

fn run(f: impl FnOnce() -> CuResult<()>) -> RawResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => to_raw(r),
        // The panic hook already printed the message; the caller gets an error code.
        Err(_) => CuError::CUDA_ERROR_UNKNOWN.raw(),
    }
}

/// Entry points the application calls: they wait while the process is locked.
fn gated(f: impl FnOnce() -> CuResult<()>) -> RawResult {
    if driver::forked_child() {
        return CuError::CUDA_ERROR_NOT_INITIALIZED.raw();
    }
    let _pass = checkpoint::enter();
    run(f)
}

fn with(f: impl FnOnce(&mut Driver) -> CuResult<()>) -> RawResult {
    gated(|| driver::with(f))
}

/// Writes an output argument.
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> CuResult<()> {
    if p.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, per the caller, valid for writes.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads an input argument.
///
/// # Safety
/// `p` is null or valid for a read of `T`, and its bytes are a valid `T`.
unsafe fn get<T: Copy>(p: *const T) -> CuResult<T> {
    if p.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and, per the caller, valid for reads.
    Ok(unsafe { p.read() })
}

fn handle_ptr<T>(h: u64) -> *mut T {
    std::ptr::without_provenance_mut(h as usize)
}

// ---- initialisation, version, errors ----

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> RawResult {
    gated(|| driver::init(flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> RawResult {
    // SAFETY: `version` is the caller's int out-parameter (cuda.h).
    gated(|| unsafe { put(version, 13010) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: c_uint, p_str: *mut *const c_char) -> RawResult {
    run(|| {
        let name = crate::error::error_name(error);
        // SAFETY: `p_str` is the caller's string out-parameter (cuda.h).
        unsafe { put(p_str, name.map_or(std::ptr::null(), |n| n.as_ptr())) }?;
        name.map(|_| ()).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: c_uint, p_str: *mut *const c_char) -> RawResult {
    run(|| {
        let s = crate::error::error_string(error);
        // SAFETY: `p_str` is the caller's string out-parameter (cuda.h).
        unsafe { put(p_str, s.map_or(std::ptr::null(), |n| n.as_ptr())) }?;
        s.map(|_| ()).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> RawResult {
    // SAFETY: forwarded under the same contract, with no status out-parameter.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_uint,
) -> RawResult {
    gated(|| {
        if symbol.is_null() || pfn.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `symbol` is a NUL-terminated C string (cuda.h).
        let name = unsafe { std::ffi::CStr::from_ptr(symbol) }
            .to_str()
            .unwrap_or("");
        let (ptr, status, result) = proc_address::lookup(name, cuda_version, flags);
        // SAFETY: `pfn` is the caller's pointer out-parameter (checked non-null above).
        unsafe { put(pfn, ptr) }?;
        if !symbol_status.is_null() {
            // SAFETY: optional CUdriverProcAddressQueryResult out-parameter (a C enum: u32).
            unsafe { put(symbol_status, status) }?;
        }
        result
    })
}

// ---- devices ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(ordinal)?;
        // SAFETY: CUdevice out-parameter (cuda.h).
        unsafe { put(device, dev as CUdevice) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> RawResult {
    // SAFETY: int out-parameter (cuda.h).
    with(|d| unsafe { put(count, d.config.devices as c_int) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(
    name: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        if name.is_null() || len <= 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let s = device::name(dev);
        let n = s.len().min(len as usize - 1);
        // SAFETY: `name` has room for `len` bytes (cuda.h); we write `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), name, n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> RawResult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        let bytes = device::uuid(dev).map(|b| b as c_char);
        // SAFETY: CUuuid out-parameter (cuda.h).
        unsafe { put(uuid, CUuuid { bytes }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    dev: CUdevice,
) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        let v = device::attribute(attrib, dev)?;
        // SAFETY: int out-parameter (cuda.h).
        unsafe { put(pi, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> RawResult {
    with(|d| {
        d.config.check_device(dev)?;
        // SAFETY: size_t out-parameter (cuda.h).
        unsafe { put(bytes, d.config.memory as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> RawResult {
    with(|d| {
        let (f, t) = d.mem_info()?;
        // SAFETY: size_t out-parameters (cuda.h).
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

// ---- contexts and streams ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    pctx: *mut CUcontext,
    dev: CUdevice,
) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        if pctx.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.contexts.primary_retain(dev)?;
        // SAFETY: CUcontext out-parameter (cuda.h).
        unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        d.contexts.primary_release(dev)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        // cudaDeviceReset: everything the primary context owned goes with it.
        d.release_context_memory(d.contexts.primary_handle(dev))?;
        d.contexts.primary_reset(dev)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> RawResult {
    with(|d| {
        let dev = d.config.check_device(dev)?;
        let on = d.contexts.primary_state(dev)?;
        // SAFETY: out-parameters (cuda.h).
        unsafe {
            put(flags, 0)?;
            put(active, c_int::from(on))
        }
    })
}

fn ctx_create(pctx: *mut CUcontext, dev: CUdevice) -> CuResult<()> {
    driver::with(|d| {
        let dev = d.config.check_device(dev)?;
        if pctx.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.next_handle();
        d.contexts.create(h, dev);
        // SAFETY: CUcontext out-parameter (cuda.h), non-null.
        unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> RawResult {
    gated(|| {
        // Scheduling and map-host flags (bits 0..=4, 0x80) change nothing in a synchronous model.
        if flags & !0x9f != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        ctx_create(pctx, dev)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> RawResult {
    gated(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) || flags & !0x9f != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if num_params > 0 {
            // Execution affinity (SM partitioning) is not modelled.
            return Err(CuError::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
        }
        ctx_create(pctx, dev)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> RawResult {
    gated(|| {
        if flags & !0x9f != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if !params.is_null() {
            // SAFETY: optional CUctxCreateParams (cuda.h); plain pointers and ints.
            let p = unsafe { params.read() };
            if p.numExecAffinityParams != 0 || !p.cigParams.is_null() {
                return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        ctx_create(pctx, dev)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> RawResult {
    with(|d| {
        let ctx = ctx as usize as u64;
        d.contexts.destroy(ctx)?;
        // What the context owned goes with it.
        d.release_context_memory(ctx)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> RawResult {
    with(|d| {
        let h = d.contexts.current_handle();
        // SAFETY: CUcontext out-parameter (cuda.h).
        unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> RawResult {
    with(|d| d.contexts.set_current(ctx as usize as u64))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> RawResult {
    with(|d| d.contexts.push(ctx as usize as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> RawResult {
    with(|d| {
        d.contexts.current()?;
        let h = d.contexts.pop()?;
        if !pctx.is_null() {
            // SAFETY: optional CUcontext out-parameter (cuda.h).
            unsafe { put(pctx, handle_ptr::<CUctx_st>(h)) }?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> RawResult {
    // All work completes before its call returns: nothing to wait for.
    with(|d| d.contexts.current().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> RawResult {
    with(|d| {
        let (_, dev) = d.contexts.current()?;
        // SAFETY: CUdevice out-parameter (cuda.h).
        unsafe { put(device, dev as CUdevice) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph_stream: *mut CUstream, flags: c_uint) -> RawResult {
    with(|d| {
        if ph_stream.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.next_handle();
        d.contexts.create_stream(h, flags)?;
        // SAFETY: CUstream out-parameter (cuda.h), non-null.
        unsafe { put(ph_stream, handle_ptr::<CUstream_st>(h)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: CUstream) -> RawResult {
    stream_sync_delay();
    with(|d| d.contexts.check_stream(stream as usize as u64))
}

/// Test hook: `FAKECUDA_STREAM_SYNC_DELAY_MS` makes every `cuStreamSynchronize` take that
/// long before it does anything (holding nothing), so a test can have a thread parked inside
/// a driver call.
fn stream_sync_delay() {
    static DELAY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *DELAY.get_or_init(|| {
        std::env::var("FAKECUDA_STREAM_SYNC_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> RawResult {
    with(|d| d.contexts.destroy_stream(stream as usize as u64))
}

// ---- virtual memory management ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> RawResult {
    with(|d| {
        if ptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let at = d.address_reserve(size as u64, alignment as u64, addr, flags)?;
        // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
        unsafe { put(ptr, at) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> RawResult {
    with(|d| d.address_free(ptr, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const RawAllocProp,
    flags: c_ulonglong,
) -> RawResult {
    with(|d| {
        // SAFETY: CUmemAllocationProp input (cuda.h), read as plain integers.
        let prop = unsafe { get(prop) }?;
        if handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.mem_create(size as u64, &prop, flags)?;
        // SAFETY: handle out-parameter (cuda.h), non-null.
        unsafe { put(handle, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> RawResult {
    with(|d| d.mem_release(handle))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> RawResult {
    with(|d| d.mem_map(ptr, size as u64, offset as u64, handle, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> RawResult {
    with(|d| d.mem_unmap(ptr, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const RawAccessDesc,
    count: usize,
) -> RawResult {
    with(|d| {
        if desc.is_null() || count == 0 || count > 4096 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` points at `count` CUmemAccessDesc (cuda.h), read as plain integers.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) }.to_vec();
        d.set_access(ptr, size as u64, &descs)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAccess(
    flags: *mut c_ulonglong,
    location: *const RawLocation,
    ptr: CUdeviceptr,
) -> RawResult {
    with(|d| {
        // SAFETY: CUmemLocation input (cuda.h), read as plain integers.
        let loc = unsafe { get(location) }?;
        let f = d.get_access(&loc, ptr)?;
        // SAFETY: flags out-parameter (cuda.h).
        unsafe { put(flags, u64::from(f)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut c_void,
) -> RawResult {
    with(|d| {
        if handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.retain_handle(addr as usize as u64)?;
        // SAFETY: handle out-parameter (cuda.h), non-null.
        unsafe { put(handle, h) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut RawAllocProp,
    handle: CUmemGenericAllocationHandle,
) -> RawResult {
    with(|d| {
        if prop.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.alloc_props(handle)?;
        // SAFETY: CUmemAllocationProp out-parameter (cuda.h); every field holds a valid value.
        unsafe { put(prop, p) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const RawAllocProp,
    option: c_uint,
) -> RawResult {
    with(|d| {
        use crate::abi::consts as c;
        // SAFETY: CUmemAllocationProp input (cuda.h), read as plain integers.
        let p = unsafe { get(prop) }?;
        if option != c::GRANULARITY_MINIMUM && option != c::GRANULARITY_RECOMMENDED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if p.type_ != c::ALLOCATION_TYPE_PINNED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        match p.location.type_ {
            t if t == c::LOCATION_TYPE_DEVICE => d.config.check_device(p.location.id).map(drop)?,
            t if t == c::LOCATION_TYPE_HOST_NUMA => {
                d.config.check_numa_node(p.location.id).map(drop)?
            }
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: size_t out-parameter (cuda.h).
        unsafe { put(granularity, crate::sys::GRANULARITY as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_uint,
    flags: c_ulonglong,
) -> RawResult {
    with(|d| {
        if shareable.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let fd = d.export(handle, handle_type, flags)?;
        // SAFETY: for POSIX FDs `shareable` points at an int (cuda.h); the caller owns the FD.
        unsafe { put(shareable.cast::<c_int>(), fd.into_raw_fd()) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> RawResult {
    with(|d| {
        if handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if handle_type != crate::abi::consts::HANDLE_TYPE_POSIX_FD {
            // Only POSIX FDs travel as numbers; fabric (no IMEX) and Win32 handles are not
            // supported here, anything else is no handle type.
            return d.import_type_check(handle_type);
        }
        // For POSIX FDs the "pointer" carries the descriptor number itself (cuda.h).
        let raw = os_handle as usize;
        let fd_num = i32::try_from(raw).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        if nix::fcntl::fcntl(
            // SAFETY: only used to probe validity; F_GETFD on any number is harmless.
            unsafe { BorrowedFd::borrow_raw(fd_num) },
            nix::fcntl::FcntlArg::F_GETFD,
        )
        .is_err()
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the descriptor is open (checked above) and stays open for this call; the
        // caller keeps ownership.
        let fd = unsafe { BorrowedFd::borrow_raw(fd_num) };
        let h = d.import(fd, handle_type)?;
        // SAFETY: handle out-parameter (cuda.h), non-null.
        unsafe { put(handle, h) }
    })
}

// ---- classic allocations, copies, host registration ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> RawResult {
    with(|d| {
        if dptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.mem_alloc(bytesize as u64)?;
        // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
        unsafe { put(dptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> RawResult {
    with(|d| d.mem_free(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CUdeviceptr,
    psize: *mut usize,
    dptr: CUdeviceptr,
) -> RawResult {
    with(|d| {
        let (base, size) = d.address_range(dptr)?;
        // SAFETY: both out-parameters are optional (cuda.h); non-null ones are writable.
        unsafe {
            if !pbase.is_null() {
                put(pbase, base)?;
            }
            if !psize.is_null() {
                put(psize, size as usize)?;
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> RawResult {
    // SAFETY: forwarded with the default stream.
    unsafe { cuMemcpyHtoDAsync_v2(dst, src, n, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if src.is_null() && n > 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `src` is the caller's host buffer of `n` bytes (cuda.h).
        unsafe { memcpy::htod(dst, src.cast(), n, Some(stream as usize as u64)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> RawResult {
    // SAFETY: forwarded with the default stream.
    unsafe { cuMemcpyDtoHAsync_v2(dst, src, n, std::ptr::null_mut()) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if dst.is_null() && n > 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `dst` is the caller's writable host buffer of `n` bytes (cuda.h).
        unsafe { memcpy::dtoh(dst.cast(), src, n, Some(stream as usize as u64)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> RawResult {
    gated(|| memcpy::dtod(dst, src, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| memcpy::dtod(dst, src, n, Some(stream as usize as u64)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> RawResult {
    // Unified addressing: with both sides device memory this is a device-to-device copy.
    gated(|| memcpy::dtod(dst, src, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize) -> RawResult {
    gated(|| memcpy::memset_d8(dst, value, n, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: c_uchar,
    n: usize,
    stream: CUstream,
) -> RawResult {
    gated(|| memcpy::memset_d8(dst, value, n, Some(stream as usize as u64)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytesize: usize,
    flags: c_uint,
) -> RawResult {
    with(|d| d.host_register(p as usize as u64, bytesize as u64, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> RawResult {
    with(|d| d.host_unregister(p as usize as u64))
}

// ---- native IPC ----

/// What fakecuda holds for the calling process, for leak checks (not a CUDA API).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FakecudaObjects {
    /// Physical allocations (VMM, cuMemAlloc, imported, IPC-opened) still alive.
    pub allocations: u64,
    /// Mappings (of allocations and multicast objects).
    pub mappings: u64,
    /// Address reservations (the application's and fakecuda's own).
    pub reservations: u64,
    /// Multicast objects still alive.
    pub multicast_objects: u64,
    /// Native IPC handles of peers open here.
    pub ipc_opened: u64,
}

/// Fills `out` with what the driver holds for this process. Not a CUDA API: fakecuda's test
/// hook (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fakecuda_objects(out: *mut FakecudaObjects) -> RawResult {
    run(|| {
        let objects = driver::with(|d| Ok(d.objects()))?;
        // SAFETY: out-parameter of the caller.
        unsafe { put(out, objects) }
    })
}

/// How many times this process called cuIpcGetMemHandle, cuIpcOpenMemHandle_v2 or
/// cuIpcCloseMemHandle (successful or not). Not a CUDA API: fakecuda's test hook.
#[unsafe(no_mangle)]
pub extern "C" fn fakecuda_native_ipc_calls() -> u64 {
    ipc::calls()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> RawResult {
    ipc::count_call();
    with(|d| {
        if handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = d.ipc_get(dptr)?;
        let reserved = bytes.map(|b| b as c_char);
        // SAFETY: CUipcMemHandle out-parameter (cuda.h), non-null.
        unsafe { put(handle, CUipcMemHandle { reserved }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> RawResult {
    ipc::count_call();
    gated(|| {
        if pdptr.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = handle.reserved.map(|b| b as u8);
        let p = ipc::open(&bytes, flags)?;
        // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
        unsafe { put(pdptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> RawResult {
    ipc::count_call();
    with(|d| d.ipc_close(dptr))
}

// ---- multicast ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastCreate(
    mc_handle: *mut CUmemGenericAllocationHandle,
    prop: *const CUmulticastObjectProp,
) -> RawResult {
    with(|d| {
        // SAFETY: CUmulticastObjectProp input (cuda.h): integers only.
        let prop = unsafe { get(prop) }?;
        if mc_handle.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let h = d.mc_create(&prop)?;
        // SAFETY: handle out-parameter (cuda.h), non-null.
        unsafe { put(mc_handle, h) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastAddDevice(
    mc_handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
) -> RawResult {
    with(|d| d.mc_add_device(mc_handle, dev))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindMem(
    mc_handle: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem_handle: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    let src = multicast::BindSource::Mem {
        handle: mem_handle,
        offset: mem_offset as u64,
    };
    gated(|| multicast::bind(mc_handle, None, mc_offset as u64, src, size as u64, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindMem_v2(
    mc_handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    mem_handle: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    let src = multicast::BindSource::Mem {
        handle: mem_handle,
        offset: mem_offset as u64,
    };
    gated(|| {
        multicast::bind(
            mc_handle,
            Some(dev),
            mc_offset as u64,
            src,
            size as u64,
            flags,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindAddr(
    mc_handle: CUmemGenericAllocationHandle,
    mc_offset: usize,
    memptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    let src = multicast::BindSource::Addr { ptr: memptr };
    gated(|| multicast::bind(mc_handle, None, mc_offset as u64, src, size as u64, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastBindAddr_v2(
    mc_handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    memptr: CUdeviceptr,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    let src = multicast::BindSource::Addr { ptr: memptr };
    gated(|| {
        multicast::bind(
            mc_handle,
            Some(dev),
            mc_offset as u64,
            src,
            size as u64,
            flags,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMulticastUnbind(
    mc_handle: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> RawResult {
    with(|d| d.mc_unbind(mc_handle, dev, mc_offset as u64, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMulticastGetGranularity(
    granularity: *mut usize,
    prop: *const CUmulticastObjectProp,
    option: c_uint,
) -> RawResult {
    with(|_| {
        // SAFETY: CUmulticastObjectProp input (cuda.h): integers only.
        let prop = unsafe { get(prop) }?;
        let g = multicast::granularity(&prop, option)?;
        // SAFETY: size_t out-parameter (cuda.h).
        unsafe { put(granularity, g as usize) }
    })
}

// ---- native checkpoint (another process's driver) ----

/// Reads an optional args struct and checks its reserved bytes are zero.
///
/// # Safety
/// `args` is null or points at a readable `T`.
unsafe fn reserved_zero<T: Copy>(args: *const T, skip: usize) -> CuResult<Option<T>> {
    if args.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, readable per the caller; viewed as bytes of a plain C struct.
    let bytes = unsafe { std::slice::from_raw_parts(args.cast::<u8>(), size_of::<T>()) };
    if bytes[skip..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: as above; the struct holds only integers and pointers.
    Ok(Some(unsafe { args.read() }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_uint) -> RawResult {
    run(|| {
        if state.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let s = checkpoint::client::get_state(pid)?;
        // SAFETY: CUprocessState out-parameter (a C enum: u32), non-null.
        unsafe { put(state, s) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessLock(
    pid: c_int,
    args: *mut CUcheckpointLockArgs,
) -> RawResult {
    run(|| {
        // SAFETY: optional CUcheckpointLockArgs (cuda.h); only timeoutMs may be non-zero.
        let a = unsafe { reserved_zero(args, 4) }?;
        let timeout = a.map_or(0, |a| a.timeoutMs);
        checkpoint::client::simple(pid, Op::Lock, u64::from(timeout))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(
    pid: c_int,
    args: *mut CUcheckpointCheckpointArgs,
) -> RawResult {
    run(|| {
        // SAFETY: optional CUcheckpointCheckpointArgs (cuda.h): reserved, must be zero.
        unsafe { reserved_zero(args, 0) }?;
        checkpoint::client::simple(pid, Op::Checkpoint, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessRestore(
    pid: c_int,
    args: *mut CUcheckpointRestoreArgs,
) -> RawResult {
    run(|| {
        if !args.is_null() {
            // SAFETY: optional CUcheckpointRestoreArgs (cuda.h).
            let a = unsafe { args.read() };
            if a.gpuPairsCount != 0 {
                // GPU remapping on restore is not modelled: devices are the same ordinals.
                return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
            }
        }
        checkpoint::client::simple(pid, Op::Restore, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(
    pid: c_int,
    args: *mut CUcheckpointUnlockArgs,
) -> RawResult {
    run(|| {
        // SAFETY: optional CUcheckpointUnlockArgs (cuda.h): reserved, must be zero.
        unsafe { reserved_zero(args, 0) }?;
        checkpoint::client::simple(pid, Op::Unlock, 0)
    })
}

const _: () = assert!(CUDA_SUCCESS == 0);
