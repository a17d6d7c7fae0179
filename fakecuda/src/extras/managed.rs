//! Advice and prefetches for managed memory (`cuMemAdvise`, `cuMemPrefetchAsync`) and what
//! `cuMemRangeGetAttribute(s)` reads back, kept per page as the driver keeps it. Nothing
//! migrates here (managed memory is host memory every device and the CPU reach), so advice
//! changes no behaviour; it is remembered and reported.

use crate::abi::{RawLocation, consts as c};
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::extras::managed::{
    ACCESSED_BY, DEVICE_CPU, DEVICE_INVALID, LAST_PREFETCH_LOCATION, LAST_PREFETCH_LOCATION_ID,
    LAST_PREFETCH_LOCATION_TYPE, PAGE, PREFERRED_LOCATION, PREFERRED_LOCATION_ID,
    PREFERRED_LOCATION_TYPE, Page, Place, READ_MOSTLY, RangeValue, SET_READ_MOSTLY,
    UNSET_ACCESSED_BY,
};

impl DriverState {
    /// The pages of managed memory `[ptr, ptr + count)` covers: (buffer, first page, end page),
    /// within one allocation; anything else is `CUDA_ERROR_INVALID_VALUE`.
    fn managed_pages(&self, ptr: u64, count: u64) -> CuResult<(u64, usize, usize)> {
        let (base, size, buffer, managed) = self
            .allocation_of(ptr)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let end = ptr
            .checked_add(count)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        if !managed || count == 0 || end > base + size {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let first = ((ptr - base) / PAGE) as usize;
        let last = (end - base).div_ceil(PAGE) as usize;
        Ok((buffer, first, last))
    }

    fn pages_mut(&mut self, ptr: u64, count: u64) -> CuResult<&mut [Page]> {
        let (buffer, first, last) = self.managed_pages(ptr, count)?;
        let (_, size, _, _) = self.allocation_of(ptr).expect("checked above");
        let total = size.div_ceil(PAGE) as usize;
        let pages = self
            .advice
            .pages
            .entry(buffer)
            .or_insert_with(|| vec![Page::default(); total]);
        Ok(&mut pages[first..last])
    }

    /// A location advice or a prefetch names: a device, the host, a host NUMA node (the
    /// calling thread's, for `HOST_NUMA_CURRENT`: node 0 here).
    pub fn advice_place(&self, at: RawLocation) -> CuResult<Place> {
        match at.type_ {
            t if t == c::LOCATION_TYPE_DEVICE => {
                Ok(Place::Device(self.config.check_device(at.id)?))
            }
            t if t == c::LOCATION_TYPE_HOST => Ok(Place::Host),
            t if t == c::LOCATION_TYPE_HOST_NUMA => {
                Ok(Place::HostNuma(self.config.check_numa_node(at.id)?))
            }
            t if t == c::LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(Place::HostNuma(0)),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// The legacy ABI's device argument: an ordinal, or `CU_DEVICE_CPU`.
    pub fn advice_device(&self, device: i32) -> CuResult<Place> {
        if device == DEVICE_CPU {
            return Ok(Place::Host);
        }
        Ok(Place::Device(self.config.check_device(device)?))
    }

    /// `cuMemAdvise`: read-mostly and preferred location set or unset, a location added to or
    /// removed from those that access the range (the location is ignored for read-mostly).
    pub fn mem_advise(&mut self, ptr: u64, count: u64, advice: u32, at: Place) -> CuResult<()> {
        if !(SET_READ_MOSTLY..=UNSET_ACCESSED_BY).contains(&advice) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let accessor = match at {
            Place::Device(d) => Some(d),
            Place::Host | Place::HostNuma(_) => None,
        };
        for page in self.pages_mut(ptr, count)? {
            match advice {
                1 => page.read_mostly = true,
                2 => page.read_mostly = false,
                3 => page.preferred = Some(at),
                4 => page.preferred = None,
                5 if !page.accessed_by.contains(&accessor) => page.accessed_by.push(accessor),
                5 => {}
                _ => page.accessed_by.retain(|a| *a != accessor),
            }
        }
        Ok(())
    }

    /// Checks a prefetch of `[ptr, ptr + count)` (managed memory in one allocation).
    pub fn check_prefetch(&self, ptr: u64, count: u64) -> CuResult<()> {
        self.managed_pages(ptr, count).map(drop)
    }

    /// A prefetch reached in stream order: the range's last prefetch location.
    pub fn prefetched(&mut self, ptr: u64, count: u64, to: Place) -> CuResult<()> {
        for page in self.pages_mut(ptr, count)? {
            page.last_prefetch = Some(to);
        }
        Ok(())
    }

    /// `cuMemRangeGetAttribute`: what holds for every page of the range (read-mostly only if
    /// all are, a location only if all share it, the accessors all have), in `size` bytes.
    pub fn range_attribute(
        &self,
        attribute: u32,
        size: usize,
        ptr: u64,
        count: u64,
    ) -> CuResult<RangeValue> {
        let (buffer, first, last) = self.managed_pages(ptr, count)?;
        let unadvised = vec![Page::default(); last - first];
        let pages = self
            .advice
            .pages
            .get(&buffer)
            .map_or(&unadvised[..], |p| &p[first..last]);
        let common = |of: fn(&Page) -> Option<Place>| {
            let first = of(&pages[0]);
            pages
                .iter()
                .all(|p| of(p) == first)
                .then_some(first)
                .flatten()
        };
        let int = |v: i32| {
            if size == 4 {
                Ok(RangeValue::Int(v))
            } else {
                Err(CuError::CUDA_ERROR_INVALID_VALUE)
            }
        };
        match attribute {
            READ_MOSTLY => int(i32::from(pages.iter().all(|p| p.read_mostly))),
            PREFERRED_LOCATION => int(Place::ordinal(common(|p| p.preferred))),
            LAST_PREFETCH_LOCATION => int(Place::ordinal(common(|p| p.last_prefetch))),
            PREFERRED_LOCATION_TYPE => int(Place::location(common(|p| p.preferred)).0 as i32),
            PREFERRED_LOCATION_ID => int(Place::location(common(|p| p.preferred)).1),
            LAST_PREFETCH_LOCATION_TYPE => {
                int(Place::location(common(|p| p.last_prefetch)).0 as i32)
            }
            LAST_PREFETCH_LOCATION_ID => int(Place::location(common(|p| p.last_prefetch)).1),
            ACCESSED_BY => {
                if size == 0 || !size.is_multiple_of(4) {
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
                let mut all: Vec<Option<u32>> = pages[0]
                    .accessed_by
                    .iter()
                    .copied()
                    .filter(|a| pages.iter().all(|p| p.accessed_by.contains(a)))
                    .collect();
                // Devices by ordinal, then the CPU; the rest of the array is CU_DEVICE_INVALID.
                all.sort_by_key(|a| a.map_or(u64::MAX, u64::from));
                let mut list: Vec<i32> = all
                    .iter()
                    .map(|a| a.map_or(DEVICE_CPU, |d| d as i32))
                    .collect();
                list.resize(size / 4, DEVICE_INVALID);
                Ok(RangeValue::List(list))
            }
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Forgets the advice of an allocation that is freed.
    pub fn forget_advice(&mut self, buffer: u64) {
        self.advice.pages.remove(&buffer);
        self.sync_memops.remove(&buffer);
    }
}
