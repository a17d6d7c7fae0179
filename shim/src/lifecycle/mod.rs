//! The lifecycle floor: the checkpoint lifecycle, served by the control worker. A phase
//! machine where an operation that does not follow from the current phase is refused without
//! mutation, and a driver error after destructive work fail-stops the process (it refuses to
//! resume).
//!
//! [`begin`] closes the gate and freezes; [`unicast`] and [`multicast`] take sharing apart
//! and rebuild it; [`carrier`] copies the shared bytes to and from the host, [`storage`] to
//! and from files of the checkpoint directory; [`inspect`]
//! builds the records an inspection reports; [`rollback`] puts a process whose coordinator
//! went quiet mid-capture back on its own.

pub mod begin;
pub mod carrier;
pub mod inspect;
pub mod multicast;
pub mod rollback;
mod step;
pub mod storage;
pub mod unicast;

use crate::driver::driver;
use crate::log;
use crate::state::cache::refused;
use crate::state::gate;
use crate::state::process;
use crate::state::progress;
use crate::state::registry::Registry;
use crate::sys::settings::Settings;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    CompletedReply, ExecuteRequest, Operation, Phase, RefusalCode, Reply, Request,
};
use std::os::fd::OwnedFd;
use step::Done;
use unicast::Carriage;

/// A reply, and what to do once it was sent.
#[derive(Debug)]
pub struct Outcome {
    pub reply: Reply,
    pub after: After,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Nothing,
    /// `load_allocations` succeeded: the host copy is no longer needed once the coordinator
    /// knows.
    FreeArena,
}

fn reply(reply: Reply) -> Outcome {
    Outcome {
        reply,
        after: After::Nothing,
    }
}

/// Runs `request`; `fd` is the descriptor it carried (the storage carrier's folder, for the
/// copies that use it; the transport lets no other request bring one).
pub fn handle(request: &Request, fd: Option<OwnedFd>, settings: &Settings) -> Outcome {
    // Inspections are read-only and come from anyone (`cuinterpose inspect` polled by an
    // operator): only the steps of a run, and its copy polls, show a coordinator at work.
    if matches!(
        request,
        Request::BeginCheckpoint | Request::Execute(_) | Request::Hold
    ) {
        rollback::note_activity();
    }
    if let Request::BeginCheckpoint = request {
        // Not under the registry lock: the drain waits for application threads that may
        // need it to finish their tracked calls.
        return reply(begin::begin(&settings.timeouts));
    }
    if let Request::RollBack = request {
        // Not under the registry lock either: it first asks its creators for their phase.
        return reply(rollback::asked(&settings.timeouts));
    }
    let mut guard = process::lock();
    let r = guard.as_mut().expect("created by lock()");
    match request {
        Request::Inspect => {
            let answer = inspect::inspection(r);
            if matches!(answer, Reply::Inspection(_)) {
                // The verifying inspection of a restore: application calls continue.
                gate::release_hold();
            }
            reply(answer)
        }
        Request::BeginCheckpoint | Request::RollBack => unreachable!("handled above"),
        Request::Execute(execute) => run(r, execute, fd, &settings.timeouts),
        Request::Export(_) => reply(refused(
            RefusalCode::Invalid,
            "export requests are served by the peer thread".into(),
        )),
        Request::Progress => reply(progress::reply(process::own_pid()).into()),
        Request::FailStop(stop) => reply(fail_stop(r, stop.reason.as_str())),
        Request::Hold => reply(hold(r)),
    }
}

/// The capture's state is published: stay released until a restore, never rolling back on
/// its own (a restore from that state expects this process released).
fn hold(r: &mut Registry) -> Reply {
    if let Some(failure) = &r.failure {
        return refused(
            RefusalCode::FailStopped,
            format!("fail-stopped earlier: {failure}"),
        );
    }
    if r.phase != Phase::Released {
        return refused(
            RefusalCode::OutOfOrder,
            format!(
                "hold needs phase released; this process is in phase {}",
                r.phase
            ),
        );
    }
    progress::set_held();
    // A held process never reads its carrier on its own; a restore brings the folder again.
    if let Some(carrier) = r.carrier.as_mut() {
        carrier.close_folder();
    }
    cuinterpose_protocol::HeldReply {
        namespace_pid: r.pid,
    }
    .into()
}

/// The coordinator gave up on this workload: fail-stop, said once, so that application
/// threads waiting at the gate get an error instead of waiting for a restore that never comes.
fn fail_stop(r: &mut Registry, reason: &str) -> Reply {
    if r.failure.is_none() {
        let message = format!(
            "the coordinator declared a fail-stop ({reason}); this process will not resume: \
             every CUDA call fails from now on"
        );
        log!("{message}");
        r.failure = Some(message);
    }
    r.set_phase(Phase::Failed);
    gate::fail();
    cuinterpose_protocol::StoppedReply {
        namespace_pid: r.pid,
    }
    .into()
}

pub fn after_reply(after: After, sent: bool) {
    if after == After::FreeArena {
        if !sent {
            log!(
                "the coordinator did not receive the load_allocations reply; the host copy is freed anyway (restore already completed here)"
            );
        }
        let mut guard = process::lock();
        if let Some(r) = guard.as_mut() {
            r.carrier = None;
        }
    }
}

/// The phase an operation starts from and the one it leads to (the schema's lifecycle chain).
pub fn transition(operation: Operation) -> (Phase, Phase) {
    (operation.from_phase(), operation.to_phase())
}

fn run(
    r: &mut Registry,
    execute: &ExecuteRequest,
    folder: Option<OwnedFd>,
    timeouts: &Timeouts,
) -> Outcome {
    let operation = execute.operation;
    if let Some(failure) = &r.failure {
        return reply(refused(
            RefusalCode::FailStopped,
            format!("fail-stopped earlier: {failure}"),
        ));
    }
    let (from, to) = transition(operation);
    if r.phase != from {
        return reply(refused(
            RefusalCode::OutOfOrder,
            format!(
                "{operation} needs phase {from}; this process is in phase {}",
                r.phase
            ),
        ));
    }
    let d = match driver() {
        Ok(d) => d,
        Err(e) => return reply(refused(RefusalCode::DriverError, format!("no driver: {e}"))),
    };
    // Peers read the phase without the lock: while this step runs they are told the phase it
    // leads to, so none mistakes a creator in the middle of prepare_unicast for one that still
    // holds its memory.
    crate::state::progress::set_phase(to);
    crate::state::progress::reset_copy_time();
    let result = match operation {
        Operation::SaveAllocations => unicast::save(d, r, Carriage::asked(execute, folder)),
        Operation::LoadAllocations => unicast::load(d, r, Carriage::asked(execute, folder)),
        Operation::PrepareMulticast => multicast::prepare_multicast(d, r).map(Done::from),
        Operation::PrepareUnicast => unicast::prepare_unicast(d, r).map(Done::from),
        Operation::RestoreUnicast => unicast::restore_unicast(d, r).map(Done::from),
        Operation::RestoreMulticastCreators => {
            multicast::restore_multicast_creators(d, r).map(Done::from)
        }
        Operation::RestoreMulticastImporters => {
            multicast::restore_multicast_importers(d, r).map(Done::from)
        }
        Operation::RestoreMulticastDevices => {
            multicast::restore_multicast_devices(d, r).map(Done::from)
        }
        Operation::RestoreMulticastBindings => {
            multicast::restore_multicast_bindings(d, r).map(Done::from)
        }
    };
    match result {
        Ok(done) => {
            r.set_phase(to);
            if to == Phase::Active {
                // The restore is complete; blocked application threads continue once the
                // coordinator's verifying inspection has read the records.
                gate::hold(timeouts.control());
            }
            Outcome {
                reply: Reply::Completed(CompletedReply {
                    operation,
                    bytes: done.bytes,
                    copy_ns: crate::state::progress::copy_ns(),
                    peak_carrier_bytes: done.peak_carrier_bytes,
                    checksums: done.checksums,
                }),
                after: if operation == Operation::LoadAllocations {
                    After::FreeArena
                } else {
                    After::Nothing
                },
            }
        }
        Err(failure) if operation == Operation::SaveAllocations => {
            // Nothing was given up: the device memory still holds every byte, so the process
            // stays where it was and the coordinator rolls it back (a full disk, an
            // unusable staging window).
            crate::state::progress::set_phase(from);
            let message = format!(
                "{operation} failed: {failure}; nothing was changed (every shared byte is still \
                 in device memory)"
            );
            log!("{message}");
            reply(refused(RefusalCode::CarrierFailed, message))
        }
        Err(failure) => {
            let message = format!(
                "{operation} failed: {failure}; this process is fail-stopped and will not resume"
            );
            log!("{message}");
            r.failure = Some(message.clone());
            r.set_phase(Phase::Failed);
            // From now on every gated call fails the same way: no half state where some
            // calls work on released memory.
            gate::fail();
            reply(refused(RefusalCode::DriverError, message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_chain_from_frozen_back_to_active() {
        let mut phase = Phase::Frozen;
        for operation in <Operation as cuinterpose_protocol::wire::WireName>::ALL {
            let (from, to) = transition(*operation);
            assert_eq!(from, phase, "{operation}");
            phase = to;
        }
        assert_eq!(phase, Phase::Active);
    }
}
