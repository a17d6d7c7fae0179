//! The records an inspection reports: the generated schema types, built from the registry,
//! in a deterministic order.

use crate::state::cache::refused;
use crate::state::registry::{BindingTarget, Kind, Registry};
use crate::sys::error::CuError;
use cuinterpose_protocol::{
    AddressBindingSource, AllocationRecord, BindingSource, BoundedVec, MAX_RECORDS, MappingRecord,
    MemberRange, MemoryBindingSource, MulticastBindingRecord, MulticastDeviceRecord,
    MulticastMappingRecord, MulticastRecord, PoolMemberRecord, PoolRecord, Record,
};
use cuinterpose_protocol::{
    Device, DeviceUuid, InspectionReply, MAX_DEVICES, Phase, RefusalCode, Reply,
};
use std::sync::Mutex;

/// Every record of this process, sorted, each device named by `devices` (the registry keeps
/// ordinals alone); `Err` with the count when they exceed `MAX_RECORDS`.
pub fn records(r: &Registry, devices: &[Device]) -> Result<BoundedVec<Record, MAX_RECORDS>, usize> {
    let mut out = Vec::new();
    for a in r.allocations.values() {
        out.push(Record::Allocation(AllocationRecord {
            allocation: a.reference.clone(),
            size: a.size,
            properties: a.properties.clone(),
            host_carrier: a.host_carrier(r.pid),
            handle_count: a.handle_refs,
        }));
    }
    for (&address, m) in &r.mappings {
        // Access lists are bounded when they are recorded (cuMemSetAccess refuses more).
        let access = BoundedVec::try_from(m.access.clone()).unwrap_or_default();
        let Some(reference) = r.reference(&m.id, m.kind).cloned() else {
            continue;
        };
        out.push(match m.kind {
            Kind::Unicast => Record::Mapping(MappingRecord {
                allocation: reference,
                address,
                size: m.size,
                offset: m.offset,
                access,
            }),
            Kind::Multicast => Record::MulticastMapping(MulticastMappingRecord {
                object: reference,
                address,
                size: m.size,
                offset: m.offset,
                flags: m.flags,
                access,
            }),
        });
    }
    for o in r.multicasts.values() {
        out.push(Record::Multicast(MulticastRecord {
            object: o.reference.clone(),
            properties: o.properties.clone(),
            handle_count: o.handle_refs,
        }));
        for &device in &o.devices {
            out.push(Record::MulticastDevice(MulticastDeviceRecord {
                object: o.reference.clone(),
                device,
                uuid: None,
            }));
        }
        for b in &o.bindings {
            let source = match &b.target {
                BindingTarget::Memory { member, offset } => {
                    BindingSource::Memory(MemoryBindingSource {
                        member: MemberRange {
                            allocation: member.clone(),
                            offset: *offset,
                        },
                    })
                }
                BindingTarget::Address { address, member } => {
                    BindingSource::Address(AddressBindingSource {
                        address: *address,
                        member: member.as_ref().map(|(allocation, offset)| MemberRange {
                            allocation: allocation.clone(),
                            offset: *offset,
                        }),
                    })
                }
            };
            out.push(Record::MulticastBinding(MulticastBindingRecord {
                object: o.reference.clone(),
                source,
                multicast_offset: b.multicast_offset,
                size: b.size,
                flags: b.flags,
                version: b.version,
                device: b.device,
                device_uuid: None,
            }));
        }
    }
    pool_records(r, &mut out);
    for record in &mut out {
        record.name_devices(devices);
    }
    out.sort();
    let count = out.len();
    BoundedVec::try_from(out).map_err(|_| count)
}

/// The inspection reply, or a refusal while a call that may wait on other processes is in
/// flight or when the records exceed the protocol's limit.
pub fn inspection(r: &Registry) -> Reply {
    if !r.pool_shares.is_empty() {
        let pools: Vec<String> = r
            .pool_shares
            .iter()
            .map(|(pool, share)| match (share.imported, share.exports) {
                (true, _) => format!("pool {pool:#x} was imported from another process"),
                (false, n) => format!(
                    "pool {pool:#x} was exported {n} time{}",
                    if n == 1 { "" } else { "s" }
                ),
            })
            .collect();
        return refused(
            RefusalCode::Unsupported,
            format!(
                "memory-pool sharing cannot be checkpointed: {} (the shim rebuilds only the IPC \
                 device pools it created itself; destroy these before a checkpoint)",
                pools.join("; ")
            ),
        );
    }
    if r.unlocked_calls > 0 {
        return refused(
            RefusalCode::Busy,
            format!(
                "{} driver call(s) in flight that may wait on other processes",
                r.unlocked_calls
            ),
        );
    }
    let devices = match devices(r.phase) {
        Ok(devices) => devices,
        Err(why) => return refused(RefusalCode::DriverError, why),
    };
    match records(r, &devices) {
        Ok(records) => Reply::Inspection(InspectionReply {
            namespace_pid: r.pid,
            phase: r.phase,
            raw_imports: r.raw_imports.values().sum(),
            records,
            devices,
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

/// The devices this process sees, by ordinal (none before it initialised the driver): which
/// GPU each ordinal of its records names, what restore onto other GPUs pairs. Asked of the
/// driver only while active or frozen: from `prepare_multicast` until the restore's last
/// step the process may be natively locked or checkpointed, where every driver call waits,
/// so those phases report the list last asked (at `begin_checkpoint`). A restore onto other
/// GPUs thus shows its new devices once the participant is active again.
fn devices(phase: Phase) -> Result<BoundedVec<Device, MAX_DEVICES>, String> {
    static LAST: Mutex<Option<BoundedVec<Device, MAX_DEVICES>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let (Some(devices), false) = (
        last.as_ref(),
        matches!(phase, Phase::Active | Phase::Frozen),
    ) {
        return Ok(devices.clone());
    }
    let devices = list_devices()?;
    *last = Some(devices.clone());
    Ok(devices)
}

fn list_devices() -> Result<BoundedVec<Device, MAX_DEVICES>, String> {
    let listed = match crate::driver::driver().and_then(|d| d.devices()) {
        Ok(listed) => listed,
        Err(e) if e == CuError::NOT_INITIALIZED => Vec::new(),
        Err(e) => return Err(format!("cannot list this process's devices: {e}")),
    };
    let count = listed.len();
    let devices = (0i32..)
        .zip(listed)
        .map(|(ordinal, d)| {
            let uuid = DeviceUuid::new(d.uuid)
                .ok_or_else(|| format!("device {ordinal} reports an all-zero UUID"))?;
            // Read from a 256-byte buffer: always within MAX_TEXT_BYTES.
            Ok(Device {
                ordinal,
                uuid,
                name: d
                    .name
                    .as_str()
                    .try_into()
                    .map_err(|e| format!("device {ordinal}: {e}"))?,
                memory: d.memory,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    BoundedVec::try_from(devices)
        .map_err(|_| format!("{count} devices exceed the protocol's limit of {MAX_DEVICES}"))
}

/// The pool adapter's pools and which allocation belongs to which.
fn pool_records(r: &Registry, out: &mut Vec<Record>) {
    let reference = |p: &crate::state::pools::Pool| cuinterpose_protocol::AllocationReference {
        id: p.id,
        creator_pid: p.creator_pid,
    };
    for p in r.pools.by_handle.values() {
        out.push(Record::Pool(PoolRecord {
            pool: reference(p),
            device: p.device,
            max_size: p.max_size,
            release_threshold: p.release_threshold,
            // Bounded when recorded (cuMemPoolSetAccess refuses more).
            access: BoundedVec::try_from(p.access.clone()).unwrap_or_default(),
            device_uuid: None,
        }));
    }
    for a in r.allocations.values() {
        let Some(malloc) = a.malloc.filter(|m| m.pool != 0) else {
            continue;
        };
        let Some(p) = r.pools.by_handle.get(&malloc.pool) else {
            continue;
        };
        out.push(Record::PoolMember(PoolMemberRecord {
            pool: reference(p),
            allocation: a.reference.clone(),
            requested_size: malloc.requested,
        }));
    }
}
