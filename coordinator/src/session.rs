//! The I/O edge of the lifecycle: finds the participants' sockets, sends one request to all of
//! them concurrently (one scoped thread each) and feeds the outcomes to a [`Run`].
//!
//! Every exchange is bounded by the protocol's timeouts ([`Timeouts`]: the control timeout for
//! connecting and for most requests, the copy timeout for `save_allocations` and
//! `load_allocations`), so a participant that dies or stalls mid-phase makes the phase fail
//! within its timeout, naming it. One thread per participant (not a pool): a participant may
//! block in a collective until every other one has received the same request.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cuinterpose_protocol::transport::{Endpoint, Timeouts, TransportError, call_with};
use cuinterpose_protocol::{
    BoundedVec, Device, InspectionReply, MAX_DEVICES, NamespacePid, Operation, Reply, Request,
    StateFile,
};

mod ready;
mod sockets;
pub use ready::Readiness;
use sockets::{Sockets, carried_folder, name_folder};

use crate::events::{CopyProgress, CopyState, Event};
use crate::plan::{Carriage, ExchangeError, ExchangeKind, Outcome, Run};
use crate::report::Report;
pub use crate::stale::StaleSocket;
use crate::stale::{self, Probe};
use crate::validate::{self, Topology, TopologyError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("control directory {}: {source}", path.display())]
    ControlDirectory { path: PathBuf, source: io::Error },
    #[error(
        "no participants: no cuinterpose-<pid>.sock socket in {} answers (is the shim loaded, \
         and is this the control directory it uses?){}",
        path.display(),
        gone.iter().map(|s| format!("; {s}")).collect::<String>()
    )]
    NoParticipants {
        path: PathBuf,
        /// Sockets of processes that are gone, found on the way.
        gone: Vec<StaleSocket>,
    },
    #[error("namespace pid {0} is given twice")]
    DuplicatePid(NamespacePid),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// The namespace PIDs of the sockets named `cuinterpose-<pid>.sock` in `control_dir`,
/// ascending. Other files are ignored; a matching name that is not a socket is skipped too.
pub fn discover(control_dir: &Path) -> Result<Vec<NamespacePid>, SessionError> {
    use std::os::unix::fs::FileTypeExt;
    let error = |source| SessionError::ControlDirectory {
        path: control_dir.to_path_buf(),
        source,
    };
    let mut pids = Vec::new();
    for entry in fs::read_dir(control_dir).map_err(error)? {
        let entry = entry.map_err(error)?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(parse_socket_name) else {
            continue;
        };
        if entry.file_type().map_err(error)?.is_socket() {
            pids.push(pid);
        }
    }
    pids.sort();
    Ok(pids)
}

/// The sockets of [`discover`] that answer, and those of processes that are gone (removed
/// where no process has them bound; see [`crate::stale`]).
pub fn discover_live(
    control_dir: &Path,
) -> Result<(Vec<NamespacePid>, Vec<StaleSocket>), SessionError> {
    let mut live = Vec::new();
    let mut gone = Vec::new();
    let mut bound = None;
    for pid in discover(control_dir)? {
        let path = control_dir.join(format!("cuinterpose-{pid}.sock"));
        if stale::probe(&path) == Probe::Alive {
            live.push(pid);
            continue;
        }
        let bound = bound.get_or_insert_with(stale::bound_paths);
        if bound.as_ref().is_some_and(|b| b.contains(&path)) {
            // Bound but not listening yet: a shim starting up. It answers in a moment.
            live.push(pid);
            continue;
        }
        let removed = stale::removable(&path, bound.as_ref()) && fs::remove_file(&path).is_ok();
        gone.push(StaleSocket { pid, path, removed });
    }
    Ok((live, gone))
}

/// `cuinterpose-<pid>.sock` → the pid (decimal, no sign, no leading zero, non-zero).
pub fn parse_socket_name(name: &str) -> Option<NamespacePid> {
    let digits = name.strip_prefix("cuinterpose-")?.strip_suffix(".sock")?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u32>().ok().and_then(NamespacePid::new)
}

/// The participants of one command and how to reach them.
#[derive(Debug, Clone)]
pub struct Session {
    control_dir: PathBuf,
    endpoints: BTreeMap<NamespacePid, Endpoint>,
    timeouts: Timeouts,
    /// Sockets of processes that are gone, left out of the session.
    gone: Vec<StaleSocket>,
    /// How a capture's copies move the bytes (a restore takes only the staging window).
    carriage: Carriage,
    /// Participants still being restored natively: their loads wait for it.
    natives: Option<std::sync::Arc<Readiness>>,
    /// This machine's GPUs, for a capture's state (none: not listed).
    machine: BoundedVec<Device, MAX_DEVICES>,
}

impl Session {
    /// The stale sockets discovery found and left out (each also said on stderr).
    pub fn gone(&self) -> &[StaleSocket] {
        &self.gone
    }

    /// The participants `pids` (their namespace PIDs), or every socket in `control_dir` when
    /// `pids` is empty.
    pub fn open(
        control_dir: &Path,
        pids: &[NamespacePid],
        timeouts: Timeouts,
    ) -> Result<Self, SessionError> {
        let mut gone = Vec::new();
        let pids = if pids.is_empty() {
            let (found, stale) = discover_live(control_dir)?;
            if found.is_empty() {
                return Err(SessionError::NoParticipants {
                    path: control_dir.to_path_buf(),
                    gone: stale,
                });
            }
            for s in &stale {
                eprintln!("cuinterpose: {s}");
            }
            gone = stale;
            found
        } else {
            pids.to_vec()
        };
        let mut endpoints = BTreeMap::new();
        for pid in pids {
            let endpoint = Endpoint::for_pid(control_dir, pid)?;
            if endpoints.insert(pid, endpoint).is_some() {
                return Err(SessionError::DuplicatePid(pid));
            }
        }
        Ok(Self {
            control_dir: control_dir.to_path_buf(),
            endpoints,
            timeouts,
            gone,
            carriage: Carriage::Host,
            natives: None,
            machine: BoundedVec::default(),
        })
    }

    /// Each `load_allocations` exchange first waits for its participant's native restore in
    /// `natives` (and fails with its error).
    pub fn awaiting(mut self, natives: std::sync::Arc<Readiness>) -> Self {
        self.natives = Some(natives);
        self
    }

    /// This session's runs copy with `carriage` (the host carrier unless set).
    pub fn carrying(mut self, carriage: Carriage) -> Self {
        self.carriage = carriage;
        self
    }

    pub fn carriage(&self) -> Carriage {
        self.carriage
    }

    /// Records `machine`'s GPUs in the state a capture publishes (see
    /// [`crate::commands::machine`]).
    pub fn on_machine(mut self, machine: BoundedVec<Device, MAX_DEVICES>) -> Self {
        self.machine = machine;
        self
    }

    pub fn machine(&self) -> &BoundedVec<Device, MAX_DEVICES> {
        &self.machine
    }

    pub fn control_dir(&self) -> &Path {
        &self.control_dir
    }

    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    pub fn participants(&self) -> Vec<NamespacePid> {
        self.endpoints.keys().copied().collect()
    }

    /// Sends `request` to each of `pids` concurrently and waits for every exchange to end.
    /// A PID without an endpoint in this session gets an error outcome.
    pub fn broadcast(
        &self,
        request: &Request,
        pids: &[NamespacePid],
    ) -> BTreeMap<NamespacePid, Outcome> {
        self.broadcast_timed(request, pids)
            .into_iter()
            .map(|(pid, (outcome, _))| (pid, outcome))
            .collect()
    }

    /// [`Session::broadcast`], with how long each exchange took (request sent to reply read).
    pub fn broadcast_timed(
        &self,
        request: &Request,
        pids: &[NamespacePid],
    ) -> BTreeMap<NamespacePid, (Outcome, Duration)> {
        self.broadcast_carrying(request, pids, None)
    }

    /// [`Session::broadcast_timed`]; a request that carries the storage carrier's folder gets
    /// `folder` opened for each participant.
    fn broadcast_carrying(
        &self,
        request: &Request,
        pids: &[NamespacePid],
        folder: Option<&Path>,
    ) -> BTreeMap<NamespacePid, (Outcome, Duration)> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = pids
                .iter()
                .map(|&pid| {
                    let endpoint = self.endpoints.get(&pid);
                    let spawned = std::thread::Builder::new()
                        .name(format!("cuinterpose-{pid}"))
                        .spawn_scoped(scope, move || {
                            let started = Instant::now();
                            let outcome = endpoint
                                .ok_or_else(|| ExchangeError::Unsent {
                                    kind: ExchangeKind::NoEndpoint,
                                    message: format!("no endpoint for participant {pid}"),
                                })
                                .and_then(|endpoint| {
                                    self.await_native(pid, request)?;
                                    let fd = carried_folder(request, folder)?;
                                    call_with(endpoint, request, fd, &self.timeouts)
                                        .map(|(reply, _fd)| name_folder(reply, folder))
                                        .map_err(|error| ExchangeError::from(&error))
                                });
                            (outcome, started.elapsed())
                        });
                    (pid, spawned)
                })
                .collect();
            handles
                .into_iter()
                .map(|(pid, spawned)| {
                    let outcome = match spawned {
                        Ok(handle) => handle.join().unwrap_or_else(|panic| {
                            let message = panic
                                .downcast_ref::<&str>()
                                .map(ToString::to_string)
                                .or_else(|| panic.downcast_ref::<String>().cloned())
                                .unwrap_or_default();
                            (
                                Err(ExchangeError::Lost {
                                    kind: ExchangeKind::Panicked,
                                    message: format!("the exchange thread panicked: {message}"),
                                }),
                                Duration::ZERO,
                            )
                        }),
                        Err(error) => (
                            Err(ExchangeError::Unsent {
                                kind: ExchangeKind::NoThread,
                                message: format!("cannot start an exchange thread: {error}"),
                            }),
                            Duration::ZERO,
                        ),
                    };
                    (pid, outcome)
                })
                .collect()
        })
    }

    /// Tells `pids` that the coordinator declared a fail-stop for `reason` (best effort);
    /// returns those that acknowledged.
    pub fn declare_fail_stop(&self, pids: &[NamespacePid], reason: &str) -> Vec<NamespacePid> {
        let request = Request::FailStop(cuinterpose_protocol::FailStopRequest {
            reason: cuinterpose_protocol::BoundedString::truncating(reason),
        });
        self.broadcast(&request, pids)
            .into_iter()
            .filter(|(_, outcome)| matches!(outcome, Ok(Reply::Stopped(_))))
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Runs `run` to its end ([`crate::plan::drive`]): broadcasts, publishes through
    /// `publish`, reports to `progress` each phase as it starts and ends, and the copy phases'
    /// progress while they run; tells the participants when the run failed after changing them.
    pub fn drive(
        &self,
        run: &mut Run,
        folder: Option<&Path>,
        publish: &mut dyn FnMut(&StateFile) -> Result<(), String>,
        progress: &mut dyn FnMut(&Event),
    ) -> Result<Report, crate::plan::RunError> {
        // A silent participant is waited for no longer than a released one waits for this
        // coordinator before it rolls back on its own.
        run.set_settle_limit(self.timeouts.quiet_window());
        let mut through = Sockets {
            session: self,
            folder,
            publish,
            progress,
            copies: Vec::new(),
        };
        let mut report = crate::plan::drive(run, &mut through)?;
        report.copies = through.copies;
        Ok(report)
    }

    /// [`Session::broadcast`] of a copy operation, asking every participant for its progress
    /// every [`PROGRESS_INTERVAL`] until the broadcast ends and reporting it to `progress`.
    /// The polls run on this thread and never delay the exchanges themselves.
    fn broadcast_watching(
        &self,
        request: &Request,
        pids: &[NamespacePid],
        folder: Option<&Path>,
        copy: &Copy,
        progress: &mut dyn FnMut(&Event),
    ) -> BTreeMap<NamespacePid, (Outcome, Duration)> {
        let started = Instant::now();
        // A participant that does not answer within this is left out of that report.
        let poll = Timeouts::new(
            self.timeouts.control().min(PROGRESS_POLL_TIMEOUT),
            self.timeouts.copy(),
        )
        .unwrap_or(self.timeouts);
        std::thread::scope(|scope| {
            let (finished, ended) = mpsc::channel::<()>();
            let exchanges = scope.spawn(move || {
                let outcomes = self.broadcast_carrying(request, pids, folder);
                drop(finished);
                outcomes
            });
            while let Err(mpsc::RecvTimeoutError::Timeout) = ended.recv_timeout(PROGRESS_INTERVAL) {
                let participants = pids
                    .iter()
                    .filter_map(|&pid| Some((pid, self.copy_state(pid, copy, &poll)?)))
                    .collect();
                progress(&Event::Copy(&CopyProgress {
                    phase: copy.phase.to_owned(),
                    elapsed: started.elapsed(),
                    participants,
                }));
            }
            exchanges.join().unwrap_or_else(|_| {
                pids.iter()
                    .map(|pid| {
                        let lost = Err(ExchangeError::Lost {
                            kind: ExchangeKind::Panicked,
                            message: "the broadcast thread panicked".to_owned(),
                        });
                        (*pid, (lost, Duration::ZERO))
                    })
                    .collect()
            })
        })
    }

    /// One participant's progress in `copy`; before its copy starts, nothing of what the
    /// topology says it carries is done.
    fn copy_state(&self, pid: NamespacePid, copy: &Copy, poll: &Timeouts) -> Option<CopyState> {
        let endpoint = self.endpoints.get(&pid)?;
        let expected = copy.expected.get(&pid).copied().unwrap_or(0);
        match call_with(endpoint, &Request::Progress, None, poll) {
            Ok((Reply::Progress(reply), _)) if reply.namespace_pid == pid => {
                if reply.operation == Some(copy.operation) {
                    Some(CopyState {
                        done: reply.done,
                        total: reply.total,
                    })
                } else {
                    Some(CopyState {
                        done: 0,
                        total: expected,
                    })
                }
            }
            _ => None,
        }
    }

    /// Read-only: every participant's inspection, or why there is none.
    pub fn inspect(&self) -> BTreeMap<NamespacePid, Result<InspectionReply, String>> {
        self.broadcast(&Request::Inspect, &self.participants())
            .into_iter()
            .map(|(pid, outcome)| {
                let inspection = outcome
                    .map_err(|e| e.to_string())
                    .and_then(|reply| match reply {
                        Reply::Inspection(inspection) => Ok(inspection),
                        Reply::Refused(refused) => Err(format!(
                            "refused ({}): {}",
                            refused.code,
                            refused.message.as_str()
                        )),
                        other => Err(format!("replied `{}`, expected `inspection`", other.kind())),
                    });
                (pid, inspection)
            })
            .collect()
    }
}

/// How often a copy phase asks the participants how far they got.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
/// How long one progress answer may take (a stalled participant is left out of that report).
pub const PROGRESS_POLL_TIMEOUT: Duration = Duration::from_millis(500);

/// A copy phase being watched: its operation, its name, and the bytes each participant
/// carries per the topology.
struct Copy<'a> {
    operation: Operation,
    phase: &'a str,
    expected: BTreeMap<NamespacePid, u64>,
}

/// What `inspect` found.
#[derive(Debug)]
pub struct Inspection {
    pub replies: BTreeMap<NamespacePid, Result<InspectionReply, String>>,
    /// `None` when some participant did not answer (nothing to validate as a whole).
    pub validation: Option<Result<Topology, Vec<TopologyError>>>,
}

impl Inspection {
    /// Every participant answered and the topology is valid for a checkpoint.
    pub fn is_valid(&self) -> bool {
        matches!(self.validation, Some(Ok(_)))
    }
}

/// Inspects every participant and validates the topology for prepare; changes nothing.
pub fn inspect(session: &Session) -> Inspection {
    let replies = session.inspect();
    let complete: Option<BTreeMap<NamespacePid, InspectionReply>> = replies
        .iter()
        .map(|(pid, reply)| reply.as_ref().ok().map(|reply| (*pid, reply.clone())))
        .collect();
    let validation = complete.map(|inspections| validate::validate(&inspections));
    Inspection {
        replies,
        validation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names() {
        let pid = |value| NamespacePid::new(value);
        for (name, expected) in [
            ("cuinterpose-12.sock", pid(12)),
            ("cuinterpose-4294967295.sock", pid(u32::MAX)),
            ("cuinterpose-0.sock", None),
            ("cuinterpose-012.sock", None),
            ("cuinterpose-+12.sock", None),
            ("cuinterpose-.sock", None),
            ("cuinterpose-4294967296.sock", None),
            ("cuinterpose-12.sock.tmp", None),
            ("other-12.sock", None),
        ] {
            assert_eq!(parse_socket_name(name), expected, "{name}");
        }
    }
}
