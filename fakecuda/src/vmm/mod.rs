//! Virtual memory management: physical allocations (memfds), address reservations
//! (`PROT_NONE` mappings), mappings (`MAP_FIXED|MAP_SHARED` views of a memfd) and access
//! (`mprotect`), with CUDA's reference rules for handles and mappings.

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::context::Actor;
use crate::state::vmm::{Mapping, Target};

mod address;

mod alloc;

impl DriverState {
    /// Checks that `[ptr, ptr+len)` is mapped device memory `actor`'s device may read (and
    /// write): what its copy engine would touch. Unmapped memory is an invalid value; mapped
    /// memory without the access (or a multicast range with no memory bound for the view's
    /// device) is an illegal address, as a GPU fault would report it.
    pub fn check_range(&self, actor: Actor, ptr: u64, len: u64, write: bool) -> CuResult<()> {
        if len == 0 {
            return Ok(());
        }
        let end = ptr
            .checked_add(len)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let mut at = ptr;
        while at < end {
            let Some((start, m)) = self.vmm.mapping_at(at) else {
                // Page-locked host memory the driver knows is device-accessible under unified
                // addressing (a GPU reaches it over the bus).
                let (base, size, _, _) = self
                    .host_range(at)
                    .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
                at = end.min(base + size);
                continue;
            };
            let granted = self.device_access(actor, start, m);
            let enough = if write {
                granted == c::ACCESS_READWRITE
            } else {
                granted == c::ACCESS_READ || granted == c::ACCESS_READWRITE
            };
            // The host protection must agree (an mprotect the grants did not make).
            let need = if write {
                libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            if !enough || m.prot() & need == 0 {
                return Err(CuError::CUDA_ERROR_ILLEGAL_ADDRESS);
            }
            let stop = end.min(start + m.size);
            if let Target::Multicast(h) = m.target
                && !self.mc_view_backed(h, m, at - start + m.offset, stop - start + m.offset)
            {
                return Err(CuError::CUDA_ERROR_ILLEGAL_ADDRESS);
            }
            at = stop;
        }
        Ok(())
    }

    /// The access `actor`'s device has to the mapping at `start`: its VMM grant, and for
    /// memory a context owns (`cuMemAlloc` blocks and opened IPC handles) read-write once
    /// the actor's context has peer access to the owner; managed memory is everyone's.
    fn device_access(&self, actor: Actor, start: u64, m: &Mapping) -> u32 {
        let granted = m
            .access
            .get(&actor.device)
            .copied()
            .unwrap_or(c::ACCESS_NONE);
        if granted == c::ACCESS_READWRITE {
            return granted;
        }
        let owner = match self.legacy.by_base.get(&start) {
            Some(l) if l.managed => return c::ACCESS_READWRITE,
            Some(l) => Some(l.context),
            None => self.ipc.context_at(start),
        };
        match owner {
            Some(owner) if self.contexts.peer_enabled(actor.ctx, owner) => c::ACCESS_READWRITE,
            _ => granted,
        }
    }
}
