//! `cuinterpose demo`: the whole product on one screen, with nothing built at run time.
//!
//! It starts worker processes (`cuinterpose-worker`) under the shim over the embedded default
//! driver (fakecuda, next to this executable) or a real one, builds a sharing topology (a
//! creator whose allocation every other process imports, a partial import, private and
//! untracked allocations, a memory-IPC producer/consumer pair), fills every byte with a known
//! pattern, checkpoints and restores in place (or, with `--criu`, dumps the process tree,
//! kills it and restores it from the images; with `--criu --criu-hook`, plain CRIU dumps and
//! restores it twice, the hook doing cuinterpose's part), then verifies every byte at its original
//! address and that the sharing is live: a write by one process is seen by the others.
//!
//! Layout: `types` (options, error, outcome), `workers` (starting the processes), `topology`
//! (what they share and how it is checked), `run` (the whole demo), `hook` (CRIU configured
//! with the hook), `podman` (the workload in a container).

mod hook;
mod podman;
mod run;
mod topology;
mod types;
mod workers;

pub use run::{environment, run, work_dir};
pub use types::{DemoError, DriverChoice, Options, Outcome};
