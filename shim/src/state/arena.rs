//! The host carrier's arena: one block of host memory holding a full copy of each shared
//! allocation this process created, between `save_allocations` and `load_allocations`, and
//! where each allocation's bytes sit in it.
//!
//! It is ordinary private memory, so CRIU saves it with the process and native checkpoint
//! never sees it as device memory.
//!
//! Laying it out (mapping and faulting in its pages) is a large part of a save. With
//! `CUINTERPOSE_KEEP_CARRIER=1` the memory of a freed arena is kept for the next one that
//! fits in it, so repeated toggles pay that once; the price is that the memory stays
//! resident between toggles, and a CRIU dump of the process includes it.

use crate::driver::HostMemory;
use crate::sys::error::{CuError, CuResult};
use crate::sys::settings;
use cuinterpose_protocol::{AllocationId, CarrierChecksum};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Memory of the last freed arena, kept for reuse (only with `CUINTERPOSE_KEEP_CARRIER=1`).
static SPARE: Mutex<Option<HostMemory>> = Mutex::new(None);

fn keep_carrier() -> bool {
    settings::current().is_ok_and(|s| s.keep_carrier)
}

#[derive(Debug)]
pub struct Arena {
    /// Always `Some` until the arena is dropped (when it may move to [`SPARE`]).
    memory: Option<HostMemory>,
    /// Each allocation's `(offset, size)` in `memory`: disjoint, within its length.
    slots: BTreeMap<AllocationId, (usize, u64)>,
    /// The checksums of the bytes as the save copied them in (empty until then).
    checksums: BTreeMap<AllocationId, CarrierChecksum>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        if keep_carrier() {
            *SPARE.lock().unwrap_or_else(|p| p.into_inner()) = self.memory.take();
        }
    }
}

impl Arena {
    /// Lays out `sizes` back to back and maps memory for all of them. `Err` names what does not
    /// fit: an allocation larger than the address space, or a sum that overflows.
    pub fn for_sizes(sizes: &[(AllocationId, u64)]) -> Result<Self, String> {
        let mut slots = BTreeMap::new();
        let mut total: usize = 0;
        for &(id, size) in sizes {
            let len = usize::try_from(size)
                .map_err(|_| format!("allocation {id}: size {size} does not fit in memory"))?;
            slots.insert(id, (total, size));
            total = total
                .checked_add(len)
                .ok_or("host carrier size overflows")?;
        }
        let spare = SPARE.lock().unwrap_or_else(|p| p.into_inner()).take();
        Self::lay_out(slots, total, spare)
    }

    /// An arena of `slots` (`total` bytes) in `spare` when it is large enough, else in new
    /// memory.
    fn lay_out(
        slots: BTreeMap<AllocationId, (usize, u64)>,
        total: usize,
        spare: Option<HostMemory>,
    ) -> Result<Self, String> {
        let memory = match spare.filter(|memory| memory.len() >= total) {
            Some(memory) => memory,
            None => HostMemory::new(total)
                .map_err(|e: CuError| format!("allocating a {total}-byte host carrier: {e}"))?,
        };
        Ok(Arena {
            memory: Some(memory),
            slots,
            checksums: BTreeMap::new(),
        })
    }

    fn memory(&self) -> &HostMemory {
        self.memory
            .as_ref()
            .expect("an arena holds its memory until dropped")
    }

    /// Host memory the arena holds.
    pub fn len(&self) -> usize {
        self.memory().len()
    }

    /// Never empty: at least one byte is mapped.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The checksums of the saved bytes, by allocation (what a load verifies).
    pub fn checksums(&self) -> &BTreeMap<AllocationId, CarrierChecksum> {
        &self.checksums
    }

    /// Records the checksums the save computed.
    pub fn set_checksums(&mut self, checksums: impl IntoIterator<Item = CarrierChecksum>) {
        self.checksums = checksums.into_iter().map(|c| (c.allocation, c)).collect();
    }

    /// The size recorded for `id`, if the arena holds it.
    pub fn size_of(&self, id: &AllocationId) -> Option<u64> {
        self.slots.get(id).map(|&(_, size)| size)
    }

    pub fn memory_mut(&mut self) -> &mut HostMemory {
        self.memory
            .as_mut()
            .expect("an arena holds its memory until dropped")
    }

    /// Each allocation's `(offset, size)` in the arena's memory.
    pub fn layout(&self) -> &BTreeMap<AllocationId, (usize, u64)> {
        &self.slots
    }

    /// Every slot as its own mutable slice (they are disjoint), by allocation.
    pub fn slices_mut(&mut self) -> BTreeMap<AllocationId, &mut [u8]> {
        let slots = self.slots.clone();
        Self::split(&slots, self.memory_mut().as_mut_slice())
    }

    /// `memory` (the arena's, as [`Arena::memory_mut`] gives it) cut into the slots of
    /// `layout` (as [`Arena::layout`] gives it).
    pub fn split<'m>(
        layout: &BTreeMap<AllocationId, (usize, u64)>,
        memory: &'m mut [u8],
    ) -> BTreeMap<AllocationId, &'m mut [u8]> {
        let mut by_offset: Vec<(usize, usize, AllocationId)> = layout
            .iter()
            .map(|(id, &(offset, size))| (offset, size as usize, *id))
            .collect();
        by_offset.sort_unstable();
        let mut rest = memory;
        let mut consumed = 0;
        let mut out = BTreeMap::new();
        for (offset, size, id) in by_offset {
            let (_, tail) = rest.split_at_mut(offset - consumed);
            let (slot, tail) = tail.split_at_mut(size);
            out.insert(id, slot);
            rest = tail;
            consumed = offset + size;
        }
        out
    }

    /// The bytes held for `id`.
    pub fn slice(&self, id: &AllocationId) -> CuResult<&[u8]> {
        let &(offset, size) = self.slots.get(id).ok_or(CuError::INVALID_VALUE)?;
        Ok(&self.memory().as_slice()[offset..offset + size as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> AllocationId {
        AllocationId::new([n; 16]).expect("non-zero")
    }

    #[test]
    fn slots_are_disjoint_and_keep_their_bytes() {
        let mut arena = Arena::for_sizes(&[(id(1), 3), (id(2), 5), (id(3), 0)]).expect("maps");
        for (n, slice) in arena.slices_mut() {
            slice.fill(n.as_bytes()[0]);
        }
        assert_eq!(arena.slice(&id(1)).unwrap(), &[1, 1, 1]);
        assert_eq!(arena.slice(&id(2)).unwrap(), &[2; 5]);
        assert!(arena.slice(&id(3)).unwrap().is_empty());
        assert_eq!(arena.size_of(&id(2)), Some(5));
        assert_eq!(arena.slice(&id(4)), Err(CuError::INVALID_VALUE));
    }

    #[test]
    fn kept_memory_is_reused_only_when_it_fits() {
        let spare = HostMemory::new(8 << 10).expect("maps");
        let base = spare.as_slice().as_ptr();
        let slots = BTreeMap::from([(id(1), (0, 4 << 10))]);
        let mut reused = Arena::lay_out(slots.clone(), 4 << 10, Some(spare)).expect("fits");
        assert_eq!(reused.memory().as_slice().as_ptr(), base);
        reused.slices_mut().get_mut(&id(1)).expect("slot").fill(7);
        assert_eq!(reused.slice(&id(1)).unwrap(), &[7; 4 << 10][..]);
        let small = HostMemory::new(4 << 10).expect("maps");
        let fresh = Arena::lay_out(
            BTreeMap::from([(id(1), (0, 8 << 10))]),
            8 << 10,
            Some(small),
        )
        .expect("new memory");
        assert_eq!(fresh.memory().len(), 8 << 10);
    }

    #[test]
    fn an_impossible_size_is_named() {
        let error = Arena::for_sizes(&[(id(1), u64::MAX), (id(2), u64::MAX)]).unwrap_err();
        assert!(
            error.contains("overflows") || error.contains("does not fit"),
            "{error}"
        );
    }
}
