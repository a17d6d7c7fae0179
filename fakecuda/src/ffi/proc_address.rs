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
/// first (`from => module::symbol`: the symbol a caller built for `from` or later gets, and the
/// `ffi` module that defines it). From it come the exported symbols by exact name and the
/// version table. The versions are those NVIDIA's
/// `cuda.bindings` 13 asks for, the version each ABI first shipped in.
macro_rules! entry_points {
    ($($name:ident: $($from:literal => $module:ident::$symbol:ident),+;)*) => {
        /// (name, [(from version, symbol)]), newest ABI first.
        pub const TABLE: &[(&str, &[(i32, &str)])] =
            &[$((stringify!($name), &[$(($from, stringify!($symbol))),+])),*];

        /// Every CUDA entry point the library exports, by exact symbol name.
        // An alias (cuGraphInstantiate) names a symbol listed under its own name too.
        #[allow(unreachable_patterns)]
        pub fn exact(name: &str) -> Option<*mut c_void> {
            match name {
                $($(stringify!($symbol) =>
                    Some(ffi::$module::$symbol as *const () as *mut c_void),)+)*
                _ => None,
            }
        }
    };
}

entry_points! {
    cuInit: 2000 => init::cuInit;
    cuDriverGetVersion: 2020 => init::cuDriverGetVersion;
    cuGetErrorName: 6000 => init::cuGetErrorName;
    cuGetErrorString: 6000 => init::cuGetErrorString;
    cuGetProcAddress: 12000 => init::cuGetProcAddress_v2, 11030 => init::cuGetProcAddress;
    cuDeviceGet: 2000 => devices::cuDeviceGet;
    cuDeviceGetCount: 2000 => devices::cuDeviceGetCount;
    cuDeviceGetName: 2000 => devices::cuDeviceGetName;
    cuDeviceGetUuid: 11040 => devices::cuDeviceGetUuid_v2, 9020 => devices::cuDeviceGetUuid;
    cuDeviceGetAttribute: 2000 => devices::cuDeviceGetAttribute;
    cuDeviceTotalMem: 3020 => devices::cuDeviceTotalMem_v2;
    cuMemGetInfo: 3020 => devices::cuMemGetInfo_v2;
    cuDevicePrimaryCtxRetain: 7000 => contexts::cuDevicePrimaryCtxRetain;
    cuDevicePrimaryCtxRelease:
        11000 => contexts::cuDevicePrimaryCtxRelease_v2,
        7000 => extras::cuDevicePrimaryCtxRelease;
    cuDevicePrimaryCtxReset:
        11000 => contexts::cuDevicePrimaryCtxReset_v2,
        7000 => extras::cuDevicePrimaryCtxReset;
    cuDevicePrimaryCtxGetState: 7000 => contexts::cuDevicePrimaryCtxGetState;
    cuCtxCreate:
        12050 => contexts::cuCtxCreate_v4,
        11040 => contexts::cuCtxCreate_v3,
        3020 => contexts::cuCtxCreate_v2;
    cuCtxDestroy: 4000 => contexts::cuCtxDestroy_v2;
    cuCtxGetCurrent: 4000 => contexts::cuCtxGetCurrent;
    cuCtxSetCurrent: 4000 => contexts::cuCtxSetCurrent;
    cuCtxPushCurrent: 4000 => contexts::cuCtxPushCurrent_v2;
    cuCtxPopCurrent: 4000 => contexts::cuCtxPopCurrent_v2;
    cuCtxSynchronize: 13000 => contexts::cuCtxSynchronize_v2, 2000 => contexts::cuCtxSynchronize;
    cuCtxGetDevice: 13000 => contexts::cuCtxGetDevice_v2, 2000 => contexts::cuCtxGetDevice;
    cuCtxEnablePeerAccess: 4000 => contexts::cuCtxEnablePeerAccess;
    cuCtxDisablePeerAccess: 4000 => contexts::cuCtxDisablePeerAccess;
    cuDeviceCanAccessPeer: 4000 => devices::cuDeviceCanAccessPeer;
    cuDeviceGetP2PAttribute: 8000 => devices::cuDeviceGetP2PAttribute;
    cuStreamCreate: 2000 => streams::cuStreamCreate;
    cuStreamCreateWithPriority: 5050 => streams::cuStreamCreateWithPriority;
    cuCtxGetStreamPriorityRange: 5050 => streams::cuCtxGetStreamPriorityRange;
    cuStreamGetPriority: 5050 => streams::cuStreamGetPriority;
    cuStreamGetFlags: 5050 => streams::cuStreamGetFlags;
    cuStreamGetCtx: 12050 => streams::cuStreamGetCtx_v2, 9020 => streams::cuStreamGetCtx;
    cuStreamGetId: 12000 => streams::cuStreamGetId;
    cuStreamQuery: 2000 => streams::cuStreamQuery;
    cuStreamIsCapturing: 10000 => streams::cuStreamIsCapturing;
    cuDeviceGetDevResource: 12040 => resources::cuDeviceGetDevResource;
    cuCtxGetDevResource: 12040 => resources::cuCtxGetDevResource;
    cuStreamGetDevResource: 13010 => resources::cuStreamGetDevResource;
    cuDevSmResourceSplitByCount: 12040 => resources::cuDevSmResourceSplitByCount;
    cuDevSmResourceSplit: 13010 => resources::cuDevSmResourceSplit;
    cuDevResourceGenerateDesc: 12040 => green_contexts::cuDevResourceGenerateDesc;
    cuGreenCtxCreate: 12040 => green_contexts::cuGreenCtxCreate;
    cuGreenCtxDestroy: 12040 => green_contexts::cuGreenCtxDestroy;
    cuCtxFromGreenCtx: 12040 => green_contexts::cuCtxFromGreenCtx;
    cuGreenCtxGetDevResource: 12040 => green_contexts::cuGreenCtxGetDevResource;
    cuGreenCtxGetId: 13000 => green_contexts::cuGreenCtxGetId;
    cuGreenCtxStreamCreate: 12050 => green_contexts::cuGreenCtxStreamCreate;
    cuStreamGetGreenCtx: 12040 => green_contexts::cuStreamGetGreenCtx;
    cuGreenCtxRecordEvent: 12040 => green_contexts::cuGreenCtxRecordEvent;
    cuGreenCtxWaitEvent: 12040 => green_contexts::cuGreenCtxWaitEvent;
    cuGraphCreate: 10000 => graphs::cuGraphCreate;
    cuGraphDestroy: 10000 => graphs::cuGraphDestroy;
    cuGraphAddEmptyNode: 10000 => graphs::cuGraphAddEmptyNode;
    cuGraphAddHostNode: 10000 => graphs::cuGraphAddHostNode;
    cuGraphAddMemsetNode: 10000 => graphs::cuGraphAddMemsetNode;
    cuGraphAddMemcpyNode: 10000 => graphs::cuGraphAddMemcpyNode;
    cuGraphAddChildGraphNode: 10000 => graphs::cuGraphAddChildGraphNode;
    cuGraphAddNode:
        13041 => graph_nodes::cuGraphAddNode_v3,
        12030 => graph_nodes::cuGraphAddNode_v2,
        12020 => graph_nodes::cuGraphAddNode;
    cuGraphConditionalHandleCreate: 12030 => graph_nodes::cuGraphConditionalHandleCreate;
    cuGraphAddMemAllocNode: 11040 => graph_memory::cuGraphAddMemAllocNode;
    cuGraphAddMemFreeNode: 11040 => graph_memory::cuGraphAddMemFreeNode;
    cuDeviceGetGraphMemAttribute: 11040 => graph_memory::cuDeviceGetGraphMemAttribute;
    cuDeviceSetGraphMemAttribute: 11040 => graph_memory::cuDeviceSetGraphMemAttribute;
    cuDeviceGraphMemTrim: 11040 => graph_memory::cuDeviceGraphMemTrim;
    cuGraphNodeGetType: 10000 => graph_params::cuGraphNodeGetType;
    cuGraphAddEventRecordNode: 11010 => graph_events::cuGraphAddEventRecordNode;
    cuGraphAddEventWaitNode: 11010 => graph_events::cuGraphAddEventWaitNode;
    cuGraphEventRecordNodeGetEvent: 11010 => graph_events::cuGraphEventRecordNodeGetEvent;
    cuGraphEventRecordNodeSetEvent: 11010 => graph_events::cuGraphEventRecordNodeSetEvent;
    cuGraphEventWaitNodeGetEvent: 11010 => graph_events::cuGraphEventWaitNodeGetEvent;
    cuGraphEventWaitNodeSetEvent: 11010 => graph_events::cuGraphEventWaitNodeSetEvent;
    cuGraphExecEventRecordNodeSetEvent: 11010 => graph_events::cuGraphExecEventRecordNodeSetEvent;
    cuGraphExecEventWaitNodeSetEvent: 11010 => graph_events::cuGraphExecEventWaitNodeSetEvent;
    cuUserObjectCreate: 11030 => user_objects::cuUserObjectCreate;
    cuUserObjectRetain: 11030 => user_objects::cuUserObjectRetain;
    cuUserObjectRelease: 11030 => user_objects::cuUserObjectRelease;
    cuGraphRetainUserObject: 11030 => user_objects::cuGraphRetainUserObject;
    cuGraphReleaseUserObject: 11030 => user_objects::cuGraphReleaseUserObject;
    cuGraphGetRootNodes: 10000 => graph_queries::cuGraphGetRootNodes;
    cuGraphAddDependencies:
        12030 => graph_queries::cuGraphAddDependencies_v2,
        10000 => graph_queries::cuGraphAddDependencies;
    cuGraphRemoveDependencies:
        12030 => graph_queries::cuGraphRemoveDependencies_v2,
        10000 => graph_queries::cuGraphRemoveDependencies;
    cuGraphGetEdges:
        12030 => graph_queries::cuGraphGetEdges_v2,
        10000 => graph_queries::cuGraphGetEdges;
    cuGraphNodeGetDependencies:
        12030 => graph_queries::cuGraphNodeGetDependencies_v2,
        10000 => graph_queries::cuGraphNodeGetDependencies;
    cuGraphNodeGetDependentNodes:
        12030 => graph_queries::cuGraphNodeGetDependentNodes_v2,
        10000 => graph_queries::cuGraphNodeGetDependentNodes;
    cuGraphDestroyNode: 10000 => graph_queries::cuGraphDestroyNode;
    cuGraphDebugDotPrint: 11030 => graph_queries::cuGraphDebugDotPrint;
    cuGraphInstantiateWithParams: 12000 => graph_queries::cuGraphInstantiateWithParams;
    cuGraphUpload: 11010 => graph_queries::cuGraphUpload;
    cuGraphMemAllocNodeGetParams: 11040 => graph_queries::cuGraphMemAllocNodeGetParams;
    cuGraphMemFreeNodeGetParams: 11040 => graph_queries::cuGraphMemFreeNodeGetParams;
    cuGraphGetNodes: 10000 => graph_queries::cuGraphGetNodes;
    cuGraphMemcpyNodeGetParams: 10000 => graph_params::cuGraphMemcpyNodeGetParams;
    cuGraphMemcpyNodeSetParams: 10000 => graph_params::cuGraphMemcpyNodeSetParams;
    cuGraphMemsetNodeGetParams: 10000 => graph_params::cuGraphMemsetNodeGetParams;
    cuGraphMemsetNodeSetParams: 10000 => graph_params::cuGraphMemsetNodeSetParams;
    cuGraphHostNodeGetParams: 10000 => graph_params::cuGraphHostNodeGetParams;
    cuGraphHostNodeSetParams: 10000 => graph_params::cuGraphHostNodeSetParams;
    cuGraphExecMemcpyNodeSetParams: 10020 => graph_params::cuGraphExecMemcpyNodeSetParams;
    cuGraphExecMemsetNodeSetParams: 10020 => graph_params::cuGraphExecMemsetNodeSetParams;
    cuGraphExecHostNodeSetParams: 10020 => graph_params::cuGraphExecHostNodeSetParams;
    cuGraphNodeSetParams:
        13041 => graph_params::cuGraphNodeSetParams_v2,
        12020 => graph_params::cuGraphNodeSetParams;
    cuGraphExecNodeSetParams: 12020 => graph_params::cuGraphExecNodeSetParams;
    cuGraphNodeGetParams: 13020 => graph_params::cuGraphNodeGetParams;
    cuGraphInstantiateWithFlags: 11040 => graphs::cuGraphInstantiateWithFlags;
    cuGraphInstantiate: 12000 => graphs::cuGraphInstantiateWithFlags;
    cuGraphLaunch: 10000 => graphs::cuGraphLaunch;
    cuGraphExecDestroy: 10000 => graphs::cuGraphExecDestroy;
    cuGraphGetId: 13010 => graphs::cuGraphGetId;
    cuGraphExecGetId: 13010 => graphs::cuGraphExecGetId;
    cuGraphNodeGetLocalId: 13010 => graphs::cuGraphNodeGetLocalId;
    cuGraphNodeGetToolsId: 13010 => graphs::cuGraphNodeGetToolsId;
    cuGraphNodeGetContainingGraph: 13010 => graphs::cuGraphNodeGetContainingGraph;
    cuStreamSynchronize: 2000 => streams::cuStreamSynchronize;
    cuStreamDestroy: 4000 => streams::cuStreamDestroy_v2;
    cuStreamWaitEvent: 3020 => streams::cuStreamWaitEvent;
    cuLaunchHostFunc: 13020 => streams::cuLaunchHostFunc_v2, 10000 => streams::cuLaunchHostFunc;
    cuStreamAddCallback: 5000 => streams::cuStreamAddCallback;
    cuEventCreate: 2000 => streams::cuEventCreate;
    cuEventDestroy: 4000 => streams::cuEventDestroy_v2;
    cuEventRecord: 2000 => streams::cuEventRecord;
    cuEventRecordWithFlags: 11010 => streams::cuEventRecordWithFlags;
    cuEventQuery: 2000 => streams::cuEventQuery;
    cuEventSynchronize: 2000 => streams::cuEventSynchronize;
    cuEventElapsedTime:
        12080 => streams::cuEventElapsedTime_v2,
        2000 => streams::cuEventElapsedTime;
    cuCtxGetApiVersion: 3020 => streams::cuCtxGetApiVersion;
    cuMemAddressReserve: 10020 => virtual_memory::cuMemAddressReserve;
    cuMemAddressFree: 10020 => virtual_memory::cuMemAddressFree;
    cuMemCreate: 10020 => virtual_memory::cuMemCreate;
    cuMemRelease: 10020 => virtual_memory::cuMemRelease;
    cuMemMap: 10020 => virtual_memory::cuMemMap;
    cuMemUnmap: 10020 => virtual_memory::cuMemUnmap;
    cuMemSetAccess: 10020 => virtual_memory::cuMemSetAccess;
    cuMemGetAccess: 10020 => virtual_memory::cuMemGetAccess;
    cuMemRetainAllocationHandle: 11000 => virtual_memory::cuMemRetainAllocationHandle;
    cuMemGetAllocationPropertiesFromHandle:
        10020 => virtual_memory::cuMemGetAllocationPropertiesFromHandle;
    cuMemGetAllocationGranularity: 10020 => virtual_memory::cuMemGetAllocationGranularity;
    cuMemExportToShareableHandle: 10020 => virtual_memory::cuMemExportToShareableHandle;
    cuMemImportFromShareableHandle: 10020 => virtual_memory::cuMemImportFromShareableHandle;
    cuMemAlloc: 3020 => memory::cuMemAlloc_v2;
    cuMemFree: 3020 => memory::cuMemFree_v2;
    cuMemGetAddressRange: 3020 => memory::cuMemGetAddressRange_v2;
    cuMemcpyHtoD: 3020 => memory::cuMemcpyHtoD_v2;
    cuMemcpyHtoDAsync: 3020 => memory::cuMemcpyHtoDAsync_v2;
    cuMemcpyDtoH: 3020 => memory::cuMemcpyDtoH_v2;
    cuMemcpyDtoHAsync: 3020 => memory::cuMemcpyDtoHAsync_v2;
    cuMemcpyDtoD: 3020 => memory::cuMemcpyDtoD_v2;
    cuMemcpyDtoDAsync: 3020 => memory::cuMemcpyDtoDAsync_v2;
    cuMemcpy: 4000 => memory::cuMemcpy;
    cuMemcpyAsync: 4000 => memory::cuMemcpyAsync;
    cuMemcpyPeer: 4000 => memory::cuMemcpyPeer;
    cuMemcpyPeerAsync: 4000 => memory::cuMemcpyPeerAsync;
    cuMemsetD8: 3020 => memory::cuMemsetD8_v2;
    cuMemsetD8Async: 3020 => memory::cuMemsetD8Async;
    cuMemsetD16: 3020 => memory::cuMemsetD16_v2;
    cuMemsetD16Async: 3020 => memory::cuMemsetD16Async;
    cuMemsetD32: 3020 => memory::cuMemsetD32_v2;
    cuMemsetD32Async: 3020 => memory::cuMemsetD32Async;
    cuMemHostRegister: 6050 => memory::cuMemHostRegister_v2;
    cuMemHostUnregister: 4000 => memory::cuMemHostUnregister;
    cuMemAllocHost: 3020 => memory::cuMemAllocHost_v2;
    cuMemHostAlloc: 2020 => memory::cuMemHostAlloc;
    cuMemFreeHost: 2000 => memory::cuMemFreeHost;
    cuMemHostGetDevicePointer: 3020 => memory::cuMemHostGetDevicePointer_v2;
    cuMemHostGetFlags: 2030 => memory::cuMemHostGetFlags;
    cuMemAllocManaged: 6000 => memory::cuMemAllocManaged;
    cuPointerGetAttribute: 4000 => memory::cuPointerGetAttribute;
    cuPointerGetAttributes: 7000 => memory::cuPointerGetAttributes;
    cuPointerSetAttribute: 6000 => memory::cuPointerSetAttribute;
    cuMemAdvise: 12020 => managed::cuMemAdvise_v2, 8000 => managed::cuMemAdvise;
    cuMemPrefetchAsync:
        12020 => managed::cuMemPrefetchAsync_v2,
        8000 => managed::cuMemPrefetchAsync;
    cuMemRangeGetAttribute: 8000 => managed::cuMemRangeGetAttribute;
    cuMemPrefetchBatchAsync: 13000 => managed::cuMemPrefetchBatchAsync;
    cuMemDiscardBatchAsync: 13000 => managed::cuMemDiscardBatchAsync;
    cuMemDiscardAndPrefetchBatchAsync: 13000 => managed::cuMemDiscardAndPrefetchBatchAsync;
    cuMemRangeGetAttributes: 8000 => managed::cuMemRangeGetAttributes;
    cuDeviceGetDefaultMemPool: 11020 => pools::cuDeviceGetDefaultMemPool;
    cuDeviceGetMemPool: 11020 => pools::cuDeviceGetMemPool;
    cuDeviceSetMemPool: 11020 => pools::cuDeviceSetMemPool;
    cuMemGetMemPool: 13000 => pools::cuMemGetMemPool;
    cuMemPoolCreate: 11020 => pools::cuMemPoolCreate;
    cuMemPoolDestroy: 11020 => pools::cuMemPoolDestroy;
    cuMemPoolGetAttribute: 11020 => pools::cuMemPoolGetAttribute;
    cuMemPoolSetAttribute: 11020 => pools::cuMemPoolSetAttribute;
    cuMemPoolSetAccess: 11020 => pools::cuMemPoolSetAccess;
    cuMemPoolGetAccess: 11020 => pools::cuMemPoolGetAccess;
    cuMemPoolTrimTo: 11020 => pools::cuMemPoolTrimTo;
    cuMemAllocFromPoolAsync: 11020 => pools::cuMemAllocFromPoolAsync;
    cuMemAllocAsync: 11020 => pools::cuMemAllocAsync;
    cuMemFreeAsync: 11020 => pools::cuMemFreeAsync;
    cuMemPoolExportToShareableHandle: 11020 => pools::cuMemPoolExportToShareableHandle;
    cuMemPoolImportFromShareableHandle: 11020 => pools::cuMemPoolImportFromShareableHandle;
    cuMemPoolExportPointer: 11020 => pools::cuMemPoolExportPointer;
    cuMemPoolImportPointer: 11020 => pools::cuMemPoolImportPointer;
    cuIpcGetMemHandle: 4010 => native_ipc::cuIpcGetMemHandle;
    cuIpcOpenMemHandle:
        11000 => native_ipc::cuIpcOpenMemHandle_v2,
        4010 => native_ipc::cuIpcOpenMemHandle;
    cuIpcCloseMemHandle: 4010 => native_ipc::cuIpcCloseMemHandle;
    cuIpcGetEventHandle: 4010 => native_ipc::cuIpcGetEventHandle;
    cuIpcOpenEventHandle: 4010 => native_ipc::cuIpcOpenEventHandle;
    cuMulticastCreate: 12010 => multicast_objects::cuMulticastCreate;
    cuMulticastAddDevice: 12010 => multicast_objects::cuMulticastAddDevice;
    cuMulticastBindMem:
        13010 => multicast_objects::cuMulticastBindMem_v2,
        12010 => multicast_objects::cuMulticastBindMem;
    cuMulticastBindAddr:
        13010 => multicast_objects::cuMulticastBindAddr_v2,
        12010 => multicast_objects::cuMulticastBindAddr;
    cuMulticastUnbind: 12010 => multicast_objects::cuMulticastUnbind;
    cuMulticastGetGranularity: 12010 => multicast_objects::cuMulticastGetGranularity;
    cuProfilerStart: 4000 => extras::cuProfilerStart;
    cuProfilerStop: 4000 => extras::cuProfilerStop;
    cuCoredumpSetAttributeGlobal: 12010 => extras::cuCoredumpSetAttributeGlobal;
    cuCoredumpGetAttributeGlobal: 12010 => extras::cuCoredumpGetAttributeGlobal;
    cuCoredumpSetAttribute: 12010 => extras::cuCoredumpSetAttribute;
    cuCoredumpGetAttribute: 12010 => extras::cuCoredumpGetAttribute;
    cuKernelGetName: 12030 => extras::cuKernelGetName;
    cuFuncGetName: 12030 => extras::cuFuncGetName;
    cuModuleLoad: 2000 => extras::cuModuleLoad;
    cuModuleLoadData: 2000 => extras::cuModuleLoadData;
    cuModuleLoadDataEx: 2010 => extras::cuModuleLoadDataEx;
    cuModuleLoadFatBinary: 2000 => extras::cuModuleLoadFatBinary;
    cuLibraryLoadData: 12000 => extras::cuLibraryLoadData;
    cuLibraryLoadFromFile: 12000 => extras::cuLibraryLoadFromFile;
    cuArrayCreate: 3020 => extras::cuArrayCreate_v2;
    cuArrayGetDescriptor: 3020 => extras::cuArrayGetDescriptor_v2;
    cuArrayDestroy: 2000 => extras::cuArrayDestroy;
    cuCheckpointProcessGetState: 12080 => native_checkpoint::cuCheckpointProcessGetState;
    cuCheckpointProcessGetRestoreThreadId:
        12080 => native_checkpoint::cuCheckpointProcessGetRestoreThreadId;
    cuCheckpointProcessLock: 12080 => native_checkpoint::cuCheckpointProcessLock;
    cuCheckpointProcessCheckpoint: 12080 => native_checkpoint::cuCheckpointProcessCheckpoint;
    cuCheckpointProcessRestore: 12080 => native_checkpoint::cuCheckpointProcessRestore;
    cuCheckpointProcessUnlock: 12080 => native_checkpoint::cuCheckpointProcessUnlock;
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
