//! The virtual address space: reservations, mappings and access grants.

use crate::abi::{RawAccessDesc, RawLocation, consts as c};
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::vmm::{Mapping, Owner, Reservation, Target, aligned};
use crate::sys;
use std::collections::BTreeMap;

impl DriverState {
    pub fn address_reserve(
        &mut self,
        size: u64,
        align: u64,
        hint: u64,
        flags: u64,
    ) -> CuResult<u64> {
        if flags != 0 || size == 0 || !aligned(size) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let align = if align == 0 {
            sys::granularity()
        } else {
            align
        };
        if !align.is_power_of_two() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(sys::granularity());
        self.reserve_internal(size, align, hint, Owner::User)
    }

    /// Maps all of allocation `h` at a fresh internal reservation, read-write for `device`:
    /// the shape of `cuMemAlloc` and of an opened IPC handle. On failure nothing stays mapped
    /// or reserved, and the allocation is freed unless something else holds it.
    pub fn map_whole_readwrite(&mut self, h: u64, size: u64, device: u32) -> CuResult<u64> {
        let base = match self.reserve_internal(size, sys::granularity(), 0, Owner::Internal) {
            Ok(base) => base,
            Err(error) => {
                self.alloc_maybe_free(h);
                return Err(error);
            }
        };
        let mapped = self
            .map_target(base, size, 0, Target::Alloc(h))
            .and_then(|()| {
                if let Some(m) = self.vmm.mappings.get_mut(&base) {
                    m.access.insert(device, c::ACCESS_READWRITE);
                }
                self.apply_access(base)
            });
        if let Err(error) = mapped {
            let _ = self.unmap_one(base);
            self.free_reservation(base);
            self.alloc_maybe_free(h);
            return Err(error);
        }
        Ok(base)
    }

    pub fn reserve_internal(
        &mut self,
        size: u64,
        align: u64,
        hint: u64,
        owner: Owner,
    ) -> CuResult<u64> {
        let at = sys::reserve(hint, size, align)?;
        self.vmm
            .reservations
            .insert(at, Reservation { size, owner });
        Ok(at)
    }

    pub fn address_free(&mut self, ptr: u64, size: u64) -> CuResult<()> {
        match self.vmm.reservations.get(&ptr) {
            Some(r) if r.size == size && r.owner == Owner::User => {}
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        if self.vmm.mappings.range(ptr..ptr + size).next().is_some() {
            // The driver requires ranges to be unmapped before they are freed.
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.free_reservation(ptr);
        Ok(())
    }

    pub fn free_reservation(&mut self, ptr: u64) {
        if let Some(r) = self.vmm.reservations.remove(&ptr) {
            // SAFETY: the range was reserved by fakecuda and has just left the table, so no
            // fakecuda object refers to it any more.
            unsafe { sys::unreserve(ptr, r.size) };
        }
    }

    pub fn mem_map(
        &mut self,
        ptr: u64,
        size: u64,
        offset: u64,
        h: u64,
        flags: u64,
    ) -> CuResult<()> {
        if flags != 0 || size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let target = if let Some(m) = self.mc.objects.get(&h).filter(|m| m.handle_refs > 0) {
            if offset.checked_add(size).is_none_or(|e| e > m.size) {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            Target::Multicast(h)
        } else {
            let a = self.alloc_by_handle(h)?;
            if offset.checked_add(size).is_none_or(|e| e > a.size) {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            Target::Alloc(h)
        };
        self.vmm
            .reservation_for(ptr, size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if self.vmm.mapping_at(ptr).is_some()
            || self.vmm.mappings.range(ptr..ptr + size).next().is_some()
        {
            return Err(CuError::CUDA_ERROR_ALREADY_MAPPED);
        }
        self.map_target(ptr, size, offset, target)
    }

    /// Maps a target without handle-reference checks (also used by cuMemAlloc and IPC).
    pub fn map_target(&mut self, ptr: u64, size: u64, offset: u64, target: Target) -> CuResult<()> {
        match target {
            Target::Alloc(h) => {
                let a = self.vmm.alloc_mut(h, CuError::CUDA_ERROR_INVALID_HANDLE)?;
                // SAFETY: `ptr..ptr+size` lies in a fakecuda reservation with no mapping in it
                // (checked by the caller).
                unsafe { sys::map_shared(ptr, size, a.fd()?, offset, libc::PROT_NONE)? };
                a.users += 1;
            }
            Target::Multicast(h) => {
                self.mc
                    .object_mut(h, CuError::CUDA_ERROR_INVALID_HANDLE)?
                    .users += 1;
                // The view stays inaccessible until cuMemSetAccess picks the device.
            }
        }
        self.vmm.mappings.insert(
            ptr,
            Mapping {
                size,
                offset,
                target,
                access: BTreeMap::new(),
                host_access: BTreeMap::new(),
            },
        );
        Ok(())
    }

    pub fn mem_unmap(&mut self, ptr: u64, size: u64) -> CuResult<()> {
        if !aligned(ptr) || !aligned(size) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let starts = self.vmm.tiling(ptr, size)?;
        for s in starts {
            self.unmap_one(s)?;
        }
        Ok(())
    }

    pub fn unmap_one(&mut self, start: u64) -> CuResult<()> {
        let m = self
            .vmm
            .mappings
            .remove(&start)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the mapping was inside a fakecuda reservation and has left the table.
        unsafe { sys::unmap_to_reservation(start, m.size)? };
        match m.target {
            Target::Alloc(h) => {
                if let Some(a) = self.vmm.allocs.get_mut(&h) {
                    a.users -= 1;
                }
                self.alloc_maybe_free(h);
            }
            Target::Multicast(h) => {
                if let Some(o) = self.mc.objects.get_mut(&h) {
                    o.users -= 1;
                }
                self.mc_maybe_free(h);
            }
        }
        Ok(())
    }

    pub fn set_access(&mut self, ptr: u64, size: u64, descs: &[RawAccessDesc]) -> CuResult<()> {
        if descs.is_empty() || !aligned(ptr) || !aligned(size) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let mut grants = Vec::with_capacity(descs.len());
        for d in descs {
            let host = match d.location.type_ {
                t if t == c::LOCATION_TYPE_DEVICE => false,
                t if t == c::LOCATION_TYPE_HOST_NUMA => true,
                _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
            };
            let id = if host {
                self.config.check_numa_node(d.location.id)?
            } else {
                self.config.check_device(d.location.id)?
            };
            if ![c::ACCESS_NONE, c::ACCESS_READ, c::ACCESS_READWRITE].contains(&d.flags) {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            grants.push((host, id, d.flags));
        }
        let starts = self.vmm.tiling(ptr, size)?;
        // Host NUMA access exists for host memory only: check every mapping before changing one.
        if grants.iter().any(|(host, _, _)| *host) {
            for s in &starts {
                let on_host = match self.vmm.mappings.get(s).map(|m| m.target) {
                    Some(Target::Alloc(h)) => self.vmm.allocs.get(&h).is_some_and(|a| a.on_host()),
                    _ => false,
                };
                if !on_host {
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
            }
        }
        for s in starts {
            let m = self.vmm.mapping_mut(s)?;
            for (host, id, flags) in &grants {
                let table = if *host {
                    &mut m.host_access
                } else {
                    &mut m.access
                };
                if *flags == c::ACCESS_NONE {
                    table.remove(id);
                } else {
                    table.insert(*id, *flags);
                }
            }
            self.apply_access(s)?;
        }
        Ok(())
    }

    /// Makes the host view of one mapping match its access grants.
    pub fn apply_access(&mut self, start: u64) -> CuResult<()> {
        let m = self.vmm.mapping(start)?;
        match m.target {
            // SAFETY: the mapping is a fakecuda view inside a fakecuda reservation.
            Target::Alloc(_) => unsafe { sys::protect(start, m.size, m.prot()) },
            Target::Multicast(_) => self.mc_install_view(start),
        }
    }

    pub fn get_access(&self, location: &RawLocation, ptr: u64) -> CuResult<u32> {
        let host = match location.type_ {
            t if t == c::LOCATION_TYPE_DEVICE => false,
            t if t == c::LOCATION_TYPE_HOST_NUMA => true,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        let id = if host {
            self.config.check_numa_node(location.id)?
        } else {
            self.config.check_device(location.id)?
        };
        let (_, m) = self
            .vmm
            .mapping_at(ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let table = if host { &m.host_access } else { &m.access };
        Ok(table.get(&id).copied().unwrap_or(c::ACCESS_NONE))
    }
}
