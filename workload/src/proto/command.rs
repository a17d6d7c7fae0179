//! The commands a worker executes, one per driver call or test step.

use super::*;

fn device_location() -> u32 {
    crate::cuda::LOCATION_TYPE_DEVICE
}

/// Expands the command table below: the enum, the groups, and what each command answers.
macro_rules! commands {
    ($(
        $(#[$group_doc:meta])*
        $group:ident {
            $(
                $(#[$attr:meta])*
                $variant:ident $({ $($(#[$field_attr:meta])* $field:ident : $ty:ty),* $(,)? })?
                    => $reply:ident
            ),* $(,)?
        }
    )*) => {
        /// A request to the worker. Every command answers `Ok(Reply)` or `Err(ErrorReply)`;
        /// the `Ok` variant is the one the table names ([`Command::reply_name`]).
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
        pub enum Command {
            $($(
                $(#[$attr])*
                $variant $({ $($(#[$field_attr])* $field: $ty),* })?,
            )*)*
        }

        /// The worker's groups of command handlers (`worker/exec/`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Group {
            $($(#[$group_doc])* $group,)*
        }

        impl Command {
            /// The group of handlers that runs this command.
            pub fn group(&self) -> Group {
                match self {
                    $($(Command::$variant { .. } => Group::$group,)*)*
                }
            }

            /// The command's variant name (cheap, unlike [`Command::name`]).
            pub fn kind(&self) -> &'static str {
                match self {
                    $($(Command::$variant { .. } => stringify!($variant),)*)*
                }
            }

            /// The reply variant this command answers with, by name.
            pub fn reply_name(&self) -> &'static str {
                match self {
                    $($(Command::$variant { .. } => stringify!($reply),)*)*
                }
            }

            /// A test of whether a reply is the variant this command answers with (taken
            /// before the command is consumed).
            pub fn answers(&self) -> fn(&Reply) -> bool {
                match self {
                    $($(Command::$variant { .. } => |r| matches!(r, Reply::$reply { .. }),)*)*
                }
            }
        }
    };
}

// The worker's commands, declared once: each command's fields, the reply variant it answers
// with, and the group of handlers that runs it. From this table come `Command`, `Group` and
// `Command::group` (the worker's dispatch), and `Command::reply_name` / `Command::answers`
// (the worker checks every reply against it; the client names it when a reply is unexpected).
commands! {
    /// Identity and init, VMM, export and import, descriptors, driver objects (`worker/exec/memory.rs`).
    Memory {
        /// No driver call: the worker's identity.
        Ping => Hello,
        /// `cuInit(0)`, `cuDeviceGetCount`, `cuDevicePrimaryCtxRetain(device)`, `cuCtxSetCurrent`.
        Init { device: i32 } => Init,
        /// Retains `device`'s primary context and makes it current.
        SetDevice { device: i32 } => Context,
        /// `cuDriverGetVersion`.
        DriverVersion => Version,
        /// `cuMemGetAllocationGranularity` for pinned device memory.
        Granularity {
            device: i32,
            handle_types: u32,
            /// 0 minimum, 1 recommended.
            option: u32,
        } => Size,
        /// `cuMemCreate` of pinned memory.
        Create {
            size: u64,
            /// Device ordinal (or NUMA node for host NUMA memory).
            device: i32,
            /// Requested handle types: 0 none, 1 POSIX FD, 8 FABRIC (bits).
            handle_types: u32,
            /// 1 device (default), 3 host NUMA.
            #[serde(default = "device_location")]
            location_type: u32,
        } => Handle,
        /// `cuMemRelease`.
        Release { handle: u64 } => Done,
        /// `cuMemRetainAllocationHandle`.
        Retain { address: u64 } => Handle,
        /// `cuMemGetAllocationPropertiesFromHandle`.
        Properties { handle: u64 } => Properties,
        /// `cuMemAddressReserve`.
        Reserve {
            size: u64,
            #[serde(default)]
            alignment: u64,
            /// Requested address (0: anywhere).
            #[serde(default)]
            hint: u64,
            #[serde(default)]
            flags: u64,
        } => Address,
        /// `cuMemAddressFree`.
        FreeAddress { address: u64, size: u64 } => Done,
        /// `cuMemMap(address, size, offset, handle, 0)`.
        Map {
            address: u64,
            size: u64,
            #[serde(default)]
            offset: u64,
            handle: u64,
        } => Done,
        /// `cuMemUnmap`.
        Unmap { address: u64, size: u64 } => Done,
        /// `cuMemSetAccess` with one descriptor per grant.
        SetAccess {
            address: u64,
            size: u64,
            grants: Vec<Grant>,
        } => Done,
        /// `cuMemGetAccess` for a location (device by default).
        GetAccess {
            address: u64,
            device: i32,
            #[serde(default = "device_location")]
            location_type: u32,
        } => Access,
        /// `cuMemExportToShareableHandle`. For a POSIX FD the descriptor travels attached to the
        /// reply; the worker keeps its own copy open under the reported number when `keep`, and
        /// closes it otherwise. Other types return the handle's bytes.
        Export {
            handle: u64,
            handle_type: u32,
            #[serde(default)]
            keep: bool,
            #[serde(default)]
            flags: u64,
        } => Exported,
        /// `cuMemImportFromShareableHandle`. The POSIX FD is the one attached to the request, or
        /// else the worker's own descriptor `fd`; other types take `shareable` bytes. The worker
        /// closes an attached FD afterwards unless `keep`.
        Import {
            handle_type: u32,
            #[serde(default)]
            fd: Option<i32>,
            #[serde(default, with = "hex_opt")]
            shareable: Option<Vec<u8>>,
            #[serde(default)]
            keep: bool,
        } => Imported,
        /// `pidfd_open(pid)` + `pidfd_getfd(pidfd, fd)`, import the descriptor, close both.
        ImportFromPid { pid: i32, fd: i32, handle_type: u32 } => Imported,
        /// `pidfd_open(pid)` + `pidfd_getfd(pidfd, fd)`; the worker keeps the copy.
        PidGetFd { pid: i32, fd: i32 } => Fd,
        /// `close(fd)`.
        CloseFd { fd: i32 } => Done,
        /// Keeps the descriptor attached to the request open (without importing it): the number
        /// it has in the worker.
        HoldFd => Fd,
        /// Sends a duplicate of the worker's descriptor `fd` back attached to the reply (as a
        /// process relaying an FD by `SCM_RIGHTS` does); closes `fd` itself too when `close`.
        /// Its `Fd` is the number `fd` had.
        SendFd {
            fd: i32,
            #[serde(default)]
            close: bool,
        } => Fd,
        /// `cuMemExportToShareableHandle(POSIX FD)` of `handle` on a new thread (a proxy thread),
        /// which first makes the worker's current context current there when `context` (as
        /// `cudaSetDevice` on NCCL's proxy thread); the FD travels attached to the reply and the
        /// worker closes its copy.
        ProxyExport {
            handle: u64,
            #[serde(default)]
            context: bool,
        } => Exported,
        /// `cuDeviceGetAttribute`.
        DeviceAttribute { attribute: i32, device: i32 } => Attribute,
        /// `cuDevicePrimaryCtxReset_v2` (what `cudaDeviceReset` does).
        PrimaryCtxReset { device: i32 } => Done,
        /// fakecuda's count of what it holds for this process (its extra export
        /// `fakecuda_objects`), for leak checks.
        DriverObjects => DriverObjects,
        /// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`.
        DupFd { fd: i32 } => Fd,
    }
    /// Bytes (fill, verify, read, write, checksums, memsets), `cuMemAlloc` and memory IPC, descriptor counts (`worker/exec/data.rs`).
    Data {
        /// Entries of `/proc/self/fd`, less the one used to read it.
        OpenFdCount => Count,
        /// fakecuda's count of native `cuIpc*` calls made by this process (its extra export
        /// `fakecuda_native_ipc_calls`), so a test can prove an interposer never made one.
        NativeIpcCalls => Count,
        /// Every open descriptor and its `readlink` target.
        FdTargets => FdTargets,
        /// Writes [`crate::pattern()`] for `seed` with `cuMemcpyHtoD` (4 MiB chunks).
        Fill { address: u64, size: u64, seed: u64 } => Done,
        /// Reads with `cuMemcpyDtoH` and compares with the pattern; the first difference is an
        /// error of kind `Mismatch`.
        Verify { address: u64, size: u64, seed: u64 } => Done,
        /// `cuMemcpyDtoH` of at most [`MAX_TRANSFER`] bytes.
        Read { address: u64, size: u64 } => Bytes,
        /// `cuMemcpyHtoD` of at most [`MAX_TRANSFER`] bytes.
        Write {
            address: u64,
            #[serde(with = "hex")]
            bytes: Vec<u8>,
        } => Done,
        /// FNV-1a ([`crate::pattern::checksum`]) of the range, read in 4 MiB chunks.
        Checksum { address: u64, size: u64 } => Checksum,
        /// `cuMemsetD8`.
        Memset { address: u64, value: u8, size: u64 } => Done,
        /// `cuMemAlloc_v2`.
        MemAlloc { size: u64 } => Address,
        /// `cuMemFree_v2`.
        MemFree { dptr: u64 } => Done,
        /// `cuMemGetAddressRange_v2`.
        AddressRange { dptr: u64 } => Range,
        /// `cuIpcGetMemHandle`.
        IpcGet { dptr: u64 } => IpcHandle,
        /// `cuIpcOpenMemHandle_v2` of a 64-byte handle.
        IpcOpen {
            #[serde(with = "hex")]
            handle: Vec<u8>,
            #[serde(default = "lazy_peer_access")]
            flags: u32,
        } => Address,
        /// `cuIpcCloseMemHandle`.
        IpcClose { dptr: u64 } => Done,
    }
    /// Multicast, contexts, host registration, symbol resolution, synchronization and traffic, and the worker's own commands (`worker/exec/objects.rs`).
    Objects {
        /// `cuMulticastGetGranularity`.
        McGranularity {
            device_count: u32,
            size: u64,
            handle_types: u64,
            option: u32,
        } => Size,
        /// `cuMulticastCreate`.
        McCreate {
            device_count: u32,
            size: u64,
            handle_types: u64,
            #[serde(default)]
            flags: u64,
        } => Handle,
        /// `cuMulticastAddDevice`.
        McAddDevice { handle: u64, device: i32 } => Done,
        /// `cuMulticastBindMem` (v1, `device: None`) or `cuMulticastBindMem_v2` (for `device`).
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
        } => Done,
        /// `cuMulticastBindAddr` (v1) or `cuMulticastBindAddr_v2` (for `device`).
        McBindAddr {
            mc: u64,
            mc_offset: u64,
            address: u64,
            size: u64,
            #[serde(default)]
            flags: u64,
            #[serde(default)]
            device: Option<i32>,
        } => Done,
        /// `cuMulticastUnbind`.
        McUnbind {
            mc: u64,
            device: i32,
            mc_offset: u64,
            size: u64,
        } => Done,
        /// `cuCtxCreate` (the `_v4`/`_v3`/`_v2` signature the entry path's version implies; `_v4`
        /// for exact-name paths); the new context becomes current.
        CtxCreate {
            device: i32,
            #[serde(default)]
            flags: u32,
        } => Context,
        /// `cuCtxDestroy_v2`.
        CtxDestroy { ctx: u64 } => Done,
        /// `cuDevicePrimaryCtxRelease_v2`.
        PrimaryCtxRelease { device: i32 } => Done,
        /// Maps `size` bytes of anonymous host memory and `cuMemHostRegister_v2`s them.
        HostRegister {
            size: u64,
            #[serde(default)]
            flags: u32,
        } => Address,
        /// `cuMemHostUnregister`, then unmaps memory `HostRegister` mapped.
        HostUnregister { address: u64 } => Done,
        /// The pointer the entry path gives for `name` (no cache) and, by `dladdr`, the library
        /// file that contains it.
        Resolve { name: String } => Resolved,
        /// `cuCtxSynchronize`.
        Synchronize => Done,
        /// Starts application traffic: one thread per entry, each writing and reading its range
        /// in a loop until `TrafficStop`, in the primary context of `device`.
        TrafficStart {
            device: i32,
            threads: Vec<TrafficThread>,
        } => Done,
        /// Stops the traffic threads and reports what each saw.
        TrafficStop => Traffic,
        /// `cuStreamSynchronize(0)` on a thread of its own (primary context of `device`), not
        /// waited for: a call that is in flight while the test does something else.
        SynchronizeInThread { device: i32 } => Done,
        /// Sleeps (no driver call), for timeout tests.
        Sleep { ms: u64 } => Done,
        /// Panics inside the command handler (a test of the worker's panic handling).
        Panic { message: String } => Done,
        /// Replies `Done`, then exits with `code`.
        Exit { code: i32 } => Done,
        /// Hands the control channel over to a listening socket at `path`: the worker binds it,
        /// replies `Done`, closes the current channel and waits (in `accept`) for the next
        /// connection, which becomes the channel. While detached the worker holds no connection
        /// to another process, so a process checkpoint (CRIU) can dump it.
        Detach { path: std::path::PathBuf } => Done,
    }
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
    /// The command's tag, for messages (serializes the command: not for every call).
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("cmd").and_then(|c| c.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned())
    }
}
