//! Shared helpers of the client scenario suite (the scenarios are in `tests/`).
//!
//! Each scenario reproduces one sharing pattern of a real client (PyTorch, NCCL, vLLM, SGLang,
//! mscclpp; see `shared/reference/clients.md` §6) with scriptable workers
//! ([`cuinterpose_workload::Worker`]) over fakecuda, and runs twice:
//!
//! - **plain** ([`plain`]): once on the bare driver, then under the shim through every entry
//!   path; the scenario's own checks must pass every time and everything it notes (error codes,
//!   equalities) must match the bare run exactly;
//! - **across a toggle** ([`across_toggle`]): under the shim, with a whole checkpoint/restore
//!   cycle ([`toggle::toggle`]: the coordinator's `prepare` and `restore` around fakecuda's
//!   native checkpoint) where the scenario calls [`Ctx::checkpoint`]; afterwards the scenario
//!   checks addresses, bytes and live sharing, and the toggle itself checks that no descriptor
//!   or driver object leaked.

#![forbid(unsafe_code)]

pub mod build;
pub mod scenario;
pub mod steps;
pub mod toggle;

pub use build::{direct_library, entry_name, entry_paths, fake_runtime};
pub use scenario::{ANY, CUDA_11, CUDA_12_1, Ctx, Mode, Needs, across_toggle, co_preloaded, plain};

/// Both halves of one scenario (a `fn(&mut Ctx)` named `$name`) as two tests in a module of
/// that name: `$name::plain` runs it [`plain`], `$name::across_toggle` [`across_toggle`], both
/// with the entry-path needs `$needs` (named as at the call site, hence the glob import).
#[macro_export]
macro_rules! scenario {
    ($name:ident, $needs:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn plain() {
                $crate::plain(stringify!($name), $needs, $name);
            }

            #[test]
            fn across_toggle() {
                $crate::across_toggle(stringify!($name), $needs, $name);
            }
        }
    };
}

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
