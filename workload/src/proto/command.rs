//! The commands a worker executes, one per driver call or test step.

use super::*;

fn device_location() -> u32 {
    crate::cuda::LOCATION_TYPE_DEVICE
}

/// A request to the worker. Every command answers `Ok(Reply)` or `Err(ErrorReply)`; the
/// reply variant each one gives is named in its documentation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// No driver call: the worker's identity. → `Hello`.
    Ping,
    /// `cuInit(0)`, `cuDeviceGetCount`, `cuDevicePrimaryCtxRetain(device)`, `cuCtxSetCurrent`.
    /// → `Init`.
    Init { device: i32 },
    /// Retains `device`'s primary context and makes it current. → `Context`.
    SetDevice { device: i32 },
    /// `cuDriverGetVersion`. → `Version`.
    DriverVersion,
    /// `cuMemGetAllocationGranularity` for pinned device memory. → `Size`.
    Granularity {
        device: i32,
        handle_types: u32,
        /// 0 minimum, 1 recommended.
        option: u32,
    },
    /// `cuMemCreate` of pinned memory. → `Handle`.
    Create {
        size: u64,
        /// Device ordinal (or NUMA node for host NUMA memory).
        device: i32,
        /// Requested handle types: 0 none, 1 POSIX FD, 8 FABRIC (bits).
        handle_types: u32,
        /// 1 device (default), 3 host NUMA.
        #[serde(default = "device_location")]
        location_type: u32,
    },
    /// `cuMemRelease`. → `Done`.
    Release { handle: u64 },
    /// `cuMemRetainAllocationHandle`. → `Handle`.
    Retain { address: u64 },
    /// `cuMemGetAllocationPropertiesFromHandle`. → `Properties`.
    Properties { handle: u64 },
    /// `cuMemAddressReserve`. → `Address`.
    Reserve {
        size: u64,
        #[serde(default)]
        alignment: u64,
        /// Requested address (0: anywhere).
        #[serde(default)]
        hint: u64,
        #[serde(default)]
        flags: u64,
    },
    /// `cuMemAddressFree`. → `Done`.
    FreeAddress { address: u64, size: u64 },
    /// `cuMemMap(address, size, offset, handle, 0)`. → `Done`.
    Map {
        address: u64,
        size: u64,
        #[serde(default)]
        offset: u64,
        handle: u64,
    },
    /// `cuMemUnmap`. → `Done`.
    Unmap { address: u64, size: u64 },
    /// `cuMemSetAccess` with one descriptor per grant. → `Done`.
    SetAccess {
        address: u64,
        size: u64,
        grants: Vec<Grant>,
    },
    /// `cuMemGetAccess` for a location (device by default). → `Access`.
    GetAccess {
        address: u64,
        device: i32,
        #[serde(default = "device_location")]
        location_type: u32,
    },
    /// `cuMemExportToShareableHandle`. For a POSIX FD the descriptor travels attached to the
    /// reply; the worker keeps its own copy open under the reported number when `keep`, and
    /// closes it otherwise. Other types return the handle's bytes. → `Exported`.
    Export {
        handle: u64,
        handle_type: u32,
        #[serde(default)]
        keep: bool,
        #[serde(default)]
        flags: u64,
    },
    /// `cuMemImportFromShareableHandle`. The POSIX FD is the one attached to the request, or
    /// else the worker's own descriptor `fd`; other types take `shareable` bytes. The worker
    /// closes an attached FD afterwards unless `keep`. → `Imported`.
    Import {
        handle_type: u32,
        #[serde(default)]
        fd: Option<i32>,
        #[serde(default, with = "hex_opt")]
        shareable: Option<Vec<u8>>,
        #[serde(default)]
        keep: bool,
    },
    /// `pidfd_open(pid)` + `pidfd_getfd(pidfd, fd)`, import the descriptor, close both.
    /// → `Imported`.
    ImportFromPid { pid: i32, fd: i32, handle_type: u32 },
    /// `pidfd_open(pid)` + `pidfd_getfd(pidfd, fd)`; the worker keeps the copy. → `Fd`.
    PidGetFd { pid: i32, fd: i32 },
    /// `close(fd)`. → `Done`.
    CloseFd { fd: i32 },
    /// Keeps the descriptor attached to the request open (without importing it): the number
    /// it has in the worker. → `Fd`.
    HoldFd,
    /// Sends a duplicate of the worker's descriptor `fd` back attached to the reply (as a
    /// process relaying an FD by `SCM_RIGHTS` does); closes `fd` itself too when `close`.
    /// → `Fd` (the number `fd` had).
    SendFd {
        fd: i32,
        #[serde(default)]
        close: bool,
    },
    /// `cuMemExportToShareableHandle(POSIX FD)` of `handle` on a new thread (a proxy thread),
    /// which first makes the worker's current context current there when `context` (as
    /// `cudaSetDevice` on NCCL's proxy thread); the FD travels attached to the reply and the
    /// worker closes its copy. → `Exported`.
    ProxyExport {
        handle: u64,
        #[serde(default)]
        context: bool,
    },
    /// `cuDeviceGetAttribute`. → `Attribute`.
    DeviceAttribute { attribute: i32, device: i32 },
    /// `cuDevicePrimaryCtxReset_v2` (what `cudaDeviceReset` does). → `Done`.
    PrimaryCtxReset { device: i32 },
    /// fakecuda's count of what it holds for this process (its extra export
    /// `fakecuda_objects`), for leak checks. → `DriverObjects`.
    DriverObjects,
    /// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`. → `Fd`.
    DupFd { fd: i32 },
    /// Entries of `/proc/self/fd`, less the one used to read it. → `Count`.
    OpenFdCount,
    /// fakecuda's count of native `cuIpc*` calls made by this process (its extra export
    /// `fakecuda_native_ipc_calls`), so a test can prove an interposer never made one.
    /// → `Count`.
    NativeIpcCalls,
    /// Every open descriptor and its `readlink` target. → `FdTargets`.
    FdTargets,
    /// Writes [`crate::pattern()`] for `seed` with `cuMemcpyHtoD` (4 MiB chunks). → `Done`.
    Fill { address: u64, size: u64, seed: u64 },
    /// Reads with `cuMemcpyDtoH` and compares with the pattern; the first difference is an
    /// error of kind `Mismatch`. → `Done`.
    Verify { address: u64, size: u64, seed: u64 },
    /// `cuMemcpyDtoH` of at most [`MAX_TRANSFER`] bytes. → `Bytes`.
    Read { address: u64, size: u64 },
    /// `cuMemcpyHtoD` of at most [`MAX_TRANSFER`] bytes. → `Done`.
    Write {
        address: u64,
        #[serde(with = "hex")]
        bytes: Vec<u8>,
    },
    /// FNV-1a ([`crate::pattern::checksum`]) of the range, read in 4 MiB chunks. → `Checksum`.
    Checksum { address: u64, size: u64 },
    /// `cuMemsetD8`. → `Done`.
    Memset { address: u64, value: u8, size: u64 },
    /// `cuMemAlloc_v2`. → `Address`.
    MemAlloc { size: u64 },
    /// `cuMemFree_v2`. → `Done`.
    MemFree { dptr: u64 },
    /// `cuMemGetAddressRange_v2`. → `Range`.
    AddressRange { dptr: u64 },
    /// `cuIpcGetMemHandle`. → `IpcHandle`.
    IpcGet { dptr: u64 },
    /// `cuIpcOpenMemHandle_v2` of a 64-byte handle. → `Address`.
    IpcOpen {
        #[serde(with = "hex")]
        handle: Vec<u8>,
        #[serde(default = "lazy_peer_access")]
        flags: u32,
    },
    /// `cuIpcCloseMemHandle`. → `Done`.
    IpcClose { dptr: u64 },
    /// `cuMulticastGetGranularity`. → `Size`.
    McGranularity {
        device_count: u32,
        size: u64,
        handle_types: u64,
        option: u32,
    },
    /// `cuMulticastCreate`. → `Handle`.
    McCreate {
        device_count: u32,
        size: u64,
        handle_types: u64,
        #[serde(default)]
        flags: u64,
    },
    /// `cuMulticastAddDevice`. → `Done`.
    McAddDevice { handle: u64, device: i32 },
    /// `cuMulticastBindMem` (v1, `device: None`) or `cuMulticastBindMem_v2` (for `device`).
    /// → `Done`.
    McBindMem {
        mc: u64,
        mc_offset: u64,
        mem_handle: u64,
        mem_offset: u64,
        size: u64,
        #[serde(default)]
        flags: u64,
        #[serde(default)]
        device: Option<i32>,
    },
    /// `cuMulticastBindAddr` (v1) or `cuMulticastBindAddr_v2` (for `device`). → `Done`.
    McBindAddr {
        mc: u64,
        mc_offset: u64,
        address: u64,
        size: u64,
        #[serde(default)]
        flags: u64,
        #[serde(default)]
        device: Option<i32>,
    },
    /// `cuMulticastUnbind`. → `Done`.
    McUnbind {
        mc: u64,
        device: i32,
        mc_offset: u64,
        size: u64,
    },
    /// `cuCtxCreate` (the `_v4`/`_v3`/`_v2` signature the entry path's version implies; `_v4`
    /// for exact-name paths); the new context becomes current. → `Context`.
    CtxCreate {
        device: i32,
        #[serde(default)]
        flags: u32,
    },
    /// `cuCtxDestroy_v2`. → `Done`.
    CtxDestroy { ctx: u64 },
    /// `cuDevicePrimaryCtxRelease_v2`. → `Done`.
    PrimaryCtxRelease { device: i32 },
    /// Maps `size` bytes of anonymous host memory and `cuMemHostRegister_v2`s them.
    /// → `Address`.
    HostRegister {
        size: u64,
        #[serde(default)]
        flags: u32,
    },
    /// `cuMemHostUnregister`, then unmaps memory `HostRegister` mapped. → `Done`.
    HostUnregister { address: u64 },
    /// The pointer the entry path gives for `name` (no cache) and, by `dladdr`, the library
    /// file that contains it. → `Resolved`.
    Resolve { name: String },
    /// `cuCtxSynchronize`. → `Done`.
    Synchronize,
    /// Starts application traffic: one thread per entry, each writing and reading its range
    /// in a loop until `TrafficStop`, in the primary context of `device`. → `Done`.
    TrafficStart {
        device: i32,
        threads: Vec<TrafficThread>,
    },
    /// Stops the traffic threads and reports what each saw. → `Traffic`.
    TrafficStop,
    /// `cuStreamSynchronize(0)` on a thread of its own (primary context of `device`), not
    /// waited for: a call that is in flight while the test does something else. → `Done`.
    SynchronizeInThread { device: i32 },
    /// Sleeps (no driver call), for timeout tests. → `Done`.
    Sleep { ms: u64 },
    /// Panics inside the command handler (a test of the worker's panic handling).
    Panic { message: String },
    /// Replies `Done`, then exits with `code`.
    Exit { code: i32 },
    /// Hands the control channel over to a listening socket at `path`: the worker binds it,
    /// replies `Done`, closes the current channel and waits (in `accept`) for the next
    /// connection, which becomes the channel. While detached the worker holds no connection
    /// to another process, so a process checkpoint (CRIU) can dump it.
    Detach { path: std::path::PathBuf },
}

/// What a traffic thread does in each iteration (after checking the previous write is still
/// there): write a new value, read it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrafficMode {
    /// `cuMemcpyHtoD` / `cuMemcpyDtoH`.
    Copy,
    /// `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` on the thread's stream, then
    /// `cuStreamSynchronize`.
    CopyAsync,
    /// `cuMemsetD8`, read with `cuMemcpyDtoH`.
    Memset,
    /// `cuMemsetD8Async` / `cuMemcpyDtoHAsync` on the thread's stream, then
    /// `cuStreamSynchronize`.
    MemsetAsync,
}

/// One traffic thread: its range (at most [`MAX_TRANSFER`] bytes) and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficThread {
    pub address: u64,
    pub size: u64,
    pub mode: TrafficMode,
}

/// What one traffic thread saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficReport {
    pub address: u64,
    pub mode: TrafficMode,
    pub iterations: u64,
    /// Failed driver calls, by "function: error name".
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Reads that contradicted an acknowledged write.
    pub inconsistencies: u64,
    pub first_inconsistency: Option<String>,
    /// The sequence number of the last acknowledged write, if the last write succeeded.
    pub last_acknowledged: Option<u64>,
}

fn lazy_peer_access() -> u32 {
    crate::cuda::IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}

impl Command {
    /// The command's tag, for messages.
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("cmd").and_then(|c| c.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned())
    }
}
