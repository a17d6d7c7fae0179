//! Which names the shim wraps, and where its wrappers are.

use super::{exports as x, proc_address as p};
use crate::driver::DRIVER_VARIABLE;
use std::ffi::{CStr, c_void};

/// Every driver name the shim answers with its own function.
pub const WRAPPED: &[&str] = &[
    "cuInit",
    "cuDeviceGetAttribute",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMulticastCreate",
    "cuMulticastAddDevice",
    "cuMulticastBindMem",
    "cuMulticastBindMem_v2",
    "cuMulticastBindAddr",
    "cuMulticastBindAddr_v2",
    "cuMulticastUnbind",
    "cuMulticastGetGranularity",
    "cuDevicePrimaryCtxReset_v2",
    "cuCtxDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPointByVersion",
];

/// The shim's wrapper for a driver symbol name, if it wraps that name.
pub fn wrapper(name: &[u8]) -> Option<*mut c_void> {
    let f: *mut c_void = match name {
        b"cuInit" => x::cuInit as *mut c_void,
        b"cuDeviceGetAttribute" => x::cuDeviceGetAttribute as *mut c_void,
        b"cuGetProcAddress" => p::cuGetProcAddress as *mut c_void,
        b"cuGetProcAddress_v2" => p::cuGetProcAddress_v2 as *mut c_void,
        b"cuMemCreate" => x::cuMemCreate as *mut c_void,
        b"cuMemRelease" => x::cuMemRelease as *mut c_void,
        b"cuMemRetainAllocationHandle" => x::cuMemRetainAllocationHandle as *mut c_void,
        b"cuMemMap" => x::cuMemMap as *mut c_void,
        b"cuMemUnmap" => x::cuMemUnmap as *mut c_void,
        b"cuMemSetAccess" => x::cuMemSetAccess as *mut c_void,
        b"cuMemGetAllocationGranularity" => x::cuMemGetAllocationGranularity as *mut c_void,
        b"cuMemGetAllocationPropertiesFromHandle" => {
            x::cuMemGetAllocationPropertiesFromHandle as *mut c_void
        }
        b"cuMemExportToShareableHandle" => x::cuMemExportToShareableHandle as *mut c_void,
        b"cuMemImportFromShareableHandle" => x::cuMemImportFromShareableHandle as *mut c_void,
        b"cuMulticastCreate" => x::cuMulticastCreate as *mut c_void,
        b"cuMulticastAddDevice" => x::cuMulticastAddDevice as *mut c_void,
        b"cuMulticastBindMem" => x::cuMulticastBindMem as *mut c_void,
        b"cuMulticastBindMem_v2" => x::cuMulticastBindMem_v2 as *mut c_void,
        b"cuMulticastBindAddr" => x::cuMulticastBindAddr as *mut c_void,
        b"cuMulticastBindAddr_v2" => x::cuMulticastBindAddr_v2 as *mut c_void,
        b"cuMulticastUnbind" => x::cuMulticastUnbind as *mut c_void,
        b"cuMulticastGetGranularity" => x::cuMulticastGetGranularity as *mut c_void,
        b"cuDevicePrimaryCtxReset_v2" => x::cuDevicePrimaryCtxReset_v2 as *mut c_void,
        b"cuCtxDestroy_v2" => x::cuCtxDestroy_v2 as *mut c_void,
        b"cuMemAlloc_v2" => x::cuMemAlloc_v2 as *mut c_void,
        b"cuMemFree_v2" => x::cuMemFree_v2 as *mut c_void,
        b"cuMemGetAddressRange_v2" => x::cuMemGetAddressRange_v2 as *mut c_void,
        b"cuIpcGetMemHandle" => x::cuIpcGetMemHandle as *mut c_void,
        b"cuIpcOpenMemHandle" => x::cuIpcOpenMemHandle as *mut c_void,
        b"cuIpcOpenMemHandle_v2" => x::cuIpcOpenMemHandle_v2 as *mut c_void,
        b"cuIpcCloseMemHandle" => x::cuIpcCloseMemHandle as *mut c_void,
        b"cudaGetDriverEntryPoint" => p::cudaGetDriverEntryPoint as *mut c_void,
        b"cudaGetDriverEntryPointByVersion" => p::cudaGetDriverEntryPointByVersion as *mut c_void,
        _ => return None,
    };
    Some(f)
}

fn dladdr(p: *const c_void) -> Option<libc::Dl_info> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    (unsafe { libc::dladdr(p, &mut info) } != 0).then_some(info)
}

fn basename(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// Whether `p` lies in a CUDA library: the driver (`libcuda.so*`, or the library named by
/// `CUINTERPOSE_DRIVER`) or the runtime (`libcudart.so*`).
pub fn is_cuda_library(p: *const c_void) -> bool {
    let Some(info) = dladdr(p) else {
        return false;
    };
    if info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let file = basename(file);
    if file.starts_with(b"libcuda.so") || file.starts_with(b"libcudart.so") {
        return true;
    }
    std::env::var_os(DRIVER_VARIABLE)
        .is_some_and(|v| !v.is_empty() && basename(v.as_encoded_bytes()) == file)
}

/// The wrapper to hand out in place of `found`, a pointer a driver or runtime lookup
/// returned: the wrapper of the exact driver symbol at that address, or `found` itself.
pub fn substitute(found: *mut c_void) -> *mut c_void {
    if found.is_null() || !is_cuda_library(found) {
        return found;
    }
    let Some(info) = dladdr(found) else {
        return found;
    };
    if info.dli_sname.is_null() || info.dli_saddr != found {
        return found;
    }
    // SAFETY: dladdr's symbol name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_sname) };
    wrapper(name.to_bytes()).unwrap_or(found)
}
