//! `cuGetProcAddress`: fakecuda's own entry points by name, resolving unsuffixed names to the
//! version CUDA hands out for the requested `cudaVersion` (e.g. "cuMemAlloc" → `cuMemAlloc_v2`
//! from 3.2 on). Because the library is linked with `-Bsymbolic-functions`, these are the
//! library's own functions even when an interposer exports the same names.

use crate::abi::consts as c;
use crate::error::{CuError, CuResult};
use crate::ffi;
use std::ffi::c_void;

macro_rules! exported {
    ($($name:ident),* $(,)?) => {
        /// Every CUDA entry point the library exports, by exact name.
        pub fn exact(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($name) => Some(ffi::$name as *const () as *mut c_void),)*
                _ => None,
            }
        }
    };
}

exported!(
    cuInit,
    cuDriverGetVersion,
    cuGetErrorName,
    cuGetErrorString,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    cuDeviceGet,
    cuDeviceGetCount,
    cuDeviceGetName,
    cuDeviceGetUuid,
    cuDeviceGetUuid_v2,
    cuDeviceGetAttribute,
    cuDeviceTotalMem_v2,
    cuMemGetInfo_v2,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease_v2,
    cuDevicePrimaryCtxReset_v2,
    cuDevicePrimaryCtxGetState,
    cuCtxCreate_v2,
    cuCtxCreate_v3,
    cuCtxCreate_v4,
    cuCtxDestroy_v2,
    cuCtxGetCurrent,
    cuCtxSetCurrent,
    cuCtxPushCurrent_v2,
    cuCtxPopCurrent_v2,
    cuCtxSynchronize,
    cuCtxGetDevice,
    cuCtxEnablePeerAccess,
    cuCtxDisablePeerAccess,
    cuDeviceCanAccessPeer,
    cuDeviceGetP2PAttribute,
    cuStreamCreate,
    cuStreamCreateWithPriority,
    cuCtxGetStreamPriorityRange,
    cuStreamGetPriority,
    cuStreamGetFlags,
    cuStreamGetCtx,
    cuStreamGetCtx_v2,
    cuStreamGetId,
    cuStreamQuery,
    cuStreamIsCapturing,
    cuDeviceGetDevResource,
    cuCtxGetDevResource,
    cuStreamGetDevResource,
    cuDevSmResourceSplitByCount,
    cuDevSmResourceSplit,
    cuGraphCreate,
    cuGraphDestroy,
    cuGraphAddEmptyNode,
    cuGraphAddHostNode,
    cuGraphAddMemsetNode,
    cuGraphAddMemcpyNode,
    cuGraphAddChildGraphNode,
    cuGraphAddNode,
    cuGraphAddNode_v2,
    cuGraphConditionalHandleCreate,
    cuGraphInstantiateWithFlags,
    cuGraphLaunch,
    cuGraphExecDestroy,
    cuGraphGetId,
    cuGraphExecGetId,
    cuGraphNodeGetLocalId,
    cuGraphNodeGetToolsId,
    cuGraphNodeGetContainingGraph,
    cuStreamSynchronize,
    cuStreamDestroy_v2,
    cuStreamWaitEvent,
    cuLaunchHostFunc,
    cuStreamAddCallback,
    cuEventCreate,
    cuEventDestroy_v2,
    cuEventRecord,
    cuEventRecordWithFlags,
    cuEventQuery,
    cuEventSynchronize,
    cuEventElapsedTime,
    cuEventElapsedTime_v2,
    cuCtxGetApiVersion,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemSetAccess,
    cuMemGetAccess,
    cuMemRetainAllocationHandle,
    cuMemGetAllocationPropertiesFromHandle,
    cuMemGetAllocationGranularity,
    cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle,
    cuMemAlloc_v2,
    cuMemFree_v2,
    cuMemGetAddressRange_v2,
    cuMemcpyHtoD_v2,
    cuMemcpyHtoDAsync_v2,
    cuMemcpyDtoH_v2,
    cuMemcpyDtoHAsync_v2,
    cuMemcpyDtoD_v2,
    cuMemcpyDtoDAsync_v2,
    cuMemcpy,
    cuMemcpyAsync,
    cuMemcpyPeer,
    cuMemcpyPeerAsync,
    cuMemsetD8_v2,
    cuMemsetD8Async,
    cuMemsetD16_v2,
    cuMemsetD16Async,
    cuMemsetD32_v2,
    cuMemsetD32Async,
    cuMemHostRegister_v2,
    cuMemHostUnregister,
    cuMemAllocHost_v2,
    cuMemHostAlloc,
    cuMemFreeHost,
    cuMemHostGetDevicePointer_v2,
    cuMemHostGetFlags,
    cuMemAllocManaged,
    cuPointerGetAttribute,
    cuPointerGetAttributes,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
    cuDeviceSetMemPool,
    cuMemGetMemPool,
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuMemPoolGetAttribute,
    cuMemPoolSetAttribute,
    cuMemPoolSetAccess,
    cuMemPoolGetAccess,
    cuMemPoolTrimTo,
    cuMemAllocFromPoolAsync,
    cuMemAllocAsync,
    cuMemFreeAsync,
    cuMemPoolExportToShareableHandle,
    cuMemPoolImportFromShareableHandle,
    cuMemPoolExportPointer,
    cuMemPoolImportPointer,
    cuIpcGetMemHandle,
    cuIpcOpenMemHandle_v2,
    cuIpcOpenMemHandle,
    cuIpcCloseMemHandle,
    cuMulticastCreate,
    cuMulticastAddDevice,
    cuMulticastBindMem,
    cuMulticastBindMem_v2,
    cuMulticastBindAddr,
    cuMulticastBindAddr_v2,
    cuMulticastUnbind,
    cuMulticastGetGranularity,
    cuProfilerStart,
    cuProfilerStop,
    cuCoredumpSetAttributeGlobal,
    cuCoredumpGetAttributeGlobal,
    cuCoredumpSetAttribute,
    cuCoredumpGetAttribute,
    cuKernelGetName,
    cuFuncGetName,
    cuModuleLoad,
    cuModuleLoadData,
    cuModuleLoadDataEx,
    cuModuleLoadFatBinary,
    cuLibraryLoadData,
    cuLibraryLoadFromFile,
    cuArrayCreate_v2,
    cuArrayGetDescriptor_v2,
    cuArrayDestroy,
    cuDevicePrimaryCtxRelease,
    cuDevicePrimaryCtxReset,
    cuCheckpointProcessGetState,
    cuCheckpointProcessGetRestoreThreadId,
    cuCheckpointProcessLock,
    cuCheckpointProcessCheckpoint,
    cuCheckpointProcessRestore,
    cuCheckpointProcessUnlock,
);

/// Unsuffixed names whose current version carries a suffix: (name, [(from version, symbol)]),
/// newest first, as cuda.h's `#define`s pick them.
const VERSIONED: &[(&str, &[(i32, &str)])] = &[
    ("cuMemAlloc", &[(3020, "cuMemAlloc_v2")]),
    ("cuMemFree", &[(3020, "cuMemFree_v2")]),
    ("cuMemGetAddressRange", &[(3020, "cuMemGetAddressRange_v2")]),
    ("cuMemGetInfo", &[(3020, "cuMemGetInfo_v2")]),
    ("cuDeviceTotalMem", &[(3020, "cuDeviceTotalMem_v2")]),
    ("cuMemcpyHtoD", &[(3020, "cuMemcpyHtoD_v2")]),
    ("cuMemcpyDtoH", &[(3020, "cuMemcpyDtoH_v2")]),
    ("cuMemcpyDtoD", &[(3020, "cuMemcpyDtoD_v2")]),
    ("cuMemcpyHtoDAsync", &[(3020, "cuMemcpyHtoDAsync_v2")]),
    ("cuMemcpyDtoHAsync", &[(3020, "cuMemcpyDtoHAsync_v2")]),
    ("cuMemcpyDtoDAsync", &[(3020, "cuMemcpyDtoDAsync_v2")]),
    ("cuMemsetD8", &[(3020, "cuMemsetD8_v2")]),
    ("cuMemsetD16", &[(3020, "cuMemsetD16_v2")]),
    ("cuMemAllocHost", &[(3020, "cuMemAllocHost_v2")]),
    (
        "cuGraphInstantiate",
        &[(12000, "cuGraphInstantiateWithFlags")],
    ),
    (
        "cuGraphAddNode",
        &[(12030, "cuGraphAddNode_v2"), (12020, "cuGraphAddNode")],
    ),
    (
        "cuMemHostGetDevicePointer",
        &[(3020, "cuMemHostGetDevicePointer_v2")],
    ),
    ("cuMemsetD32", &[(3020, "cuMemsetD32_v2")]),
    ("cuEventDestroy", &[(4000, "cuEventDestroy_v2")]),
    (
        "cuEventElapsedTime",
        &[
            (12080, "cuEventElapsedTime_v2"),
            (2000, "cuEventElapsedTime"),
        ],
    ),
    (
        "cuStreamGetCtx",
        &[(12050, "cuStreamGetCtx_v2"), (9020, "cuStreamGetCtx")],
    ),
    (
        "cuCtxCreate",
        &[
            (12050, "cuCtxCreate_v4"),
            (11040, "cuCtxCreate_v3"),
            (3020, "cuCtxCreate_v2"),
        ],
    ),
    ("cuCtxDestroy", &[(4000, "cuCtxDestroy_v2")]),
    ("cuCtxPushCurrent", &[(4000, "cuCtxPushCurrent_v2")]),
    ("cuCtxPopCurrent", &[(4000, "cuCtxPopCurrent_v2")]),
    ("cuStreamDestroy", &[(4000, "cuStreamDestroy_v2")]),
    ("cuMemHostRegister", &[(6050, "cuMemHostRegister_v2")]),
    (
        "cuDevicePrimaryCtxRelease",
        &[
            (11000, "cuDevicePrimaryCtxRelease_v2"),
            (7000, "cuDevicePrimaryCtxRelease"),
        ],
    ),
    (
        "cuDevicePrimaryCtxReset",
        &[
            (11000, "cuDevicePrimaryCtxReset_v2"),
            (7000, "cuDevicePrimaryCtxReset"),
        ],
    ),
    ("cuArrayCreate", &[(3020, "cuArrayCreate_v2")]),
    ("cuArrayGetDescriptor", &[(3020, "cuArrayGetDescriptor_v2")]),
    (
        "cuIpcOpenMemHandle",
        &[
            (11000, "cuIpcOpenMemHandle_v2"),
            (4010, "cuIpcOpenMemHandle"),
        ],
    ),
    // CUDA 12.0 added the status out-parameter: cuda.h maps the name to the _v2 ABI from then
    // on, so a caller built for 12.x calls what it gets with five arguments.
    (
        "cuGetProcAddress",
        &[(12000, "cuGetProcAddress_v2"), (11030, "cuGetProcAddress")],
    ),
    (
        "cuDeviceGetUuid",
        &[(11040, "cuDeviceGetUuid_v2"), (9020, "cuDeviceGetUuid")],
    ),
];

/// CUDA version that introduced an unsuffixed entry point, where it matters for callers that
/// probe features by version.
const INTRODUCED: &[(&str, i32)] = &[
    ("cuMemCreate", 10020),
    ("cuMemRelease", 10020),
    ("cuMemMap", 10020),
    ("cuMemUnmap", 10020),
    ("cuMemSetAccess", 10020),
    ("cuMemGetAccess", 10020),
    ("cuMemAddressReserve", 10020),
    ("cuMemAddressFree", 10020),
    ("cuMemExportToShareableHandle", 10020),
    ("cuMemImportFromShareableHandle", 10020),
    ("cuMemGetAllocationGranularity", 10020),
    ("cuMemGetAllocationPropertiesFromHandle", 10020),
    ("cuMemRetainAllocationHandle", 11000),
    ("cuGetProcAddress", 11030),
    ("cuMulticastCreate", 12010),
    ("cuMulticastAddDevice", 12010),
    ("cuMulticastBindMem", 12010),
    ("cuMulticastBindAddr", 12010),
    ("cuMulticastUnbind", 12010),
    ("cuMulticastGetGranularity", 12010),
    ("cuCheckpointProcessGetState", 12080),
    ("cuCheckpointProcessGetRestoreThreadId", 12080),
    ("cuCheckpointProcessLock", 12080),
    ("cuCheckpointProcessCheckpoint", 12080),
    ("cuCheckpointProcessRestore", 12080),
    ("cuCheckpointProcessUnlock", 12080),
];

/// Resolves `name` for a caller built against `version`. Per-thread-default-stream requests
/// (`flags`) get the same functions: every stream operation here is synchronous.
pub fn lookup(name: &str, version: i32, flags: u64) -> (*mut c_void, u32, CuResult<()>) {
    let not_found = (
        std::ptr::null_mut(),
        c::PROC_ADDRESS_SYMBOL_NOT_FOUND,
        Err(CuError::CUDA_ERROR_NOT_FOUND),
    );
    if flags > 2 {
        return (
            std::ptr::null_mut(),
            c::PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Err(CuError::CUDA_ERROR_INVALID_VALUE),
        );
    }
    if let Some((_, versions)) = VERSIONED.iter().find(|(n, _)| *n == name) {
        return match versions.iter().find(|(from, _)| version >= *from) {
            Some((_, sym)) => match exact(sym) {
                Some(p) => (p, c::PROC_ADDRESS_SUCCESS, Ok(())),
                None => not_found,
            },
            // Only the pre-suffix ABI exists for such an old version, and fakecuda lacks it.
            None => (
                std::ptr::null_mut(),
                c::PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                Err(CuError::CUDA_ERROR_NOT_FOUND),
            ),
        };
    }
    if let Some((_, from)) = INTRODUCED.iter().find(|(n, _)| *n == name)
        && version < *from
    {
        return (
            std::ptr::null_mut(),
            c::PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            Err(CuError::CUDA_ERROR_NOT_FOUND),
        );
    }
    match exact(name) {
        Some(p) => (p, c::PROC_ADDRESS_SUCCESS, Ok(())),
        None => not_found,
    }
}
