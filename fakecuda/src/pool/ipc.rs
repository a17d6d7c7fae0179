//! Pool IPC: a pool exported as a small memfd naming its creator, pointers exported as 64
//! bytes naming an allocation, and imports that fetch the allocation's memfd from the
//! creator and map it, so the bytes are really shared.

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::pool::Place;
use crate::sys;

const POOL_MAGIC: &[u8; 8] = b"FKCUPOOL";
const POINTER_MAGIC: &[u8; 8] = b"FKCUPPTR";
/// `CUmemPoolPtrExportData`.
pub const POINTER_BYTES: usize = 64;
/// In an exported pool's place: the pool is a host NUMA node's (the low bits its number).
const HOST_NUMA_PLACE: u64 = 1 << 32;

/// What an exported pointer names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub pid: u32,
    pub pool: u64,
    pub alloc: u64,
    pub size: u64,
}

impl DriverState {
    /// `cuMemPoolExportToShareableHandle`: a memfd naming this process and the pool.
    pub fn pool_export(
        &mut self,
        h: u64,
        handle_type: u32,
        flags: u64,
    ) -> CuResult<std::os::fd::OwnedFd> {
        let p = self.pool(h)?;
        if flags != 0 || handle_type != c::HANDLE_TYPE_POSIX_FD || p.handle_types != handle_type {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if p.imported.is_some() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // The place: a device's ordinal, or a host NUMA node's with HOST_NUMA_PLACE set.
        let place = match p.place {
            Place::HostNuma(node) => HOST_NUMA_PLACE | u64::from(node),
            _ => u64::from(p.device()),
        };
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(POOL_MAGIC);
        bytes[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        bytes[16..24].copy_from_slice(&h.to_le_bytes());
        bytes[24..32].copy_from_slice(&place.to_le_bytes());
        let fd = sys::new_memfd("fakecuda-pool", bytes.len() as u64)?;
        sys::write_all(&fd, &bytes)?;
        self.pool_mut(h)?.exported = true;
        Ok(fd)
    }

    /// `cuMemPoolImportFromShareableHandle`: a local pool standing for the creator's.
    pub fn pool_import(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        handle_type: u32,
        flags: u64,
    ) -> CuResult<u64> {
        if flags != 0 || handle_type != c::HANDLE_TYPE_POSIX_FD {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = sys::read_all(fd, 32).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        if bytes.len() != 32 || &bytes[..8] != POOL_MAGIC {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let pid =
            u32::try_from(sys::le_u64(&bytes, 8)).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        let (remote, place) = (sys::le_u64(&bytes, 16), sys::le_u64(&bytes, 24));
        if pid == std::process::id() {
            // The creator's own export names the pool it already has.
            return self.pool(remote).map(|_| remote);
        }
        let id = i32::try_from(place & !HOST_NUMA_PLACE)
            .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        let place = if place & HOST_NUMA_PLACE != 0 {
            Place::HostNuma(self.config.check_numa_node(id)?)
        } else {
            Place::Device(self.config.check_device(id)?)
        };
        Ok(self.new_pool_with(place, false, 0, handle_type, Some((pid, remote))))
    }

    /// `cuMemPoolExportPointer`: the base of an allocation of a shareable pool.
    pub fn pool_export_pointer(&mut self, ptr: u64) -> CuResult<[u8; POINTER_BYTES]> {
        let &(h, alloc, size) = self
            .pools
            .allocations
            .get(&ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let p = self.pool(h)?;
        if p.handle_types != c::HANDLE_TYPE_POSIX_FD || p.imported.is_some() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // The control socket serves its FD from now on (and native checkpoint refuses).
        if let Some(a) = self.vmm.allocs.get_mut(&alloc) {
            a.ipc_handle = true;
        }
        let mut data = [0u8; POINTER_BYTES];
        data[..8].copy_from_slice(POINTER_MAGIC);
        data[8..16].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        data[16..24].copy_from_slice(&h.to_le_bytes());
        data[24..32].copy_from_slice(&alloc.to_le_bytes());
        data[32..40].copy_from_slice(&size.to_le_bytes());
        Ok(data)
    }

    /// `cuMemPoolImportPointer`, first half: the base when it is imported here already, or
    /// what to fetch from the creator.
    pub fn pool_import_existing(
        &self,
        h: u64,
        data: &[u8; POINTER_BYTES],
    ) -> CuResult<Result<u64, Named>> {
        if &data[..8] != POINTER_MAGIC {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let named = Named {
            pid: u32::try_from(sys::le_u64(data, 8))
                .map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?,
            pool: sys::le_u64(data, 16),
            alloc: sys::le_u64(data, 24),
            size: sys::le_u64(data, 32),
        };
        if self.pool(h)?.imported != Some((named.pid, named.pool)) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if named.size == 0 || !named.size.is_multiple_of(sys::granularity()) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(self
            .pools
            .imported_ptrs
            .get(&(named.pid, named.alloc))
            .map_or(Err(named), |&base| Ok(base)))
    }

    /// Second half: maps the creator's allocation FD with the imported pool's access.
    pub fn pool_import_map(
        &mut self,
        h: u64,
        named: Named,
        fd: std::os::fd::OwnedFd,
    ) -> CuResult<u64> {
        if let Some(&base) = self.pools.imported_ptrs.get(&(named.pid, named.alloc)) {
            return Ok(base);
        }
        if sys::file_size(std::os::fd::AsFd::as_fd(&fd))? < named.size {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let (location_type, id) = self.pool(h)?.place.memory();
        let alloc = self.next_handle();
        let opened = crate::state::vmm::PhysAlloc::opened_at(named.size, location_type, id, fd);
        self.vmm.allocs.insert(alloc, opened);
        let base = self.map_pool_memory(h, alloc, named.size)?;
        self.pools.allocations.insert(base, (h, alloc, named.size));
        self.pools
            .imported_ptrs
            .insert((named.pid, named.alloc), base);
        Ok(base)
    }
}

/// `cuMemPoolImportPointer` as a whole: the FD is fetched without holding the driver lock.
pub fn import_pointer(h: u64, data: &[u8; POINTER_BYTES]) -> CuResult<u64> {
    let named = match crate::driver::with(|d| d.pool_import_existing(h, data))? {
        Ok(base) => return Ok(base),
        Err(named) => named,
    };
    let fd = crate::checkpoint::client::fetch_ipc_fd(named.pid, named.alloc)?;
    crate::driver::with(|d| d.pool_import_map(h, named, fd))
}
