//! Devices: how many (`FAKECUDA_DEVICES`), their names, UUIDs, memory and attributes.

use crate::error::{CuError, CuResult};
use cudarc::driver::sys::CUdevice_attribute as A;

/// Most devices one process may configure (multicast teams keep members in a 64-bit mask).
pub const MAX_DEVICES: u32 = 64;
const DEFAULT_DEVICES: u32 = 2;
const DEFAULT_NUMA_NODES: u32 = 1;
const MAX_NUMA_NODES: u32 = 64;
const DEFAULT_MEMORY_MIB: u64 = 80 * 1024;

#[derive(Debug, Clone)]
pub struct Config {
    pub devices: u32,
    /// Bytes each device reports and allows to be allocated on it.
    pub memory: u64,
    /// Host NUMA nodes (`CU_MEM_LOCATION_TYPE_HOST_NUMA` ids `0..numa_nodes`).
    pub numa_nodes: u32,
}

impl Config {
    /// Reads `FAKECUDA_DEVICES` (default 2) and `FAKECUDA_DEVICE_MEMORY_MIB` (default 80 GiB).
    /// An unusable value fails `cuInit` and says why on stderr.
    pub fn from_env() -> CuResult<Config> {
        let devices = parse_env(
            "FAKECUDA_DEVICES",
            u64::from(DEFAULT_DEVICES),
            0..=u64::from(MAX_DEVICES),
        )?;
        let mib = parse_env(
            "FAKECUDA_DEVICE_MEMORY_MIB",
            DEFAULT_MEMORY_MIB,
            2..=(1 << 30),
        )?;
        let numa_nodes = parse_env(
            "FAKECUDA_NUMA_NODES",
            u64::from(DEFAULT_NUMA_NODES),
            1..=u64::from(MAX_NUMA_NODES),
        )?;
        Ok(Config {
            devices: devices as u32,
            memory: mib << 20,
            numa_nodes: numa_nodes as u32,
        })
    }

    pub fn check_device(&self, dev: i32) -> CuResult<u32> {
        u32::try_from(dev)
            .ok()
            .filter(|d| *d < self.devices)
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)
    }

    /// A host NUMA node id of `CU_MEM_LOCATION_TYPE_HOST_NUMA`.
    pub fn check_numa_node(&self, node: i32) -> CuResult<u32> {
        u32::try_from(node)
            .ok()
            .filter(|n| *n < self.numa_nodes)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }
}

fn parse_env(name: &str, default: u64, range: std::ops::RangeInclusive<u64>) -> CuResult<u64> {
    let Ok(raw) = std::env::var(name) else {
        return Ok(default);
    };
    match raw.trim().parse::<u64>() {
        Ok(v) if range.contains(&v) => Ok(v),
        _ => {
            eprintln!(
                "fakecuda: cuInit failed: {name}={raw:?} is not a whole number in {}..={}",
                range.start(),
                range.end()
            );
            Err(CuError::CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub fn name(dev: u32) -> String {
    format!("fakecuda device {dev}")
}

/// A stable UUID per ordinal, so a restored process finds "the same" GPUs.
pub fn uuid(dev: u32) -> [u8; 16] {
    let mut u = *b"FAKECUDA\0\0\0\0\0\0\0\0";
    u[8..12].copy_from_slice(&dev.to_be_bytes());
    u
}

/// Attribute values modelled on an H100/H200-class GPU with VMM, POSIX-FD sharing and
/// multicast, but no fabric (IMEX) handles. Unknown attributes below the enum's end read 0,
/// as on the real driver for features a device lacks.
pub fn attribute(attr: u32, dev: u32) -> CuResult<i32> {
    let v = match attr {
        x if x == A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as u32 => 1024,
        x if x == A::CU_DEVICE_ATTRIBUTE_WARP_SIZE as u32 => 32,
        x if x == A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as u32 => 132,
        x if x == A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as u32 => dev as i32 + 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as u32 => 9,
        x if x == A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED as u32 => 0,
        // Stream-ordered pools of device memory, shareable as POSIX FDs.
        x if x == A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES as u32 => 1,
        x if x < A::CU_DEVICE_ATTRIBUTE_MAX as u32 && x > 0 => 0,
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(v)
}
