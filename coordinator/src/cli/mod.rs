//! The `cuinterpose` command line.
//!
//! Exit codes: 0 success; 1 refused or invalid, nothing was changed; 2 failed after
//! participants were changed (fail-stop: the workload must not resume); 3 aborted after
//! participants were changed, the workload put back in place and resumed; 64 usage (bad
//! arguments or settings); `launch` passes on its command's status (127/126 when it cannot run).
//!
//! Layout: `args` (the grammar), `dispatch` (running a command), `settings` (exit statuses,
//! usage failures, settings), `output` (what commands print), `progress` (events while they run), `launch`,
//! `restart` (settings only the environment can carry).

mod args;
mod dispatch;
mod launch;
mod output;
mod progress;
mod restart;
mod settings;
#[cfg(test)]
mod tests;

pub use args::{Cli, Command, CriuArgs, Format, StateCommand, Target, Tree};
pub use dispatch::{run, run_from_env};
pub use launch::{SHIM_FILE_NAME, SHIM_VARIABLE, preload_value, shim_path};
pub use settings::{EXIT_ABORTED, EXIT_FAIL_STOP, EXIT_REFUSED, EXIT_USAGE};
