//! The way back of a checkpoint whose step failed after `prepare`: the executor of the
//! [`Course`]'s abort steps, and what it reports.

use std::path::Path;

use super::steps::{Course, Task, Verdict};
use super::{
    Member, Workload, died_since, find_members, native_phase, participants, tell_survivors,
};
use crate::commands::{self, CommandError};
use crate::events::Event;
use crate::native::{NativeDriver, ProcessState};
use crate::report::Report;
use crate::session::Session;

/// Abort and resume: `during` failed with `error` after `prepare` released the sharing and
/// published the state, with every process still alive. [`Course::aborted`]'s way back.
pub fn resume_in_place(
    workload: &Workload,
    root: u32,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
    during: Task,
    error: CommandError,
) -> CommandError {
    way_back(
        workload,
        root,
        dir,
        progress,
        Course::aborted(during, error),
    )
}

/// The way back of a plan sent there by a failed step: undo the native steps where they
/// happened (restore a checkpointed process, unlock a locked one), then run the
/// coordinator's restore phases from the host carriers the shims still hold, ending with the
/// record-by-record comparison. The workload runs on unchanged ([`CommandError::Aborted`],
/// exit 3); if the way back fails, it is fail-stop ([`CommandError::AfterMutation`], exit 2)
/// naming both failures and who was told.
pub(super) fn way_back(
    workload: &Workload,
    root: u32,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
    mut plan: Course<CommandError>,
) -> CommandError {
    let during = plan.cause().map_or("checkpoint", |(step, _)| step.during());
    let mut resumed = Report::new("resume");
    let mut reason = String::new();
    let mut told = Vec::new();
    // Found again by the native undo (the tree as it is now), then the restore's participants.
    let mut members = Vec::new();
    loop {
        let step = plan.step();
        let result = match step {
            Task::NativeUndo => {
                native_undo(workload, root, &mut resumed, progress).map(|found| members = found)
            }
            Task::Resume => Session::open(
                &workload.control_dir,
                &participants(&members),
                workload.timeouts,
            )
            .map_err(CommandError::from)
            .and_then(|session| {
                commands::restore(&session.carrying(workload.carriage), dir, progress)
            })
            .map(|done| resumed.absorb(done)),
            Task::Discard => {
                crate::checkpoint_dir::discard(dir);
                Ok(())
            }
            Task::TellSurvivors => {
                told = tell_survivors(workload, root, dir, &reason);
                Ok(())
            }
            _ => break,
        };
        // A participant that died meanwhile (as its tree collapsed) explains the failure.
        let result =
            result.map_err(|error| died_since(workload, root, dir, during).unwrap_or(error));
        if let Err(error) = &result {
            reason = format!("{during}, and putting the workload back failed: {error}");
        }
        plan.feed(result);
    }
    match plan.verdict() {
        Some(Verdict::Aborted { during, cause }) => CommandError::Aborted {
            during: during.during().to_owned(),
            cause: cause.to_string(),
            source: Box::new(cause),
            resumed: Box::new(resumed),
        },
        Some(Verdict::FailStop {
            during,
            cause,
            rollback,
        }) => {
            let told = match &told[..] {
                [] => String::new(),
                pids => format!(
                    "; told to fail-stop (their CUDA calls now fail instead of waiting): {}",
                    pids.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            CommandError::AfterMutation {
                during: format!(
                    "{} (and putting the workload back failed too: {rollback}{told})",
                    during.during()
                ),
                source: Box::new(cause),
            }
        }
        other => unreachable!("the way back ends aborted or fail-stop, not {other:?}"),
    }
}

/// The way back's first step: every CUDA process of the tree, found again, restored where it
/// was checkpointed and unlocked where it was locked. Returns the processes found.
fn native_undo(
    workload: &Workload,
    root: u32,
    report: &mut Report,
    progress: &mut dyn FnMut(&Event),
) -> Result<Vec<Member>, CommandError> {
    let driver = NativeDriver::load_from(&workload.driver)?;
    let members = find_members(workload, &driver, root)?;
    native_phase(
        report,
        progress,
        "native_undo",
        &members,
        |member| match driver.state(member.host_pid)? {
            ProcessState::Checkpointed => {
                driver.restore(member.host_pid)?;
                driver.unlock(member.host_pid)
            }
            ProcessState::Locked => driver.unlock(member.host_pid),
            _ => Ok(()),
        },
    )?;
    Ok(members)
}
