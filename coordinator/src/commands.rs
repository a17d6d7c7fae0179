//! The coordinator's commands as library functions: what the CLI runs, usable from tests and
//! other tools.

use std::io;
use std::path::{Path, PathBuf};

use cuinterpose_protocol::{
    BoundedVec, Carrier, Device, DeviceUuid, MAX_DEVICES, NamespacePid, StateFile,
};

use crate::checkpoint_dir;
use crate::events::Event;
use crate::plan::{Carriage, Run, RunError, Stage};
use crate::remap::{DeviceMapSpec, Remap, TargetGpu};
use crate::report::Report;
use crate::session::{Session, SessionError};
use crate::state::{self, StateError};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Native(#[from] crate::native::NativeError),
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// The `--device-map` cannot be honoured here; nothing was changed.
    #[error("device map refused, nothing was changed: {0}")]
    DeviceMap(#[from] crate::remap::RemapError),
    /// The storage carrier's staging window cannot hold a chunk; nothing was changed.
    #[error("storage carrier refused, nothing was changed: {0}")]
    Window(#[from] cuinterpose_protocol::WindowTooSmall),
    /// `--device-map` was given, but this machine's driver cannot list its GPUs.
    #[error("device map refused, nothing was changed: {0}")]
    Devices(String),
    #[error("{}: {during}: {source}", path.display())]
    Io {
        path: PathBuf,
        during: &'static str,
        source: io::Error,
    },
    /// A step failed after participants were changed: the workload must not resume.
    #[error(
        "{}\nFAIL-STOP: {during} failed after the participants were prepared; nothing \
         was rolled back. The workload must not resume: restart it",
        source.cause()
    )]
    AfterMutation {
        during: String,
        #[source]
        source: Box<CommandError>,
    },
    /// Participants of the checkpoint died while a step ran (a task CRIU was injecting its
    /// parasite into when CRIU was killed dies of the trap CRIU left, and a PID namespace ends
    /// with its init): the workload cannot be put back.
    #[error(
        "{} died during {during}, so the workload cannot be put back",
        match pids.as_slice() {
            [one] => format!("participant {one}"),
            many => format!(
                "participants {}",
                many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        }
    )]
    Died {
        pids: Vec<NamespacePid>,
        during: String,
    },
    /// A step failed after participants were changed, every participant was alive, and the
    /// workload was put back in place from the host carriers: it runs on, unchanged.
    #[error(
        "{cause}\nABORTED: {during} failed after the participants were prepared; the workload \
         was put back in place (same bytes, addresses and sharing, verified) and resumed. \
         Nothing was checkpointed"
    )]
    Aborted {
        during: String,
        /// What failed, as the user reads it (without a fail-stop verdict).
        cause: String,
        #[source]
        source: Box<CommandError>,
        /// The phases of the rollback.
        resumed: Box<crate::report::Report>,
    },
}

impl CommandError {
    /// 1: refused or invalid, nothing changed; 2: failed after mutation (fail-stop); 3: failed
    /// after mutation, and the workload was put back in place and resumed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Run(error) => error.exit_code(),
            Self::AfterMutation { .. } => crate::plan::EXIT_FAIL_STOP,
            Self::Aborted { .. } => crate::plan::EXIT_ABORTED,
            _ => crate::plan::EXIT_REFUSED,
        }
    }

    /// What failed, without a verdict of its own: a run's failures without its "nothing was
    /// changed" or "FAIL-STOP" line, so a wrapping verdict is the only one printed.
    pub fn cause(&self) -> String {
        match self {
            Self::Run(error) => error.failures_text(),
            other => other.to_string(),
        }
    }

    /// What a failed file or process operation on `path` becomes, `during` saying which.
    pub fn io(path: impl Into<PathBuf>, during: &'static str) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            path,
            during,
            source,
        }
    }

    /// Wraps `self` as a failure after mutation (unless it already says so).
    pub fn after_mutation(self, during: impl Into<String>) -> Self {
        match self {
            Self::AfterMutation { .. } | Self::Aborted { .. } => self,
            Self::Run(ref error) if error.mutated => self,
            other => Self::AfterMutation {
                during: during.into(),
                source: Box::new(other),
            },
        }
    }
}

/// Creates the checkpoint directory (mode 0700) if it does not exist.
pub fn ensure_directory(dir: &Path) -> Result<(), CommandError> {
    checkpoint_dir::create(dir).map_err(CommandError::io(dir, "creating the checkpoint directory"))
}

/// inspect → validate → begin_checkpoint → prepare_multicast → save_allocations →
/// prepare_unicast → publish `cuinterpose.state` in `checkpoint_dir`. Refuses a directory that
/// already holds a state before contacting anyone.
pub fn prepare(
    session: &Session,
    checkpoint_dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    ensure_directory(checkpoint_dir)?;
    state::check_absent(checkpoint_dir)?;
    let carriage = session.carriage();
    let folder = match carriage {
        Carriage::Host => None,
        Carriage::Storage { staging_bytes } => {
            // Refused before anyone is frozen: the shims would each refuse it at the save.
            cuinterpose_protocol::window_chunks(staging_bytes)?;
            let folder = checkpoint_dir::carrier(checkpoint_dir);
            ensure_directory(&folder)?;
            Some(folder)
        }
    };
    let mut run = Run::capture(session.participants())
        .on_machine(session.machine().clone())
        .carried(carriage);
    let mut publish = |state: &cuinterpose_protocol::StateFile| {
        state::publish(checkpoint_dir, state)
            .map(|_| ())
            .map_err(|error| error.to_string())
    };
    let error = match session.drive(&mut run, folder.as_deref(), &mut publish, progress) {
        Ok(mut report) => {
            report.checkpoint_dir = Some(checkpoint_dir.to_path_buf());
            return Ok(report);
        }
        Err(error) => error,
    };
    // A save that failed removed its files; the folder goes too where it is empty (a
    // creator's files stay wherever something may still need them).
    if folder.is_some() && !error.resumes_from_state() {
        checkpoint_dir::remove_empty_carrier(checkpoint_dir);
    }
    // Publishing failed (disk full, directory gone), a participant did not take the hold, or
    // one did not answer prepare_unicast in time and the run waited until all were released:
    // every participant is released and holds its host carrier, so the workload is put back
    // from the state in memory.
    let Some(state) = run.state().filter(|_| error.resumes_from_state()).cloned() else {
        return Err(error.into());
    };
    let mut back = Run::restore(&state, session.participants()).carried(carriage);
    let mut nothing = |_: &cuinterpose_protocol::StateFile| Ok(());
    match session.drive(&mut back, folder.as_deref(), &mut nothing, progress) {
        Ok(resumed) => {
            checkpoint_dir::discard(checkpoint_dir);
            Err(CommandError::Aborted {
                during: aborted_during(&error).into(),
                cause: error.failures_text(),
                source: Box::new(error.into()),
                resumed: Box::new(resumed),
            })
        }
        Err(rollback) => Err(CommandError::AfterMutation {
            during: format!(
                "{} (and putting the workload back failed too: {rollback})",
                aborted_during(&error)
            ),
            source: Box::new(error.into()),
        }),
    }
}

/// How an abort after `prepare_unicast` names the step that failed.
fn aborted_during(error: &RunError) -> &'static str {
    match error.stage {
        _ if error.settled => "prepare_unicast (a participant did not answer in time)",
        Stage::Hold => "holding the participants for the published state",
        _ => "publishing the state",
    }
}

/// Loads the state (before contacting anyone) → checks the live participants against it →
/// load_allocations … restore_multicast_bindings → verify the records.
pub fn restore(
    session: &Session,
    checkpoint_dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    restore_remapped(session, checkpoint_dir, Remap::identity(), progress)
}

/// [`restore`] of processes natively restored onto the GPUs `remap` names: the final
/// inspection must show each saved ordinal on its paired GPU.
pub fn restore_remapped(
    session: &Session,
    checkpoint_dir: &Path,
    remap: Remap,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    let state = state::load(checkpoint_dir)?;
    let mut run = Run::restore(&state, session.participants())
        .remapped(remap)
        .carried(session.carriage());
    let folder =
        (state.carrier == Carrier::Storage).then(|| checkpoint_dir::carrier(checkpoint_dir));
    let mut publish = |_: &cuinterpose_protocol::StateFile| Ok(());
    let mut report = session.drive(&mut run, folder.as_deref(), &mut publish, progress)?;
    report.checkpoint_dir = Some(checkpoint_dir.to_path_buf());
    Ok(report)
}

/// A GPU as a checkpoint records it, from the driver's listing (`None` for an all-zero UUID,
/// which names nothing; the name, read from a 256-byte buffer, is always within bounds).
fn recorded(device: &crate::native::MachineDevice) -> Option<Device> {
    Some(Device {
        ordinal: device.ordinal,
        uuid: DeviceUuid::new(device.uuid)?,
        name: device.name.as_str().try_into().ok()?,
        memory: device.memory,
    })
}

/// The machine's GPUs as `driver` lists them, for a checkpoint's state; none when it cannot
/// (a restore onto other GPUs then names old GPUs by UUID).
pub fn machine(driver: &crate::native::NativeDriver) -> BoundedVec<Device, MAX_DEVICES> {
    let devices: Vec<Device> = driver
        .devices(false)
        .map(|devices| devices.iter().filter_map(recorded).collect())
        .unwrap_or_default();
    BoundedVec::try_from(devices).unwrap_or_default()
}

/// [`machine`] for the driver at `path`; none when it cannot be loaded here.
pub fn machine_at(path: &Path) -> BoundedVec<Device, MAX_DEVICES> {
    crate::native::NativeDriver::load_from(path)
        .map(|driver| machine(&driver))
        .unwrap_or_default()
}

/// Resolves `spec` for `state` against this machine's GPUs (listed with their free memory).
pub fn resolve_device_map(
    driver: &crate::native::NativeDriver,
    spec: &DeviceMapSpec,
    state: &StateFile,
) -> Result<Remap, CommandError> {
    let listed = driver
        .devices(true)
        .map_err(|error| CommandError::Devices(error.to_string()))?;
    let target: Vec<TargetGpu> = listed
        .iter()
        .filter_map(|device| {
            Some(TargetGpu {
                ordinal: device.ordinal,
                uuid: DeviceUuid::new(device.uuid)?,
                name: device.name.clone(),
                memory: device.memory,
                free: device.free,
            })
        })
        .collect();
    Ok(crate::remap::resolve(
        spec,
        &state.devices,
        &target,
        &crate::remap::shared_bytes(state),
    )?)
}
