//! The suite's short names (sizes, handle and location types, results) and what a worker
//! call gave.

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// fakecuda's allocation granularity; every allocation of the suite is one or two of these.
pub const GRAN: u64 = 2 * MIB;

// The suite's short names for the handle types, location types and results it names most;
// the values come from the workspace's one driver ABI.
pub use cuinterpose_abi::consts::{
    HANDLE_TYPE_FABRIC as FABRIC, HANDLE_TYPE_NONE as NONE, HANDLE_TYPE_POSIX_FD as POSIX,
    LOCATION_TYPE_DEVICE as DEVICE, LOCATION_TYPE_HOST_NUMA as HOST_NUMA,
};
pub use cuinterpose_abi::results::{
    CUDA_ERROR_INVALID_CONTEXT as INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE as INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE as INVALID_VALUE, CUDA_ERROR_NOT_FOUND as NOT_FOUND,
    CUDA_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
};

/// What a worker call gave, for notes that plain runs compare: `ok`, `cuda:NAME` for a
/// driver result, `errno:NAME` for a system call, `unresolved:SYMBOL`, or the error's text.
pub fn outcome<T>(result: &Result<T, cuinterpose_workload::WorkloadError>) -> String {
    use cuinterpose_workload::WorkloadError as E;
    match result {
        Ok(_) => "ok".to_owned(),
        Err(E::Cuda { name, .. }) => format!("cuda:{name}"),
        Err(E::Errno { name, .. }) => format!("errno:{name}"),
        Err(E::Unresolved { symbol, .. }) => format!("unresolved:{symbol}"),
        Err(other) => format!("other:{other}"),
    }
}
