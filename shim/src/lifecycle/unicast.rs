//! The unicast operations: save the shared bytes to the host carrier, release the shared
//! allocations, and after the native restore recreate them (creators, from the carrier) and
//! import them again (importers), each at its recorded addresses.

use super::carrier::{self, Direction};
use super::step::{Done, MappingIndex, OpResult, StepError, at, carrying, remap};
use super::storage;
use crate::calls::sharing;
use crate::driver::{Driver, context};
use crate::state::arena::Arena;
use crate::state::cache;
use crate::state::registry::{Kind, Registry};
use crate::state::stored::Held;
use cuinterpose_protocol::{
    AllocationId, Carrier, ExecuteRequest, NamespacePid, Reply, ResourceKind,
};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

/// The checksums of a transfer, for the reply (one per carried allocation, so within its
/// bound whenever the records are).
fn bounded(
    checksums: Vec<cuinterpose_protocol::CarrierChecksum>,
) -> OpResult<
    cuinterpose_protocol::BoundedVec<
        cuinterpose_protocol::CarrierChecksum,
        { cuinterpose_protocol::MAX_RECORDS },
    >,
> {
    let count = checksums.len();
    checksums.try_into().map_err(|_| {
        StepError::Records(format!(
            "{count} carried allocations are more than a reply can list"
        ))
    })
}

/// The allocations this process carries, in a fixed order.
fn carried(r: &Registry) -> Vec<cuinterpose_protocol::AllocationId> {
    r.allocations
        .values()
        .filter(|a| a.host_carrier(r.pid))
        .map(|a| a.reference.id)
        .collect()
}

/// How a copy runs: the carrier the request names, its staging window, and the folder it
/// brought (storage); or, for a rollback of the process's own, the carrier its save filled.
#[derive(Debug)]
pub struct Carriage {
    carrier: Option<Carrier>,
    staging_bytes: u64,
    folder: Option<OwnedFd>,
}

impl Carriage {
    /// As the coordinator's request says.
    pub fn asked(execute: &ExecuteRequest, folder: Option<OwnedFd>) -> Self {
        Self {
            carrier: Some(execute.carrier),
            staging_bytes: execute.staging_bytes,
            folder,
        }
    }

    /// A load of whatever the save filled, from the folder it kept, through the window it
    /// used.
    pub fn own() -> Self {
        Self {
            carrier: None,
            staging_bytes: 0,
            folder: None,
        }
    }
}

pub fn save(d: &Driver, r: &mut Registry, how: Carriage) -> OpResult<Done> {
    let ids = carried(r);
    if ids.is_empty() {
        r.carrier = None;
        return Ok(Done::default());
    }
    let sizes: Vec<_> = ids.iter().map(|id| (*id, r.allocations[id].size)).collect();
    let jobs: Vec<_> = ids.iter().map(|id| &r.allocations[id]).collect();
    let through = carrier::readable_mappings(r, &ids);
    let (held, transferred, peak_carrier_bytes) = match how.carrier {
        Some(Carrier::Storage) => {
            let folder = how.folder.ok_or_else(|| {
                StepError::Records(
                    "save_allocations with the storage carrier came without the carrier folder"
                        .into(),
                )
            })?;
            let (stored, transferred, staged) =
                storage::save(d, folder, &jobs, &through, how.staging_bytes).map_err(carrying(
                    "copying shared allocations to the storage carrier",
                ))?;
            (Held::Storage(stored), transferred, staged)
        }
        _ => {
            let mut arena = Arena::for_sizes(&sizes).map_err(StepError::Records)?;
            let transferred = carrier::transfer(d, &mut arena, &jobs, &through, Direction::Save)
                .map_err(carrying("copying shared allocations to the host carrier"))?;
            let len = arena.len() as u64;
            (Held::Host(arena), transferred, len)
        }
    };
    r.carrier = Some(held);
    Ok(Done {
        bytes: sizes.iter().map(|&(_, size)| size).sum(),
        peak_carrier_bytes,
        checksums: bounded(transferred.checksums)?,
    })
}

pub fn prepare_unicast(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    cache::clear();
    let shared: Vec<AllocationId> = r
        .allocations
        .values()
        .filter(|a| a.shared)
        .map(|a| a.reference.id)
        .collect();
    release(d, r, &shared)?;
    Ok(0)
}

pub fn load(d: &Driver, r: &mut Registry, how: Carriage) -> OpResult<Done> {
    let ids = carried(r);
    if ids.is_empty() {
        return Ok(Done::default());
    }
    let Some(mut held) = r.carrier.take() else {
        return Err(StepError::Records(
            "no carrier to load from (save_allocations did not run in this process image)".into(),
        ));
    };
    if let Some(asked) = how.carrier.filter(|&asked| asked != held.kind()) {
        let kind = held.kind();
        r.carrier = Some(held);
        return Err(StepError::Records(format!(
            "load_allocations asks for the {asked} carrier, but save_allocations filled the \
             {kind} carrier"
        )));
    }
    if let Some(id) = ids
        .iter()
        .find(|id| held.size_of(id) != Some(r.allocations[*id].size))
    {
        r.carrier = Some(held);
        return Err(StepError::Records(format!(
            "allocation {id}: the carrier does not hold it"
        )));
    }
    let result = (|| {
        for id in &ids {
            let a = &r.allocations[id];
            let prop = a.raw_properties();
            let raw = context::run(d, a.context, carrier::device_of(a), || {
                d.mem_create(a.size as usize, &prop, 0)
            })
            .map_err(at(|| format!("recreating allocation {id}")))?;
            r.allocations.get_mut(id).expect("listed above").driver = Some(raw);
        }
        let jobs: Vec<_> = ids.iter().map(|id| &r.allocations[id]).collect();
        let (transferred, peak_carrier_bytes) = match &mut held {
            Held::Host(arena) => {
                let transferred =
                    carrier::transfer(d, arena, &jobs, &Default::default(), Direction::Load)
                        .map_err(carrying("copying the host carrier back"))?;
                (transferred, arena.len() as u64)
            }
            Held::Storage(stored) => {
                let folder = how
                    .folder
                    .as_ref()
                    .or(stored.folder.as_ref())
                    .map(AsFd::as_fd)
                    .ok_or_else(|| {
                        StepError::Records(
                            "load_allocations from the storage carrier came without its folder"
                                .into(),
                        )
                    })?;
                let window = match how.staging_bytes {
                    0 => stored.window,
                    asked => asked,
                };
                storage::load(d, stored, folder, &jobs, window)
                    .map_err(carrying("copying the storage carrier back"))?
            }
        };
        let index = MappingIndex::new(r, Kind::Unicast);
        let mut bytes = 0;
        for id in &ids {
            let a = &r.allocations[id];
            let raw = a.driver.expect("recreated above");
            context::run(d, a.context, carrier::device_of(a), || {
                remap(d, r, &index, id, raw)
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
        Ok(Done {
            bytes,
            peak_carrier_bytes,
            checksums: bounded(transferred.checksums)?,
        })
    })();
    // Keep the copy until the reply is sent (After::FreeArena), or for good on failure.
    r.carrier = Some(held);
    result
}

pub fn restore_unicast(d: &Driver, r: &mut Registry) -> OpResult<u64> {
    for (creator, ids) in imports_by_creator(r) {
        import_from(d, r, creator, &ids)?;
    }
    Ok(0)
}

/// The shared allocations this process imports, by creator: each creator is asked for all of
/// its allocations over one connection.
pub fn imports_by_creator(r: &Registry) -> BTreeMap<NamespacePid, Vec<AllocationId>> {
    let me = r.pid;
    let mut by_creator: BTreeMap<NamespacePid, Vec<AllocationId>> = BTreeMap::new();
    for a in r
        .allocations
        .values()
        .filter(|a| a.shared && !a.is_creator(me))
    {
        by_creator
            .entry(a.reference.creator_pid)
            .or_default()
            .push(a.reference.id);
    }
    by_creator
}

/// Unmaps `ids` at every recorded address and releases their handles (their records stay):
/// `prepare_unicast` for every shared allocation, a rollback for the imports of a creator that
/// recreates its memory, so that [`import_from`] can import it again.
pub fn release(d: &Driver, r: &mut Registry, ids: &[AllocationId]) -> OpResult<()> {
    let index = MappingIndex::new(r, Kind::Unicast);
    for id in ids {
        for &base in index.of(id) {
            let size = r.mappings[&base].size;
            d.mem_unmap(base, size as usize)
                .map_err(at(|| format!("unmapping allocation {id} at {base:#x}")))?;
        }
        let a = r.allocations.get_mut(id).expect("a tracked allocation");
        if let Some(raw) = a.driver.take() {
            d.mem_release(raw)
                .map_err(at(|| format!("releasing allocation {id}")))?;
        }
    }
    Ok(())
}

/// Imports `ids` from `creator` again and maps each at its recorded addresses.
pub fn import_from(
    d: &Driver,
    r: &mut Registry,
    creator: NamespacePid,
    ids: &[AllocationId],
) -> OpResult<()> {
    let index = MappingIndex::new(r, Kind::Unicast);
    let asks: Vec<_> = ids
        .iter()
        .map(|id| {
            let a = &r.allocations[id];
            (a.reference.clone(), a.capability)
        })
        .collect();
    sharing::for_each_export(creator, &asks, ResourceKind::Unicast, |n, answer| {
        let id = ids[n];
        let (reply, fd) = answer.map_err(|e| {
            StepError::Peer(format!("asking creator {creator} for allocation {id}: {e}"))
        })?;
        let a = &r.allocations[&id];
        match reply {
            Reply::UnicastExport(export) if export.size == a.size => {}
            other => {
                return Err(StepError::Peer(format!(
                    "allocation {id}: creator answered {other:?}, expected an export of {} bytes",
                    a.size
                )));
            }
        }
        let raw = context::run(d, a.context, carrier::device_of(a), || {
            crate::calls::track::import_fd(d, std::os::fd::AsFd::as_fd(&fd))
        })
        .map_err(at(|| format!("importing allocation {id}")))?;
        drop(fd);
        r.allocations.get_mut(&id).expect("listed above").driver = Some(raw);
        let a = &r.allocations[&id];
        context::run(d, a.context, carrier::device_of(a), || {
            remap(d, r, &index, &id, raw)
        })
        .map_err(at(|| format!("remapping allocation {id}")))
    })
}
