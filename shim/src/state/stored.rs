//! What a creator holds of its shared bytes between `save_allocations` and
//! `load_allocations`: a host arena, or the storage carrier's files (their folder, sizes and
//! checksums; the files themselves are written and read by the lifecycle's storage carrier).

use super::arena::Arena;
use cuinterpose_protocol::{AllocationId, Carrier, CarrierChecksum};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

/// The carrier a save filled.
#[derive(Debug)]
pub enum Held {
    Host(Arena),
    Storage(Stored),
}

impl Held {
    pub fn kind(&self) -> Carrier {
        match self {
            Self::Host(_) => Carrier::Host,
            Self::Storage(_) => Carrier::Storage,
        }
    }

    /// The size recorded for `id`, if the carrier holds it.
    pub fn size_of(&self, id: &AllocationId) -> Option<u64> {
        match self {
            Self::Host(arena) => arena.size_of(id),
            Self::Storage(stored) => stored.sizes.get(id).copied(),
        }
    }

    /// Drops the storage carrier's folder descriptor (a held process never reads its files
    /// on its own, and a dump must not find the descriptor open).
    pub fn close_folder(&mut self) {
        if let Self::Storage(stored) = self {
            stored.folder = None;
        }
    }
}

/// A storage carrier's files: one per allocation in the folder, named by allocation.
#[derive(Debug)]
pub struct Stored {
    /// The folder, until `hold` (a load then brings its own).
    pub folder: Option<OwnedFd>,
    pub sizes: BTreeMap<AllocationId, u64>,
    /// The checksums of the bytes as the save wrote them.
    pub checksums: BTreeMap<AllocationId, CarrierChecksum>,
    /// The staging window the save used (its own rollback loads through the same).
    pub window: u64,
}
