//! Host carriers: the copy of each shared allocation this process created between its device
//! memory and its slot of the arena ([`crate::state::arena`]), checksummed chunk by chunk.
//!
//! The arena is page-locked (`cuMemHostRegister`) only for the duration of each transfer.
//! A save reads through the application's own mapping where one covers the whole allocation
//! readable from its device (the common case: no mapping calls, and memory the application
//! already touched); every other copy goes through a temporary device alias of the whole
//! allocation (reserve, map, grant read-write), so partial or read-only application mappings
//! do not matter.
//!
//! Copies go in chunks of [`CHUNK`] bytes, each on a stream of its own that is synchronized
//! before the next (so `progress` requests see the copy advance, and the chunk's bytes are
//! free to read). Each chunk's XXH3-64 is computed while the driver copies: a save hashes the
//! previous chunk while the next one is in flight, a load hashes the chunk it is copying out of
//! the arena (both only read it) and compares it with the checksum the save recorded. A
//! mismatch stops the load at that chunk, naming the allocation and the offset.

use crate::driver::context;
use crate::driver::vmm::{map_read_write, unmap_and_free};
use crate::driver::{Driver, HostMemory, Stream};
use crate::state::arena::Arena;
use crate::state::progress;
use crate::state::registry::Allocation;
use crate::state::registry::{Kind, Registry};
use crate::sys::error::CuError;
use cuinterpose_protocol::{AccessFlags, AllocationId, CarrierChecksum, LocationType, Operation};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use twox_hash::XxHash3_64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Save,
    Load,
}

impl Direction {
    pub(super) fn operation(self) -> Operation {
        match self {
            Self::Save => Operation::SaveAllocations,
            Self::Load => Operation::LoadAllocations,
        }
    }
}

/// Bytes of one copy and one checksum ([`cuinterpose_protocol::CARRIER_CHUNK_BYTES`]): small
/// enough that progress moves several times a second and a hash overlaps the next copy, large
/// enough that a synchronization per chunk costs nothing against the copy.
pub const CHUNK: usize = cuinterpose_protocol::CARRIER_CHUNK_BYTES;

/// Why a transfer stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferError {
    /// A driver call failed.
    Driver(CuError),
    /// A load found bytes in the carrier that do not hash to what the save recorded.
    Mismatch {
        allocation: AllocationId,
        offset: u64,
        len: u64,
        saved: u64,
        found: u64,
    },
    /// A load has no checksum for an allocation the carrier holds (or one of another shape).
    NoChecksum { allocation: AllocationId },
    /// A storage carrier's file could not be written, read or verified.
    File { path: String, what: String },
    /// A storage carrier's staging window cannot be used.
    Window(String),
}

impl From<CuError> for TransferError {
    fn from(error: CuError) -> Self {
        Self::Driver(error)
    }
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Driver(error) => write!(f, "{error}"),
            Self::Mismatch {
                allocation,
                offset,
                len,
                saved,
                found,
            } => write!(
                f,
                "allocation {allocation}: the host carrier's {len} bytes at offset {offset} hash \
                 to {found:#018x}, but save_allocations recorded {saved:#018x} (the carrier was \
                 damaged after the save); the bytes were not put back in service"
            ),
            Self::NoChecksum { allocation } => write!(
                f,
                "allocation {allocation}: the carrier holds no checksum of its size for it"
            ),
            Self::File { path, what } => write!(f, "carrier file {path}: {what}"),
            Self::Window(why) => f.write_str(why),
        }
    }
}

/// What a transfer did: every allocation's checksums, and how long its copies took (the
/// chunks' wall time, hashing included; not page-locking, aliases or the arena's layout).
#[derive(Debug, Default)]
pub struct Transferred {
    pub checksums: Vec<CarrierChecksum>,
    pub copying: Duration,
}

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
/// reads an allocation listed in `through` at that address (see [`readable_mappings`]) and
/// records the checksums in the arena, a load verifies the bytes against them.
pub fn transfer(
    d: &Driver,
    arena: &mut Arena,
    jobs: &[&Allocation],
    through: &BTreeMap<AllocationId, u64>,
    direction: Direction,
) -> Result<Transferred, TransferError> {
    let total = jobs.iter().map(|a| a.size).fold(0u64, u64::saturating_add);
    progress::start(direction.operation(), total);
    let expected = match direction {
        Direction::Save => BTreeMap::new(),
        Direction::Load => arena.checksums().clone(),
    };
    let layout = arena.layout().clone();
    let result = pinned(d, jobs, arena.memory_mut(), |bytes| {
        let mut slots = Arena::split(&layout, bytes);
        each_allocation(d, jobs, through, direction, |a, device_address| {
            // An allocation without a slot of its size fails the transfer.
            let host = slots
                .remove(&a.reference.id)
                .filter(|host| host.len() as u64 == a.size)
                .ok_or(TransferError::Driver(CuError::INVALID_VALUE))?;
            match direction {
                Direction::Save => save_chunks(d, a, host, device_address),
                Direction::Load => load_chunks(d, a, host, device_address, &expected),
            }
        })
    });
    if let Ok(done) = &result {
        progress::add_copy_time(done.copying);
        if direction == Direction::Save {
            arena.set_checksums(done.checksums.iter().cloned());
        }
    }
    progress::finish();
    result
}

/// Runs `body` on `memory` page-locked (in the context of the first job) where the driver
/// agrees, unlocking it afterwards; an unlock that fails fails the transfer.
pub(super) fn pinned<T>(
    d: &Driver,
    jobs: &[&Allocation],
    memory: &mut HostMemory,
    body: impl FnOnce(&mut [u8]) -> Result<T, TransferError>,
) -> Result<T, TransferError> {
    let Some(first) = jobs.first() else {
        return body(memory.as_mut_slice());
    };
    let (ctx, device) = (first.context, device_of(first));
    let pinned = context::run(d, ctx, device, || memory.register(d)).is_ok();
    let result = body(memory.as_mut_slice());
    if pinned {
        let unregistered = context::run(d, ctx, device, || memory.unregister(d));
        return result.and_then(|done| unregistered.map(|()| done).map_err(TransferError::Driver));
    }
    result
}

/// Runs `copy` for each of `jobs` with the device address to copy its bytes at (for a save
/// listed in `through` the application's mapping, else a temporary alias of the whole
/// allocation, unmapped once its group is done), one context switch per (context, device)
/// group. The checksums come back sorted by allocation, `copying` is the copies' wall time.
pub(super) fn each_allocation<'j>(
    d: &Driver,
    jobs: &[&'j Allocation],
    through: &BTreeMap<AllocationId, u64>,
    direction: Direction,
    mut copy: impl FnMut(&'j Allocation, u64) -> Result<CarrierChecksum, TransferError>,
) -> Result<Transferred, TransferError> {
    let mut groups: BTreeMap<(usize, i32), Vec<&'j Allocation>> = BTreeMap::new();
    for a in jobs {
        groups.entry((a.context, device_of(a))).or_default().push(a);
    }
    let mut done = Transferred::default();
    for ((ctx, device), members) in groups {
        // The outer error is the context switch's, the inner one the copies'.
        context::run(d, ctx, device, || {
            Ok(copy_group(
                d, device, &members, through, direction, &mut copy, &mut done,
            ))
        })
        .map_err(TransferError::Driver)
        .and_then(|copied| copied)?;
    }
    done.checksums.sort_by_key(|c| c.allocation);
    Ok(done)
}

struct Alias {
    address: u64,
    size: usize,
}

fn copy_group<'j>(
    d: &Driver,
    device: i32,
    members: &[&'j Allocation],
    through: &BTreeMap<AllocationId, u64>,
    direction: Direction,
    copy: &mut impl FnMut(&'j Allocation, u64) -> Result<CarrierChecksum, TransferError>,
    done: &mut Transferred,
) -> Result<(), TransferError> {
    let mut aliases: Vec<Alias> = Vec::new();
    let mut result = Ok(());
    for &a in members {
        let Ok(size) = usize::try_from(a.size) else {
            result = Err(CuError::INVALID_VALUE.into());
            break;
        };
        let Some(raw) = a.driver else {
            result = Err(CuError::INVALID_HANDLE.into());
            break;
        };
        let device_address = match through.get(&a.reference.id) {
            Some(&address) if direction == Direction::Save => address,
            _ => match map_read_write(d, raw, a.size, device) {
                Ok(address) => {
                    aliases.push(Alias { address, size });
                    address
                }
                Err(error) => {
                    result = Err(error.into());
                    break;
                }
            },
        };
        let started = Instant::now();
        let copied = copy(a, device_address);
        done.copying += started.elapsed();
        match copied {
            Ok(checksum) => done.checksums.push(checksum),
            Err(error) => {
                result = Err(error);
                break;
            }
        }
    }
    // Every chunk's stream was synchronized: no copy uses an alias any more.
    for alias in aliases {
        let unmapped = unmap_and_free(d, alias.address, alias.size);
        if result.is_ok() {
            result = unmapped.map_err(TransferError::Driver);
        }
    }
    result
}

/// The checksum record of `a`'s bytes, for `chunks`.
pub(super) fn checksum_of(
    a: &Allocation,
    chunks: Vec<u64>,
) -> Result<CarrierChecksum, TransferError> {
    Ok(CarrierChecksum {
        allocation: a.reference.id,
        size: a.size,
        chunk_bytes: CHUNK as u64,
        chunks: chunks.try_into().map_err(|_| CuError::INVALID_VALUE)?,
    })
}

/// Device to carrier, chunk by chunk: each chunk is hashed while the next one is copied.
fn save_chunks(
    d: &Driver,
    a: &Allocation,
    host: &mut [u8],
    mut device_address: u64,
) -> Result<CarrierChecksum, TransferError> {
    let mut hashes = Vec::with_capacity(host.len().div_ceil(CHUNK));
    let mut previous: Option<&[u8]> = None;
    for chunk in host.chunks_mut(CHUNK) {
        let len = chunk.len();
        // The scope synchronizes before it returns: then the chunk is copied and readable.
        Stream::scope(d, |stream| {
            stream.copy_to_host(&mut *chunk, device_address)?;
            if let Some(copied) = previous {
                hashes.push(XxHash3_64::oneshot(copied));
            }
            Ok(())
        })?;
        progress::advance(len as u64);
        previous = Some(chunk);
        device_address += len as u64;
    }
    if let Some(copied) = previous {
        hashes.push(XxHash3_64::oneshot(copied));
    }
    checksum_of(a, hashes)
}

/// Carrier to device, chunk by chunk: each chunk is hashed while it is copied, and the load
/// stops at the first chunk that differs from the save's checksum.
fn load_chunks(
    d: &Driver,
    a: &Allocation,
    host: &[u8],
    mut device_address: u64,
    expected: &BTreeMap<AllocationId, CarrierChecksum>,
) -> Result<CarrierChecksum, TransferError> {
    let id = a.reference.id;
    let saved = expected
        .get(&id)
        .filter(|c| {
            c.size == a.size
                && c.chunk_bytes == CHUNK as u64
                && c.chunks.len() == host.len().div_ceil(CHUNK)
        })
        .ok_or(TransferError::NoChecksum { allocation: id })?;
    let mut hashes = Vec::with_capacity(saved.chunks.len());
    for (index, chunk) in host.chunks(CHUNK).enumerate() {
        let hash = Stream::scope(d, |stream| {
            stream.copy_to_device(device_address, chunk)?;
            Ok(XxHash3_64::oneshot(chunk))
        })?;
        if hash != saved.chunks[index] {
            return Err(TransferError::Mismatch {
                allocation: id,
                offset: (index * CHUNK) as u64,
                len: chunk.len() as u64,
                saved: saved.chunks[index],
                found: hash,
            });
        }
        hashes.push(hash);
        progress::advance(chunk.len() as u64);
        device_address += chunk.len() as u64;
    }
    checksum_of(a, hashes)
}
