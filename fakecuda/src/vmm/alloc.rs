//! Physical allocations: creation, release, retained handles, properties, export and import.

use crate::abi::{RawAllocProp, RawLocation, consts as c};
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::vmm::{
    PhysAlloc, Target, aligned, alloc_memfd_name, check_export_type, parse_alloc_memfd_name,
};
use crate::sys;
use std::os::fd::{BorrowedFd, OwnedFd};

/// `CUmemAllocationProp.allocFlags.gpuDirectRDMACapable`: its byte in the flags.
const RDMA_FLAG: usize = 1;

impl DriverState {
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
                .is_none_or(|u| u > self.config.memory(device))
        {
            return Err(CuError::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let name = alloc_memfd_name(&self.config, location_type, device, handle_types)?;
        let fd = sys::new_memfd(&name, size)?;
        let h = self.next_handle();
        self.vmm.allocs.insert(
            h,
            PhysAlloc {
                handle_refs: u32::from(!legacy),
                legacy,
                ..PhysAlloc::new(size, (location_type, device), handle_types, fd)
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
    pub(super) fn alloc_by_handle(&mut self, h: u64) -> CuResult<&mut PhysAlloc> {
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
        let h = self.alloc_create(size, location_type, device, types, false)?;
        if let Some(a) = self.vmm.allocs.get_mut(&h) {
            a.rdma_capable = prop.alloc_flags[RDMA_FLAG] != 0;
        }
        Ok(h)
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

    /// cuMemRetainAllocationHandle: the very handle value that was mapped, one more reference.
    pub fn retain_handle(&mut self, addr: u64) -> CuResult<u64> {
        let (_, m) = self
            .vmm
            .mapping_at(addr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        match m.target {
            Target::Alloc(h) => {
                let a = self.vmm.alloc_mut(h, CuError::CUDA_ERROR_INVALID_VALUE)?;
                if a.legacy || a.ipc_opened {
                    // Not VMM memory: there is no generic handle to return.
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
                a.handle_refs += 1;
                Ok(h)
            }
            Target::Multicast(h) => {
                self.mc
                    .object_mut(h, CuError::CUDA_ERROR_INVALID_VALUE)?
                    .handle_refs += 1;
                Ok(h)
            }
        }
    }

    /// `cuMemGetAllocationGranularity`: one granularity for every pinned device or host NUMA
    /// location that exists.
    pub fn allocation_granularity(&self, p: &RawAllocProp, option: u32) -> CuResult<u64> {
        if option != c::GRANULARITY_MINIMUM && option != c::GRANULARITY_RECOMMENDED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if p.type_ != c::ALLOCATION_TYPE_PINNED {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        match p.location.type_ {
            t if t == c::LOCATION_TYPE_DEVICE => {
                self.config.check_device(p.location.id).map(drop)?
            }
            t if t == c::LOCATION_TYPE_HOST_NUMA => {
                self.config.check_numa_node(p.location.id).map(drop)?
            }
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(sys::granularity())
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
            alloc_flags: {
                let mut flags = [0; 8];
                flags[RDMA_FLAG] = u8::from(a.rdma_capable);
                flags
            },
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
        if let Some((location_type, id, types)) = parse_alloc_memfd_name(&name) {
            // A GPU by its machine index, as this process numbers it; one it does not see
            // cannot hold memory it imports.
            let device = if location_type == c::LOCATION_TYPE_DEVICE {
                self.config
                    .ordinal_of(id)
                    .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)?
            } else {
                id
            };
            let size = sys::file_size(fd)?;
            let own = sys::dup_cloexec(fd)?;
            let h = self.next_handle();
            self.vmm.allocs.insert(
                h,
                PhysAlloc {
                    handle_refs: 1,
                    imported: true,
                    ..PhysAlloc::new(size, (location_type, device), types, own)
                },
            );
            return Ok(h);
        }
        self.mc_import(fd, &name)
    }
}
