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

pub mod build;
pub mod scenario;
pub mod steps;
pub mod toggle;

pub use build::{direct_library, entry_name, entry_paths, fake_runtime};
pub use scenario::{ANY, CUDA_11, CUDA_12_1, Ctx, Mode, Needs, across_toggle, co_preloaded, plain};

/// Both halves of one scenario (a `fn(&mut Ctx)` named `$name`) as two tests: `$plain` runs
/// it [`plain`], `$toggle` [`across_toggle`], both with the entry-path needs `$needs`.
#[macro_export]
macro_rules! scenario {
    ($name:ident, $plain:ident, $toggle:ident, $needs:expr) => {
        #[test]
        fn $plain() {
            $crate::plain(stringify!($name), $needs, $name);
        }

        #[test]
        fn $toggle() {
            $crate::across_toggle(stringify!($name), $needs, $name);
        }
    };
}

/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// fakecuda's allocation granularity; every allocation of the suite is one or two of these.
pub const GRAN: u64 = 2 * MIB;

/// `CU_MEM_HANDLE_TYPE_NONE`.
pub const NONE: u32 = 0;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const POSIX: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
pub const FABRIC: u32 = 8;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
pub const HOST_NUMA: u32 = 3;

/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const INVALID_CONTEXT: u32 = 201;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub const INVALID_HANDLE: u32 = 400;
/// `CUDA_ERROR_NOT_FOUND`.
pub const NOT_FOUND: u32 = 500;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: u32 = 801;

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
