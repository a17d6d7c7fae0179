//! The worker's control protocol: one [`Command`] in, one [`Response`] out, each a JSON
//! document in a length-prefixed frame (see [`crate::wire`]), with at most one file
//! descriptor attached.
//!
//! Numbers are exact: addresses, sizes and handles are `u64` JSON integers. Byte strings
//! (`Write`, `Read`, IPC handles, non-FD shareable handles) travel as lowercase hex.

use serde::{Deserialize, Serialize};

/// The most bytes one `Read` or `Write` moves (16 MiB).
pub const MAX_TRANSFER: u64 = 16 << 20;
/// The largest frame either side accepts (64 MiB).
pub const MAX_FRAME: usize = 64 << 20;
/// The chunk size of `Fill`, `Verify` and `Checksum` copies (4 MiB).
pub const COPY_CHUNK: u64 = 4 << 20;

/// One access grant of `SetAccess` (a `CUmemAccessDesc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `CUmemLocationType` (1 device, 3 host NUMA).
    pub location_type: u32,
    /// Device ordinal or NUMA node.
    pub id: i32,
    /// `CUmemAccess_flags`: 0 none, 1 read, 3 read-write.
    pub flags: u32,
}

impl Grant {
    /// Read-write access for device `device`.
    pub fn readwrite(device: i32) -> Grant {
        Grant {
            location_type: crate::cuda::LOCATION_TYPE_DEVICE,
            id: device,
            flags: crate::cuda::ACCESS_READWRITE,
        }
    }

    /// Read-only access for device `device`.
    pub fn read(device: i32) -> Grant {
        Grant {
            location_type: crate::cuda::LOCATION_TYPE_DEVICE,
            id: device,
            flags: crate::cuda::ACCESS_READ,
        }
    }
}

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

/// `cuMemGetAllocationPropertiesFromHandle`'s answer, every field as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationProperties {
    pub allocation_type: u32,
    pub requested_handle_types: u32,
    pub location_type: u32,
    pub location_id: i32,
    pub win32_handle_meta_data: u64,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
}

/// fakecuda's `FakecudaObjects`: what the driver holds for one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DriverObjects {
    pub allocations: u64,
    pub mappings: u64,
    pub reservations: u64,
    pub multicast_objects: u64,
    pub ipc_opened: u64,
}

/// One descriptor of `FdTargets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdTarget {
    pub fd: i32,
    pub target: String,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Done,
    /// `TrafficStop`: one report per thread, in the order they were started.
    Traffic {
        threads: Vec<TrafficReport>,
    },
    /// `pid`: `getpid()` (the worker's own PID namespace); `nspid`: the `NSpid:` line of
    /// `/proc/self/status` (outermost namespace visible through `/proc` first).
    Hello {
        pid: i32,
        nspid: Vec<i32>,
        ppid: i32,
    },
    Init {
        pid: i32,
        nspid: Vec<i32>,
        device_count: i32,
    },
    Version {
        version: i32,
    },
    Context {
        ctx: u64,
    },
    Size {
        size: u64,
    },
    Handle {
        handle: u64,
    },
    Address {
        address: u64,
    },
    Properties(AllocationProperties),
    Access {
        flags: u64,
    },
    /// `fd`: the worker's descriptor number (still open only if `keep`); a POSIX FD also
    /// travels attached. `shareable`: the bytes of any other handle type.
    Exported {
        fd: Option<i32>,
        #[serde(default, with = "hex_opt")]
        shareable: Option<Vec<u8>>,
    },
    /// `fd`: the number of the imported descriptor the worker kept, if it kept it.
    Imported {
        handle: u64,
        fd: Option<i32>,
    },
    Fd {
        fd: i32,
    },
    Count {
        count: u64,
    },
    FdTargets {
        fds: Vec<FdTarget>,
    },
    Attribute {
        value: i32,
    },
    /// What fakecuda holds for the worker (see `Command::DriverObjects`).
    DriverObjects(DriverObjects),
    Bytes {
        #[serde(with = "hex")]
        bytes: Vec<u8>,
    },
    Checksum {
        checksum: u64,
    },
    Range {
        base: u64,
        size: u64,
    },
    IpcHandle {
        #[serde(with = "hex")]
        handle: Vec<u8>,
    },
    /// `library`: `dladdr`'s `dli_fname`; `symbol`: its `dli_sname` where known.
    Resolved {
        address: u64,
        library: Option<String>,
        symbol: Option<String>,
    },
}

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A driver call returned `code` (a `CUresult`).
    Cuda,
    /// A system call failed with errno `code`.
    Errno,
    /// `Verify` found different bytes (`mismatch` says where).
    Mismatch,
    /// A driver symbol could not be resolved through the entry path (`name` is the symbol;
    /// `code` the resolver's `CUresult`/`cudaError_t` where it gave one, else -1).
    Unresolved,
    /// The request was malformed or out of bounds.
    Request,
    /// The command handler panicked.
    Panic,
}

/// Where `Verify` found the first different byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Offset from the verified range's start.
    pub offset: u64,
    pub expected: u8,
    pub found: u8,
}

/// A failed command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub kind: ErrorKind,
    /// The `CUresult` or errno; -1 where neither applies.
    pub code: i64,
    /// `CUDA_ERROR_*`, the errno's name, or the unresolved symbol.
    pub name: String,
    pub message: String,
    #[serde(default)]
    pub mismatch: Option<Mismatch>,
}

/// The worker's answer to one command.
pub type Response = Result<Reply, ErrorReply>;

/// Lowercase hex for `Vec<u8>`.
pub mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn encode(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        s
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        fn nibble(c: u8) -> Result<u8, String> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(format!("not a hex digit: {:?}", char::from(c))),
            }
        }
        let s = s.as_bytes();
        if !s.len().is_multiple_of(2) {
            return Err("odd number of hex digits".to_owned());
        }
        s.chunks_exact(2)
            .map(|p| Ok(nibble(p[0])? << 4 | nibble(p[1])?))
            .collect()
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        decode(&s).map_err(serde::de::Error::custom)
    }
}

/// Lowercase hex for `Option<Vec<u8>>`.
pub mod hex_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&super::hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<std::borrow::Cow<'de, str>>::deserialize(d)?
            .map(|s| super::hex::decode(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_as_json() {
        let cmds = [
            Command::Ping,
            Command::Create {
                size: 2 << 20,
                device: 1,
                handle_types: 1,
                location_type: 1,
            },
            Command::Write {
                address: u64::MAX - 7,
                bytes: vec![0, 1, 0xab, 0xff],
            },
            Command::Import {
                handle_type: 8,
                fd: None,
                shareable: Some(vec![9; 64]),
                keep: true,
            },
            Command::SetAccess {
                address: 1 << 40,
                size: 4096,
                grants: vec![Grant::readwrite(0), Grant::read(1)],
            },
        ];
        for c in cmds {
            let text = serde_json::to_string(&c).expect("encode");
            let back: Command = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, c, "{text}");
        }
        let w = serde_json::to_string(&Command::Write {
            address: 1,
            bytes: vec![0xab, 0x01],
        })
        .expect("encode");
        assert_eq!(w, r#"{"cmd":"write","address":1,"bytes":"ab01"}"#);
        let c: Command =
            serde_json::from_str(r#"{"cmd":"create","size":4096,"device":0,"handle_types":1}"#)
                .expect("defaults");
        assert_eq!(
            c,
            Command::Create {
                size: 4096,
                device: 0,
                handle_types: 1,
                location_type: 1
            }
        );
        assert_eq!(c.name(), "create");
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"init","device":0,"x":1}"#).is_err());
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"nope"}"#).is_err());
    }

    #[test]
    fn responses_round_trip() {
        let rs: [Response; 3] = [
            Ok(Reply::IpcHandle {
                handle: (0..64).collect(),
            }),
            Ok(Reply::Exported {
                fd: Some(7),
                shareable: None,
            }),
            Err(ErrorReply {
                kind: ErrorKind::Mismatch,
                code: -1,
                name: "MISMATCH".into(),
                message: "x".into(),
                mismatch: Some(Mismatch {
                    offset: 3,
                    expected: 1,
                    found: 2,
                }),
            }),
        ];
        for r in rs {
            let text = serde_json::to_string(&r).expect("encode");
            let back: Response = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, r, "{text}");
        }
        assert!(hex::decode("abc").is_err());
        assert!(hex::decode("zz").is_err());
    }
}
