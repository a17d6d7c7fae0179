//! The multicast tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::multicast`.

use crate::abi::consts as c;
use crate::error::{CuError, CuResult};
use crate::sys;
use cudarc::driver::sys::CUmulticastObjectProp;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The shared team page: devices that joined, as a bit mask.
#[derive(Debug)]
pub(crate) struct Team {
    pub(crate) fd: OwnedFd,
    pub(crate) page: *mut AtomicU64,
}

// SAFETY: the page is only accessed through the `AtomicU64` it holds, which is Sync; the
// mapping lives as long as the `Team`.
unsafe impl Send for Team {}

// SAFETY: as above.
unsafe impl Sync for Team {}

pub(crate) const TEAM_PAGE: usize = 4096;

impl Team {
    pub(crate) fn map(fd: OwnedFd) -> CuResult<Team> {
        let p = sys::map_page(fd.as_fd(), TEAM_PAGE).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(Team { fd, page: p.cast() })
    }

    pub(crate) fn members(&self) -> &AtomicU64 {
        // SAFETY: `page` points at a live, page-aligned shared mapping (see `map`), zero
        // initialised by the kernel, which is a valid AtomicU64.
        unsafe { &*self.page }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        // SAFETY: unmaps the page mapped in `map`; no reference to it outlives `self`.
        unsafe { libc::munmap(self.page.cast(), TEAM_PAGE) };
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Binding {
    pub device: u32,
    pub mc_offset: u64,
    pub size: u64,
    pub alloc: u64,
    pub mem_offset: u64,
}

#[derive(Debug)]
pub struct McObject {
    pub num_devices: u32,
    pub size: u64,
    pub handle_types: u32,
    pub(crate) team: Team,
    pub bindings: Vec<Binding>,
    /// Devices this process added.
    pub local_devices: Vec<u32>,
    pub handle_refs: u32,
    pub users: u32,
    /// Exported or imported: other processes may still join, so binds wait for the team.
    pub shared: bool,
}

#[derive(Debug, Default)]
pub struct Multicast {
    pub objects: HashMap<u64, McObject>,
}

impl Multicast {
    /// Object `h`, or `unknown` (the error the caller reports) where there is none.
    pub fn object_mut(&mut self, h: u64, unknown: CuError) -> CuResult<&mut McObject> {
        self.objects.get_mut(&h).ok_or(unknown)
    }
}

pub(crate) fn mc_memfd_name(num: u32, size: u64, types: u32) -> String {
    format!("fakecuda-mc:n{num}:s{size}:t{types}")
}

pub(crate) fn parse_mc_memfd_name(name: &str) -> Option<(u32, u64, u32)> {
    let rest = name.strip_prefix("fakecuda-mc:n")?;
    let (n, rest) = rest.split_once(":s")?;
    let (s, t) = rest.split_once(":t")?;
    Some((n.parse().ok()?, s.parse().ok()?, t.parse().ok()?))
}

/// How long a bind waits for other processes to add their devices.
pub(crate) fn bind_wait() -> Duration {
    let ms = std::env::var("FAKECUDA_MULTICAST_BIND_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    Duration::from_millis(ms)
}

pub fn granularity(prop: &CUmulticastObjectProp, option: u32) -> CuResult<u64> {
    if option != c::GRANULARITY_MINIMUM && option != c::GRANULARITY_RECOMMENDED {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    if prop.numDevices == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(sys::granularity())
}

/// A bind request, resolved in the driver once the team is complete.
#[derive(Debug, Clone, Copy)]
pub enum BindSource {
    Mem { handle: u64, offset: u64 },
    Addr { ptr: u64 },
}
