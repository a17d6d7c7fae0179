//! Devices: count, names, UUIDs, attributes, memory sizes.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{put, with, with_out};
use crate::device;
use crate::error::{CuError, RawResult};
use cudarc::driver::sys::{CUdevice, CUuuid};
use std::ffi::{c_char, c_int, c_uint};

export! {
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> device |d| {
        d.config.check_device(ordinal).map(|dev| dev as CUdevice)
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        // SAFETY: int out-parameter (cuda.h).
        with(|d| unsafe { put(count, d.config.count() as c_int) })
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            if name.is_null() || len <= 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let s = d.config.name(dev);
            let n = s.len().min(len as usize - 1);
            // SAFETY: `name` has room for `len` bytes (cuda.h); we write `n + 1 <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), name, n);
                name.add(n).write(0);
            }
            Ok(())
        })
    }

    fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) {
        // SAFETY: same contract.
        unsafe { cuDeviceGetUuid_v2(uuid, dev) }
    }

    fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) {
        with(|d| {
            let dev = d.config.check_device(dev)?;
            let bytes = d.config.device(dev).uuid.map(|b| b as c_char);
            // SAFETY: CUuuid out-parameter (cuda.h).
            unsafe { put(uuid, CUuuid { bytes }) }
        })
    }

    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_uint, dev: CUdevice) -> pi |d| {
        let dev = d.config.check_device(dev)?;
        let v = device::attribute(attrib, d.config.device(dev).index)?;
        Ok(v)
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> bytes |d| {
        d.config
            .check_device(dev)
            .map(|dev| d.config.memory(dev) as usize)
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        with(|d| {
            let (f, t) = d.mem_info()?;
            // SAFETY: size_t out-parameters (cuda.h).
            unsafe {
                put(free, f as usize)?;
                put(total, t as usize)
            }
        })
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> can |d| {
        let (dev, peer) = (d.config.check_device(dev)?, d.config.check_device(peer)?);
        let v = c_int::from(d.config.can_access_peer(dev, peer));
        Ok(v)
    }

    /// Between two distinct devices: the performance rank (0, one NVLink domain), and 1 for
    /// access, native atomics and array access exactly when the pair can access each other.
    fn cuDeviceGetP2PAttribute(
        value: *mut c_int,
        attrib: c_uint,
        src: CUdevice,
        dst: CUdevice,
    ) -> value |d| {
        let (src, dst) = (d.config.check_device(src)?, d.config.check_device(dst)?);
        if src == dst {
            return Err(CuError::CUDA_ERROR_INVALID_DEVICE);
        }
        let capable = c_int::from(d.config.can_access_peer(src, dst));
        let v = match attrib {
            1 => 0,
            2..=4 => capable,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        Ok(v)
    }
}
