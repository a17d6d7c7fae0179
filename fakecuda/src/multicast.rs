//! Multicast objects (NVLS). The team (which devices joined) lives in a small shared memfd
//! page, so a multicast object exported to other processes keeps one membership; bindings and
//! mappings are per process, as each process binds and maps its own devices' memory.
//!
//! Model: the multicast mapping seen through device `d` (the first device granted access to
//! the mapping) shows the memory bound for `d` at that multicast offset, so bytes written
//! through a member are visible through its device's multicast view. Unbound ranges stay
//! inaccessible. Writes through the view reach that member only (no broadcast).

use crate::abi::consts as c;
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::multicast::{
    BindSource, Binding, McObject, TEAM_PAGE, Team, bind_wait, mc_memfd_name, parse_mc_memfd_name,
};
use crate::state::vmm::Target;
use crate::sys;
use cudarc::driver::sys::CUmulticastObjectProp;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl DriverState {
    fn mc_live(&mut self, h: u64) -> CuResult<&mut McObject> {
        self.mc
            .objects
            .get_mut(&h)
            .filter(|m| m.handle_refs > 0)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn mc_create(&mut self, prop: &CUmulticastObjectProp) -> CuResult<u64> {
        let size = prop.size as u64;
        let types =
            u32::try_from(prop.handleTypes).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?;
        if prop.numDevices == 0
            || prop.numDevices > crate::device::MAX_DEVICES
            || size == 0
            || !size.is_multiple_of(sys::granularity())
            || prop.flags != 0
            || types & !(c::HANDLE_TYPE_POSIX_FD | c::HANDLE_TYPE_FABRIC) != 0
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let fd = sys::new_memfd(
            &mc_memfd_name(prop.numDevices, size, types),
            TEAM_PAGE as u64,
        )?;
        let team = Team::map(fd)?;
        let h = self.next_handle();
        self.mc.objects.insert(
            h,
            McObject {
                num_devices: prop.numDevices,
                size,
                handle_types: types,
                team,
                bindings: Vec::new(),
                local_devices: Vec::new(),
                handle_refs: 1,
                users: 0,
                shared: false,
            },
        );
        Ok(h)
    }

    pub fn mc_add_device(&mut self, h: u64, dev: i32) -> CuResult<()> {
        let dev = self.config.check_device(dev)?;
        let m = self.mc_live(h)?;
        if !m.bindings.is_empty() {
            // The team is fixed once memory is bound.
            return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
        }
        let bit = 1u64 << dev;
        let members = m.team.members();
        let mut cur = members.load(Ordering::Acquire);
        loop {
            if cur & bit != 0 {
                return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
            }
            if cur.count_ones() >= m.num_devices {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            match members.compare_exchange(cur, cur | bit, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        m.local_devices.push(dev);
        Ok(())
    }

    /// Whether every device joined; `None` when the caller should wait (team shared with
    /// other processes that may still join).
    fn mc_team_state(&self, h: u64) -> CuResult<Option<bool>> {
        let m = self
            .mc
            .objects
            .get(&h)
            .filter(|m| m.handle_refs > 0)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        let complete = m.team.members().load(Ordering::Acquire).count_ones() >= m.num_devices;
        Ok(if complete {
            Some(true)
        } else if m.shared {
            None
        } else {
            Some(false)
        })
    }

    /// Resolves `(alloc, offset)` for a bind by address: the range must lie in one mapping.
    pub fn mc_resolve_addr(&self, ptr: u64, size: u64) -> CuResult<(u64, u64)> {
        let (start, m) = self
            .vmm
            .mapping_at(ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let Target::Alloc(a) = m.target else {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        };
        if ptr + size > start + m.size {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok((a, m.offset + (ptr - start)))
    }

    fn mc_bind_checked(
        &mut self,
        h: u64,
        dev: Option<u32>,
        mc_offset: u64,
        alloc: u64,
        mem_offset: u64,
        size: u64,
    ) -> CuResult<()> {
        if size == 0
            || !size.is_multiple_of(sys::granularity())
            || !mc_offset.is_multiple_of(sys::granularity())
            || !mem_offset.is_multiple_of(sys::granularity())
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let a = self
            .vmm
            .allocs
            .get(&alloc)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        if mem_offset.checked_add(size).is_none_or(|e| e > a.size) || a.on_host() {
            // Multicast objects bind device memory only.
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let device = a.device;
        if dev.is_some_and(|d| d != device) {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        let m = self.mc_live(h)?;
        if mc_offset.checked_add(size).is_none_or(|e| e > m.size) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        if !m.local_devices.contains(&device) {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        let overlaps = m.bindings.iter().any(|b| {
            b.device == device && b.mc_offset < mc_offset + size && mc_offset < b.mc_offset + b.size
        });
        if overlaps {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        m.bindings.push(Binding {
            device,
            mc_offset,
            size,
            alloc,
            mem_offset,
        });
        if let Some(a) = self.vmm.allocs.get_mut(&alloc) {
            a.users += 1;
        }
        self.mc_refresh_views(h)
    }

    pub fn mc_unbind(&mut self, h: u64, dev: i32, mc_offset: u64, size: u64) -> CuResult<()> {
        let dev = self.config.check_device(dev)?;
        if size == 0
            || !size.is_multiple_of(sys::granularity())
            || !mc_offset.is_multiple_of(sys::granularity())
        {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let m = self.mc_live(h)?;
        let end = mc_offset
            .checked_add(size)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let (gone, kept): (Vec<Binding>, Vec<Binding>) = m.bindings.iter().partition(|b| {
            b.device == dev && b.mc_offset >= mc_offset && b.mc_offset + b.size <= end
        });
        if gone.is_empty() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        m.bindings = kept;
        for b in gone {
            if let Some(a) = self.vmm.allocs.get_mut(&b.alloc) {
                a.users -= 1;
            }
            self.alloc_maybe_free(b.alloc);
        }
        self.mc_refresh_views(h)
    }

    fn mc_refresh_views(&mut self, h: u64) -> CuResult<()> {
        let starts: Vec<u64> = self
            .vmm
            .mappings
            .iter()
            .filter(|(_, m)| m.target == Target::Multicast(h))
            .map(|(s, _)| *s)
            .collect();
        for s in starts {
            self.mc_install_view(s)?;
        }
        Ok(())
    }

    /// Whether multicast offsets `[lo, hi)` of mapping `m` have memory bound for its view
    /// device.
    pub fn mc_view_backed(&self, h: u64, m: &crate::state::vmm::Mapping, lo: u64, hi: u64) -> bool {
        let Some(view_dev) = m
            .access
            .iter()
            .find(|(_, f)| **f != c::ACCESS_NONE)
            .map(|(d, _)| *d)
        else {
            return false;
        };
        let Some(obj) = self.mc.objects.get(&h) else {
            return false;
        };
        let mut bound: Vec<(u64, u64)> = obj
            .bindings
            .iter()
            .filter(|b| b.device == view_dev)
            .map(|b| (b.mc_offset, b.mc_offset + b.size))
            .collect();
        bound.sort_unstable();
        let mut at = lo;
        for (s, e) in bound {
            if s <= at && at < e {
                at = e;
            }
        }
        at >= hi
    }

    /// Rebuilds the host view of one multicast mapping from the bindings of its view device.
    pub fn mc_install_view(&mut self, start: u64) -> CuResult<()> {
        let m = self.vmm.mapping(start)?;
        let Target::Multicast(h) = m.target else {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        };
        let (size, offset, prot) = (m.size, m.offset, m.prot());
        let view_dev = m
            .access
            .iter()
            .find(|(_, f)| **f != c::ACCESS_NONE)
            .map(|(d, _)| *d);
        // SAFETY: the mapping lies in a fakecuda reservation; it is rebuilt below.
        unsafe { sys::unmap_to_reservation(start, size)? };
        let Some(view_dev) = view_dev else {
            return Ok(());
        };
        let obj = self
            .mc
            .objects
            .get(&h)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        for b in obj.bindings.iter().filter(|b| b.device == view_dev) {
            let lo = b.mc_offset.max(offset);
            let hi = (b.mc_offset + b.size).min(offset + size);
            if lo >= hi {
                continue;
            }
            let a = self
                .vmm
                .allocs
                .get(&b.alloc)
                .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
            // SAFETY: `start + (lo - offset) .. + (hi - lo)` lies within this mapping, which
            // lies in a fakecuda reservation.
            unsafe {
                sys::map_shared(
                    start + (lo - offset),
                    hi - lo,
                    a.fd()?,
                    b.mem_offset + (lo - b.mc_offset),
                    prot,
                )?;
            }
        }
        Ok(())
    }

    pub fn mc_release(&mut self, h: u64) -> CuResult<()> {
        let m = self.mc_live(h)?;
        m.handle_refs -= 1;
        self.mc_maybe_free(h);
        Ok(())
    }

    pub fn mc_maybe_free(&mut self, h: u64) {
        let Some(m) = self.mc.objects.get(&h) else {
            return;
        };
        if m.handle_refs > 0 || m.users > 0 {
            return;
        }
        if let Some(m) = self.mc.objects.remove(&h) {
            // Leave the team so a process re-creating a team from the same export does not
            // see stale members, then drop this process's bindings.
            for d in &m.local_devices {
                m.team.members().fetch_and(!(1u64 << d), Ordering::AcqRel);
            }
            for b in m.bindings {
                if let Some(a) = self.vmm.allocs.get_mut(&b.alloc) {
                    a.users -= 1;
                }
                self.alloc_maybe_free(b.alloc);
            }
        }
    }

    pub fn mc_export(&mut self, h: u64, handle_type: u32) -> CuResult<OwnedFd> {
        let m = self.mc_live(h)?;
        crate::state::vmm::check_export_type(handle_type, m.handle_types)?;
        let fd = sys::dup_cloexec(m.team.fd.as_fd())?;
        m.shared = true;
        Ok(fd)
    }

    pub fn mc_import(&mut self, fd: BorrowedFd<'_>, name: &str) -> CuResult<u64> {
        let (num_devices, size, handle_types) =
            parse_mc_memfd_name(name).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let team = Team::map(sys::dup_cloexec(fd)?)?;
        let h = self.next_handle();
        self.mc.objects.insert(
            h,
            McObject {
                num_devices,
                size,
                handle_types,
                team,
                bindings: Vec::new(),
                local_devices: Vec::new(),
                handle_refs: 1,
                users: 0,
                shared: true,
            },
        );
        Ok(h)
    }
}

/// cuMulticastBindMem/BindAddr (+ `_v2`). All devices must have joined first: a team only
/// this process knows about fails at once; a shared team waits (without holding the driver
/// lock) for the other processes to add theirs, as the real bind blocks.
pub fn bind(
    h: u64,
    dev: Option<i32>,
    mc_offset: u64,
    src: BindSource,
    size: u64,
    flags: u64,
) -> CuResult<()> {
    if flags != 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let deadline = Instant::now() + bind_wait();
    loop {
        match crate::driver::with(|d| d.mc_team_state(h))? {
            Some(true) => break,
            Some(false) => return Err(CuError::CUDA_ERROR_ILLEGAL_STATE),
            None if Instant::now() >= deadline => return Err(CuError::CUDA_ERROR_TIMEOUT),
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    crate::driver::with(|d| {
        let dev = dev.map(|x| d.config.check_device(x)).transpose()?;
        let (alloc, mem_offset) = match src {
            BindSource::Mem { handle, offset } => {
                let a = d
                    .vmm
                    .allocs
                    .get(&handle)
                    .filter(|a| a.handle_refs > 0 && !a.legacy);
                a.ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
                (handle, offset)
            }
            BindSource::Addr { ptr } => d.mc_resolve_addr(ptr, size)?,
        };
        d.mc_bind_checked(h, dev, mc_offset, alloc, mem_offset, size)
    })
}
