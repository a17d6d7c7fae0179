//! Graph memory: an allocation node reserves its address when it is added; an executable
//! graph holding it gets physical memory at its first launch and keeps it (a free node ends
//! the allocation's lifetime within a launch, not the memory) until the executable graph is
//! destroyed or the device's graph memory is trimmed. The device's graph-memory attributes
//! count what executable graphs hold.

use crate::abi::{RawAccessDesc, RawPoolProps, consts as c};
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::extras::graph::Work;
use crate::state::extras::graph_memory::{
    RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH, Reserved, USED_MEM_CURRENT, USED_MEM_HIGH,
};
use crate::state::vmm::{Owner, Target};
use crate::sys;

impl DriverState {
    /// `cuGraphAddMemAllocNode`'s parameters checked and its address reserved: pinned memory
    /// of a device, not shareable, with read-write grants for other devices. Returns the
    /// address and the node's work; [`DriverState::graph_mem_unreserve`] undoes it when the node
    /// cannot be added.
    pub fn graph_mem_reserve(
        &mut self,
        graph: u64,
        pool: &RawPoolProps,
        grants: &[RawAccessDesc],
        bytes: u64,
    ) -> CuResult<(u64, Work)> {
        self.graphs.graph_id(graph)?;
        if pool.alloc_type != c::ALLOCATION_TYPE_PINNED
            || pool.location.type_ != c::LOCATION_TYPE_DEVICE
            || pool.handle_types != c::HANDLE_TYPE_NONE
            || bytes == 0
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let device = self.config.check_device(pool.location.id)?;
        let mut access = vec![(device, c::ACCESS_READWRITE)];
        for g in grants {
            if g.location.type_ != c::LOCATION_TYPE_DEVICE || g.flags != c::ACCESS_READWRITE {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            access.push((self.config.check_device(g.location.id)?, g.flags));
        }
        let size =
            sys::round_up(bytes, sys::granularity()).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        let base = self.reserve_internal(size, sys::granularity(), 0, Owner::Internal)?;
        self.graph_memory.reserved.insert(
            base,
            Reserved {
                size,
                device,
                graph,
                orphaned: false,
            },
        );
        let work = Work::MemAlloc {
            base,
            size,
            requested: bytes,
            device,
            access,
        };
        Ok((base, work))
    }

    /// Gives back the address of an allocation node that was never added.
    pub fn graph_mem_unreserve(&mut self, base: u64) {
        if self.graph_memory.reserved.remove(&base).is_some() {
            self.free_reservation(base);
        }
    }

    /// `cuGraphAddMemFreeNode`: `dptr` is an allocation of this graph no free node ends yet.
    pub fn graph_mem_free_node(&self, graph: u64, dptr: u64) -> CuResult<Work> {
        if !self.graphs.allocations_of(graph)?.contains(&(dptr, false)) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(Work::MemFree { base: dptr })
    }

    /// At a launch: physical memory for each allocation of `exec` it does not hold yet.
    pub fn graph_mem_launch(&mut self, exec: u64, order: &[Work]) -> CuResult<()> {
        for work in order {
            let Work::MemAlloc {
                base,
                size,
                device,
                access,
                ..
            } = work
            else {
                continue;
            };
            let held = self.graph_memory.held.entry(exec).or_default();
            if held.iter().any(|(b, _)| b == base) {
                continue;
            }
            let h = self.alloc_create(
                *size,
                c::LOCATION_TYPE_DEVICE,
                *device,
                c::HANDLE_TYPE_NONE,
                true,
            )?;
            if let Err(e) = self.map_target(*base, *size, 0, Target::Alloc(h)) {
                self.alloc_maybe_free(h);
                return Err(e);
            }
            // Held from here on, so a failure below still gives the memory back with `exec`.
            self.graph_memory
                .held
                .entry(exec)
                .or_default()
                .push((*base, h));
            if let Some(m) = self.vmm.mappings.get_mut(base) {
                m.access = access.iter().copied().collect();
            }
            self.apply_access(*base)?;
            let used = self.graph_mem_used(*device);
            let high = self.graph_memory.high.entry(*device).or_default();
            *high = (*high).max(used);
        }
        Ok(())
    }

    fn graph_mem_used(&self, device: u32) -> u64 {
        let r = &self.graph_memory.reserved;
        self.graph_memory
            .held
            .values()
            .flatten()
            .filter_map(|(base, _)| r.get(base))
            .filter(|r| r.device == device)
            .map(|r| r.size)
            .sum()
    }

    /// Gives back the memory executable graphs hold where `which(exec, device)` says so,
    /// then the addresses of destroyed graphs no one holds any more.
    fn graph_mem_drop(&mut self, which: impl Fn(u64, u32) -> bool) {
        let mut dropped = Vec::new();
        for (exec, held) in &mut self.graph_memory.held {
            let r = &self.graph_memory.reserved;
            held.retain(|(base, _)| {
                let device = r.get(base).map_or(0, |r| r.device);
                let drop = which(*exec, device);
                if drop {
                    dropped.push(*base);
                }
                !drop
            });
        }
        self.graph_memory.held.retain(|_, held| !held.is_empty());
        for base in dropped {
            let _ = self.unmap_one(base);
        }
        let held: Vec<u64> = self
            .graph_memory
            .held
            .values()
            .flatten()
            .map(|(b, _)| *b)
            .collect();
        let gone: Vec<u64> = self
            .graph_memory
            .reserved
            .iter()
            .filter(|(base, r)| r.orphaned && !held.contains(base))
            .map(|(base, _)| *base)
            .collect();
        for base in gone {
            self.graph_memory.reserved.remove(&base);
            self.free_reservation(base);
        }
    }

    /// `cuGraphExecDestroy`: the executable graph's memory goes with it.
    pub fn graph_exec_destroy(&mut self, exec: u64) -> CuResult<()> {
        self.graphs.exec_destroy(exec)?;
        self.user_objects.owner_gone(exec);
        self.graph_mem_drop(|e, _| e == exec);
        Ok(())
    }

    /// `cuGraphDestroy`: its allocation nodes' addresses go once no executable graph holds
    /// them.
    pub fn graph_destroy(&mut self, graph: u64) -> CuResult<()> {
        self.graphs.destroy(graph)?;
        self.user_objects.owner_gone(graph);
        for r in self.graph_memory.reserved.values_mut() {
            if r.graph == graph {
                r.orphaned = true;
            }
        }
        self.graph_mem_drop(|_, _| false);
        Ok(())
    }

    /// `cuDeviceGraphMemTrim`: the memory executable graphs hold on `device` goes back; their
    /// next launch gets fresh memory. (It does not wait for launches in flight, whose copies
    /// into that memory then fail with the driver's error.)
    pub fn graph_mem_trim(&mut self, device: i32) -> CuResult<()> {
        let device = self.config.check_device(device)?;
        self.graph_mem_drop(|_, d| d == device);
        Ok(())
    }

    /// `cuDeviceGetGraphMemAttribute`: what executable graphs hold (nothing is cached beyond
    /// it, so reserved equals used), and its high-water mark.
    pub fn graph_mem_attribute(&self, device: i32, attribute: u32) -> CuResult<u64> {
        let device = self.config.check_device(device)?;
        let used = self.graph_mem_used(device);
        Ok(match attribute {
            USED_MEM_CURRENT | RESERVED_MEM_CURRENT => used,
            USED_MEM_HIGH | RESERVED_MEM_HIGH => self
                .graph_memory
                .high
                .get(&device)
                .copied()
                .unwrap_or(0)
                .max(used),
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// `cuDeviceSetGraphMemAttribute`: a high-water mark may be reset (to 0, which reads as
    /// what is held now).
    pub fn graph_mem_set_attribute(
        &mut self,
        device: i32,
        attribute: u32,
        value: u64,
    ) -> CuResult<()> {
        let device = self.config.check_device(device)?;
        if !matches!(attribute, USED_MEM_HIGH | RESERVED_MEM_HIGH) || value != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let used = self.graph_mem_used(device);
        self.graph_memory.high.insert(device, used);
        Ok(())
    }
}
