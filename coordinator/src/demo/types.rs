//! The demo's public types (its options, its error, what it did) and the error helpers every
//! stage shares.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Value, json};

use crate::criu::Criu;
use crate::events::Event;
use crate::report::{PhaseReport, Report};

/// Which driver the workers (and native checkpoint) use.
#[derive(Debug, Clone)]
pub enum DriverChoice {
    /// fakecuda's `libcuda.so` next to this executable (no GPU needed).
    Embedded,
    /// A driver library by path, or `libcuda.so.1` from the system's search path.
    Path(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub processes: usize,
    /// Size of the allocation every process imports (rounded up to the granularity).
    pub shared_mib: u64,
    /// Small shared allocations per process, each imported by the next process.
    pub mesh: usize,
    pub criu: Option<Criu>,
    /// With `criu`: plain `criu dump`/`criu restore` configured with the hook, twice.
    pub criu_hook: bool,
    /// With `criu_hook`: CRIU's plugin directory (its CUDA plugin joins in).
    pub criu_plugins: Option<PathBuf>,
    /// Run the workload in a Podman container, checkpointed and restored by Podman.
    pub podman: bool,
    pub driver: DriverChoice,
    /// Keep the work directory (sockets, checkpoint, logs) instead of removing it.
    pub keep: bool,
    /// How the checkpoint's copies move the shared bytes (the hook's runs choose their own).
    pub carriage: crate::plan::Carriage,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Worker {
        what: String,
        #[source]
        source: cuinterpose_workload::WorkloadError,
    },
    #[error(transparent)]
    Command(#[from] crate::commands::CommandError),
    #[error("verification failed: {0}")]
    Verification(String),
}

impl DemoError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DemoError::Command(e) => e.exit_code(),
            _ => crate::plan::EXIT_REFUSED,
        }
    }
}

/// What the demo did, for the report.
#[derive(Debug, Default)]
pub struct Outcome {
    pub report: Report,
    pub processes: usize,
    pub topology: Vec<String>,
    pub regions_verified: usize,
    pub bytes_verified: u64,
    pub sharing_checks: usize,
    pub work_dir: PathBuf,
}

impl Outcome {
    pub fn text(&self) -> String {
        let mut out = String::from("cuinterpose demo\n\ntopology:\n");
        for line in &self.topology {
            out.push_str(&format!("  {line}\n"));
        }
        out.push('\n');
        out.push_str(&self.report.text());
        out.push_str(&format!(
            "\nVERIFIED: {} regions, {} bytes at their original addresses in {} processes; {} sharing links live after restore\n",
            self.regions_verified, self.bytes_verified, self.processes, self.sharing_checks
        ));
        out
    }

    pub fn json(&self) -> Value {
        json!({
            "verified": true,
            "processes": self.processes,
            "topology": self.topology,
            "regions_verified": self.regions_verified,
            "bytes_verified": self.bytes_verified,
            "sharing_checks": self.sharing_checks,
            "report": self.report.json(),
        })
    }
}

pub(super) fn setup(message: impl Into<String>) -> DemoError {
    DemoError::Setup(message.into())
}

pub(super) fn worker_error(
    what: impl Into<String>,
) -> impl FnOnce(cuinterpose_workload::WorkloadError) -> DemoError {
    let what = what.into();
    move |source| DemoError::Worker { what, source }
}

/// Runs `step` as the demo's phase `name` of `participants` processes: announced through
/// `progress`, timed, and added to `report` once it succeeded.
pub(super) fn phase<T>(
    name: String,
    participants: usize,
    report: &mut Report,
    progress: &mut dyn FnMut(&Event),
    step: impl FnOnce() -> Result<T, DemoError>,
) -> Result<T, DemoError> {
    let started = Instant::now();
    progress(&Event::Started {
        phase: &name,
        participants,
    });
    let value = step()?;
    let phase = PhaseReport {
        name,
        duration: started.elapsed(),
        bytes: 0,
        participants,
    };
    progress(&Event::Done(&phase));
    report.phases.push(phase);
    Ok(value)
}

/// fakecuda's control-directory variable, which the demo's driver reads in every process.
pub(super) const FAKECUDA_CONTROL_DIR: &str = "FAKECUDA_CONTROL_DIR";

/// fakecuda's control directory inside the work directory `work`: the workers', the hook's
/// and this process's.
pub(super) fn fakecuda_dir(work: &Path) -> PathBuf {
    work.join("fakecuda")
}
