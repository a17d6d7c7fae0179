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

// Floors, top to bottom: each module imports only from those below it (the tidy test).
// 1. The scenario runner.
pub mod scenario;
// 2. The steps and the toggle.
pub mod steps;
pub mod toggle;
// 3. Building what the scenarios run.
pub mod build;
// 4. The suite's short names and the outcome of a call.
pub mod names;

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

pub use names::{
    DEVICE, FABRIC, GRAN, HOST_NUMA, INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, MIB, NONE,
    NOT_FOUND, NOT_SUPPORTED, POSIX, outcome,
};
