//! A coordinator that went quiet mid-capture: the process puts itself back.
//!
//! From `begin_checkpoint` until the capture's state is published, nothing is lost: every
//! shared byte is either still in device memory or in the host carrier. So a participant
//! whose coordinator sends nothing for a whole quiet window
//! ([`Timeouts::quiet_window`]; it was killed between phases, or gave up) rolls back on its own: a creator that released its memory
//! (`prepare_unicast`) recreates it from its carrier at the same addresses and serves it
//! again; an importer imports again what such a creator recreated (asking until the creator
//! has); multicast objects are recreated and imported again, devices re-added, bindings
//! rebuilt; the host copy is dropped and the gate reopens.
//!
//! It does that only where every creator it imports from still holds its memory or is
//! rebuilding it (read from the creator's `progress` answer, which never waits for its control
//! worker). Where it cannot (a creator gone, failed, or in a phase nothing rebuilds from), it
//! fail-stops: logged once, every gated call fails.
//!
//! The coordinator asks for the same with `roll_back` when a capture stops before
//! `prepare_unicast` (a participant refused, or did not answer in time).
//!
//! Once the state is published the coordinator says `hold`: a restore from that state (the
//! native checkpoint next, or `cuinterpose restore DIR` after `cuinterpose prepare`) expects
//! the process released, so a held process never rolls back on its own, and neither does an
//! importer that finds a creator held.

use super::multicast;
use super::step::{OpResult, StepError, loaded_driver};
use super::unicast;
use crate::calls::sharing;
use crate::log;
use crate::state::cache::refused;
use crate::state::gate;
use crate::state::process;
use crate::state::progress;
use crate::state::registry::Registry;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    NamespacePid, Operation, Phase, ProgressReply, RefusalCode, Reply, Request, ResourceKind,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counts the coordinator's requests (`begin_checkpoint`, the operations, and the progress
/// polls of a copy phase), so the watcher can tell a quiet coordinator from one waiting for a
/// slow participant.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);
/// Counts `begin_checkpoint`s: a watcher of an earlier checkpoint stops.
static CHECKPOINTS: AtomicU64 = AtomicU64::new(0);

/// A request arrived from the coordinator.
pub fn note_activity() {
    ACTIVITY.fetch_add(1, Ordering::SeqCst);
}

/// Phases a process rolls back from: on its own, released too unless a hold came; asked by
/// the coordinator, only before `prepare_unicast` (after it the coordinator's way back is the
/// restore's phases).
fn may_roll_back(phase: Phase, asked: bool) -> bool {
    match phase {
        Phase::Frozen | Phase::MulticastPrepared | Phase::Saved => true,
        Phase::Released => !asked && !progress::held(),
        _ => false,
    }
}

/// Creators' phases in which their memory is still the memory this process maps, or serves
/// again: before `prepare_unicast`, or past `load_allocations` (a rollback of its own sets
/// loaded once its exports are served again).
fn creator_holds(phase: Phase) -> bool {
    !matches!(phase, Phase::Released | Phase::Failed)
}

/// Called as `begin_checkpoint` freezes the process: watches the coordinator until the process
/// leaves the phases it could roll back from.
pub fn watch(timeouts: Timeouts) {
    let checkpoint = CHECKPOINTS.fetch_add(1, Ordering::SeqCst) + 1;
    let window = timeouts.quiet_window();
    let spawned = std::thread::Builder::new()
        .name("cuinterpose-quiet".into())
        .spawn(move || {
            let mut seen = ACTIVITY.load(Ordering::SeqCst);
            loop {
                std::thread::sleep(window);
                if CHECKPOINTS.load(Ordering::SeqCst) != checkpoint
                    || !may_roll_back(progress::phase(), false)
                {
                    return;
                }
                let now = ACTIVITY.load(Ordering::SeqCst);
                if now != seen {
                    seen = now;
                    continue;
                }
                roll_back(Cause::Quiet { window, seen }, &timeouts);
                return;
            }
        });
    if let Err(e) = spawned {
        log!(
            "cannot start the quiet-coordinator watcher ({e}); a vanished coordinator would leave \
             this process stopped"
        );
    }
}

/// What started a rollback.
#[derive(Debug, Clone, Copy)]
enum Cause {
    /// No request for `window`; `seen` requests counted before it.
    Quiet { window: Duration, seen: u64 },
    /// The coordinator's `roll_back`.
    Asked,
}

impl Cause {
    /// Whether the rollback is still wanted: a quiet coordinator that spoke meanwhile is back.
    fn holds(self) -> bool {
        match self {
            Self::Quiet { seen, .. } => ACTIVITY.load(Ordering::SeqCst) == seen,
            Self::Asked => true,
        }
    }

    /// How long imports wait for their creators to rebuild: creators gone quiet too roll back
    /// within a window of this process (their watchers started at the same begin_checkpoint,
    /// and a participant's phase probe does not count as a request); one asked by the
    /// coordinator rebuilds at once, and the coordinator waits six control timeouts for the
    /// whole rollback.
    fn import_deadline(self, timeouts: &Timeouts) -> Instant {
        Instant::now()
            + match self {
                Self::Quiet { window, .. } => 3 * window,
                Self::Asked => 3 * timeouts.control(),
            }
    }

    fn asked(self) -> bool {
        matches!(self, Self::Asked)
    }

    fn reason(self) -> String {
        match self {
            Self::Quiet { window, .. } => format!(
                "no request from the coordinator for {} s",
                window.as_secs_f64()
            ),
            Self::Asked => "the coordinator stopped the capture".to_owned(),
        }
    }

    fn how(self) -> &'static str {
        match self {
            Self::Quiet { .. } => "rolled back on its own",
            Self::Asked => "rolled back as the coordinator asked",
        }
    }
}

/// How a rollback ended.
#[derive(Debug)]
enum Rolled {
    /// Back to active from this phase (active: there was nothing to do).
    Back(Phase),
    /// Not now: the process is in a phase it does not roll back from, or the coordinator
    /// spoke meanwhile (quiet watcher). Nothing was changed.
    NotFrom(Phase),
    /// Fail-stopped, with the reason.
    Stopped(String),
}

/// The creators this process imports from (none unless it may roll back now).
fn creators(r: &Registry) -> BTreeSet<NamespacePid> {
    let me = r.pid;
    r.allocations
        .values()
        .map(|a| a.reference.creator_pid)
        .chain(r.multicasts.values().map(|m| m.reference.creator_pid))
        .filter(|&pid| pid != me)
        .collect()
}

/// What the creators this process imports from say of their memory.
#[derive(Debug, Default)]
struct Creators {
    /// Released, and rolling back on their own: their memory comes back at the same
    /// addresses, but it is new memory, which this process must import again.
    rebuilding: BTreeSet<NamespacePid>,
    /// Why this process cannot roll back, one line per creator.
    blocked: Vec<String>,
    /// A creator held by a published state: stay released with it.
    held: Option<NamespacePid>,
}

/// Whether a creator that holds memory again already rolled back from released on its own,
/// before this process (in `phase`) looked: its memory is new, and this process must import it
/// again like a creator's still rebuilding. Read from its last copy: save_allocations is a
/// barrier (nobody gets prepare_unicast before every participant saved), so while this
/// process is still saved, a creator whose last copy is a load has loaded its carrier back in
/// this capture, which only a rollback from released does.
fn rebuilt(creator: &ProgressReply, phase: Phase, cause: Cause) -> bool {
    phase == Phase::Saved
        && !cause.asked()
        && !creator.running
        && creator.operation == Some(Operation::LoadAllocations)
}

fn survey(creators: &BTreeSet<NamespacePid>, phase: Phase, cause: Cause) -> Creators {
    let mut found = Creators::default();
    for &pid in creators {
        match standing_of(pid) {
            Ok(p) if p.phase == Phase::Released && p.held && phase == Phase::Released => {
                found.held = Some(pid);
            }
            Ok(p) if p.phase == Phase::Released && !p.held && !cause.asked() => {
                found.rebuilding.insert(pid);
            }
            Ok(p) if creator_holds(p.phase) && rebuilt(&p, phase, cause) => {
                found.rebuilding.insert(pid);
            }
            Ok(p) if creator_holds(p.phase) => {}
            Ok(p) => found
                .blocked
                .push(format!("creator {pid} is in phase {}", p.phase)),
            Err(e) => found
                .blocked
                .push(format!("creator {pid} does not answer ({e})")),
        }
    }
    found
}

fn roll_back(cause: Cause, timeouts: &Timeouts) -> Rolled {
    let (phase, creators) = {
        let guard = process::lock();
        let r = guard.as_ref().expect("created by lock()");
        if let Some(failure) = &r.failure {
            return Rolled::Stopped(failure.clone());
        }
        if r.phase == Phase::Active && cause.asked() {
            return Rolled::Back(Phase::Active);
        }
        if !may_roll_back(r.phase, cause.asked()) || !cause.holds() {
            return Rolled::NotFrom(r.phase);
        }
        (r.phase, creators(r))
    };
    // Asked without the registry lock: a creator rolling back at the same moment may be
    // asking this process the same.
    let mut found = survey(&creators, phase, cause);
    if let Some(creator) = found.held {
        progress::set_held();
        log!(
            "{} in phase released, but creator {creator} is held by a published state: this \
             process stays released too, for `cuinterpose restore`",
            cause.reason()
        );
        return Rolled::NotFrom(phase);
    }
    let mut guard = process::lock();
    let r = guard.as_mut().expect("created by lock()");
    if r.phase != phase || !cause.holds() || r.failure.is_some() {
        return Rolled::NotFrom(r.phase); // the coordinator came back meanwhile
    }
    if phase == Phase::Frozen && !found.rebuilding.is_empty() {
        // Its multicast imports are the objects such a creator released: nothing in this
        // process could bind them to the creator's new ones.
        for m in r.multicasts.values() {
            if found.rebuilding.contains(&m.reference.creator_pid) {
                found.blocked.push(format!(
                    "creator {} released multicast object {} that this frozen process still \
                     holds",
                    m.reference.creator_pid, m.reference.id
                ));
            }
        }
    }
    let result = if found.blocked.is_empty() {
        rebuild(r, phase, &found.rebuilding, cause.import_deadline(timeouts))
    } else {
        Err(StepError::Peer(found.blocked.join("; ")))
    };
    let (reason, how) = (cause.reason(), cause.how());
    match result {
        Ok(()) => {
            r.carrier = None;
            r.set_phase(Phase::Active);
            gate::open();
            log!(
                "{reason} in phase {phase}; {how} (shared memory and multicast objects rebuilt, \
                 host copy dropped): back to phase active, application calls continue"
            );
            Rolled::Back(phase)
        }
        Err(why) => {
            let message = format!(
                "{reason} in phase {phase}, and this process cannot roll back: {why}; it will \
                 not resume: every CUDA call fails from now on"
            );
            log!("{message}");
            r.failure = Some(message.clone());
            r.set_phase(Phase::Failed);
            gate::fail();
            Rolled::Stopped(message)
        }
    }
}

/// The coordinator's `roll_back`.
pub fn asked(timeouts: &Timeouts) -> Reply {
    match roll_back(Cause::Asked, timeouts) {
        Rolled::Back(from) => cuinterpose_protocol::RolledBackReply {
            namespace_pid: process::own_pid(),
            from,
        }
        .into(),
        Rolled::NotFrom(phase) => refused(
            RefusalCode::OutOfOrder,
            format!(
                "roll_back needs phase frozen, multicast_prepared or saved; this process is in \
                 phase {phase}"
            ),
        ),
        Rolled::Stopped(why) => refused(RefusalCode::FailStopped, why),
    }
}

/// Rebuilds what the capture released, in the restore's order, from `phase`: this process's
/// shared memory from its carrier (released), its imports from creators that are `rebuilding`
/// theirs (or all of them, released), then the multicast objects; imports wait for their
/// creators (rolling back themselves) until `deadline`.
fn rebuild(
    r: &mut Registry,
    phase: Phase,
    rebuilding: &BTreeSet<NamespacePid>,
    deadline: Instant,
) -> OpResult<()> {
    let released = phase == Phase::Released;
    if (phase == Phase::Frozen && rebuilding.is_empty())
        || (r.allocations.is_empty() && r.multicasts.is_empty())
    {
        return Ok(());
    }
    let d = loaded_driver()?;
    if released {
        unicast::load(d, r, unicast::Carriage::own())?;
        // Its exports are served again: importers waiting for it go on.
        progress::set_phase(Phase::Loaded);
    }
    for (creator, ids) in unicast::imports_by_creator(r) {
        if !released && !rebuilding.contains(&creator) {
            continue; // still mapped, and still the creator's memory
        }
        if !released {
            unicast::release(d, r, &ids)?;
        }
        let found = await_creator(creator, deadline)?;
        unicast::import_from(d, r, creator, &ids)?;
        log!(
            "imported {} shared allocation(s) of creator {creator} again (found in phase {found})",
            ids.len()
        );
    }
    if phase == Phase::Frozen || r.multicasts.is_empty() {
        return Ok(());
    }
    multicast::restore_multicast_creators(d, r)?;
    multicast::import_multicast_objects(d, r, &|m| {
        retry_until(deadline, || {
            sharing::try_request_export(&m.reference, ResourceKind::Multicast, m.capability)
                .map_err(|e| {
                    Retry::Later(format!(
                        "creator {} did not export multicast object {} again: {e}",
                        m.reference.creator_pid, m.reference.id
                    ))
                })
        })
    })?;
    multicast::restore_multicast_devices(d, r)?;
    multicast::restore_multicast_bindings(d, r)?;
    Ok(())
}

/// Waits until `creator` serves its shared memory again (see [`creator_holds`]).
fn await_creator(creator: NamespacePid, deadline: Instant) -> OpResult<Phase> {
    retry_until(deadline, || match standing_of(creator) {
        Ok(p) if creator_holds(p.phase) => Ok(p.phase),
        Ok(p) if p.phase == Phase::Released && !p.held => Err(Retry::Later(format!(
            "creator {creator} did not recreate its shared memory in time"
        ))),
        Ok(p) => Err(Retry::Never(format!(
            "creator {creator} is in phase {}",
            p.phase
        ))),
        Err(e) => Err(Retry::Never(format!(
            "creator {creator} does not answer ({e})"
        ))),
    })
}

/// Why an attempt of [`retry_until`] failed.
enum Retry {
    /// Not yet: try again (this is the error once the deadline passed).
    Later(String),
    /// It will not work: give up now.
    Never(String),
}

/// Tries `attempt` until it succeeds, says never, or `deadline` passes, pausing 10 ms, then
/// twice as long each time, up to 200 ms.
fn retry_until<T>(deadline: Instant, mut attempt: impl FnMut() -> Result<T, Retry>) -> OpResult<T> {
    let mut pause = Duration::from_millis(10);
    loop {
        match attempt() {
            Ok(done) => return Ok(done),
            Err(Retry::Never(why)) => return Err(StepError::Peer(why)),
            Err(Retry::Later(why)) if Instant::now() >= deadline => {
                return Err(StepError::Peer(why));
            }
            Err(Retry::Later(_)) => std::thread::sleep(pause),
        }
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// A participant's phase and hold, from its `progress` answer.
fn standing_of(pid: NamespacePid) -> Result<ProgressReply, String> {
    match sharing::call_participant(pid, &Request::Progress)? {
        (Reply::Progress(p), _) if p.namespace_pid == pid => Ok(p),
        (other, _) => Err(format!("answered `{}`", other.kind())),
    }
}
