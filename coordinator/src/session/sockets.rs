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
