//! The session's side of a run: its requests over the sockets ([`Sockets`], the
//! [`Participants`] a run is driven through), the storage carrier's folder each copy carries,
//! a load's wait for its native restore, and the copy reports.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cuinterpose_protocol::{NamespacePid, Operation, Reply, Request, StateFile};

use super::{Copy, Session};
use crate::events::Event;
use crate::plan::{
    Broadcast, Broadcasted, ExchangeError, ExchangeKind, Outcome, Participants, Run, Stage,
};

impl Session {
    /// Before a load: `pid`'s native restore, where one is under way.
    pub(super) fn await_native(
        &self,
        pid: NamespacePid,
        request: &Request,
    ) -> Result<(), ExchangeError> {
        let load = matches!(
            request,
            Request::Execute(execute) if execute.operation == Operation::LoadAllocations
        );
        match &self.natives {
            Some(natives) if load => natives.wait(pid).map_err(|why| ExchangeError::Unsent {
                kind: ExchangeKind::NativeRestore,
                message: format!("its native restore failed: {why}"),
            }),
            _ => Ok(()),
        }
    }
}

/// The descriptor `request` carries: the storage carrier's folder, opened for reading (the
/// shim creates and reads its files in it), for the copies that use it; else none.
pub(super) fn carried_folder(
    request: &Request,
    folder: Option<&Path>,
) -> Result<Option<std::os::fd::OwnedFd>, ExchangeError> {
    if !request.carries_fd() {
        return Ok(None);
    }
    let Some(folder) = folder else {
        return Err(ExchangeError::Unsent {
            kind: ExchangeKind::NoFolder,
            message: "the storage carrier needs a checkpoint directory".into(),
        });
    };
    if let Some(detached) = detached(folder) {
        return Ok(Some(detached));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(folder)
        .map(|file| Some(std::os::fd::OwnedFd::from(file)))
        .map_err(|error| ExchangeError::Unsent {
            kind: ExchangeKind::NoFolder,
            message: format!("opening the carrier folder {}: {error}", folder.display()),
        })
}

/// `folder` as the root of a detached copy of its mount (`open_tree` with `OPEN_TREE_CLONE`),
/// reopened as a directory: a process given it (a container's, under the CRIU hook) creates
/// and reads files in it, but `..` stops at its root, so the descriptor does not open the
/// host's file system to it. `None` where this process may not make one (it takes
/// `CAP_SYS_ADMIN`, Linux 5.2): the folder is then passed as it is, which is as far as a
/// process of the caller's own user could reach anyway.
pub(super) fn detached(folder: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(folder.as_os_str().as_bytes()).ok()?;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: open_tree(2) with a NUL-terminated path that outlives the call; it returns a new
    // descriptor or -1.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    let tree = i32::try_from(tree).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `tree` is a descriptor open_tree just returned, owned by nobody else.
    let tree = unsafe { std::os::fd::OwnedFd::from_raw_fd(tree) };
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::openat(&tree, ".", flags, nix::sys::stat::Mode::empty()).ok()
}

/// A shim given a [`detached`] folder names its files `carrier/NAME`: its refusal names them
/// by the checkpoint directory's folder (`folder`) instead.
pub(super) fn name_folder(reply: Reply, folder: Option<&Path>) -> Reply {
    const RELATIVE: &str = "carrier file carrier/";
    match (reply, folder) {
        (Reply::Refused(mut refused), Some(folder))
            if refused.message.as_str().contains(RELATIVE) =>
        {
            let named = format!("carrier file {}/", folder.display());
            if let Ok(message) = refused
                .message
                .as_str()
                .replace(RELATIVE, &named)
                .try_into()
            {
                refused.message = message;
            }
            Reply::Refused(refused)
        }
        (reply, _) => reply,
    }
}

/// A run's requests over the session's sockets, its state through the caller's `publish`.
pub(super) struct Sockets<'a> {
    pub(super) session: &'a Session,
    /// The storage carrier's folder in the checkpoint directory, for copies that use it.
    pub(super) folder: Option<&'a Path>,
    pub(super) publish: &'a mut dyn FnMut(&StateFile) -> Result<(), String>,
    pub(super) progress: &'a mut dyn FnMut(&Event),
    /// Each participant's part of the copy phases so far.
    pub(super) copies: Vec<crate::report::CopyReport>,
}

impl Participants for Sockets<'_> {
    fn broadcast(&mut self, run: &Run, call: Broadcast<'_>) -> Broadcasted {
        let started = Instant::now();
        let outcomes = match call.stage {
            Stage::Execute(
                operation @ (Operation::SaveAllocations | Operation::LoadAllocations),
            ) => {
                let phase = call.stage.name_in(run.kind());
                let expected = call
                    .participants
                    .iter()
                    .map(|pid| (*pid, run.topology().bytes_of(*pid)))
                    .collect();
                let copy = Copy {
                    operation,
                    phase,
                    expected,
                };
                let timed = self.session.broadcast_watching(
                    call.request,
                    call.participants,
                    self.folder,
                    &copy,
                    self.progress,
                );
                self.copies.extend(copy_reports(phase, &timed));
                timed
                    .into_iter()
                    .map(|(pid, (outcome, _))| (pid, outcome))
                    .collect()
            }
            _ => self.session.broadcast(call.request, call.participants),
        };
        (outcomes, started.elapsed())
    }

    fn publish(&mut self, state: &StateFile) -> (Result<(), String>, Duration) {
        let started = Instant::now();
        let result = (self.publish)(state);
        (result, started.elapsed())
    }

    fn declare_fail_stop(&mut self, pids: &[NamespacePid], reason: &str) -> Vec<NamespacePid> {
        self.session.declare_fail_stop(pids, reason)
    }

    fn started(&mut self, phase: &'static str, participants: usize) {
        (self.progress)(&Event::Started {
            phase,
            participants,
        });
    }

    fn done(&mut self, phase: &crate::report::PhaseReport) {
        (self.progress)(&Event::Done(phase));
    }
}

/// Each participant's part of a copy phase whose exchanges ended in `timed`: the bytes its
/// shim reported and how long its exchange took (participants without a completed reply are
/// left out: the run fails on them).
fn copy_reports(
    phase: &str,
    timed: &BTreeMap<NamespacePid, (Outcome, Duration)>,
) -> Vec<crate::report::CopyReport> {
    timed
        .iter()
        .filter_map(|(&participant, (outcome, duration))| match outcome {
            Ok(Reply::Completed(done)) => Some(crate::report::CopyReport {
                phase: phase.to_owned(),
                participant,
                bytes: done.bytes,
                duration: *duration,
                copying: Duration::from_nanos(done.copy_ns),
                peak_carrier_bytes: done.peak_carrier_bytes,
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuinterpose_protocol::{RefusalCode, RefusedReply};
    use std::os::fd::AsFd as _;

    #[test]
    fn a_detached_folder_holds_its_files_and_nothing_above_it() {
        let test = "a_detached_folder_holds_its_files_and_nothing_above_it";
        let dir = cuinterpose_testkit::fixtures::TempDir::new("detached").unwrap();
        let folder = dir.path().join("carrier");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(dir.path().join("secret"), b"host").unwrap();
        let Some(fd) = detached(&folder) else {
            return cuinterpose_testkit::unavailable(test, "open_tree needs CAP_SYS_ADMIN (root)");
        };
        let open = |path: &str, flags| {
            nix::fcntl::openat(
                fd.as_fd(),
                path,
                flags,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )
        };
        use nix::fcntl::OFlag;
        // `..` stops at the folder: nothing beside or above it opens.
        for escape in ["../secret", "../../../../../secret", "./../secret"] {
            assert_eq!(
                open(escape, OFlag::O_RDONLY).err(),
                Some(nix::errno::Errno::ENOENT),
                "{escape}"
            );
        }
        // What the shim does in it lands in the checkpoint directory's folder.
        drop(open("file", OFlag::O_CREAT | OFlag::O_WRONLY).unwrap());
        assert!(folder.join("file").exists());
        let seen = std::fs::read_link(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ))
        .unwrap();
        assert_eq!(
            seen,
            Path::new("/"),
            "the shim names such a folder carrier/"
        );
    }

    #[test]
    fn refusals_name_the_checkpoint_directorys_folder() {
        let refusal = |message: &str| {
            Reply::Refused(RefusedReply {
                code: RefusalCode::CarrierFailed,
                message: message.try_into().unwrap(),
            })
        };
        let text = |reply: Reply| match reply {
            Reply::Refused(refused) => refused.message.as_str().to_owned(),
            other => panic!("{}", other.kind()),
        };
        let folder = Path::new("/ckpt/carrier");
        let said = "copying: carrier file carrier/ab12: writing: No space left on device";
        assert_eq!(
            text(name_folder(refusal(said), Some(folder))),
            "copying: carrier file /ckpt/carrier/ab12: writing: No space left on device"
        );
        // A full path (a folder passed as it is) and other refusals stay as they are.
        let full = "carrier file /elsewhere/carrier/ab12: writing: EIO";
        assert_eq!(text(name_folder(refusal(full), Some(folder))), full);
        assert_eq!(text(name_folder(refusal(said), None)), said);
    }
}
