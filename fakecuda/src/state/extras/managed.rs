//! The managed tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::extras::managed`.

use crate::abi::consts as c;
use std::collections::HashMap;

/// The page advice is kept for.
pub(crate) const PAGE: u64 = 4096;

/// `CU_DEVICE_CPU` and `CU_DEVICE_INVALID` in the legacy (device-ordinal) attributes.
pub const DEVICE_CPU: i32 = -1;

pub const DEVICE_INVALID: i32 = -2;

/// `CUmem_advise`.
pub(crate) const SET_READ_MOSTLY: u32 = 1;

pub(crate) const UNSET_ACCESSED_BY: u32 = 6;

/// `CUmem_range_attribute`.
pub(crate) const READ_MOSTLY: u32 = 1;

pub(crate) const PREFERRED_LOCATION: u32 = 2;

pub(crate) const ACCESSED_BY: u32 = 3;

pub(crate) const LAST_PREFETCH_LOCATION: u32 = 4;

pub(crate) const PREFERRED_LOCATION_TYPE: u32 = 5;

pub(crate) const PREFERRED_LOCATION_ID: u32 = 6;

pub(crate) const LAST_PREFETCH_LOCATION_TYPE: u32 = 7;

pub(crate) const LAST_PREFETCH_LOCATION_ID: u32 = 8;

/// A location advice names: a device, the host, or a host NUMA node. `None` where unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Device(u32),
    Host,
    HostNuma(u32),
}

impl Place {
    /// The legacy attributes' device ordinal: the CPU for any host location.
    pub(crate) fn ordinal(place: Option<Place>) -> i32 {
        match place {
            Some(Place::Device(d)) => d as i32,
            Some(Place::Host | Place::HostNuma(_)) => DEVICE_CPU,
            None => DEVICE_INVALID,
        }
    }

    /// `(CUmemLocationType, id)`; `CU_MEM_LOCATION_TYPE_INVALID` (0) where unset.
    pub(crate) fn location(place: Option<Place>) -> (u32, i32) {
        match place {
            Some(Place::Device(d)) => (c::LOCATION_TYPE_DEVICE, d as i32),
            Some(Place::Host) => (c::LOCATION_TYPE_HOST, 0),
            Some(Place::HostNuma(n)) => (c::LOCATION_TYPE_HOST_NUMA, n as i32),
            None => (0, 0),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Page {
    pub(crate) read_mostly: bool,
    pub(crate) preferred: Option<Place>,
    /// Devices (by ordinal) and the CPU (`None`) advised to access the page.
    pub(crate) accessed_by: Vec<Option<u32>>,
    pub(crate) last_prefetch: Option<Place>,
}

/// Advice of every managed allocation that got some, by buffer id: one entry per page.
#[derive(Debug, Default)]
pub struct Advice {
    pub(crate) pages: HashMap<u64, Vec<Page>>,
}

/// One attribute's value: a single int, or the `ACCESSED_BY` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeValue {
    Int(i32),
    List(Vec<i32>),
}
