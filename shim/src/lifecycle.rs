//! The checkpoint lifecycle, served by the control worker: a phase machine where an operation
//! that does not follow from the current phase is refused without mutation, and a driver
//! error after destructive work fail-stops the process (it refuses to resume).

use crate::carrier::{self, Arena, Direction};
use crate::context;
use crate::convert;
use crate::driver::call;
use crate::driver::{Driver, driver};
use crate::error::{CuError, CuResult};
use crate::gate;
use crate::inspect;
use crate::log;
use crate::process;
use crate::registry::{BindingTarget, Kind, Registry};
use crate::runtime::cache::{self, refused};
use crate::sharing;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    CompletedReply, InspectionReply, Operation, Phase, RefusalCode, Reply, Request, ResourceKind,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Counts lifecycle requests, so the frozen watchdog can tell whether the coordinator moved
/// on after `begin_checkpoint`.
static LIFECYCLE_REQUESTS: AtomicU64 = AtomicU64::new(0);

pub fn handle(request: &Request) -> Outcome {
    if matches!(request, Request::BeginCheckpoint | Request::Execute(_)) {
        LIFECYCLE_REQUESTS.fetch_add(1, Ordering::SeqCst);
    }
    if let Request::BeginCheckpoint = request {
        // Not under the registry lock: the drain waits for application threads that may
        // need it to finish their tracked calls.
        return reply(begin());
    }
    let mut guard = process::lock();
    let r = guard.as_mut().expect("created by lock()");
    match request {
        Request::Inspect => {
            let answer = inspection(r);
            if matches!(answer, Reply::Inspection(_)) {
                // The verifying inspection of a restore: application calls continue.
                gate::release_hold();
            }
            reply(answer)
        }
        Request::BeginCheckpoint => unreachable!("handled above"),
        Request::Execute(execute) => run(r, execute.operation),
        Request::Export(_) => reply(refused(
            RefusalCode::Invalid,
            "export requests are served by the peer thread".into(),
        )),
    }
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
            r.arena = None;
        }
    }
}

fn inspection(r: &Registry) -> Reply {
    if r.unlocked_calls > 0 {
        return refused(
            RefusalCode::Busy,
            format!(
                "{} driver call(s) in flight that may wait on other processes",
                r.unlocked_calls
            ),
        );
    }
    match inspect::records(r) {
        Ok(records) => Reply::Inspection(InspectionReply {
            namespace_pid: r.pid,
            phase: r.phase,
            raw_imports: r.raw_imports.values().sum(),
            records,
        }),
        Err(count) => refused(
            RefusalCode::Unsupported,
            format!(
                "{count} records exceed the protocol's limit of {}",
                cuinterpose_protocol::MAX_RECORDS
            ),
        ),
    }
}

/// Refuses unless the process can start a checkpoint now.
fn may_begin(r: &Registry) -> Option<Reply> {
    if let Some(failure) = &r.failure {
        return Some(refused(
            RefusalCode::FailStopped,
            format!("fail-stopped earlier: {failure}"),
        ));
    }
    if r.phase != Phase::Active {
        return Some(refused(
            RefusalCode::OutOfOrder,
            format!(
                "begin_checkpoint needs phase active; this process is in phase {}",
                r.phase
            ),
        ));
    }
    None
}

/// `begin_checkpoint`: close the gate, wait until no application thread is inside a driver
/// call, synchronize every context that holds tracked memory, inspect, freeze. Any refusal
/// reopens the gate and changes nothing.
fn begin() -> Reply {
    {
        let guard = process::lock();
        if let Some(refusal) = may_begin(guard.as_ref().expect("created by lock()")) {
            return refusal;
        }
    }
    gate::close();
    let drain = Timeouts::from_env().unwrap_or_default().drain();
    if let Err(busy) = gate::drain(drain) {
        gate::open();
        let threads: Vec<String> = busy.iter().map(describe_busy).collect();
        let message = format!(
            "{} application thread(s) did not leave their driver call within {} s: {}; the gate \
             is open again and nothing was changed",
            busy.len(),
            drain.as_secs_f64(),
            threads.join(", ")
        );
        log!("begin_checkpoint refused: {message}");
        return refused(RefusalCode::Busy, message);
    }
    let mut guard = process::lock();
    let r = guard.as_mut().expect("created by lock()");
    if let Some(refusal) = may_begin(r) {
        gate::open();
        return refusal;
    }
    if let Err(failure) = synchronize(r) {
        gate::open();
        return refused(
            RefusalCode::Busy,
            format!(
                "begin_checkpoint could not synchronize: {failure}; the gate is open again and \
                 nothing was changed"
            ),
        );
    }
    match inspection(r) {
        Reply::Inspection(mut i) => {
            r.phase = Phase::Frozen;
            i.phase = Phase::Frozen;
            watch_frozen(Timeouts::from_env().unwrap_or_default().control());
            Reply::Inspection(i)
        }
        other => {
            gate::open();
            other
        }
    }
}

/// Nothing is destroyed while frozen, so a participant whose coordinator went quiet (it died,
/// or another participant refused `begin_checkpoint` and the run stopped) goes back to active
/// on its own when no further lifecycle request arrives within `timeout`.
fn watch_frozen(timeout: std::time::Duration) {
    let seen = LIFECYCLE_REQUESTS.load(Ordering::SeqCst);
    let spawned = std::thread::Builder::new()
        .name("cuinterpose-frozen".into())
        .spawn(move || {
            std::thread::sleep(timeout);
            let mut guard = process::lock();
            let Some(r) = guard.as_mut() else { return };
            if r.phase == Phase::Frozen && LIFECYCLE_REQUESTS.load(Ordering::SeqCst) == seen {
                r.phase = Phase::Active;
                gate::open();
                log!(
                    "no lifecycle request within {} s of begin_checkpoint; back to phase active, \
                     application calls continue",
                    timeout.as_secs_f64()
                );
            }
        });
    if let Err(e) = spawned {
        log!(
            "cannot start the frozen watchdog ({e}); a vanished coordinator would leave this process frozen"
        );
    }
}

fn describe_busy(b: &gate::Busy) -> String {
    let function = b
        .function
        .map(|i| crate::ffi::entry_name(i).to_owned())
        .unwrap_or_else(|| "a driver call".to_owned());
    if b.thread_name.is_empty() {
        format!("thread {} is inside {function}", b.thread)
    } else {
        format!(
            "thread {} ({}) is inside {function}",
            b.thread, b.thread_name
        )
    }
}

/// Waits for the queued work of every context that holds tracked memory, so the bytes the
/// carrier saves include every copy and kernel the application issued before the gate closed.
fn synchronize(r: &Registry) -> Step<()> {
    let d = driver().map_err(|e| format!("no driver: {e}"))?;
    let mut contexts: Vec<(usize, i32)> = r
        .allocations
        .values()
        .map(|a| (a.context, carrier::device_of(a)))
        .chain(
            r.multicasts
                .values()
                .map(|m| (m.context, m.devices.first().copied().unwrap_or(0))),
        )
        .collect();
    contexts.sort_unstable();
    contexts.dedup();
    for (ctx, device) in contexts {
        context::run(d, ctx, device, || call!(d, cuCtxSynchronize()))
            .map_err(at(|| format!("context {ctx:#x} (device {device})")))?;
    }
    Ok(())
}

/// The phase an operation starts from and the one it leads to.
pub fn transition(operation: Operation) -> (Phase, Phase) {
    use Operation as O;
    use Phase as P;
    match operation {
        O::PrepareMulticast => (P::Frozen, P::MulticastPrepared),
        O::SaveAllocations => (P::MulticastPrepared, P::Saved),
        O::PrepareUnicast => (P::Saved, P::Released),
        O::LoadAllocations => (P::Released, P::Loaded),
        O::RestoreUnicast => (P::Loaded, P::UnicastRestored),
        O::RestoreMulticastCreators => (P::UnicastRestored, P::MulticastCreatorsRestored),
        O::RestoreMulticastImporters => {
            (P::MulticastCreatorsRestored, P::MulticastImportersRestored)
        }
        O::RestoreMulticastDevices => (P::MulticastImportersRestored, P::MulticastDevicesRestored),
        O::RestoreMulticastBindings => (P::MulticastDevicesRestored, P::Active),
    }
}

fn run(r: &mut Registry, operation: Operation) -> Outcome {
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
    let result = match operation {
        Operation::PrepareMulticast => prepare_multicast(d, r),
        Operation::SaveAllocations => save(d, r),
        Operation::PrepareUnicast => prepare_unicast(d, r),
        Operation::LoadAllocations => load(d, r),
        Operation::RestoreUnicast => restore_unicast(d, r),
        Operation::RestoreMulticastCreators => restore_multicast_creators(d, r),
        Operation::RestoreMulticastImporters => restore_multicast_importers(d, r),
        Operation::RestoreMulticastDevices => restore_multicast_devices(d, r),
        Operation::RestoreMulticastBindings => restore_multicast_bindings(d, r),
    };
    match result {
        Ok(bytes) => {
            r.phase = to;
            if to == Phase::Active {
                // The restore is complete; blocked application threads continue once the
                // coordinator's verifying inspection has read the records.
                gate::hold(Timeouts::from_env().unwrap_or_default().control());
            }
            Outcome {
                reply: Reply::Completed(CompletedReply { operation, bytes }),
                after: if operation == Operation::LoadAllocations {
                    After::FreeArena
                } else {
                    After::Nothing
                },
            }
        }
        Err(failure) => {
            let message = format!(
                "{operation} failed: {failure}; this process is fail-stopped and will not resume"
            );
            log!("{message}");
            r.failure = Some(message.clone());
            r.phase = Phase::Failed;
            // From now on every gated call fails the same way: no half state where some
            // calls work on released memory.
            gate::fail();
            reply(refused(RefusalCode::DriverError, message))
        }
    }
}

/// A failure inside an operation, naming the object.
type Step<T> = Result<T, String>;

fn at(what: impl FnOnce() -> String) -> impl FnOnce(CuError) -> String {
    move |e| format!("{}: {e}", what())
}

fn prepare_multicast(d: &Driver, r: &mut Registry) -> Step<u64> {
    let mapped: Vec<(u64, u64, cuinterpose_protocol::AllocationId)> = r
        .mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Multicast)
        .map(|(&base, m)| (base, m.size, m.id))
        .collect();
    for (id, object) in r.multicasts.iter_mut() {
        cache::remove(id);
        let raw = object
            .driver
            .ok_or_else(|| format!("multicast object {id} has no driver handle"))?;
        let device = object.devices.first().copied().unwrap_or(0);
        context::run(d, object.context, device, || {
            for (base, size, _) in mapped.iter().filter(|(_, _, owner)| owner == id) {
                call!(d, cuMemUnmap(*base, *size as usize))?;
            }
            for b in &object.bindings {
                call!(
                    d,
                    cuMulticastUnbind(raw, b.device, b.multicast_offset as usize, b.size as usize)
                )?;
            }
            call!(d, cuMemRelease(raw))
        })
        .map_err(at(|| format!("multicast object {id}")))?;
        object.driver = None;
    }
    Ok(0)
}

/// The allocations this process carries, in a fixed order.
fn carried(r: &Registry) -> Vec<cuinterpose_protocol::AllocationId> {
    r.allocations
        .values()
        .filter(|a| a.host_carrier(r.pid))
        .map(|a| a.reference.id)
        .collect()
}

fn save(d: &Driver, r: &mut Registry) -> Step<u64> {
    let ids = carried(r);
    let mut slots = BTreeMap::new();
    let mut total: usize = 0;
    for id in &ids {
        let size = r.allocations[id].size;
        let len = usize::try_from(size)
            .map_err(|_| format!("allocation {id}: size {size} does not fit in memory"))?;
        slots.insert(*id, (total, size));
        total = total
            .checked_add(len)
            .ok_or("host carrier size overflows")?;
    }
    if ids.is_empty() {
        r.arena = None;
        return Ok(0);
    }
    let arena = Arena::new(slots, total)
        .map_err(at(|| format!("allocating a {total}-byte host carrier")))?;
    let jobs: Vec<_> = ids.iter().map(|id| &r.allocations[id]).collect();
    carrier::transfer(d, &arena, &jobs, Direction::Save).map_err(at(|| {
        "copying shared allocations to the host carrier".to_owned()
    }))?;
    r.arena = Some(arena);
    Ok(total as u64)
}

fn prepare_unicast(d: &Driver, r: &mut Registry) -> Step<u64> {
    cache::clear();
    let mapped: Vec<(u64, u64, cuinterpose_protocol::AllocationId)> = r
        .mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Unicast)
        .map(|(&base, m)| (base, m.size, m.id))
        .collect();
    for (id, a) in r.allocations.iter_mut().filter(|(_, a)| a.shared) {
        for (base, size, _) in mapped.iter().filter(|(_, _, owner)| owner == id) {
            call!(d, cuMemUnmap(*base, *size as usize))
                .map_err(at(|| format!("unmapping allocation {id} at {base:#x}")))?;
        }
        if let Some(raw) = a.driver.take() {
            call!(d, cuMemRelease(raw)).map_err(at(|| format!("releasing allocation {id}")))?;
        }
    }
    Ok(0)
}

/// Maps every recorded mapping of `id` at its original address and restores its access.
fn remap(
    d: &Driver,
    r: &Registry,
    id: &cuinterpose_protocol::AllocationId,
    raw: u64,
    kind: Kind,
) -> CuResult<()> {
    for (&base, m) in r
        .mappings
        .iter()
        .filter(|(_, m)| m.id == *id && m.kind == kind)
    {
        call!(
            d,
            cuMemMap(base, m.size as usize, m.offset as usize, raw, m.flags)
        )?;
        if !m.access.is_empty() {
            let descriptors: Vec<_> = m.access.iter().map(convert::raw_access).collect();
            call!(
                d,
                cuMemSetAccess(
                    base,
                    m.size as usize,
                    descriptors.as_ptr(),
                    descriptors.len()
                )
            )?;
        }
    }
    Ok(())
}

fn load(d: &Driver, r: &mut Registry) -> Step<u64> {
    let ids = carried(r);
    if ids.is_empty() {
        return Ok(0);
    }
    let Some(arena) = r.arena.take() else {
        return Err(
            "no host carrier to load from (save_allocations did not run in this process image)"
                .into(),
        );
    };
    for id in &ids {
        let a = &r.allocations[id];
        if arena.slots.get(id).map(|&(_, size)| size) != Some(a.size) {
            return Err(format!(
                "allocation {id}: the host carrier does not hold it"
            ));
        }
    }
    let result = (|| {
        for id in &ids {
            let a = &r.allocations[id];
            let prop = a.raw_properties();
            let mut raw = 0;
            context::run(d, a.context, carrier::device_of(a), || {
                call!(d, cuMemCreate(&mut raw, a.size as usize, &prop, 0))
            })
            .map_err(at(|| format!("recreating allocation {id}")))?;
            r.allocations.get_mut(id).expect("listed above").driver = Some(raw);
        }
        let jobs: Vec<_> = ids.iter().map(|id| &r.allocations[id]).collect();
        carrier::transfer(d, &arena, &jobs, Direction::Load)
            .map_err(at(|| "copying the host carrier back".to_owned()))?;
        let mut bytes = 0;
        for id in &ids {
            let a = &r.allocations[id];
            let raw = a.driver.expect("recreated above");
            context::run(d, a.context, carrier::device_of(a), || {
                remap(d, r, id, raw, Kind::Unicast)
            })
            .map_err(at(|| format!("remapping allocation {id}")))?;
            bytes += a.size;
            if !a.published {
                // Shared only by a multicast binding: nobody asks for its FD.
                continue;
            }
            sharing::cache_export(d, *id, raw, a.capability, a.export_reply())
                .map_err(at(|| format!("exporting allocation {id}")))?;
            if a.malloc.is_some_and(|m| m.ipc_exported) {
                cache::authorize_by_id(id);
            }
        }
        Ok(bytes)
    })();
    // Keep the copy until the reply is sent (After::FreeArena), or for good on failure.
    r.arena = Some(arena);
    result
}

fn restore_unicast(d: &Driver, r: &mut Registry) -> Step<u64> {
    let me = r.pid;
    let ids: Vec<_> = r
        .allocations
        .values()
        .filter(|a| a.shared && !a.is_creator(me))
        .map(|a| a.reference.id)
        .collect();
    for id in ids {
        let a = &r.allocations[&id];
        let (reply, fd) =
            sharing::request_export(&a.reference, ResourceKind::Unicast, a.capability).map_err(
                at(|| {
                    format!(
                        "asking creator {} for allocation {id}",
                        a.reference.creator_pid
                    )
                }),
            )?;
        match reply {
            Reply::UnicastExport(export) if export.size == a.size => {}
            other => {
                return Err(format!(
                    "allocation {id}: creator answered {other:?}, expected an export of {} bytes",
                    a.size
                ));
            }
        }
        let raw = context::run(d, a.context, carrier::device_of(a), || {
            sharing::import_fd(d, std::os::fd::AsFd::as_fd(&fd))
        })
        .map_err(at(|| format!("importing allocation {id}")))?;
        drop(fd);
        r.allocations.get_mut(&id).expect("listed above").driver = Some(raw);
        let a = &r.allocations[&id];
        context::run(d, a.context, carrier::device_of(a), || {
            remap(d, r, &id, raw, Kind::Unicast)
        })
        .map_err(at(|| format!("remapping allocation {id}")))?;
    }
    Ok(0)
}

fn multicast_device(r: &Registry, id: &cuinterpose_protocol::AllocationId) -> i32 {
    let m = &r.multicasts[id];
    m.devices
        .first()
        .or(m.bindings.first().map(|b| &b.device))
        .copied()
        .unwrap_or(0)
}

fn restore_multicast_creators(d: &Driver, r: &mut Registry) -> Step<u64> {
    let me = r.pid;
    let ids: Vec<_> = r
        .multicasts
        .values()
        .filter(|m| m.reference.creator_pid == me)
        .map(|m| m.reference.id)
        .collect();
    for id in ids {
        let device = multicast_device(r, &id);
        let m = &r.multicasts[&id];
        let prop = convert::raw_multicast_properties(&m.properties)
            .map_err(at(|| format!("multicast object {id}")))?;
        let mut raw = 0;
        context::run(d, m.context, device, || {
            call!(d, cuMulticastCreate(&mut raw, &prop))
        })
        .map_err(at(|| format!("recreating multicast object {id}")))?;
        if m.shared {
            sharing::cache_export(d, id, raw, m.capability, m.export_reply())
                .map_err(at(|| format!("exporting multicast object {id}")))?;
        }
        r.multicasts.get_mut(&id).expect("listed above").driver = Some(raw);
    }
    Ok(0)
}

fn restore_multicast_importers(d: &Driver, r: &mut Registry) -> Step<u64> {
    let me = r.pid;
    let ids: Vec<_> = r
        .multicasts
        .values()
        .filter(|m| m.reference.creator_pid != me)
        .map(|m| m.reference.id)
        .collect();
    for id in ids {
        let device = multicast_device(r, &id);
        let m = &r.multicasts[&id];
        let (reply, fd) =
            sharing::request_export(&m.reference, ResourceKind::Multicast, m.capability).map_err(
                at(|| {
                    format!(
                        "asking creator {} for multicast object {id}",
                        m.reference.creator_pid
                    )
                }),
            )?;
        match reply {
            Reply::MulticastExport(export) if export.properties == m.properties => {}
            other => {
                return Err(format!(
                    "multicast object {id}: creator answered {other:?}, expected the recorded properties"
                ));
            }
        }
        let raw = context::run(d, m.context, device, || {
            sharing::import_fd(d, std::os::fd::AsFd::as_fd(&fd))
        })
        .map_err(at(|| format!("importing multicast object {id}")))?;
        r.multicasts.get_mut(&id).expect("listed above").driver = Some(raw);
    }
    Ok(0)
}

fn restore_multicast_devices(d: &Driver, r: &mut Registry) -> Step<u64> {
    for (id, m) in &r.multicasts {
        let raw = m
            .driver
            .ok_or_else(|| format!("multicast object {id} was not restored"))?;
        let device = m.devices.first().copied().unwrap_or(0);
        context::run(d, m.context, device, || {
            for &dev in &m.devices {
                call!(d, cuMulticastAddDevice(raw, dev))?;
            }
            Ok(())
        })
        .map_err(at(|| format!("adding devices to multicast object {id}")))?;
    }
    Ok(0)
}

fn restore_multicast_bindings(d: &Driver, r: &mut Registry) -> Step<u64> {
    for (id, m) in &r.multicasts {
        let raw = m
            .driver
            .ok_or_else(|| format!("multicast object {id} was not restored"))?;
        let device = multicast_device(r, id);
        context::run(d, m.context, device, || {
            for b in &m.bindings {
                let (mc_offset, size) = (b.multicast_offset as usize, b.size as usize);
                let v2 = b.version == cuinterpose_protocol::BindingVersion::V2;
                match &b.target {
                    BindingTarget::Memory { member, offset } => {
                        let member_raw = r
                            .allocations
                            .get(&member.id)
                            .and_then(|a| a.driver)
                            .ok_or(CuError::INVALID_HANDLE)?;
                        crate::multicast::call_bind_mem(
                            d,
                            raw,
                            v2.then_some(b.device),
                            mc_offset,
                            member_raw,
                            *offset as usize,
                            size,
                            b.flags,
                        )?;
                    }
                    BindingTarget::Address { address, .. } => {
                        crate::multicast::call_bind_addr(
                            d,
                            raw,
                            v2.then_some(b.device),
                            mc_offset,
                            *address,
                            size,
                            b.flags,
                        )?;
                    }
                }
            }
            remap(d, r, id, raw, Kind::Multicast)
        })
        .map_err(at(|| format!("rebinding multicast object {id}")))?;
    }
    Ok(0)
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
