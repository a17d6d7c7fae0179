//! Exit statuses, the usage failures found after parsing, and the settings a command reads
//! from its flags and the environment (control directory, timeouts, PIDs, session, workload).

use std::ffi::OsString;
use std::path::PathBuf;

use cuinterpose_protocol::NamespacePid;
use cuinterpose_protocol::transport::{CONTROL_DIR_VARIABLE, Timeouts, control_dir_from};

use super::args::{CarrierArgs, CarrierChoice, DEFAULT_STAGING_MIB, Target};
use crate::commands::CommandError;
use crate::compose::Workload;
use crate::plan::Carriage;
use crate::session::Session;

pub use crate::plan::{EXIT_ABORTED, EXIT_FAIL_STOP, EXIT_REFUSED, EXIT_USAGE};

/// A usage problem found after parsing (settings from the environment, PID values).
#[derive(Debug)]
pub(super) struct Usage(pub(super) String);

pub(super) enum Failure {
    Usage(Usage),
    Command(CommandError),
}

impl From<CommandError> for Failure {
    fn from(error: CommandError) -> Self {
        Self::Command(error)
    }
}

impl From<Usage> for Failure {
    fn from(error: Usage) -> Self {
        Self::Usage(error)
    }
}

pub(super) fn control_dir(flag: Option<PathBuf>) -> Result<PathBuf, Usage> {
    let value = flag
        .map(OsString::from)
        .or_else(|| std::env::var_os(CONTROL_DIR_VARIABLE));
    control_dir_from(value).map_err(|error| Usage(format!("control directory: {error}")))
}

fn timeouts() -> Result<Timeouts, Usage> {
    Timeouts::from_env().map_err(|error| Usage(error.to_string()))
}

fn namespace_pids(values: &[u32]) -> Result<Vec<NamespacePid>, Usage> {
    values
        .iter()
        .map(|&value| {
            NamespacePid::new(value).ok_or_else(|| Usage("--pid 0 names no process".to_string()))
        })
        .collect()
}

/// `--staging-mib` in bytes: whole 64 MiB chunks, at least one.
pub(super) fn staging_bytes(mib: u64) -> Result<u64, Usage> {
    let bytes = mib.saturating_mul(1 << 20);
    cuinterpose_protocol::window_chunks(bytes)
        .map(|_| bytes)
        .map_err(|error| Usage(format!("--staging-mib {mib}: {error}")))
}

/// The carriage `--carrier` and `--staging-mib` ask for; `auto` is the storage carrier when
/// the checkpoint goes to a directory that is kept (`kept`), else the host carrier.
pub(super) fn carriage(args: &CarrierArgs, kept: bool) -> Result<Carriage, Usage> {
    let storage = match args.carrier {
        CarrierChoice::Host => false,
        CarrierChoice::Storage => true,
        CarrierChoice::Auto => kept,
    };
    Ok(if storage {
        Carriage::Storage {
            staging_bytes: staging_bytes(args.staging_mib)?,
        }
    } else {
        Carriage::Host
    })
}

/// The hook's carriage: [`crate::hook::CARRIER_VARIABLE`] and
/// [`crate::hook::STAGING_VARIABLE`] as `--carrier` and `--staging-mib` take them (unset:
/// their defaults), for an image directory, which is kept.
pub(super) fn hook_carriage(lookup: impl Fn(&str) -> Option<String>) -> Result<Carriage, Usage> {
    use clap::ValueEnum as _;
    let (carrier_name, staging_name) =
        (crate::hook::CARRIER_VARIABLE, crate::hook::STAGING_VARIABLE);
    let carrier = match lookup(carrier_name).filter(|text| !text.trim().is_empty()) {
        None => CarrierChoice::Auto,
        Some(text) => CarrierChoice::from_str(text.trim(), true).map_err(|_| {
            Usage(format!(
                "{carrier_name}={text:?}: expected auto, host or storage"
            ))
        })?,
    };
    let staging_mib = match lookup(staging_name).filter(|text| !text.trim().is_empty()) {
        None => DEFAULT_STAGING_MIB,
        Some(text) => text
            .trim()
            .parse()
            .map_err(|_| Usage(format!("{staging_name}={text:?}: expected a number of MiB")))?,
    };
    carriage(
        &CarrierArgs {
            carrier,
            staging_mib,
        },
        true,
    )
    .map_err(|Usage(why)| Usage(format!("{staging_name}: {why}")))
}

pub(super) fn session(target: &Target) -> Result<Session, Failure> {
    let dir = control_dir(target.control_dir.clone())?;
    let pids = namespace_pids(&target.pids)?;
    Ok(Session::open(&dir, &pids, timeouts()?).map_err(CommandError::from)?)
}

/// A workload to act on: its control directory (`control`, else the environment), the
/// timeouts, and the timeout of each native lock (0: no limit).
pub(super) fn workload(control: Option<PathBuf>, lock_timeout_ms: u32) -> Result<Workload, Usage> {
    Ok(Workload {
        control_dir: control_dir(control)?,
        timeouts: timeouts()?,
        lock_timeout_ms,
        proc_dir: PathBuf::from("/proc"),
        device_map: None,
        carriage: crate::plan::Carriage::Host,
        driver: driver_path(),
    })
}

/// The CUDA driver the coordinator's native calls go to: `CUINTERPOSE_DRIVER`, else the
/// system's `libcuda.so.1`.
pub(super) fn driver_path() -> PathBuf {
    crate::native::driver_path(std::env::var_os(crate::native::DRIVER_VARIABLE))
}
