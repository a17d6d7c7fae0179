//! Multicast objects.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;

export! {
    fn cuMulticastCreate(
        mc_handle: *mut CUmemGenericAllocationHandle,
        prop: *const CUmulticastObjectProp,
    ) {
        with(|d| {
            // SAFETY: CUmulticastObjectProp input (cuda.h): integers only.
            let prop = unsafe { get(prop) }?;
            if mc_handle.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let h = d.mc_create(&prop)?;
            // SAFETY: handle out-parameter (cuda.h), non-null.
            unsafe { put(mc_handle, h) }
        })
    }

    safe fn cuMulticastAddDevice(mc_handle: CUmemGenericAllocationHandle, dev: CUdevice) {
        with(|d| d.mc_add_device(mc_handle, dev))
    }
}

/// Every bind ABI: v1 binds for the device the member lives on, v2 names it.
fn bind(
    mc_handle: CUmemGenericAllocationHandle,
    dev: Option<CUdevice>,
    mc_offset: usize,
    src: multicast::BindSource,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    gated(|| multicast::bind(mc_handle, dev, mc_offset as u64, src, size as u64, flags))
}

fn member(handle: CUmemGenericAllocationHandle, offset: usize) -> multicast::BindSource {
    multicast::BindSource::Mem {
        handle,
        offset: offset as u64,
    }
}

export! {
    safe fn cuMulticastBindMem(
        mc_handle: CUmemGenericAllocationHandle,
        mc_offset: usize,
        mem_handle: CUmemGenericAllocationHandle,
        mem_offset: usize,
        size: usize,
        flags: c_ulonglong,
    ) {
        let src = member(mem_handle, mem_offset);
        bind(mc_handle, None, mc_offset, src, size, flags)
    }

    safe fn cuMulticastBindMem_v2(
        mc_handle: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        mem_handle: CUmemGenericAllocationHandle,
        mem_offset: usize,
        size: usize,
        flags: c_ulonglong,
    ) {
        let src = member(mem_handle, mem_offset);
        bind(mc_handle, Some(dev), mc_offset, src, size, flags)
    }

    safe fn cuMulticastBindAddr(
        mc_handle: CUmemGenericAllocationHandle,
        mc_offset: usize,
        memptr: CUdeviceptr,
        size: usize,
        flags: c_ulonglong,
    ) {
        let src = multicast::BindSource::Addr { ptr: memptr };
        bind(mc_handle, None, mc_offset, src, size, flags)
    }

    safe fn cuMulticastBindAddr_v2(
        mc_handle: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        memptr: CUdeviceptr,
        size: usize,
        flags: c_ulonglong,
    ) {
        let src = multicast::BindSource::Addr { ptr: memptr };
        bind(mc_handle, Some(dev), mc_offset, src, size, flags)
    }

    safe fn cuMulticastUnbind(
        mc_handle: CUmemGenericAllocationHandle,
        dev: CUdevice,
        mc_offset: usize,
        size: usize,
    ) {
        with(|d| d.mc_unbind(mc_handle, dev, mc_offset as u64, size as u64))
    }

    fn cuMulticastGetGranularity(
        granularity: *mut usize,
        prop: *const CUmulticastObjectProp,
        option: c_uint,
    ) {
        with(|_| {
            // SAFETY: CUmulticastObjectProp input (cuda.h): integers only.
            let prop = unsafe { get(prop) }?;
            let g = multicast::granularity(&prop, option)?;
            // SAFETY: size_t out-parameter (cuda.h).
            unsafe { put(granularity, g as usize) }
        })
    }
}
