//! What a worker answers: replies, and errors that name the call and its result.

use super::*;

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
