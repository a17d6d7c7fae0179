//! The pool tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::pool`.

use crate::abi::consts as c;
use std::collections::{BTreeMap, HashMap};

/// Where a pool's memory lives: a device, pinned host memory (on any node, or on one), or
/// managed memory with its preferred location (`CUmemLocation` type and id; type 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Device(u32),
    Host,
    HostNuma(u32),
    Managed(u32, u32),
}

/// `CU_MEM_ALLOCATION_TYPE_MANAGED`.
pub(crate) const ALLOCATION_TYPE_MANAGED: u32 = 2;

impl Place {
    /// Where a pool at this place keeps its memory: (`CUmemLocationType`, device or NUMA node).
    pub fn memory(self) -> (u32, u32) {
        match self {
            Place::Device(device) => (c::LOCATION_TYPE_DEVICE, device),
            Place::Host => (c::LOCATION_TYPE_HOST_NUMA, 0),
            Place::HostNuma(node) => (c::LOCATION_TYPE_HOST_NUMA, node),
            // Managed memory is host memory here, which every device and the CPU reach.
            Place::Managed(..) => (c::LOCATION_TYPE_HOST_NUMA, 0),
        }
    }
}

#[derive(Debug)]
pub struct Pool {
    pub place: Place,
    /// A device's default pool (`cuDeviceGetDefaultMemPool`): never destroyed.
    pub default: bool,
    pub max_size: u64,
    pub(crate) reuse: [bool; 3],
    pub(crate) release_threshold: u64,
    pub(crate) used: u64,
    pub(crate) used_high: u64,
    /// What live allocations asked for, each rounded to [`POOL_ALIGN`]: what `max_size`
    /// limits (a driver's pool suballocates, so many small allocations fit in one granule).
    pub(crate) charged: u64,
    /// Granted access by device (a device pool's own device always has read-write; a host
    /// pool's memory is the CPU's, and a device's only once granted).
    pub(crate) access: BTreeMap<u32, u32>,
    /// Destroyed while allocations were outstanding: released when the last one is freed.
    pub(crate) destroyed: bool,
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` or none.
    pub(crate) handle_types: u32,
    /// Exported to a shareable handle (an FD may still be open somewhere).
    pub(crate) exported: bool,
    /// Imported from another process: (its pid, its pool handle).
    pub(crate) imported: Option<(u32, u64)>,
}

impl Pool {
    /// The owning device: a device pool's own; 0 for host and managed pools, which no device
    /// owns.
    pub fn device(&self) -> u32 {
        match self.place {
            Place::Device(device) => device,
            _ => 0,
        }
    }
}

/// The pool memory of one process.
#[derive(Debug, Default)]
pub struct Pools {
    pub(crate) pools: HashMap<u64, Pool>,
    pub(crate) default_of: HashMap<Place, u64>,
    pub(crate) current_of: HashMap<Place, u64>,
    /// Every pool allocation: base → (pool, physical allocation, size).
    pub allocations: BTreeMap<u64, (u64, u64, u64)>,
    /// Pointers imported here: (creator pid, creator's allocation) → local base.
    pub(crate) imported_ptrs: HashMap<(u32, u64), u64>,
    /// What each allocation made here is charged against its pool's `max_size`.
    pub(crate) charges: HashMap<u64, u64>,
}

/// The alignment allocations are charged in against a pool's `max_size`.
pub(crate) const POOL_ALIGN: u64 = 512;

impl Pools {
    /// The pool allocation containing `p`: (base, pool, physical allocation, size).
    pub fn allocation_at(&self, p: u64) -> Option<(u64, u64, u64, u64)> {
        let (&base, &(pool, alloc, size)) = self.allocations.range(..=p).next_back()?;
        (p < base + size).then_some((base, pool, alloc, size))
    }

    /// Why native checkpoint cannot save this process's pools, if it cannot.
    /// Whether pool `h` holds pinned host memory.
    pub fn host_pool(&self, h: u64) -> bool {
        self.pools
            .get(&h)
            .is_some_and(|p| matches!(p.place, Place::Host | Place::HostNuma(_)))
    }

    /// Whether pool `h` holds managed memory.
    pub fn managed_pool(&self, h: u64) -> bool {
        self.pools
            .get(&h)
            .is_some_and(|p| matches!(p.place, Place::Managed(..)))
    }

    pub fn shared(&self) -> Option<String> {
        self.pools.iter().find_map(|(h, p)| {
            if p.exported {
                Some(format!(
                    "memory pool {h:#x} was exported to a shareable handle"
                ))
            } else {
                p.imported
                    .map(|(pid, _)| format!("memory pool {h:#x} was imported from pid {pid}"))
            }
        })
    }

    /// The device of pool `h`, if it exists.
    pub fn device_of(&self, h: u64) -> Option<u32> {
        self.pools.get(&h).map(Pool::device)
    }
}
