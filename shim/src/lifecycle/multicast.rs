//! The multicast operations: release every multicast object before the unicast memory, and
//! after the unicast restore recreate them in order: creators, importers, devices, bindings.

use super::step::{MappingIndex, OpResult, StepError, at, remap};
use crate::calls::sharing;
use crate::driver::api::Bound;
use crate::driver::{Driver, context};
use crate::state::cache;
use crate::state::registry::{BindingTarget, Kind, Multicast, Registry};
use crate::sys::convert;
use crate::sys::error::CuError;
use cuinterpose_protocol::{Reply, ResourceKind};
use std::os::fd::OwnedFd;

pub fn prepare_multicast(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    let mapped: Vec<(u64, u64, cuinterpose_protocol::AllocationId)> = r
        .mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Multicast)
        .map(|(&base, m)| (base, m.size, m.id))
        .collect();
    for (id, object) in r.multicasts.iter_mut() {
        cache::remove(id);
        let raw = object.driver.ok_or_else(|| {
            StepError::Records(format!("multicast object {id} has no driver handle"))
        })?;
        let device = object.devices.first().copied().unwrap_or(0);
        context::run(d, object.context, device, || {
            for (base, size, _) in mapped.iter().filter(|(_, _, owner)| owner == id) {
                d.mem_unmap(*base, *size as usize)?;
            }
            for b in &object.bindings {
                d.multicast_unbind(raw, b.device, b.multicast_offset as usize, b.size as usize)?;
            }
            d.mem_release(raw)
        })
        .map_err(at(|| format!("multicast object {id}")))?;
        object.driver = None;
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

pub fn restore_multicast_creators(d: &Driver, r: &mut Registry) -> OpResult<u64> {
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
        let raw = context::run(d, m.context, device, || d.multicast_create(&prop))
            .map_err(at(|| format!("recreating multicast object {id}")))?;
        if m.shared {
            sharing::cache_export(d, id, raw, m.capability, m.export_reply())
                .map_err(at(|| format!("exporting multicast object {id}")))?;
        }
        r.multicasts.get_mut(&id).expect("listed above").driver = Some(raw);
    }
    Ok(0)
}

pub fn restore_multicast_importers(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    import_multicast_objects(d, r, &|m| {
        sharing::request_export(&m.reference, ResourceKind::Multicast, m.capability).map_err(at(
            || {
                format!(
                    "asking creator {} for multicast object {}",
                    m.reference.creator_pid, m.reference.id
                )
            },
        ))
    })
}

/// The export of one multicast object, from its creator.
pub type FetchMulticast<'a> = &'a dyn Fn(&Multicast) -> OpResult<(Reply, OwnedFd)>;

/// Imports every multicast object this process imported and does not hold yet, each through
/// `fetch` (once in a restore; again and again in a rollback, whose creators may not have
/// recreated theirs yet). Objects already held are left alone, so a retried call is harmless.
pub fn import_multicast_objects(
    d: &Driver,
    r: &mut Registry,
    fetch: FetchMulticast,
) -> OpResult<u64> {
    let me = r.pid;
    let ids: Vec<_> = r
        .multicasts
        .values()
        .filter(|m| m.reference.creator_pid != me && m.driver.is_none())
        .map(|m| m.reference.id)
        .collect();
    for id in ids {
        let device = multicast_device(r, &id);
        let m = &r.multicasts[&id];
        let (reply, fd) = fetch(m)?;
        match reply {
            Reply::MulticastExport(export) if export.properties == m.properties => {}
            other => {
                return Err(StepError::Peer(format!(
                    "multicast object {id}: creator answered {other:?}, expected the recorded properties"
                )));
            }
        }
        let raw = context::run(d, m.context, device, || {
            crate::calls::track::import_fd(d, std::os::fd::AsFd::as_fd(&fd))
        })
        .map_err(at(|| format!("importing multicast object {id}")))?;
        r.multicasts.get_mut(&id).expect("listed above").driver = Some(raw);
    }
    Ok(0)
}

pub fn restore_multicast_devices(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    for (id, m) in &r.multicasts {
        let raw = m
            .driver
            .ok_or_else(|| StepError::Records(format!("multicast object {id} was not restored")))?;
        let device = m.devices.first().copied().unwrap_or(0);
        context::run(d, m.context, device, || {
            for &dev in &m.devices {
                d.multicast_add_device(raw, dev)?;
            }
            Ok(())
        })
        .map_err(at(|| format!("adding devices to multicast object {id}")))?;
    }
    Ok(0)
}

pub fn restore_multicast_bindings(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    let index = MappingIndex::new(r, Kind::Multicast);
    for (id, m) in &r.multicasts {
        let raw = m
            .driver
            .ok_or_else(|| StepError::Records(format!("multicast object {id} was not restored")))?;
        let device = multicast_device(r, id);
        context::run(d, m.context, device, || {
            for b in &m.bindings {
                let bound = match &b.target {
                    BindingTarget::Memory { member, offset } => Bound::Memory {
                        member: r
                            .allocations
                            .get(&member.id)
                            .and_then(|a| a.driver)
                            .ok_or(CuError::INVALID_HANDLE)?,
                        offset: *offset as usize,
                    },
                    BindingTarget::Address { address, .. } => Bound::Address(*address),
                };
                d.multicast_bind(raw, b.range(), bound)?;
            }
            remap(d, r, &index, id, raw)
        })
        .map_err(at(|| format!("rebinding multicast object {id}")))?;
    }
    Ok(0)
}
