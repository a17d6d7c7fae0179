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
use std::time::Instant;

use cuinterpose_protocol::transport::{Endpoint, Timeouts, TransportError, call_with};
use cuinterpose_protocol::{InspectionReply, NamespacePid, Reply, Request, StateFile};

use crate::plan::{Outcome, Run, Step};
use crate::report::{PhaseReport, Report};
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
        })
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
    ) -> BTreeMap<NamespacePid, Result<Reply, String>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = pids
                .iter()
                .map(|&pid| {
                    let endpoint = self.endpoints.get(&pid);
                    let spawned = std::thread::Builder::new()
                        .name(format!("cuinterpose-{pid}"))
                        .spawn_scoped(scope, move || -> Result<Reply, String> {
                            let endpoint = endpoint
                                .ok_or_else(|| format!("no endpoint for participant {pid}"))?;
                            call_with(endpoint, request, &self.timeouts)
                                .map(|(reply, _fd)| reply)
                                .map_err(|error| error.to_string())
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
                            Err(format!("the exchange thread panicked: {message}"))
                        }),
                        Err(error) => Err(format!("cannot start an exchange thread: {error}")),
                    };
                    (pid, outcome)
                })
                .collect()
        })
    }

    /// Runs `run` to its end: broadcasts, publishes through `publish`, reports each completed
    /// phase to `progress`.
    pub fn drive(
        &self,
        run: &mut Run,
        publish: &mut dyn FnMut(&StateFile) -> Result<(), String>,
        progress: &mut dyn FnMut(&PhaseReport),
    ) -> Result<Report, crate::plan::RunError> {
        let mut reported = 0;
        loop {
            for phase in &run.phases()[reported..] {
                progress(phase);
            }
            reported = run.phases().len();
            match run.step() {
                Step::Broadcast {
                    request,
                    participants,
                    ..
                } => {
                    let (request, participants) = (request.clone(), participants.clone());
                    let started = Instant::now();
                    let outcomes: BTreeMap<NamespacePid, Outcome> =
                        self.broadcast(&request, &participants);
                    run.feed(outcomes, started.elapsed());
                }
                Step::Publish(state) => {
                    let state = state.clone();
                    let started = Instant::now();
                    let result = publish(&state);
                    run.feed_publish(result, started.elapsed());
                }
                Step::Done(report) => return Ok(report.clone()),
                Step::Failed(error) => return Err(error.clone()),
            }
        }
    }

    /// Read-only: every participant's inspection, or why there is none.
    pub fn inspect(&self) -> BTreeMap<NamespacePid, Result<InspectionReply, String>> {
        self.broadcast(&Request::Inspect, &self.participants())
            .into_iter()
            .map(|(pid, outcome)| {
                let inspection = outcome.and_then(|reply| match reply {
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
