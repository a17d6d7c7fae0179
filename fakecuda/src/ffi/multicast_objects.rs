//! Multicast objects.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, get, granularity_of, put, with};
use crate::error::{CuError, RawResult};
use crate::multicast;
use cudarc::driver::sys::{
    CUdevice, CUdeviceptr, CUmemGenericAllocationHandle, CUmulticastObjectProp,
};
use std::ffi::{c_uint, c_ulonglong};

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
    src: crate::state::multicast::BindSource,
    size: usize,
    flags: c_ulonglong,
) -> RawResult {
    gated(|| multicast::bind(mc_handle, dev, mc_offset as u64, src, size as u64, flags))
}

fn member(
    handle: CUmemGenericAllocationHandle,
    offset: usize,
) -> crate::state::multicast::BindSource {
    crate::state::multicast::BindSource::Mem {
        handle,
        offset: offset as u64,
    }
}

/// A bind's two ABIs: v1 (the member's own device) and v2 (`dev` named after the handle), of
/// one source (`$src`, made of the arguments between the offset and the size).
macro_rules! bind_abis {
    ($($v1:ident, $v2:ident($($arg:ident: $type:ty),+) => $src:expr;)*) => {
        export! {$(
            safe fn $v1(
                mc_handle: CUmemGenericAllocationHandle,
                mc_offset: usize,
                $($arg: $type,)+
                size: usize,
                flags: c_ulonglong,
            ) {
                bind(mc_handle, None, mc_offset, $src, size, flags)
            }

            safe fn $v2(
                mc_handle: CUmemGenericAllocationHandle,
                dev: CUdevice,
                mc_offset: usize,
                $($arg: $type,)+
                size: usize,
                flags: c_ulonglong,
            ) {
                bind(mc_handle, Some(dev), mc_offset, $src, size, flags)
            }
        )*}
    };
}

bind_abis! {
    cuMulticastBindMem, cuMulticastBindMem_v2(
        mem_handle: CUmemGenericAllocationHandle,
        mem_offset: usize
    ) => member(mem_handle, mem_offset);
    cuMulticastBindAddr, cuMulticastBindAddr_v2(memptr: CUdeviceptr)
        => crate::state::multicast::BindSource::Addr { ptr: memptr };
}

export! {
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
        // SAFETY: cuda.h's contract for the properties (integers only) and the out-parameter.
        unsafe { granularity_of(granularity, prop, |_, p| crate::state::multicast::granularity(p, option)) }
    }
}
