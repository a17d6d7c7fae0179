//! Whole-workload compositions: coordinator phases plus the driver's native checkpoint of
//! every CUDA process of a process tree (`checkpoint`, `restore --dir`, `toggle`).
//!
//! Checkpoint: find the tree's CUDA processes and participants → `prepare` (state published)
//! → record the processes → native lock of every CUDA process → native checkpoint of each.
//! Restore: load the state → find the processes → native restore of each → native unlock of
//! each → the coordinator's restore phases. A native step that fails after `prepare` changed
//! the participants is aborted: the workload is put back in place from the host carriers and
//! resumes (exit 3); only a failed rollback is fail-stop (exit 2). The checkpoint's steps and
//! its way back are a sans-I/O [`Course`] (in `compose/steps.rs`); this module and
//! `compose/back.rs` execute it.

use crate::events::Event;
use crate::plan::Run;
use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cuinterpose_protocol::NamespacePid;
use cuinterpose_protocol::transport::{Timeouts, socket_name};
use serde::{Deserialize, Serialize};

use crate::commands::{self, CommandError};
use crate::native::{NativeDriver, NativeError, NativeStep, ProcessState};
use crate::process;
use crate::remap::Remap;
use crate::report::{PhaseReport, Report};
use crate::session::Session;
use crate::state;

mod back;
mod natives;
mod steps;
mod toggle;
pub use back::resume_in_place;
use back::way_back;
pub use steps::{Course, Task, Verdict};
pub use toggle::{resume_unless_refused_map, toggle};

/// One process of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub host_pid: u32,
    pub namespace_pid: u32,
    /// Has a cuinterpose socket in the control directory.
    pub participant: bool,
    /// The driver knows it (native checkpoint applies).
    pub cuda: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ProcessesFile {
    root: u32,
    processes: Vec<Member>,
}

/// Where the workload is and how to talk to it.
#[derive(Debug, Clone)]
pub struct Workload {
    pub control_dir: PathBuf,
    pub timeouts: Timeouts,
    /// Passed to `cuCheckpointProcessLock` (0: wait as long as it takes).
    pub lock_timeout_ms: u32,
    /// `/proc`, replaceable for tests.
    pub proc_dir: PathBuf,
    /// Restore onto other GPUs (`--device-map`); `None`: the same GPUs.
    pub device_map: Option<crate::remap::DeviceMapSpec>,
    /// How a checkpoint's copies move the shared bytes (a restore takes only the staging
    /// window: its carrier is its state's).
    pub carriage: crate::plan::Carriage,
    /// The CUDA driver the native checkpoint calls go to (see [`crate::native::driver_path`]).
    pub driver: PathBuf,
}

fn has_socket(control_dir: &Path, pid: NamespacePid) -> bool {
    fs::symlink_metadata(control_dir.join(socket_name(pid)))
        .is_ok_and(|metadata| metadata.file_type().is_socket())
}

/// Whether any process of the tree rooted at `root` has a socket in the control directory
/// (without the driver: a tree without cuinterpose needs none).
pub fn has_participants(workload: &Workload, root: u32) -> Result<bool, CommandError> {
    Ok(process::tree(&workload.proc_dir, root)?
        .iter()
        .any(|process| has_socket(&workload.control_dir, process.namespace_pid)))
}

/// The CUDA processes and participants of the tree rooted at `root`.
pub fn find_members(
    workload: &Workload,
    driver: &NativeDriver,
    root: u32,
) -> Result<Vec<Member>, CommandError> {
    let mut members: Vec<Member> = Vec::new();
    for process in process::tree(&workload.proc_dir, root)? {
        // This coordinator (inside the tree when a workload runs it, and a CUDA process once it
        // listed the GPUs) is never checkpointed by itself.
        if process.host_pid == std::process::id() {
            continue;
        }
        let participant = has_socket(&workload.control_dir, process.namespace_pid);
        let cuda = driver.state(process.host_pid).is_ok();
        if !participant && !cuda {
            continue;
        }
        let twin = members.iter().find(|member| {
            participant && member.participant && member.namespace_pid == process.namespace_pid.get()
        });
        if let Some(twin) = twin {
            return Err(CommandError::Process(
                process::ProcessError::DuplicateNamespacePid {
                    namespace_pid: process.namespace_pid,
                    first: twin.host_pid,
                    second: process.host_pid,
                },
            ));
        }
        members.push(Member {
            host_pid: process.host_pid,
            namespace_pid: process.namespace_pid.get(),
            participant,
            cuda,
        });
    }
    if !members.iter().any(|member| member.participant) {
        return Err(CommandError::Session(
            crate::session::SessionError::NoParticipants {
                path: workload.control_dir.clone(),
                gone: Vec::new(),
            },
        ));
    }
    Ok(members)
}

fn participants(members: &[Member]) -> Vec<NamespacePid> {
    members
        .iter()
        .filter(|member| member.participant)
        .filter_map(|member| NamespacePid::new(member.namespace_pid))
        .collect()
}

fn write_members(dir: &Path, root: u32, members: &[Member]) -> Result<(), CommandError> {
    let path = crate::checkpoint_dir::processes(dir);
    let file = ProcessesFile {
        root,
        processes: members.to_vec(),
    };
    let text = serde_json::to_string_pretty(&file).expect("plain data serializes");
    fs::write(&path, text + "\n").map_err(CommandError::io(path, "writing the process list"))
}

/// The processes `checkpoint` recorded, each checked to still be the same namespace PID.
pub fn read_members(workload: &Workload, dir: &Path) -> Result<Vec<Member>, CommandError> {
    let path = crate::checkpoint_dir::processes(dir);
    let text = fs::read_to_string(&path).map_err(CommandError::io(
        &path,
        "reading the process list (written by `cuinterpose checkpoint`; pass --pid ROOT otherwise)",
    ))?;
    let file: ProcessesFile = serde_json::from_str(&text).map_err(|error| CommandError::Io {
        path: path.clone(),
        during: "parsing the process list",
        source: std::io::Error::other(error),
    })?;
    for member in &file.processes {
        let status = workload
            .proc_dir
            .join(member.host_pid.to_string())
            .join("status");
        let current = fs::read_to_string(&status)
            .ok()
            .and_then(|text| process::parse_namespace_pid(&text));
        if current.map(NamespacePid::get) != Some(member.namespace_pid) {
            return Err(CommandError::Process(
                process::ProcessError::NoSuchProcess {
                    pid: member.host_pid,
                },
            ));
        }
    }
    Ok(file.processes)
}

fn native_phase(
    report: &mut Report,
    progress: &mut dyn FnMut(&Event),
    name: &str,
    members: &[Member],
    mut step: impl FnMut(&Member) -> Result<(), NativeError>,
) -> Result<(), CommandError> {
    let started = Instant::now();
    let cuda: Vec<&Member> = members.iter().filter(|member| member.cuda).collect();
    progress(&Event::Started {
        phase: name,
        participants: cuda.len(),
    });
    for member in &cuda {
        step(member)?;
    }
    let phase = PhaseReport {
        name: name.to_string(),
        duration: started.elapsed(),
        bytes: 0,
        participants: cuda.len(),
    };
    progress(&Event::Done(&phase));
    report.phases.push(phase);
    Ok(())
}

/// prepare → native lock and checkpoint of every CUDA process of the tree rooted at `root`.
pub fn checkpoint(
    workload: &Workload,
    root: u32,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    checkpoint_with(workload, root, dir, progress, None)
}

/// A step the caller adds at the end of a checkpoint (`criu dump`), given the report so far.
pub type Dump<'a> =
    &'a mut dyn FnMut(&mut Report, &mut dyn FnMut(&Event)) -> Result<(), CommandError>;

/// The steps of [`Course::checkpoint`] done here: prepare, record the processes, lock each,
/// checkpoint each, then `dump` when there is one. A failure after `prepare` takes the plan's
/// way back ([`resume_in_place`]).
pub fn checkpoint_with(
    workload: &Workload,
    root: u32,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
    mut dump: Option<Dump<'_>>,
) -> Result<Report, CommandError> {
    let driver = NativeDriver::load_from(&workload.driver)?;
    let members = find_members(workload, &driver, root)?;
    for member in members.iter().filter(|member| member.cuda) {
        driver.expect_state(member.host_pid, NativeStep::Lock, ProcessState::Running)?;
    }
    let mut session = Some(
        Session::open(
            &workload.control_dir,
            &participants(&members),
            workload.timeouts,
        )?
        .carrying(workload.carriage)
        .on_machine(commands::machine(&driver)),
    );
    let mut report = Report::new("checkpoint");
    let mut plan = Course::checkpoint(dump.is_some());
    loop {
        let result = match plan.step() {
            Task::Prepare => {
                let session = session.take().expect("prepare is one step");
                commands::prepare(&session, dir, progress).map(|done| report.absorb(done))
            }
            Task::RecordMembers => write_members(dir, root, &members),
            Task::NativeLock => native_phase(&mut report, progress, "native_lock", &members, |m| {
                driver.lock(m.host_pid, workload.lock_timeout_ms)
            }),
            Task::NativeCheckpoint => {
                native_phase(&mut report, progress, "native_checkpoint", &members, |m| {
                    driver.checkpoint(m.host_pid)
                })
            }
            Task::CriuDump => match dump.as_mut() {
                Some(dump) => dump(&mut report, progress),
                None => unreachable!("a dump is planned only when there is one"),
            },
            Task::Finished => {
                return match plan.verdict() {
                    Some(Verdict::NotTaken(error)) => Err(error),
                    _ => Ok(report),
                };
            }
            // A step after the capture failed.
            _ => return Err(way_back(workload, root, dir, progress, plan)),
        };
        plan.feed(result);
    }
}

/// The participants of the state in `dir` split by whether they still live in the tree of
/// `root` (none do when the root is gone): `(alive, dead)`. `None` when the state or the tree
/// cannot be read.
fn census(
    workload: &Workload,
    root: u32,
    dir: &Path,
) -> Option<(Vec<NamespacePid>, Vec<NamespacePid>)> {
    let saved = state::load(dir).ok()?;
    let living: Vec<u32> = match process::tree(&workload.proc_dir, root) {
        Ok(tree) => tree.iter().map(|p| p.namespace_pid.get()).collect(),
        Err(process::ProcessError::NoSuchProcess { .. }) => Vec::new(),
        Err(_) => return None,
    };
    Some(
        saved
            .participants
            .keys()
            .copied()
            .partition(|pid| living.contains(&pid.get())),
    )
}

/// The participants of the state in `dir` that are no longer alive in the tree of `root`, as
/// the error that says so; `None` when every one lives.
fn died_since(workload: &Workload, root: u32, dir: &Path, during: &str) -> Option<CommandError> {
    let (_, died) = census(workload, root, dir)?;
    (!died.is_empty()).then(|| CommandError::Died {
        pids: died,
        during: during.to_owned(),
    })
}

/// Tells the participants of the state in `dir` still alive in the tree of `root` that the
/// coordinator declared a fail-stop (best effort); returns those that acknowledged. Only the
/// checkpoint's own participants: a shared control directory may serve other workloads.
fn tell_survivors(workload: &Workload, root: u32, dir: &Path, reason: &str) -> Vec<NamespacePid> {
    let Some((survivors, _)) = census(workload, root, dir).filter(|(alive, _)| !alive.is_empty())
    else {
        return Vec::new();
    };
    match Session::open(&workload.control_dir, &survivors, workload.timeouts) {
        Ok(session) => session.declare_fail_stop(&survivors, reason),
        Err(_) => Vec::new(),
    }
}

/// Which processes `restore` restores natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeRestore {
    /// Every CUDA process must be checkpointed (restore and unlock) or locked (unlock: a
    /// checkpoint or restore whose coordinator was killed after the native lock, or between
    /// the native restore and unlock); none may be running (the CLI's `restore --dir`).
    Strict,
    /// Only those still checkpointed (restore and unlock) or locked (unlock): another tool,
    /// CRIU's CUDA plugin, may have restored some already (the CRIU hook's `post-resume`).
    WhereNeeded,
}

/// [`restore_with`], every CUDA process checkpointed or locked.
pub fn restore(
    workload: &Workload,
    root: Option<u32>,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    restore_with(workload, root, dir, progress, NativeRestore::Strict)
}

/// The state checked against the live processes, then native restore and unlock of the CUDA
/// processes (per `native`), then the coordinator's restore phases. The processes are those
/// of the tree rooted at `root`, or those `checkpoint` recorded.
pub fn restore_with(
    workload: &Workload,
    root: Option<u32>,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
    native: NativeRestore,
) -> Result<Report, CommandError> {
    let saved = state::load(dir)?;
    let driver = NativeDriver::load_from(&workload.driver)?;
    let members = match root {
        Some(root) => find_members(workload, &driver, root)?,
        None => read_members(workload, dir)?,
    };
    let mut states = Vec::new();
    for member in members.iter().filter(|member| member.cuda) {
        let found = driver.state(member.host_pid)?;
        let accepted = match native {
            NativeRestore::Strict => {
                matches!(found, ProcessState::Checkpointed | ProcessState::Locked)
            }
            NativeRestore::WhereNeeded => matches!(
                found,
                ProcessState::Checkpointed | ProcessState::Locked | ProcessState::Running
            ),
        };
        if !accepted {
            driver.expect_state(
                member.host_pid,
                NativeStep::Restore,
                ProcessState::Checkpointed,
            )?;
        }
        states.push((member.host_pid, found));
    }
    let state_of = |member: &Member| {
        states
            .iter()
            .find(|(pid, _)| *pid == member.host_pid)
            .map(|(_, state)| *state)
    };
    // Onto other GPUs: resolved against this machine before anything changes.
    let remap = match &workload.device_map {
        Some(spec) => commands::resolve_device_map(&driver, spec, &saved)?,
        None => Remap::identity(),
    };
    if remap.moves()
        && let Some(done) = members
            .iter()
            .find(|member| member.cuda && state_of(member) != Some(ProcessState::Checkpointed))
    {
        return Err(CommandError::Devices(format!(
            "process {} was already restored natively (by CRIU's CUDA plugin?) onto its old GPUs",
            done.host_pid
        )));
    }
    // Each participant's native restore names the GPUs it saw; another CUDA process gets
    // every pair (its devices are not known).
    let pairs_of = |member: &Member| {
        let seen = NamespacePid::new(member.namespace_pid)
            .filter(|_| member.participant)
            .and_then(|pid| saved.devices.participants.get(&pid));
        match seen {
            Some(devices) => remap.pairs_for(devices),
            None => remap.all_pairs(),
        }
    };
    // Before anything changes, while the processes are still checkpointed (their shims
    // answer): the participant set and every live record must be the saved ones, or the
    // restore is refused with nothing changed.
    let mut report = Report::new("restore");
    {
        let session = Session::open(
            &workload.control_dir,
            &participants(&members),
            workload.timeouts,
        )?;
        let mut check = Run::check(&saved, session.participants());
        let mut nothing = |_: &cuinterpose_protocol::StateFile| Ok(());
        report.absorb(session.drive(&mut check, None, &mut nothing, progress)?);
    }
    let after = |error: CommandError| error.after_mutation("restore");
    // Native restore and unlock on a thread of their own, process by process: each
    // participant's load_allocations waits for its own process only, so it overlaps the
    // native restore of the next.
    let natives: Vec<natives::Native> = members
        .iter()
        .filter(|member| member.cuda)
        .map(|member| natives::Native {
            member,
            state: state_of(member),
            pairs: pairs_of(member),
        })
        .collect();
    let ready = std::sync::Arc::new(crate::session::Readiness::pending(natives::participants(
        &natives,
    )));
    let session = Session::open(
        &workload.control_dir,
        &participants(&members),
        workload.timeouts,
    )
    .map_err(|error| after(error.into()))?
    .carrying(workload.carriage)
    .awaiting(std::sync::Arc::clone(&ready));
    let (restored, rebuilt) = std::thread::scope(|scope| {
        let restoring = scope.spawn(|| {
            let restored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                natives::restore_all(&driver, &natives, &ready)
            }));
            if restored.is_err() {
                // Loads still waiting learn that no native restore will come.
                ready.abandon("the native restore stopped (a panic)");
            }
            restored
        });
        let rebuilt = commands::restore_remapped(&session, dir, remap, progress);
        let restored = restoring
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (restored, rebuilt)
    });
    for (name, duration) in [
        ("native_restore", restored.restoring),
        ("native_unlock", restored.unlocking),
    ] {
        let phase = PhaseReport {
            name: name.to_string(),
            duration,
            bytes: 0,
            participants: natives.len(),
        };
        // They ran beside the restore's phases: announced once they are over (their time is
        // the sum of each process's step; events never interleave).
        progress(&Event::Started {
            phase: if name == "native_restore" {
                "native_restore"
            } else {
                "native_unlock"
            },
            participants: natives.len(),
        });
        progress(&Event::Done(&phase));
        report.phases.push(phase);
    }
    restored.result.map_err(|error| after(error.into()))?;
    report.absorb(rebuilt.map_err(after)?);
    Ok(report)
}

/// Whether the tree rooted at `root` runs natively and every participant is active again (a
/// restore already happened: the hook's `post-resume` delivered twice).
pub fn is_restored(workload: &Workload, root: u32) -> Result<bool, CommandError> {
    let driver = NativeDriver::load_from(&workload.driver)?;
    let members = find_members(workload, &driver, root)?;
    for member in members.iter().filter(|member| member.cuda) {
        if driver.state(member.host_pid)? != ProcessState::Running {
            return Ok(false);
        }
    }
    let session = Session::open(
        &workload.control_dir,
        &participants(&members),
        workload.timeouts,
    )?;
    Ok(session.inspect().values().all(|reply| {
        reply
            .as_ref()
            .is_ok_and(|inspection| inspection.phase == cuinterpose_protocol::Phase::Active)
    }))
}

#[cfg(test)]
#[path = "compose_tests.rs"]
mod tests;
