//! Host carriers: the copy of each shared allocation this process created between its device
//! memory and its slot of the arena ([`crate::state::arena`]).
//!
//! The arena is page-locked (`cuMemHostRegister`) only for the duration of each transfer.
//! A save reads through the application's own mapping where one covers the whole allocation
//! readable from its device (the common case: no mapping calls, and memory the application
//! already touched); every other copy goes through a temporary device alias of the whole
//! allocation (reserve, map, grant read-write), so partial or read-only application mappings
//! do not matter. Copies run on one stream per context; the stream holds the arena's slices
//! until its copies have finished. Copies are
//! queued in chunks of at most [`CHUNK`] bytes, and the stream is synchronized every
//! [`PROGRESS_STEP`] bytes so `progress` requests see the copy advance (one wait per 256 MiB
//! costs microseconds against the copy itself).

use crate::driver::context;
use crate::driver::vmm::{map_read_write, unmap_and_free};
use crate::driver::{Driver, Stream};
use crate::state::arena::Arena;
use crate::state::progress;
use crate::state::registry::Allocation;
use crate::state::registry::{Kind, Registry};
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{AccessFlags, AllocationId, LocationType, Operation};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Save,
    Load,
}

impl Direction {
    fn operation(self) -> Operation {
        match self {
            Self::Save => Operation::SaveAllocations,
            Self::Load => Operation::LoadAllocations,
        }
    }
}

/// Largest single queued copy.
pub const CHUNK: usize = 64 << 20;
/// Bytes queued between two progress updates (stream synchronizations).
pub const PROGRESS_STEP: usize = 256 << 20;

/// The device a transfer of `a` runs on.
pub fn device_of(a: &Allocation) -> i32 {
    match a.properties.location.location_type {
        LocationType::Device => a.properties.location.id,
        _ => 0,
    }
}

/// Where the application maps each of `ids` whole, readable from the device its copy runs on:
/// a save can read there instead of through an alias.
pub fn readable_mappings(r: &Registry, ids: &[AllocationId]) -> BTreeMap<AllocationId, u64> {
    let ids: std::collections::BTreeSet<&AllocationId> = ids.iter().collect();
    let mut found = BTreeMap::new();
    for (&base, m) in &r.mappings {
        let Some(a) = r.allocations.get(&m.id) else {
            continue;
        };
        let readable = m.access.iter().any(|grant| {
            grant.location.location_type == LocationType::Device
                && grant.location.id == device_of(a)
                && matches!(
                    grant.flags,
                    AccessFlags::ProtRead | AccessFlags::ProtReadWrite
                )
        });
        if m.kind == Kind::Unicast
            && m.offset == 0
            && m.size == a.size
            && readable
            && ids.contains(&m.id)
        {
            found.entry(m.id).or_insert(base);
        }
    }
    found
}

/// Copies every allocation in `jobs` between its device memory and its arena slot; a save
/// reads an allocation listed in `through` at that address (see [`readable_mappings`]).
pub fn transfer(
    d: &Driver,
    arena: &mut Arena,
    jobs: &[&Allocation],
    through: &BTreeMap<AllocationId, u64>,
    direction: Direction,
) -> CuResult<()> {
    let total = jobs.iter().map(|a| a.size).fold(0u64, u64::saturating_add);
    progress::start(direction.operation(), total);
    let copies = Copies { through, direction };
    let result = transfer_all(d, arena, jobs, &copies);
    progress::finish();
    result
}

/// How a transfer copies: which direction, and where a save may read instead of an alias.
struct Copies<'a> {
    through: &'a BTreeMap<AllocationId, u64>,
    direction: Direction,
}

fn transfer_all(
    d: &Driver,
    arena: &mut Arena,
    jobs: &[&Allocation],
    copies: &Copies,
) -> CuResult<()> {
    let Some(first) = jobs.first() else {
        return Ok(());
    };
    let (ctx, device) = (first.context, device_of(first));
    let pinned = context::run(d, ctx, device, || arena.memory_mut().register(d)).is_ok();
    // One stream per (context, device) group.
    let mut groups: BTreeMap<(usize, i32), Vec<&Allocation>> = BTreeMap::new();
    for a in jobs {
        groups.entry((a.context, device_of(a))).or_default().push(a);
    }
    let mut result = Ok(());
    {
        let mut slices = arena.slices_mut();
        for ((ctx, device), members) in groups {
            let mut mine = Vec::with_capacity(members.len());
            for a in &members {
                let slice = slices
                    .remove(&a.reference.id)
                    .ok_or(CuError::INVALID_VALUE)?;
                mine.push((*a, slice));
            }
            result = context::run(d, ctx, device, || copy_group(d, device, mine, copies));
            if result.is_err() {
                break;
            }
        }
    }
    if pinned {
        let unregistered = context::run(d, ctx, device, || arena.memory_mut().unregister(d));
        result = result.and(unregistered);
    }
    result
}

struct Alias {
    address: u64,
    size: usize,
}

fn copy_group(
    d: &Driver,
    device: i32,
    members: Vec<(&Allocation, &mut [u8])>,
    copies: &Copies,
) -> CuResult<()> {
    let Copies { through, direction } = *copies;
    let mut aliases: Vec<Alias> = Vec::new();
    // Whatever was issued has finished when the scope returns, before the aliases go away or
    // the arena is touched again.
    let mut unreported = 0usize;
    let issued = Stream::scope(d, |stream| {
        for (a, host) in members {
            let size = usize::try_from(a.size).map_err(|_| CuError::INVALID_VALUE)?;
            if host.len() != size {
                return Err(CuError::INVALID_VALUE);
            }
            let raw = a.driver.ok_or(CuError::INVALID_HANDLE)?;
            let mut device_address = match through.get(&a.reference.id) {
                Some(&address) if direction == Direction::Save => address,
                _ => {
                    let address = map_read_write(d, raw, a.size, device)?;
                    aliases.push(Alias { address, size });
                    address
                }
            };
            for chunk in host.chunks_mut(CHUNK) {
                let len = chunk.len();
                match direction {
                    Direction::Save => stream.copy_to_host(chunk, device_address)?,
                    Direction::Load => stream.copy_to_device(device_address, chunk)?,
                }
                device_address += len as u64;
                unreported += len;
                if unreported >= PROGRESS_STEP {
                    stream.synchronize()?;
                    progress::advance(unreported as u64);
                    unreported = 0;
                }
            }
        }
        Ok(())
    });
    if issued.is_ok() {
        // The scope synchronized: the rest has been copied too.
        progress::advance(unreported as u64);
    }
    let mut cleanup = Ok(());
    for alias in aliases {
        cleanup = cleanup.and(unmap_and_free(d, alias.address, alias.size));
    }
    issued.and(cleanup)
}
