//! The vmm tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::vmm`.

use crate::abi::consts as c;
use crate::error::{CuError, CuResult};
use crate::sys;
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
    /// Created GPUDirect RDMA capable (`allocFlags.gpuDirectRDMACapable`), read back by
    /// `cuMemGetAllocationPropertiesFromHandle`.
    pub rdma_capable: bool,
    /// Made by cuMemAlloc: has no generic handle the application may use.
    pub legacy: bool,
}

impl PhysAlloc {
    /// Another process's device memory, opened here from its memfd (a legacy IPC handle or
    /// an imported pool pointer): no handle of its own, mapped by the opener.
    pub fn opened(size: u64, device: u32, fd: OwnedFd) -> PhysAlloc {
        PhysAlloc::opened_at(size, c::LOCATION_TYPE_DEVICE, device, fd)
    }

    /// [`PhysAlloc::opened`] for memory at any location: a device, or a host NUMA node (an
    /// imported pointer of a pinned host pool).
    pub fn opened_at(size: u64, location_type: u32, device: u32, fd: OwnedFd) -> PhysAlloc {
        PhysAlloc {
            ipc_opened: true,
            ..PhysAlloc::new(size, (location_type, device), 0, fd)
        }
    }

    /// A memfd's allocation at a location (`CUmemLocationType`, device or node) with no
    /// handle, mapping, export or import yet: each maker sets what differs.
    pub fn new(size: u64, at: (u32, u32), handle_types: u32, fd: OwnedFd) -> PhysAlloc {
        PhysAlloc {
            size,
            location_type: at.0,
            device: at.1,
            handle_types,
            backing: Backing::Device(fd),
            handle_refs: 0,
            users: 0,
            exported: false,
            imported: false,
            ipc_handle: false,
            ipc_opened: false,
            rdma_capable: false,
            legacy: false,
        }
    }

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
    pub(crate) used: HashMap<u32, u64>,
}

pub fn aligned(v: u64) -> bool {
    v.is_multiple_of(sys::granularity())
}

/// Memfd names carry what an importer in another process must know: the location (`d` and
/// the GPU's index on the machine, since ordinals are each process's own; or `n` and the host
/// NUMA node) and the requested handle types. `id` is this process's ordinal or node; an
/// ordinal it does not have is `CUDA_ERROR_INVALID_DEVICE`.
pub fn alloc_memfd_name(
    config: &crate::device::Config,
    location_type: u32,
    id: u32,
    handle_types: u32,
) -> CuResult<String> {
    if location_type == c::LOCATION_TYPE_HOST_NUMA {
        return Ok(format!("fakecuda-alloc:n{id}:t{handle_types}"));
    }
    let index = config
        .devices
        .get(id as usize)
        .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)?
        .index;
    Ok(format!("fakecuda-alloc:d{index}:t{handle_types}"))
}

/// (location type, id, handle types) of an allocation memfd's name.
pub(crate) fn parse_alloc_memfd_name(name: &str) -> Option<(u32, u32, u32)> {
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
    /// The mapping that starts at `start`.
    pub fn mapping(&self, start: u64) -> CuResult<&Mapping> {
        self.mappings
            .get(&start)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    pub fn mapping_mut(&mut self, start: u64) -> CuResult<&mut Mapping> {
        self.mappings
            .get_mut(&start)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// Allocation `h`, or `unknown` (the error the caller reports) where there is none.
    pub fn alloc_mut(&mut self, h: u64, unknown: CuError) -> CuResult<&mut PhysAlloc> {
        self.allocs.get_mut(&h).ok_or(unknown)
    }

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
