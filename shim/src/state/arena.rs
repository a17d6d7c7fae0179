//! The host carrier's arena: one block of host memory holding a full copy of each shared
//! allocation this process created, between `save_allocations` and `load_allocations`, and
//! where each allocation's bytes sit in it.
//!
//! It is ordinary private memory, so CRIU saves it with the process and native checkpoint
//! never sees it as device memory.

use crate::driver::HostMemory;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::AllocationId;
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct Arena {
    memory: HostMemory,
    /// Each allocation's `(offset, size)` in `memory`: disjoint, within its length.
    slots: BTreeMap<AllocationId, (usize, u64)>,
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
        let memory = HostMemory::new(total)
            .map_err(|e: CuError| format!("allocating a {total}-byte host carrier: {e}"))?;
        Ok(Arena { memory, slots })
    }

    /// The size recorded for `id`, if the arena holds it.
    pub fn size_of(&self, id: &AllocationId) -> Option<u64> {
        self.slots.get(id).map(|&(_, size)| size)
    }

    pub fn memory_mut(&mut self) -> &mut HostMemory {
        &mut self.memory
    }

    /// Every slot as its own mutable slice (they are disjoint), by allocation.
    pub fn slices_mut(&mut self) -> BTreeMap<AllocationId, &mut [u8]> {
        let mut by_offset: Vec<(usize, usize, AllocationId)> = self
            .slots
            .iter()
            .map(|(id, &(offset, size))| (offset, size as usize, *id))
            .collect();
        by_offset.sort_unstable();
        let mut rest = self.memory.as_mut_slice();
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
        Ok(&self.memory.as_slice()[offset..offset + size as usize])
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
    fn an_impossible_size_is_named() {
        let error = Arena::for_sizes(&[(id(1), u64::MAX), (id(2), u64::MAX)]).unwrap_err();
        assert!(
            error.contains("overflows") || error.contains("does not fit"),
            "{error}"
        );
    }
}
