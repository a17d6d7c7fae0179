//! Virtual memory management: physical allocations (memfds), address reservations
//! (`PROT_NONE` mappings), mappings (`MAP_FIXED|MAP_SHARED` views of a memfd) and access
//! (`mprotect`), with CUDA's reference rules for handles and mappings.

use crate::abi::{RawAccessDesc, RawAllocProp, RawLocation, consts as c};
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys::{self, GRANULARITY};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Where an allocation's bytes live: on the "device" (a memfd) or, after a native checkpoint,
/// in private host memory.
#[derive(Debug)]
pub enum Backing {
    Device(OwnedFd),
    Host(Vec<u8>),
}

#[derive(Debug)]
pub struct PhysAlloc {
    pub size: u64,
    /// `CU_MEM_LOCATION_TYPE_DEVICE` or `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
    pub location_type: u32,
    /// The device ordinal, or the NUMA node of host memory.
    pub device: u32,
    pub handle_types: u32,
    pub backing: Backing,
    /// Outstanding handle references (cuMemCreate/Import/Retain minus cuMemRelease).
    pub handle_refs: u32,
    /// Mappings and multicast bindings that keep the memory alive.
    pub users: u32,
    /// Ever exported to a shareable handle (an FD may still be open somewhere).
    pub exported: bool,
    /// Created by an import of another allocation's FD.
    pub imported: bool,
    /// A native IPC handle was handed out for it.
    pub ipc_handle: bool,
    /// A peer's allocation opened with cuIpcOpenMemHandle.
    pub ipc_opened: bool,
    /// Made by cuMemAlloc: has no generic handle the application may use.
    pub legacy: bool,
}

impl PhysAlloc {
    pub fn fd(&self) -> CuResult<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Device(fd) => Ok(fd.as_fd()),
            Backing::Host(_) => Err(CuError::CUDA_ERROR_ILLEGAL_STATE),
        }
    }

    /// Sharing that NVIDIA's native checkpoint cannot handle.
    pub fn shared(&self) -> bool {
        self.exported || self.imported || self.ipc_handle || self.ipc_opened
    }

    /// Host (NUMA node) memory rather than device memory.
    pub fn on_host(&self) -> bool {
        self.location_type == c::LOCATION_TYPE_HOST_NUMA
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Alloc(u64),
    Multicast(u64),
}

#[derive(Debug)]
pub struct Mapping {
    pub size: u64,
    pub offset: u64,
    pub target: Target,
    /// Granted access per device ordinal.
    pub access: BTreeMap<u32, u32>,
    /// Granted access per host NUMA node (host memory only).
    pub host_access: BTreeMap<u32, u32>,
}

impl Mapping {
    /// Host protection: the CPU stands in for every device and node, so the widest grant
    /// applies.
    pub fn prot(&self) -> i32 {
        sys::prot_for(
            self.access
                .values()
                .chain(self.host_access.values())
                .copied()
                .max()
                .unwrap_or(c::ACCESS_NONE),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// cuMemAddressReserve.
    User,
    /// Inside fakecuda: cuMemAlloc and cuIpcOpenMemHandle ranges.
    Internal,
}

#[derive(Debug)]
pub struct Reservation {
    pub size: u64,
    pub owner: Owner,
}

#[derive(Debug, Default)]
pub struct Vmm {
    pub allocs: HashMap<u64, PhysAlloc>,
    pub mappings: BTreeMap<u64, Mapping>,
    pub reservations: BTreeMap<u64, Reservation>,
    used: HashMap<u32, u64>,
}

pub fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

/// Memfd names carry what an importer in another process must know: the location (`d` and
/// the device ordinal, or `n` and the host NUMA node) and the requested handle types.
pub fn alloc_memfd_name(location_type: u32, id: u32, handle_types: u32) -> String {
    let kind = if location_type == c::LOCATION_TYPE_HOST_NUMA {
        'n'
    } else {
        'd'
    };
    format!("fakecuda-alloc:{kind}{id}:t{handle_types}")
}

/// (location type, id, handle types) of an allocation memfd's name.
fn parse_alloc_memfd_name(name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix("fakecuda-alloc:")?;
    let location_type = match rest.chars().next()? {
        'd' => c::LOCATION_TYPE_DEVICE,
        'n' => c::LOCATION_TYPE_HOST_NUMA,
        _ => return None,
    };
    let (id, t) = rest[1..].split_once(":t")?;
    Some((location_type, id.parse().ok()?, t.parse().ok()?))
}

impl Vmm {
    pub fn mapping_at(&self, ptr: u64) -> Option<(u64, &Mapping)> {
        let (start, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < start + m.size).then_some((*start, m))
    }

    /// The reservation containing `[ptr, ptr+size)`, if one does entirely.
    pub fn reservation_for(&self, ptr: u64, size: u64) -> Option<(u64, &Reservation)> {
        let (start, r) = self.reservations.range(..=ptr).next_back()?;
        let end = ptr.checked_add(size)?;
        (end <= start + r.size).then_some((*start, r))
    }

    /// Starts of the mappings that exactly tile `[ptr, ptr+size)`, none cut in part.
    pub fn tiling(&self, ptr: u64, size: u64) -> CuResult<Vec<u64>> {
        let end = ptr
            .checked_add(size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let mut at = ptr;
        let mut out = Vec::new();
        while at < end {
            let m = self
                .mappings
                .get(&at)
                .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            out.push(at);
            at += m.size;
        }
        if at != end || out.is_empty() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(out)
    }

    pub fn used(&self, device: u32) -> u64 {
        self.used.get(&device).copied().unwrap_or(0)
    }
}

impl Driver {
    /// Checks that `[ptr, ptr+len)` is mapped device memory the CPU may read (and write): what
    /// a copy engine would touch. Unmapped memory is an invalid value; mapped memory without
    /// the access (or a multicast range with no memory bound for the view's device) is an
    /// illegal address, as a GPU fault would report it.
    pub fn check_range(&self, ptr: u64, len: u64, write: bool) -> CuResult<()> {
        if len == 0 {
            return Ok(());
        }
        let end = ptr
            .checked_add(len)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let mut at = ptr;
        while at < end {
            let (start, m) = self
                .vmm
                .mapping_at(at)
                .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
            let need = if write {
                libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            if m.prot() & need == 0 {
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

    /// Creates a physical allocation backed by a fresh memfd: device memory (counted against
    /// the device's memory) or host NUMA memory (`location_type`).
    pub fn alloc_create(
        &mut self,
        size: u64,
        location_type: u32,
        device: u32,
        handle_types: u32,
        legacy: bool,
    ) -> CuResult<u64> {
        let on_host = location_type == c::LOCATION_TYPE_HOST_NUMA;
        let used = self.vmm.used(device);
        if !on_host
            && used
                .checked_add(size)
                .is_none_or(|u| u > self.config.memory)
        {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let fd = sys::new_memfd(&alloc_memfd_name(location_type, device, handle_types), size)?;
        let h = self.next_handle();
        self.vmm.allocs.insert(
            h,
            PhysAlloc {
                size,
                location_type,
                device,
                handle_types,
                backing: Backing::Device(fd),
                handle_refs: u32::from(!legacy),
                users: 0,
                exported: false,
                imported: false,
                ipc_handle: false,
                ipc_opened: false,
                legacy,
            },
        );
        if !on_host {
            *self.vmm.used.entry(device).or_default() += size;
        }
        Ok(h)
    }

    /// Frees an allocation once neither a handle nor a mapping refers to it.
    pub fn alloc_maybe_free(&mut self, h: u64) {
        let Some(a) = self.vmm.allocs.get(&h) else {
            return;
        };
        if a.handle_refs > 0 || a.users > 0 {
            return;
        }
        if let Some(a) = self.vmm.allocs.remove(&h)
            && !a.imported
            && !a.ipc_opened
            && !a.on_host()
            && let Some(u) = self.vmm.used.get_mut(&a.device)
        {
            *u = u.saturating_sub(a.size);
        }
    }

    /// An allocation the application holds a handle to.
    fn alloc_by_handle(&mut self, h: u64) -> CuResult<&mut PhysAlloc> {
        self.vmm
            .allocs
            .get_mut(&h)
            .filter(|a| a.handle_refs > 0)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn mem_create(&mut self, size: u64, prop: &RawAllocProp, flags: u64) -> CuResult<u64> {
        if flags != 0 || prop.type_ != c::ALLOCATION_TYPE_PINNED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let location_type = prop.location.type_;
        let device = match location_type {
            t if t == c::LOCATION_TYPE_DEVICE => self.config.check_device(prop.location.id)?,
            t if t == c::LOCATION_TYPE_HOST_NUMA => {
                self.config.check_numa_node(prop.location.id)?
            }
            // Plain host, current-NUMA-node and invalid locations: not modelled.
            t if t == c::LOCATION_TYPE_HOST || t == c::LOCATION_TYPE_HOST_NUMA_CURRENT => {
                return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
            }
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        if size == 0 || !aligned(size) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let types = prop.requested_handle_types;
        if types & !c::HANDLE_TYPES_ALL != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if types & (c::HANDLE_TYPE_WIN32 | c::HANDLE_TYPE_WIN32_KMT) != 0 {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        // FABRIC is accepted here and refused at export, as a driver without IMEX does.
        self.alloc_create(size, location_type, device, types, false)
    }

    /// cuMemRelease: for allocations and multicast objects alike.
    pub fn mem_release(&mut self, h: u64) -> CuResult<()> {
        if self.mc.objects.contains_key(&h) {
            return self.mc_release(h);
        }
        let a = self.alloc_by_handle(h)?;
        a.handle_refs -= 1;
        self.alloc_maybe_free(h);
        Ok(())
    }

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
        let align = if align == 0 { GRANULARITY } else { align };
        if !align.is_power_of_two() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let align = align.max(GRANULARITY);
        self.reserve_internal(size, align, hint, Owner::User)
    }

    /// Maps all of allocation `h` at a fresh internal reservation, read-write for `device`:
    /// the shape of `cuMemAlloc` and of an opened IPC handle. On failure nothing stays mapped
    /// or reserved, and the allocation is freed unless something else holds it.
    pub fn map_whole_readwrite(&mut self, h: u64, size: u64, device: u32) -> CuResult<u64> {
        let base = match self.reserve_internal(size, GRANULARITY, 0, Owner::Internal) {
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
                let a = self
                    .vmm
                    .allocs
                    .get_mut(&h)
                    .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
                // SAFETY: `ptr..ptr+size` lies in a fakecuda reservation with no mapping in it
                // (checked by the caller).
                unsafe { sys::map_shared(ptr, size, a.fd()?, offset, libc::PROT_NONE)? };
                a.users += 1;
            }
            Target::Multicast(h) => {
                let m = self
                    .mc
                    .objects
                    .get_mut(&h)
                    .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
                m.users += 1;
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
            let m = self
                .vmm
                .mappings
                .get_mut(&s)
                .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
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
        let m = self
            .vmm
            .mappings
            .get(&start)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
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

    /// cuMemRetainAllocationHandle: the very handle value that was mapped, one more reference.
    pub fn retain_handle(&mut self, addr: u64) -> CuResult<u64> {
        let (_, m) = self
            .vmm
            .mapping_at(addr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        match m.target {
            Target::Alloc(h) => {
                let a = self
                    .vmm
                    .allocs
                    .get_mut(&h)
                    .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
                if a.legacy || a.ipc_opened {
                    // Not VMM memory: there is no generic handle to return.
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
                a.handle_refs += 1;
                Ok(h)
            }
            Target::Multicast(h) => {
                let o = self
                    .mc
                    .objects
                    .get_mut(&h)
                    .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
                o.handle_refs += 1;
                Ok(h)
            }
        }
    }

    pub fn alloc_props(&mut self, h: u64) -> CuResult<RawAllocProp> {
        let a = self.alloc_by_handle(h)?;
        Ok(RawAllocProp {
            type_: c::ALLOCATION_TYPE_PINNED,
            requested_handle_types: a.handle_types,
            location: RawLocation {
                type_: a.location_type,
                id: a.device as i32,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        })
    }

    /// cuMemExportToShareableHandle: a new FD for each call.
    pub fn export(&mut self, h: u64, handle_type: u32, flags: u64) -> CuResult<OwnedFd> {
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if self.mc.objects.contains_key(&h) {
            return self.mc_export(h, handle_type);
        }
        let a = self.alloc_by_handle(h)?;
        check_export_type(handle_type, a.handle_types)?;
        let fd = sys::dup_cloexec(a.fd()?)?;
        a.exported = true;
        Ok(fd)
    }

    /// What cuMemImportFromShareableHandle answers for `handle_type` before looking at the
    /// handle: only POSIX FDs import here (fabric needs IMEX, Win32 another OS).
    pub fn import_type_check(&self, handle_type: u32) -> CuResult<()> {
        match handle_type {
            t if t == c::HANDLE_TYPE_POSIX_FD => Ok(()),
            t if t == c::HANDLE_TYPE_FABRIC => Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
            t if t == c::HANDLE_TYPE_WIN32 || t == c::HANDLE_TYPE_WIN32_KMT => {
                Err(CuError::CUDA_ERROR_NOT_SUPPORTED)
            }
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// cuMemImportFromShareableHandle: a new handle for every import, even of the same FD.
    pub fn import(&mut self, fd: BorrowedFd<'_>, handle_type: u32) -> CuResult<u64> {
        self.import_type_check(handle_type)?;
        let name = sys::memfd_name(fd).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if let Some((location_type, device, types)) = parse_alloc_memfd_name(&name) {
            let size = sys::file_size(fd)?;
            let own = sys::dup_cloexec(fd)?;
            let h = self.next_handle();
            self.vmm.allocs.insert(
                h,
                PhysAlloc {
                    size,
                    location_type,
                    device,
                    handle_types: types,
                    backing: Backing::Device(own),
                    handle_refs: 1,
                    users: 0,
                    exported: false,
                    imported: true,
                    ipc_handle: false,
                    ipc_opened: false,
                    legacy: false,
                },
            );
            return Ok(h);
        }
        self.mc_import(fd, &name)
    }
}

/// Which shareable handle types an object created with `requested` may be exported as.
pub fn check_export_type(handle_type: u32, requested: u32) -> CuResult<()> {
    match handle_type {
        t if t == c::HANDLE_TYPE_FABRIC => Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
        t if t == c::HANDLE_TYPE_POSIX_FD => {
            if requested & c::HANDLE_TYPE_POSIX_FD == 0 {
                Err(CuError::CUDA_ERROR_INVALID_VALUE)
            } else {
                Ok(())
            }
        }
        t if t == c::HANDLE_TYPE_WIN32 || t == c::HANDLE_TYPE_WIN32_KMT => {
            Err(CuError::CUDA_ERROR_NOT_SUPPORTED)
        }
        _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
    }
}
