//! `cuGetProcAddress`: fakecuda's own entry points by the names callers ask for, each resolved
//! to the ABI CUDA hands out for the caller's `cudaVersion` (e.g. "cuMemAlloc" →
//! `cuMemAlloc_v2` from 3.2 on, "cuMulticastBindMem" → `_v2` from 13.1). Because the library is
//! linked with `-Bsymbolic-functions`, these are the library's own functions even when an
//! interposer exports the same names.

use crate::abi::consts as c;
use crate::error::{CuError, CuResult};
use crate::ffi;
use std::ffi::c_void;

/// One list, the only one: each name a caller may ask for with the versions of its ABIs, newest
/// first (`from => symbol`: the symbol a caller built for `from` or later gets). From it come
/// the exported symbols by exact name and the version table. The versions are those NVIDIA's
/// `cuda.bindings` 13 asks for, the version each ABI first shipped in.
macro_rules! entry_points {
    ($($name:ident: $($from:literal => $symbol:ident),+;)*) => {
        /// (name, [(from version, symbol)]), newest ABI first.
        pub const TABLE: &[(&str, &[(i32, &str)])] =
            &[$((stringify!($name), &[$(($from, stringify!($symbol))),+])),*];

        /// Every CUDA entry point the library exports, by exact symbol name.
        // An alias (cuGraphInstantiate) names a symbol listed under its own name too.
        #[allow(unreachable_patterns)]
        pub fn exact(name: &str) -> Option<*mut c_void> {
            match name {
                $($(stringify!($symbol) => Some(ffi::$symbol as *const () as *mut c_void),)+)*
                _ => None,
            }
        }
    };
}

entry_points! {
    cuInit: 2000 => cuInit;
    cuDriverGetVersion: 2020 => cuDriverGetVersion;
    cuGetErrorName: 6000 => cuGetErrorName;
    cuGetErrorString: 6000 => cuGetErrorString;
    cuGetProcAddress: 12000 => cuGetProcAddress_v2, 11030 => cuGetProcAddress;
    cuDeviceGet: 2000 => cuDeviceGet;
    cuDeviceGetCount: 2000 => cuDeviceGetCount;
    cuDeviceGetName: 2000 => cuDeviceGetName;
    cuDeviceGetUuid: 11040 => cuDeviceGetUuid_v2, 9020 => cuDeviceGetUuid;
    cuDeviceGetAttribute: 2000 => cuDeviceGetAttribute;
    cuDeviceTotalMem: 3020 => cuDeviceTotalMem_v2;
    cuMemGetInfo: 3020 => cuMemGetInfo_v2;
    cuDevicePrimaryCtxRetain: 7000 => cuDevicePrimaryCtxRetain;
    cuDevicePrimaryCtxRelease: 11000 => cuDevicePrimaryCtxRelease_v2, 7000 => cuDevicePrimaryCtxRelease;
    cuDevicePrimaryCtxReset: 11000 => cuDevicePrimaryCtxReset_v2, 7000 => cuDevicePrimaryCtxReset;
    cuDevicePrimaryCtxGetState: 7000 => cuDevicePrimaryCtxGetState;
    cuCtxCreate: 12050 => cuCtxCreate_v4, 11040 => cuCtxCreate_v3, 3020 => cuCtxCreate_v2;
    cuCtxDestroy: 4000 => cuCtxDestroy_v2;
    cuCtxGetCurrent: 4000 => cuCtxGetCurrent;
    cuCtxSetCurrent: 4000 => cuCtxSetCurrent;
    cuCtxPushCurrent: 4000 => cuCtxPushCurrent_v2;
    cuCtxPopCurrent: 4000 => cuCtxPopCurrent_v2;
    cuCtxSynchronize: 13000 => cuCtxSynchronize_v2, 2000 => cuCtxSynchronize;
    cuCtxGetDevice: 13000 => cuCtxGetDevice_v2, 2000 => cuCtxGetDevice;
    cuCtxEnablePeerAccess: 4000 => cuCtxEnablePeerAccess;
    cuCtxDisablePeerAccess: 4000 => cuCtxDisablePeerAccess;
    cuDeviceCanAccessPeer: 4000 => cuDeviceCanAccessPeer;
    cuDeviceGetP2PAttribute: 8000 => cuDeviceGetP2PAttribute;
    cuStreamCreate: 2000 => cuStreamCreate;
    cuStreamCreateWithPriority: 5050 => cuStreamCreateWithPriority;
    cuCtxGetStreamPriorityRange: 5050 => cuCtxGetStreamPriorityRange;
    cuStreamGetPriority: 5050 => cuStreamGetPriority;
    cuStreamGetFlags: 5050 => cuStreamGetFlags;
    cuStreamGetCtx: 12050 => cuStreamGetCtx_v2, 9020 => cuStreamGetCtx;
    cuStreamGetId: 12000 => cuStreamGetId;
    cuStreamQuery: 2000 => cuStreamQuery;
    cuStreamIsCapturing: 10000 => cuStreamIsCapturing;
    cuDeviceGetDevResource: 12040 => cuDeviceGetDevResource;
    cuCtxGetDevResource: 12040 => cuCtxGetDevResource;
    cuStreamGetDevResource: 13010 => cuStreamGetDevResource;
    cuDevSmResourceSplitByCount: 12040 => cuDevSmResourceSplitByCount;
    cuDevSmResourceSplit: 13010 => cuDevSmResourceSplit;
    cuDevResourceGenerateDesc: 12040 => cuDevResourceGenerateDesc;
    cuGreenCtxCreate: 12040 => cuGreenCtxCreate;
    cuGreenCtxDestroy: 12040 => cuGreenCtxDestroy;
    cuCtxFromGreenCtx: 12040 => cuCtxFromGreenCtx;
    cuGreenCtxGetDevResource: 12040 => cuGreenCtxGetDevResource;
    cuGreenCtxGetId: 13000 => cuGreenCtxGetId;
    cuGreenCtxStreamCreate: 12050 => cuGreenCtxStreamCreate;
    cuStreamGetGreenCtx: 12040 => cuStreamGetGreenCtx;
    cuGreenCtxRecordEvent: 12040 => cuGreenCtxRecordEvent;
    cuGreenCtxWaitEvent: 12040 => cuGreenCtxWaitEvent;
    cuGraphCreate: 10000 => cuGraphCreate;
    cuGraphDestroy: 10000 => cuGraphDestroy;
    cuGraphAddEmptyNode: 10000 => cuGraphAddEmptyNode;
    cuGraphAddHostNode: 10000 => cuGraphAddHostNode;
    cuGraphAddMemsetNode: 10000 => cuGraphAddMemsetNode;
    cuGraphAddMemcpyNode: 10000 => cuGraphAddMemcpyNode;
    cuGraphAddChildGraphNode: 10000 => cuGraphAddChildGraphNode;
    cuGraphAddNode: 13041 => cuGraphAddNode_v3, 12030 => cuGraphAddNode_v2, 12020 => cuGraphAddNode;
    cuGraphConditionalHandleCreate: 12030 => cuGraphConditionalHandleCreate;
    cuGraphAddMemAllocNode: 11040 => cuGraphAddMemAllocNode;
    cuGraphAddMemFreeNode: 11040 => cuGraphAddMemFreeNode;
    cuDeviceGetGraphMemAttribute: 11040 => cuDeviceGetGraphMemAttribute;
    cuDeviceSetGraphMemAttribute: 11040 => cuDeviceSetGraphMemAttribute;
    cuDeviceGraphMemTrim: 11040 => cuDeviceGraphMemTrim;
    cuGraphNodeGetType: 10000 => cuGraphNodeGetType;
    cuGraphAddEventRecordNode: 11010 => cuGraphAddEventRecordNode;
    cuGraphAddEventWaitNode: 11010 => cuGraphAddEventWaitNode;
    cuGraphEventRecordNodeGetEvent: 11010 => cuGraphEventRecordNodeGetEvent;
    cuGraphEventRecordNodeSetEvent: 11010 => cuGraphEventRecordNodeSetEvent;
    cuGraphEventWaitNodeGetEvent: 11010 => cuGraphEventWaitNodeGetEvent;
    cuGraphEventWaitNodeSetEvent: 11010 => cuGraphEventWaitNodeSetEvent;
    cuGraphExecEventRecordNodeSetEvent: 11010 => cuGraphExecEventRecordNodeSetEvent;
    cuGraphExecEventWaitNodeSetEvent: 11010 => cuGraphExecEventWaitNodeSetEvent;
    cuUserObjectCreate: 11030 => cuUserObjectCreate;
    cuUserObjectRetain: 11030 => cuUserObjectRetain;
    cuUserObjectRelease: 11030 => cuUserObjectRelease;
    cuGraphRetainUserObject: 11030 => cuGraphRetainUserObject;
    cuGraphReleaseUserObject: 11030 => cuGraphReleaseUserObject;
    cuGraphGetRootNodes: 10000 => cuGraphGetRootNodes;
    cuGraphAddDependencies: 12030 => cuGraphAddDependencies_v2, 10000 => cuGraphAddDependencies;
    cuGraphRemoveDependencies: 12030 => cuGraphRemoveDependencies_v2, 10000 => cuGraphRemoveDependencies;
    cuGraphGetEdges: 12030 => cuGraphGetEdges_v2, 10000 => cuGraphGetEdges;
    cuGraphNodeGetDependencies: 12030 => cuGraphNodeGetDependencies_v2, 10000 => cuGraphNodeGetDependencies;
    cuGraphNodeGetDependentNodes: 12030 => cuGraphNodeGetDependentNodes_v2, 10000 => cuGraphNodeGetDependentNodes;
    cuGraphDestroyNode: 10000 => cuGraphDestroyNode;
    cuGraphDebugDotPrint: 11030 => cuGraphDebugDotPrint;
    cuGraphInstantiateWithParams: 12000 => cuGraphInstantiateWithParams;
    cuGraphUpload: 11010 => cuGraphUpload;
    cuGraphMemAllocNodeGetParams: 11040 => cuGraphMemAllocNodeGetParams;
    cuGraphMemFreeNodeGetParams: 11040 => cuGraphMemFreeNodeGetParams;
    cuGraphGetNodes: 10000 => cuGraphGetNodes;
    cuGraphMemcpyNodeGetParams: 10000 => cuGraphMemcpyNodeGetParams;
    cuGraphMemcpyNodeSetParams: 10000 => cuGraphMemcpyNodeSetParams;
    cuGraphMemsetNodeGetParams: 10000 => cuGraphMemsetNodeGetParams;
    cuGraphMemsetNodeSetParams: 10000 => cuGraphMemsetNodeSetParams;
    cuGraphHostNodeGetParams: 10000 => cuGraphHostNodeGetParams;
    cuGraphHostNodeSetParams: 10000 => cuGraphHostNodeSetParams;
    cuGraphExecMemcpyNodeSetParams: 10020 => cuGraphExecMemcpyNodeSetParams;
    cuGraphExecMemsetNodeSetParams: 10020 => cuGraphExecMemsetNodeSetParams;
    cuGraphExecHostNodeSetParams: 10020 => cuGraphExecHostNodeSetParams;
    cuGraphNodeSetParams: 13041 => cuGraphNodeSetParams_v2, 12020 => cuGraphNodeSetParams;
    cuGraphExecNodeSetParams: 12020 => cuGraphExecNodeSetParams;
    cuGraphNodeGetParams: 13020 => cuGraphNodeGetParams;
    cuGraphInstantiateWithFlags: 11040 => cuGraphInstantiateWithFlags;
    cuGraphInstantiate: 12000 => cuGraphInstantiateWithFlags;
    cuGraphLaunch: 10000 => cuGraphLaunch;
    cuGraphExecDestroy: 10000 => cuGraphExecDestroy;
    cuGraphGetId: 13010 => cuGraphGetId;
    cuGraphExecGetId: 13010 => cuGraphExecGetId;
    cuGraphNodeGetLocalId: 13010 => cuGraphNodeGetLocalId;
    cuGraphNodeGetToolsId: 13010 => cuGraphNodeGetToolsId;
    cuGraphNodeGetContainingGraph: 13010 => cuGraphNodeGetContainingGraph;
    cuStreamSynchronize: 2000 => cuStreamSynchronize;
    cuStreamDestroy: 4000 => cuStreamDestroy_v2;
    cuStreamWaitEvent: 3020 => cuStreamWaitEvent;
    cuLaunchHostFunc: 13020 => cuLaunchHostFunc_v2, 10000 => cuLaunchHostFunc;
    cuStreamAddCallback: 5000 => cuStreamAddCallback;
    cuEventCreate: 2000 => cuEventCreate;
    cuEventDestroy: 4000 => cuEventDestroy_v2;
    cuEventRecord: 2000 => cuEventRecord;
    cuEventRecordWithFlags: 11010 => cuEventRecordWithFlags;
    cuEventQuery: 2000 => cuEventQuery;
    cuEventSynchronize: 2000 => cuEventSynchronize;
    cuEventElapsedTime: 12080 => cuEventElapsedTime_v2, 2000 => cuEventElapsedTime;
    cuCtxGetApiVersion: 3020 => cuCtxGetApiVersion;
    cuMemAddressReserve: 10020 => cuMemAddressReserve;
    cuMemAddressFree: 10020 => cuMemAddressFree;
    cuMemCreate: 10020 => cuMemCreate;
    cuMemRelease: 10020 => cuMemRelease;
    cuMemMap: 10020 => cuMemMap;
    cuMemUnmap: 10020 => cuMemUnmap;
    cuMemSetAccess: 10020 => cuMemSetAccess;
    cuMemGetAccess: 10020 => cuMemGetAccess;
    cuMemRetainAllocationHandle: 11000 => cuMemRetainAllocationHandle;
    cuMemGetAllocationPropertiesFromHandle: 10020 => cuMemGetAllocationPropertiesFromHandle;
    cuMemGetAllocationGranularity: 10020 => cuMemGetAllocationGranularity;
    cuMemExportToShareableHandle: 10020 => cuMemExportToShareableHandle;
    cuMemImportFromShareableHandle: 10020 => cuMemImportFromShareableHandle;
    cuMemAlloc: 3020 => cuMemAlloc_v2;
    cuMemFree: 3020 => cuMemFree_v2;
    cuMemGetAddressRange: 3020 => cuMemGetAddressRange_v2;
    cuMemcpyHtoD: 3020 => cuMemcpyHtoD_v2;
    cuMemcpyHtoDAsync: 3020 => cuMemcpyHtoDAsync_v2;
    cuMemcpyDtoH: 3020 => cuMemcpyDtoH_v2;
    cuMemcpyDtoHAsync: 3020 => cuMemcpyDtoHAsync_v2;
    cuMemcpyDtoD: 3020 => cuMemcpyDtoD_v2;
    cuMemcpyDtoDAsync: 3020 => cuMemcpyDtoDAsync_v2;
    cuMemcpy: 4000 => cuMemcpy;
    cuMemcpyAsync: 4000 => cuMemcpyAsync;
    cuMemcpyPeer: 4000 => cuMemcpyPeer;
    cuMemcpyPeerAsync: 4000 => cuMemcpyPeerAsync;
    cuMemsetD8: 3020 => cuMemsetD8_v2;
    cuMemsetD8Async: 3020 => cuMemsetD8Async;
    cuMemsetD16: 3020 => cuMemsetD16_v2;
    cuMemsetD16Async: 3020 => cuMemsetD16Async;
    cuMemsetD32: 3020 => cuMemsetD32_v2;
    cuMemsetD32Async: 3020 => cuMemsetD32Async;
    cuMemHostRegister: 6050 => cuMemHostRegister_v2;
    cuMemHostUnregister: 4000 => cuMemHostUnregister;
    cuMemAllocHost: 3020 => cuMemAllocHost_v2;
    cuMemHostAlloc: 2020 => cuMemHostAlloc;
    cuMemFreeHost: 2000 => cuMemFreeHost;
    cuMemHostGetDevicePointer: 3020 => cuMemHostGetDevicePointer_v2;
    cuMemHostGetFlags: 2030 => cuMemHostGetFlags;
    cuMemAllocManaged: 6000 => cuMemAllocManaged;
    cuPointerGetAttribute: 4000 => cuPointerGetAttribute;
    cuPointerGetAttributes: 7000 => cuPointerGetAttributes;
    cuPointerSetAttribute: 6000 => cuPointerSetAttribute;
    cuMemAdvise: 12020 => cuMemAdvise_v2, 8000 => cuMemAdvise;
    cuMemPrefetchAsync: 12020 => cuMemPrefetchAsync_v2, 8000 => cuMemPrefetchAsync;
    cuMemRangeGetAttribute: 8000 => cuMemRangeGetAttribute;
    cuMemPrefetchBatchAsync: 13000 => cuMemPrefetchBatchAsync;
    cuMemDiscardBatchAsync: 13000 => cuMemDiscardBatchAsync;
    cuMemDiscardAndPrefetchBatchAsync: 13000 => cuMemDiscardAndPrefetchBatchAsync;
    cuMemRangeGetAttributes: 8000 => cuMemRangeGetAttributes;
    cuDeviceGetDefaultMemPool: 11020 => cuDeviceGetDefaultMemPool;
    cuDeviceGetMemPool: 11020 => cuDeviceGetMemPool;
    cuDeviceSetMemPool: 11020 => cuDeviceSetMemPool;
    cuMemGetMemPool: 13000 => cuMemGetMemPool;
    cuMemPoolCreate: 11020 => cuMemPoolCreate;
    cuMemPoolDestroy: 11020 => cuMemPoolDestroy;
    cuMemPoolGetAttribute: 11020 => cuMemPoolGetAttribute;
    cuMemPoolSetAttribute: 11020 => cuMemPoolSetAttribute;
    cuMemPoolSetAccess: 11020 => cuMemPoolSetAccess;
    cuMemPoolGetAccess: 11020 => cuMemPoolGetAccess;
    cuMemPoolTrimTo: 11020 => cuMemPoolTrimTo;
    cuMemAllocFromPoolAsync: 11020 => cuMemAllocFromPoolAsync;
    cuMemAllocAsync: 11020 => cuMemAllocAsync;
    cuMemFreeAsync: 11020 => cuMemFreeAsync;
    cuMemPoolExportToShareableHandle: 11020 => cuMemPoolExportToShareableHandle;
    cuMemPoolImportFromShareableHandle: 11020 => cuMemPoolImportFromShareableHandle;
    cuMemPoolExportPointer: 11020 => cuMemPoolExportPointer;
    cuMemPoolImportPointer: 11020 => cuMemPoolImportPointer;
    cuIpcGetMemHandle: 4010 => cuIpcGetMemHandle;
    cuIpcOpenMemHandle: 11000 => cuIpcOpenMemHandle_v2, 4010 => cuIpcOpenMemHandle;
    cuIpcCloseMemHandle: 4010 => cuIpcCloseMemHandle;
    cuIpcGetEventHandle: 4010 => cuIpcGetEventHandle;
    cuIpcOpenEventHandle: 4010 => cuIpcOpenEventHandle;
    cuMulticastCreate: 12010 => cuMulticastCreate;
    cuMulticastAddDevice: 12010 => cuMulticastAddDevice;
    cuMulticastBindMem: 13010 => cuMulticastBindMem_v2, 12010 => cuMulticastBindMem;
    cuMulticastBindAddr: 13010 => cuMulticastBindAddr_v2, 12010 => cuMulticastBindAddr;
    cuMulticastUnbind: 12010 => cuMulticastUnbind;
    cuMulticastGetGranularity: 12010 => cuMulticastGetGranularity;
    cuProfilerStart: 4000 => cuProfilerStart;
    cuProfilerStop: 4000 => cuProfilerStop;
    cuCoredumpSetAttributeGlobal: 12010 => cuCoredumpSetAttributeGlobal;
    cuCoredumpGetAttributeGlobal: 12010 => cuCoredumpGetAttributeGlobal;
    cuCoredumpSetAttribute: 12010 => cuCoredumpSetAttribute;
    cuCoredumpGetAttribute: 12010 => cuCoredumpGetAttribute;
    cuKernelGetName: 12030 => cuKernelGetName;
    cuFuncGetName: 12030 => cuFuncGetName;
    cuModuleLoad: 2000 => cuModuleLoad;
    cuModuleLoadData: 2000 => cuModuleLoadData;
    cuModuleLoadDataEx: 2010 => cuModuleLoadDataEx;
    cuModuleLoadFatBinary: 2000 => cuModuleLoadFatBinary;
    cuLibraryLoadData: 12000 => cuLibraryLoadData;
    cuLibraryLoadFromFile: 12000 => cuLibraryLoadFromFile;
    cuArrayCreate: 3020 => cuArrayCreate_v2;
    cuArrayGetDescriptor: 3020 => cuArrayGetDescriptor_v2;
    cuArrayDestroy: 2000 => cuArrayDestroy;
    cuCheckpointProcessGetState: 12080 => cuCheckpointProcessGetState;
    cuCheckpointProcessGetRestoreThreadId: 12080 => cuCheckpointProcessGetRestoreThreadId;
    cuCheckpointProcessLock: 12080 => cuCheckpointProcessLock;
    cuCheckpointProcessCheckpoint: 12080 => cuCheckpointProcessCheckpoint;
    cuCheckpointProcessRestore: 12080 => cuCheckpointProcessRestore;
    cuCheckpointProcessUnlock: 12080 => cuCheckpointProcessUnlock;
}

/// What a lookup answers: the function (or null), the `CUdriverProcAddressQueryResult` and
/// the call's result.
type Found = (*mut c_void, u32, CuResult<()>);

/// Resolves `name` for a caller built against `version`. Per-thread-default-stream requests
/// (`flags`) get the same functions: every stream operation here is synchronous.
///
/// A name the table lists resolves by version; one older than its oldest ABI here is
/// `VERSION_NOT_SUFFICIENT` (for `cuMemAlloc` before 3.2 the driver would hand out the original
/// ABI, which fakecuda does not have). A suffixed name (`cuMemAlloc_v2`) is found by its exact
/// symbol whatever the version, which the driver does not promise; callers that ask for it
/// know which ABI they want.
pub fn lookup(name: &str, version: i32, flags: u64) -> Found {
    if flags > 2 {
        return (
            std::ptr::null_mut(),
            c::PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Err(CuError::CUDA_ERROR_INVALID_VALUE),
        );
    }
    let symbol = match TABLE.iter().find(|(n, _)| *n == name) {
        Some((_, versions)) => match versions.iter().find(|(from, _)| version >= *from) {
            Some((_, symbol)) => *symbol,
            None => {
                return (
                    std::ptr::null_mut(),
                    c::PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                    Err(CuError::CUDA_ERROR_NOT_FOUND),
                );
            }
        },
        None => name,
    };
    match exact(symbol) {
        Some(p) => (p, c::PROC_ADDRESS_SUCCESS, Ok(())),
        None => (
            std::ptr::null_mut(),
            c::PROC_ADDRESS_SYMBOL_NOT_FOUND,
            Err(CuError::CUDA_ERROR_NOT_FOUND),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, version: i32, expected: Option<&str>) {
        let (found, status, result) = lookup(name, version, 0);
        match expected {
            Some(symbol) => {
                assert_eq!(result, Ok(()), "{name} at {version}");
                assert_eq!(status, c::PROC_ADDRESS_SUCCESS);
                assert_eq!(Some(found), exact(symbol), "{name} at {version}: {symbol}");
            }
            None => {
                assert_eq!(
                    result,
                    Err(CuError::CUDA_ERROR_NOT_FOUND),
                    "{name} at {version}"
                );
                assert!(found.is_null());
                assert_eq!(status, c::PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
            }
        }
    }

    #[test]
    fn each_name_resolves_to_the_abi_of_the_asked_version() {
        check("cuMulticastBindMem", 13010, Some("cuMulticastBindMem_v2"));
        check("cuMulticastBindMem", 12080, Some("cuMulticastBindMem"));
        check("cuCtxGetDevice", 13000, Some("cuCtxGetDevice_v2"));
        check("cuCtxGetDevice", 12090, Some("cuCtxGetDevice"));
        check("cuGraphAddNode", 13041, Some("cuGraphAddNode_v3"));
        check("cuGraphAddNode", 13040, Some("cuGraphAddNode_v2"));
        check("cuGraphAddNode", 12020, Some("cuGraphAddNode"));
        check("cuLaunchHostFunc", 13020, Some("cuLaunchHostFunc_v2"));
        check("cuCtxCreate", 12050, Some("cuCtxCreate_v4"));
        check("cuMemAlloc", 13010, Some("cuMemAlloc_v2"));
        check(
            "cuGraphInstantiate",
            12000,
            Some("cuGraphInstantiateWithFlags"),
        );
        check("cuMemAlloc_v2", 2000, Some("cuMemAlloc_v2"));
    }

    #[test]
    fn a_version_before_a_names_first_abi_is_not_sufficient() {
        check("cuMemPoolCreate", 11010, None);
        check("cuCheckpointProcessLock", 12070, None);
        check("cuMemAlloc", 3010, None);
        check("cuGraphAddNode", 12010, None);
    }

    #[test]
    fn unknown_names_and_bad_flags_are_refused() {
        let (found, status, result) = lookup("cuNoSuchFunction", 13010, 0);
        assert!(found.is_null());
        assert_eq!(status, c::PROC_ADDRESS_SYMBOL_NOT_FOUND);
        assert_eq!(result, Err(CuError::CUDA_ERROR_NOT_FOUND));
        let (found, _, result) = lookup("cuInit", 13010, 4);
        assert!(found.is_null());
        assert_eq!(result, Err(CuError::CUDA_ERROR_INVALID_VALUE));
    }

    /// Each name once, its versions strictly newest first, and every symbol listed under the
    /// name it is the ABI of (its own name less a `_vN` suffix), the one alias excepted.
    #[test]
    fn the_table_is_ordered_and_each_symbol_belongs_to_its_name() {
        let mut names: Vec<&str> = TABLE.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name listed twice");
        for (name, versions) in TABLE {
            assert!(
                versions.windows(2).all(|w| w[0].0 > w[1].0),
                "{name}: versions not newest first"
            );
            for (from, symbol) in *versions {
                assert!((2000..=13100).contains(from), "{name}: version {from}");
                let base = symbol.rsplit_once("_v").map_or(*symbol, |(base, n)| {
                    if n.chars().all(|c| c.is_ascii_digit()) {
                        base
                    } else {
                        symbol
                    }
                });
                let alias =
                    (*name, *symbol) == ("cuGraphInstantiate", "cuGraphInstantiateWithFlags");
                assert!(base == *name || alias, "{symbol} listed under {name}");
            }
        }
    }
}
