//! The durable checkpoint state: `cuinterpose.state` in the checkpoint directory.
//!
//! Its content is `protocol::encode(&StateFile)`: every participant's records as
//! `begin_checkpoint` reported them, sorted, sealed with a SHA-256 digest that [`load`]
//! checks, so a file that decodes but was edited or damaged is refused before it is used. [`publish`] makes it appear atomically and never
//! replaces an existing one: a temp file in the same directory (created exclusively, mode
//! 0600) is written in full and fsynced, then linked to the final name (or renamed with
//! `RENAME_NOREPLACE` where the file system has no hard links), and the directory is fsynced.
//! A reader therefore sees either no state or a complete one. Comparing saved records with
//! fresh ones lives in `compare`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use cuinterpose_protocol::{
    BoundError, BoundedMap, BoundedVec, DecodeError, Device, DeviceInventory, EncodeError,
    InspectionReply, MAX_DEVICES, MAX_MESSAGE_BYTES, NamespacePid, Record, StateFile,
};

mod compare;
#[cfg(test)]
mod tests;

pub use compare::{
    ChecksumDifference, RecordDifference, check_coverage, compare, compare_checksums,
};

use crate::checkpoint_dir::{self, STATE_FILE_NAME};

/// The observable steps of [`publish_with`], in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PublishStep {
    /// The whole encoding is in the temp file (not yet durable).
    TempWritten,
    /// The temp file is fsynced.
    Synced,
    /// The final name exists and holds the complete state; the temp name is still there.
    Published,
    /// The temp name is gone and the directory is fsynced: the state is durable.
    DirectorySynced,
}

impl PublishStep {
    pub const ALL: [Self; 4] = [
        Self::TempWritten,
        Self::Synced,
        Self::Published,
        Self::DirectorySynced,
    ];
}

/// Called after each step of publication; an error stops it there (fault injection in tests).
pub trait PublishHook {
    fn after(&mut self, step: PublishStep) -> io::Result<()>;
}

/// The production hook: does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHook;

impl PublishHook for NoHook {
    fn after(&mut self, _step: PublishStep) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "{}: a checkpoint state already exists; use a new checkpoint directory",
        path.display()
    )]
    AlreadyExists { path: PathBuf },
    #[error("{}: no checkpoint state here (nothing was prepared into this directory)", path.display())]
    Missing { path: PathBuf },
    #[error("{}: cannot read the checkpoint state: {source}", path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error(
        "{}: the checkpoint state is {size} bytes, more than the limit of {limit}",
        path.display()
    )]
    Oversized {
        path: PathBuf,
        size: u64,
        limit: usize,
    },
    #[error("{}: corrupt checkpoint state: {source}", path.display())]
    Corrupt { path: PathBuf, source: DecodeError },
    /// It decodes, but its digest does not match its records: refused before anything uses
    /// them.
    #[error("{}: corrupt checkpoint state: {source}", path.display())]
    Tampered {
        path: PathBuf,
        source: cuinterpose_protocol::DigestMismatch,
    },
    /// It decodes and its digest matches, but its parts disagree.
    #[error("{}: inconsistent checkpoint state: {message}", path.display())]
    Inconsistent { path: PathBuf, message: String },
    #[error("cannot encode the checkpoint state: {0}")]
    Encode(#[from] EncodeError),
    #[error("the checkpoint state cannot hold these participants: {0}")]
    Bound(#[from] BoundError),
    #[error("{}: {during}: {source}", path.display())]
    Io {
        path: PathBuf,
        during: &'static str,
        source: io::Error,
    },
    #[error("{}: publication stopped after step {step:?}: {source}", path.display())]
    Interrupted {
        path: PathBuf,
        step: PublishStep,
        source: io::Error,
    },
}

/// The state file for a checkpoint as frozen: each participant's records, sorted, and its
/// devices; `machine` is the machine's GPUs as the coordinator listed them. No checksums yet.
pub fn state_from_inspections(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
    machine: BoundedVec<Device, MAX_DEVICES>,
) -> Result<StateFile, StateError> {
    let mut participants = BoundedMap::default();
    let mut devices = BoundedMap::default();
    for (&pid, inspection) in inspections {
        let mut records: BoundedVec<Record, _> = inspection.records.clone();
        records.sort();
        participants.insert(pid, records)?;
        // A process that never initialised the driver sees no devices: nothing to record.
        if !inspection.devices.is_empty() {
            devices.insert(pid, inspection.devices.clone())?;
        }
    }
    let devices = DeviceInventory {
        machine,
        participants: devices,
    };
    // The checksums come with the save's replies, and the run knows its carrier: it seals the
    // state again then.
    Ok(StateFile::seal(
        participants,
        devices,
        BoundedMap::default(),
        cuinterpose_protocol::Carrier::Host,
    ))
}

/// Refuses a directory that already holds a state (prepare checks this before freezing anyone).
pub fn check_absent(dir: &Path) -> Result<(), StateError> {
    let path = checkpoint_dir::state(dir);
    match fs::symlink_metadata(&path) {
        Ok(_) => Err(StateError::AlreadyExists { path }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io {
            path,
            during: "checking for an existing state",
            source,
        }),
    }
}

/// [`publish_with`] without a hook. Returns the state file's path.
pub fn publish(dir: &Path, state: &StateFile) -> Result<PathBuf, StateError> {
    publish_with(dir, state, &mut NoHook)
}

/// Removes the temp file unless publication renamed it away.
struct TempGuard {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Removes temp files a publisher left when it was killed mid-publication: named
/// `.cuinterpose.state.<pid>.<n>.tmp`, with no process `<pid>` alive any more. They were never
/// the state (only a completed link is), so removing them loses nothing.
fn remove_abandoned_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{STATE_FILE_NAME}.");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest
            .strip_suffix(".tmp")
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Publishes `state` as `<dir>/cuinterpose.state` atomically and without replacing an existing
/// file, calling `hook` after each [`PublishStep`].
pub fn publish_with(
    dir: &Path,
    state: &StateFile,
    hook: &mut dyn PublishHook,
) -> Result<PathBuf, StateError> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let bytes = cuinterpose_protocol::encode(state)?;
    let path = checkpoint_dir::state(dir);
    check_absent(dir)?;
    remove_abandoned_temp_files(dir);
    let temp_name = format!(
        ".{STATE_FILE_NAME}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let temp_path = dir.join(&temp_name);
    let io_error = |during| {
        let path = path.clone();
        move |source| StateError::Io {
            path,
            during,
            source,
        }
    };
    let step = |hook: &mut dyn PublishHook, step| {
        hook.after(step).map_err(|source| StateError::Interrupted {
            path: path.clone(),
            step,
            source,
        })
    };

    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp_path)
        .map_err(io_error("creating the temp file"))?;
    let mut guard = TempGuard {
        path: temp_path.clone(),
        armed: true,
    };
    file.write_all(&bytes)
        .map_err(io_error("writing the temp file"))?;
    step(hook, PublishStep::TempWritten)?;
    file.sync_all().map_err(io_error("syncing the temp file"))?;
    drop(file);
    step(hook, PublishStep::Synced)?;

    let directory = File::open(dir).map_err(io_error("opening the checkpoint directory"))?;
    match fs::hard_link(&temp_path, &path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            return Err(StateError::AlreadyExists { path });
        }
        Err(error)
            if matches!(
                error.raw_os_error(),
                Some(libc::EPERM | libc::EOPNOTSUPP | libc::EMLINK)
            ) =>
        {
            // No hard links here: rename, still refusing to replace.
            match nix::fcntl::renameat2(
                &directory,
                temp_name.as_str(),
                &directory,
                STATE_FILE_NAME,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => guard.armed = false,
                Err(nix::errno::Errno::EEXIST) => {
                    return Err(StateError::AlreadyExists { path });
                }
                Err(errno) => {
                    return Err(io_error("renaming the temp file")(io::Error::from(errno)));
                }
            }
        }
        Err(source) => return Err(io_error("linking the temp file")(source)),
    }
    step(hook, PublishStep::Published)?;
    if guard.armed {
        fs::remove_file(&temp_path).map_err(io_error("removing the temp file"))?;
        guard.armed = false;
    }
    directory
        .sync_all()
        .map_err(io_error("syncing the checkpoint directory"))?;
    step(hook, PublishStep::DirectorySynced)?;
    Ok(path)
}

/// Reads and decodes `<dir>/cuinterpose.state`.
pub fn load(dir: &Path) -> Result<StateFile, StateError> {
    load_file(&checkpoint_dir::state(dir))
}

/// Reads and decodes a state file at any path.
pub fn load_file(path: &Path) -> Result<StateFile, StateError> {
    let path = path.to_path_buf();
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(StateError::Missing { path });
        }
        Err(source) => return Err(StateError::Unreadable { path, source }),
    };
    let oversized = |size| StateError::Oversized {
        path: path.clone(),
        size,
        limit: MAX_MESSAGE_BYTES,
    };
    let declared = file
        .metadata()
        .map_err(|source| StateError::Unreadable {
            path: path.clone(),
            source,
        })?
        .len();
    if declared > MAX_MESSAGE_BYTES as u64 {
        return Err(oversized(declared));
    }
    // The file may grow while we read: never read more than the limit plus one byte.
    let mut bytes = Vec::with_capacity(declared as usize);
    file.take(MAX_MESSAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| StateError::Unreadable {
            path: path.clone(),
            source,
        })?;
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(oversized(bytes.len() as u64));
    }
    let state = cuinterpose_protocol::decode::<StateFile>(&bytes).map_err(|source| {
        StateError::Corrupt {
            path: path.clone(),
            source,
        }
    })?;
    state
        .check_digest()
        .map_err(|source| StateError::Tampered {
            path: path.clone(),
            source,
        })?;
    // Sealed but not written by a checkpoint: devices of a process it did not record.
    if let Some(pid) = state
        .devices
        .participants
        .keys()
        .find(|pid| state.participants.get(pid).is_none())
    {
        return Err(StateError::Inconsistent {
            path,
            message: format!("it lists devices of process {pid}, which is not a participant"),
        });
    }
    Ok(state)
}
