//! Managed memory's advice, prefetches and range attributes (see [`crate::extras::managed`]), in both
//! ABIs: the legacy one naming a device ordinal (`CU_DEVICE_CPU` for the host) and CUDA 12.2's
//! `_v2` naming a `CUmemLocation`, which cuda.h hands out from then on.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, with};
use crate::abi::RawLocation;
use crate::driver::{self, DriverState};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use crate::state::extras::managed::{Place, RangeValue};
use cudarc::driver::sys::{CUdevice, CUdeviceptr, CUstream};
use std::ffi::{c_uint, c_ulonglong, c_void};

fn advise(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_uint,
    at: impl FnOnce(&DriverState) -> CuResult<Place>,
) -> RawResult {
    with(|d| {
        let at = at(d)?;
        d.mem_advise(ptr, count as u64, advice, at)
    })
}

export! {
    safe fn cuMemAdvise(ptr: CUdeviceptr, count: usize, advice: c_uint, device: CUdevice) {
        advise(ptr, count, advice, |d| d.advice_device(device))
    }

    safe fn cuMemAdvise_v2(ptr: CUdeviceptr, count: usize, advice: c_uint, location: RawLocation) {
        advise(ptr, count, advice, |d| d.advice_place(location))
    }
}

/// Records the prefetch when the stream reaches it (nothing moves here).
fn prefetch(
    ptr: CUdeviceptr,
    count: usize,
    to: impl FnOnce(&DriverState) -> CuResult<Place>,
    flags: c_uint,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let to = driver::with(|d| {
            d.check_prefetch(ptr, count as u64)?;
            to(d)
        })?;
        memcpy::host_work(Some(stream as usize as u64), move || {
            // The range was checked at the call; memory freed since has nothing to record.
            let _ = driver::with(|d| d.prefetched(ptr, count as u64, to));
        })
    })
}

export! {
    safe fn cuMemPrefetchAsync(ptr: CUdeviceptr, count: usize, device: CUdevice, stream: CUstream) {
        prefetch(ptr, count, |d| d.advice_device(device), 0, stream)
    }

    safe fn cuMemPrefetchAsync_v2(
        ptr: CUdeviceptr,
        count: usize,
        location: RawLocation,
        flags: c_uint,
        stream: CUstream,
    ) {
        prefetch(ptr, count, |d| d.advice_place(location), flags, stream)
    }
}

/// Writes one range attribute into `size` bytes at `data`.
///
/// # Safety
/// `data` is null or valid for writing `size` bytes.
unsafe fn put_range(data: *mut c_void, size: usize, value: RangeValue) -> CuResult<()> {
    if data.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let ints = match value {
        RangeValue::Int(v) => vec![v],
        RangeValue::List(list) => list,
    };
    debug_assert_eq!(ints.len() * 4, size);
    // SAFETY: `size / 4` ints fit the caller's `size` bytes (checked by range_attribute).
    unsafe { std::ptr::copy_nonoverlapping(ints.as_ptr(), data.cast::<i32>(), size / 4) };
    Ok(())
}

export! {
    fn cuMemRangeGetAttribute(
        data: *mut c_void,
        size: usize,
        attribute: c_uint,
        ptr: CUdeviceptr,
        count: usize,
    ) {
        with(|d| {
            let value = d.range_attribute(attribute, size, ptr, count as u64)?;
            // SAFETY: `size` bytes of the caller's (cuda.h).
            unsafe { put_range(data, size, value) }
        })
    }

    fn cuMemRangeGetAttributes(
        data: *mut *mut c_void,
        sizes: *const usize,
        attributes: *const c_uint,
        n: usize,
        ptr: CUdeviceptr,
        count: usize,
    ) {
        with(|d| {
            if n == 0 || data.is_null() || sizes.is_null() || attributes.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: cuda.h: `n` storage pointers, sizes and attributes.
            let (slots, sizes, attributes) = unsafe {
                (
                    std::slice::from_raw_parts(data, n),
                    std::slice::from_raw_parts(sizes, n),
                    std::slice::from_raw_parts(attributes, n),
                )
            };
            let values = attributes
                .iter()
                .zip(sizes)
                .map(|(&a, &size)| d.range_attribute(a, size, ptr, count as u64))
                .collect::<CuResult<Vec<_>>>()?;
            for ((slot, &size), value) in slots.iter().zip(sizes).zip(values) {
                // SAFETY: each slot holds `size` bytes of the caller's (cuda.h).
                unsafe { put_range(*slot, size, value) }?;
            }
            Ok(())
        })
    }
}

/// The CUDA 13 batch operations: `count` ranges of managed memory, each discarded (its
/// contents become undefined; here they stay as they were) and/or prefetched to the location
/// that applies to it (location `j` from range `idxs[j]` on; `idxs[0]` is 0 and the indices
/// rise). Checked at the call, recorded in stream order.
///
/// # Safety
/// `dptrs` and `sizes` hold `count` entries; with `locations`, its two arrays hold `n`.
unsafe fn batch(
    dptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locations: Option<(*const RawLocation, *const usize, usize)>,
    flags: c_ulonglong,
    stream: CUstream,
) -> RawResult {
    gated(|| {
        if count == 0 || dptrs.is_null() || sizes.is_null() || flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `count` pointers and sizes (cuda.h), per the caller.
        let (ptrs, lens) = unsafe {
            (
                std::slice::from_raw_parts(dptrs, count),
                std::slice::from_raw_parts(sizes, count),
            )
        };
        let places = match locations {
            None => None,
            Some((locs, idxs, n)) => {
                if n == 0 || n > count || locs.is_null() || idxs.is_null() {
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: `n` locations and indices (cuda.h), per the caller.
                let (locs, idxs) = unsafe {
                    (
                        std::slice::from_raw_parts(locs, n),
                        std::slice::from_raw_parts(idxs, n),
                    )
                };
                if idxs[0] != 0 || idxs.windows(2).any(|w| w[0] >= w[1]) || idxs[n - 1] >= count {
                    return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                }
                Some((locs.to_vec(), idxs.to_vec()))
            }
        };
        let work: Vec<(u64, u64, Option<Place>)> = driver::with(|d| {
            let resolved = match &places {
                None => None,
                Some((locs, idxs)) => Some(
                    locs.iter()
                        .map(|l| d.advice_place(*l))
                        .collect::<CuResult<Vec<Place>>>()
                        .map(|p| (p, idxs))?,
                ),
            };
            ptrs.iter()
                .zip(lens)
                .enumerate()
                .map(|(i, (&p, &len))| {
                    d.check_prefetch(p, len as u64)?;
                    let to = resolved.as_ref().map(|(places, idxs)| {
                        let j = idxs.iter().rposition(|&at| at <= i).unwrap_or(0);
                        places[j]
                    });
                    Ok((p, len as u64, to))
                })
                .collect()
        })?;
        memcpy::host_work(Some(stream as usize as u64), move || {
            for (p, len, to) in work {
                if let Some(to) = to {
                    // Checked at the call; memory freed since has nothing to record.
                    let _ = driver::with(|d| d.prefetched(p, len, to));
                }
            }
        })
    })
}

export! {
    fn cuMemDiscardBatchAsync(
        dptrs: *const CUdeviceptr,
        sizes: *const usize,
        count: usize,
        flags: c_ulonglong,
        stream: CUstream,
    ) {
        // SAFETY: the caller's arrays (cuda.h).
        unsafe { batch(dptrs, sizes, count, None, flags, stream) }
    }

    for (
        dptrs: *const CUdeviceptr,
        sizes: *const usize,
        count: usize,
        locations: *const RawLocation,
        location_idxs: *const usize,
        n: usize,
        flags: c_ulonglong,
        stream: CUstream,
    ) {
        fn cuMemPrefetchBatchAsync {
            let to = Some((locations, location_idxs, n));
            // SAFETY: the caller's arrays (cuda.h).
            unsafe { batch(dptrs, sizes, count, to, flags, stream) }
        }

        /// The discard changes no byte here: a prefetch.
        fn cuMemDiscardAndPrefetchBatchAsync {
            let to = Some((locations, location_idxs, n));
            // SAFETY: the caller's arrays (cuda.h).
            unsafe { batch(dptrs, sizes, count, to, flags, stream) }
        }
    }
}
