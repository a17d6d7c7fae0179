//! A restore's native restore and unlock, process by process, beside the coordinator's
//! phases: each participant's `load_allocations` starts as soon as its own process runs
//! natively again (see [`Readiness`]), while the next process is still being restored.

use std::time::{Duration, Instant};

use cuinterpose_protocol::NamespacePid;

use super::Member;
use crate::native::GpuPair;
use crate::native::{NativeDriver, NativeError, ProcessState};
use crate::session::Readiness;

/// One CUDA process to restore: its state when the restore began and its GPU pairs.
pub struct Native<'a> {
    pub member: &'a Member,
    pub state: Option<ProcessState>,
    pub pairs: Vec<GpuPair>,
}

/// How long the native steps took, summed over the processes, and how they ended.
pub struct Restored {
    pub restoring: Duration,
    pub unlocking: Duration,
    pub result: Result<(), NativeError>,
}

/// The participants of `natives`, which [`restore_all`] reports to a [`Readiness`].
pub fn participants<'a>(natives: &'a [Native<'a>]) -> impl Iterator<Item = NamespacePid> + 'a {
    natives
        .iter()
        .filter(|native| native.member.participant)
        .filter_map(|native| NamespacePid::new(native.member.namespace_pid))
}

/// Restores (a checkpointed process) and unlocks (a checkpointed or locked one) each of
/// `natives` in order, telling `ready` as each participant is done; the first failure stops
/// the rest (those still pending are told why).
pub fn restore_all(driver: &NativeDriver, natives: &[Native<'_>], ready: &Readiness) -> Restored {
    let mut done = Restored {
        restoring: Duration::ZERO,
        unlocking: Duration::ZERO,
        result: Ok(()),
    };
    for native in natives {
        let pid = native.member.host_pid;
        let started = Instant::now();
        let restored = match native.state {
            Some(ProcessState::Checkpointed) => driver.restore_onto(pid, &native.pairs),
            _ => Ok(()),
        };
        done.restoring += started.elapsed();
        let started = Instant::now();
        let result = restored.and_then(|()| match native.state {
            Some(ProcessState::Checkpointed | ProcessState::Locked) => driver.unlock(pid),
            _ => Ok(()),
        });
        done.unlocking += started.elapsed();
        if let Some(namespace_pid) =
            NamespacePid::new(native.member.namespace_pid).filter(|_| native.member.participant)
        {
            ready.done(
                namespace_pid,
                result.as_ref().map(|_| ()).map_err(ToString::to_string),
            );
        }
        if let Err(error) = result {
            ready.abandon(&format!(
                "not restored natively: the native restore of process {pid} failed first"
            ));
            done.result = Err(error);
            break;
        }
    }
    done
}
