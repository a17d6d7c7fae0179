//! The durable checkpoint state: `cuinterpose.state` in the checkpoint directory.
//!
//! Its content is `protocol::encode(&StateFile)`: every participant's records as
//! `begin_checkpoint` reported them, sorted. [`publish`] makes it appear atomically and never
//! replaces an existing one: a temp file in the same directory (created exclusively, mode
//! 0600) is written in full and fsynced, then linked to the final name (or renamed with
//! `RENAME_NOREPLACE` where the file system has no hard links), and the directory is fsynced.
//! A reader therefore sees either no state or a complete one.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use cuinterpose_protocol::{
    BoundError, BoundedMap, BoundedVec, DecodeError, EncodeError, InspectionReply,
    MAX_MESSAGE_BYTES, NamespacePid, Record, StateFile,
};

use crate::render;

/// The state file's name inside a checkpoint directory.
pub const STATE_FILE_NAME: &str = "cuinterpose.state";

/// `<dir>/cuinterpose.state`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE_NAME)
}

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

/// The state file for a checkpoint: each participant's records, sorted.
pub fn state_from_inspections(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
) -> Result<StateFile, StateError> {
    let mut participants = BoundedMap::default();
    for (&pid, inspection) in inspections {
        let mut records: BoundedVec<Record, _> = inspection.records.clone();
        records.sort();
        participants.insert(pid, records)?;
    }
    Ok(StateFile { participants })
}

/// Refuses a directory that already holds a state (prepare checks this before freezing anyone).
pub fn check_absent(dir: &Path) -> Result<(), StateError> {
    let path = state_path(dir);
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
    let path = state_path(dir);
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
    load_file(&state_path(dir))
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
    cuinterpose_protocol::decode::<StateFile>(&bytes)
        .map_err(|source| StateError::Corrupt { path, source })
}

/// A record present on one side only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordDifference {
    /// Saved, but not in the fresh inspection.
    Missing(Record),
    /// In the fresh inspection, but never saved.
    Unexpected(Record),
}

impl fmt::Display for RecordDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(record) => write!(f, "missing {}", render::record(record)),
            Self::Unexpected(record) => write!(f, "unexpected {}", render::record(record)),
        }
    }
}

/// The records that differ between `saved` and `fresh`, ignoring order (a record saved twice
/// must be there twice). Missing ones first, each group sorted.
pub fn compare(saved: &[Record], fresh: &[Record]) -> Vec<RecordDifference> {
    let mut saved: Vec<&Record> = saved.iter().collect();
    let mut fresh: Vec<&Record> = fresh.iter().collect();
    saved.sort();
    fresh.sort();
    let (mut missing, mut unexpected) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < saved.len() || j < fresh.len() {
        match (saved.get(i), fresh.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                missing.push(RecordDifference::Missing((*a).clone()));
                i += 1;
            }
            (Some(a), None) => {
                missing.push(RecordDifference::Missing((*a).clone()));
                i += 1;
            }
            (_, Some(b)) => {
                unexpected.push(RecordDifference::Unexpected((*b).clone()));
                j += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
    missing.extend(unexpected);
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use cuinterpose_protocol::Phase;
    use std::os::unix::fs::PermissionsExt;

    fn sample() -> StateFile {
        state_file(&shared_topology(101))
    }

    /// Names in `dir` other than the final state file (temp files left behind).
    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .expect("read dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name != STATE_FILE_NAME)
            .collect()
    }

    #[test]
    fn publish_then_load_round_trips() {
        let dir = TempDir::new("state").expect("temp dir");
        let state = sample();
        let path = publish(dir.path(), &state).expect("publish");
        assert_eq!(path, state_path(dir.path()));
        assert_eq!(load(dir.path()).expect("load"), state);
        let mode = fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn state_from_inspections_sorts_records() {
        let participants = shared_topology(101);
        let mut replies = inspections(&participants, Phase::Frozen);
        for reply in replies.values_mut() {
            let mut records = reply.records.clone().into_vec();
            records.reverse();
            reply.records = records.try_into().expect("bounded");
        }
        assert_eq!(state_from_inspections(&replies).expect("state"), sample());
    }

    #[test]
    fn publish_never_replaces_a_state() {
        let dir = TempDir::new("state").expect("temp dir");
        let first = sample();
        publish(dir.path(), &first).expect("publish");
        let second = state_file(&shared_topology(201));
        let error = publish(dir.path(), &second).expect_err("second publish");
        assert!(matches!(error, StateError::AlreadyExists { .. }), "{error}");
        assert!(error.to_string().contains("use a new checkpoint directory"));
        assert!(matches!(
            check_absent(dir.path()),
            Err(StateError::AlreadyExists { .. })
        ));
        assert_eq!(load(dir.path()).expect("load"), first);
        assert!(leftovers(dir.path()).is_empty());

        // A dangling symlink at the final name is not replaced either.
        let dir = TempDir::new("state").expect("temp dir");
        std::os::unix::fs::symlink("/nonexistent", state_path(dir.path())).expect("symlink");
        let error = publish(dir.path(), &first).expect_err("publish over a symlink");
        assert!(matches!(error, StateError::AlreadyExists { .. }), "{error}");
    }

    /// Observes the final file after every step, optionally failing at one of them.
    struct Observer {
        dir: PathBuf,
        expected: StateFile,
        fail_at: Option<PublishStep>,
        seen: Vec<(PublishStep, bool)>,
    }

    impl PublishHook for Observer {
        fn after(&mut self, step: PublishStep) -> io::Result<()> {
            let present = match load(&self.dir) {
                Ok(state) => {
                    assert_eq!(state, self.expected, "complete after {step:?}");
                    true
                }
                Err(StateError::Missing { .. }) => false,
                Err(error) => panic!("partial state after {step:?}: {error}"),
            };
            self.seen.push((step, present));
            if self.fail_at == Some(step) {
                return Err(io::Error::other("injected"));
            }
            Ok(())
        }
    }

    fn check_interrupted(fail_at: Option<PublishStep>) {
        let dir = TempDir::new("state").expect("temp dir");
        let state = sample();
        let mut observer = Observer {
            dir: dir.path().to_path_buf(),
            expected: state.clone(),
            fail_at,
            seen: Vec::new(),
        };
        let result = publish_with(dir.path(), &state, &mut observer);
        let expected_steps: Vec<(PublishStep, bool)> = PublishStep::ALL
            .iter()
            .take_while(|step| Some(**step) <= fail_at || fail_at.is_none())
            .map(|step| (*step, *step >= PublishStep::Published))
            .collect();
        assert_eq!(observer.seen, expected_steps, "steps until {fail_at:?}");
        match fail_at {
            None => {
                result.expect("publish");
            }
            Some(step) => {
                let error = result.expect_err("injected failure");
                assert!(
                    matches!(error, StateError::Interrupted { step: s, .. } if s == step),
                    "{error}"
                );
            }
        }
        // Complete or absent, never partial, and no temp file left behind.
        match load(dir.path()) {
            Ok(loaded) => {
                assert_eq!(loaded, state);
                assert!(fail_at.is_none_or(|step| step >= PublishStep::Published));
            }
            Err(StateError::Missing { .. }) => {
                assert!(fail_at.is_some_and(|step| step < PublishStep::Published));
            }
            Err(error) => panic!("after {fail_at:?}: {error}"),
        }
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[test]
    fn publication_is_complete_or_absent_after_every_step() {
        check_interrupted(None);
        for step in PublishStep::ALL {
            check_interrupted(Some(step));
        }
    }

    fn check_load_error(content: impl FnOnce(&Path), expected: &str) -> StateError {
        let dir = TempDir::new("state").expect("temp dir");
        content(&state_path(dir.path()));
        let error = load(dir.path()).expect_err("load must fail");
        let text = error.to_string();
        assert!(text.contains(expected), "{text}");
        assert!(
            text.contains(&state_path(dir.path()).display().to_string()),
            "{text}"
        );
        error
    }

    #[test]
    fn load_errors_are_distinct() {
        let error = check_load_error(|_| {}, "no checkpoint state here");
        assert!(matches!(error, StateError::Missing { .. }));

        let error = check_load_error(
            |path| fs::create_dir(path).expect("dir"),
            "cannot read the checkpoint state",
        );
        assert!(matches!(error, StateError::Unreadable { .. }));

        let error = check_load_error(
            |path| {
                let file = File::create(path).expect("create");
                file.set_len(MAX_MESSAGE_BYTES as u64 + 1).expect("sparse");
            },
            "more than the limit of 33554432",
        );
        assert!(
            matches!(error, StateError::Oversized { size, .. } if size == MAX_MESSAGE_BYTES as u64 + 1)
        );

        let error = check_load_error(
            |path| fs::write(path, b"not a state file at all").expect("write"),
            "corrupt checkpoint state: StateFile: not an envelope",
        );
        assert!(matches!(error, StateError::Corrupt { .. }));

        let bytes = cuinterpose_protocol::encode(&sample()).expect("encode");
        let truncated = bytes[..bytes.len() - 1].to_vec();
        let error = check_load_error(
            move |path| fs::write(path, truncated).expect("write"),
            "corrupt checkpoint state: StateFile: malformed body",
        );
        assert!(matches!(error, StateError::Corrupt { .. }));

        let mut trailing = bytes.clone();
        trailing.push(0);
        check_load_error(
            move |path| fs::write(path, trailing).expect("write"),
            "trailing bytes",
        );

        let mut other_version = bytes;
        other_version[9] = 99;
        check_load_error(
            move |path| fs::write(path, other_version).expect("write"),
            "unsupported protocol version 99",
        );
    }

    #[test]
    fn compare_ignores_order_and_names_differences() {
        let records: Vec<Record> = shared_topology(101).remove(&pid(101)).expect("101");
        let mut shuffled = records.clone();
        shuffled.reverse();
        assert!(compare(&records, &shuffled).is_empty());

        let mut fresh = records.clone();
        let removed = fresh.remove(1);
        let added: Record = mapping(1, 101, 0x1000, SIZE, 0).into();
        fresh.push(added.clone());
        fresh.push(records[0].clone());
        let differences = compare(&records, &fresh);
        // Missing first, then unexpected; each group sorted (allocations before mappings).
        assert_eq!(
            differences,
            [
                RecordDifference::Missing(removed),
                RecordDifference::Unexpected(records[0].clone()),
                RecordDifference::Unexpected(added),
            ]
        );
        let text: Vec<String> = differences.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|line| line.starts_with("missing ")));
        assert!(
            text.iter()
                .any(|line| line.starts_with("unexpected mapping of allocation")
                    && line.contains("at 0x1000")),
            "{text:?}"
        );
    }
}
