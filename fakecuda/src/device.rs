//! Devices: the machine's GPUs (`FAKECUDA_DEVICES`, `FAKECUDA_MACHINE`), the ones a process
//! sees (`CUDA_VISIBLE_DEVICES`), their names, UUIDs, memory and attributes.
//!
//! A process's ordinals are its own and never change while it lives: a native restore onto
//! other GPUs (`gpuPairs`) puts other physical devices behind the same ordinals, as the driver
//! must for a program that holds `CUdevice` values and contexts.

use crate::error::{CuError, CuResult};
use cudarc::driver::sys::CUdevice_attribute as A;

/// Most devices one machine may have (multicast teams keep members in a 64-bit mask).
pub const MAX_DEVICES: u32 = 64;
const DEFAULT_DEVICES: u32 = 2;
const DEFAULT_NUMA_NODES: u32 = 1;
const MAX_NUMA_NODES: u32 = 64;
const DEFAULT_MEMORY_MIB: u64 = 80 * 1024;
/// The model of devices given by count only.
pub const DEFAULT_MODEL: &str = "H200";
/// Longest model name (`cuDeviceGetName` callers commonly pass 256 bytes).
pub const MAX_MODEL_LEN: usize = 32;

/// One GPU of the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    /// Its index on the machine (what `CUDA_VISIBLE_DEVICES` numbers).
    pub index: u32,
    pub uuid: [u8; 16],
    /// The chip: a restore onto another device requires the same model.
    pub model: String,
    /// Bytes it reports and allows to be allocated on it (per process: fakecuda does not
    /// share memory accounting between processes).
    pub memory: u64,
}

/// The GPUs of the machine, as the environment of the process that reads it describes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    pub devices: Vec<Physical>,
}

impl Machine {
    /// `FAKECUDA_DEVICES`: a count (default 2) of `H200`s, or a comma-separated list of
    /// `MODEL[:MiB]`; the memory of a device without `:MiB` is `FAKECUDA_DEVICE_MEMORY_MIB`
    /// (default 80 GiB). `FAKECUDA_MACHINE` names the machine: devices of machines with other
    /// names have other UUIDs. An unusable value fails `cuInit` and says why on stderr.
    pub fn from_env() -> CuResult<Machine> {
        let mib = parse_env(
            "FAKECUDA_DEVICE_MEMORY_MIB",
            DEFAULT_MEMORY_MIB,
            2..=(1 << 30),
        )?;
        let raw = std::env::var("FAKECUDA_DEVICES").unwrap_or_else(|_| DEFAULT_DEVICES.to_string());
        let machine = std::env::var("FAKECUDA_MACHINE").unwrap_or_default();
        Machine::parse(&raw, mib << 20, &machine).map_err(|why| {
            eprintln!("fakecuda: cuInit failed: FAKECUDA_DEVICES={raw:?}: {why}");
            CuError::CUDA_ERROR_INVALID_VALUE
        })
    }

    /// The machine `spec` (see `from_env`) describes, `memory` bytes per device by default.
    pub fn parse(spec: &str, memory: u64, machine: &str) -> Result<Machine, String> {
        let spec = spec.trim();
        let models: Vec<(String, u64)> = if let Ok(n) = spec.parse::<u32>() {
            if n > MAX_DEVICES {
                return Err(format!("more than {MAX_DEVICES} devices"));
            }
            (0..n).map(|_| (DEFAULT_MODEL.to_owned(), memory)).collect()
        } else {
            let entries: Vec<&str> = spec.split(',').map(str::trim).collect();
            if entries.len() > MAX_DEVICES as usize {
                return Err(format!("more than {MAX_DEVICES} devices"));
            }
            entries
                .into_iter()
                .map(|entry| parse_model(entry, memory))
                .collect::<Result<_, _>>()?
        };
        let devices = models
            .into_iter()
            .zip(0u32..)
            .map(|((model, memory), index)| Physical {
                index,
                uuid: uuid(machine, index),
                model,
                memory,
            })
            .collect();
        Ok(Machine { devices })
    }

    /// The devices `CUDA_VISIBLE_DEVICES` (unset: all) selects, in its order. As with the
    /// driver, the list ends at its first entry that names no device (or repeats one); an
    /// entry is a machine index or a `GPU-` UUID prefix.
    pub fn visible(&self, list: Option<&str>) -> Vec<Physical> {
        let Some(list) = list else {
            return self.devices.clone();
        };
        let mut chosen: Vec<Physical> = Vec::new();
        for entry in list.split(',').map(str::trim) {
            let found = if let Ok(i) = entry.parse::<u32>() {
                self.devices.iter().find(|d| d.index == i)
            } else if entry.len() > "GPU-".len() && entry.starts_with("GPU-") {
                let prefix = entry.to_ascii_lowercase();
                let mut matching = self.devices.iter().filter(|d| {
                    uuid_string(&d.uuid)
                        .to_ascii_lowercase()
                        .starts_with(&prefix)
                });
                // An ambiguous prefix names no device.
                match (matching.next(), matching.next()) {
                    (Some(d), None) => Some(d),
                    _ => None,
                }
            } else {
                None
            };
            match found {
                Some(d) if !chosen.iter().any(|c| c.index == d.index) => chosen.push(d.clone()),
                _ => break,
            }
        }
        chosen
    }
}

fn parse_model(entry: &str, default_memory: u64) -> Result<(String, u64), String> {
    let (model, memory) = match entry.split_once(':') {
        Some((model, mib)) => {
            let mib: u64 = mib
                .trim()
                .parse()
                .ok()
                .filter(|m| (2..=(1 << 30)).contains(m))
                .ok_or_else(|| format!("{entry:?}: the memory is not a whole MiB in 2..=2^30"))?;
            (model.trim(), mib << 20)
        }
        None => (entry, default_memory),
    };
    let usable = |c: char| c.is_ascii_alphanumeric() || "-_. ".contains(c);
    if model.is_empty() || model.len() > MAX_MODEL_LEN || !model.chars().all(usable) {
        return Err(format!(
            "{entry:?}: a model is 1 to {MAX_MODEL_LEN} letters, digits, '-', '_', '.' or spaces"
        ));
    }
    Ok((model.to_owned(), memory))
}

/// A stable UUID per machine and index, so a restored process finds "the same" GPUs on the
/// same machine and other ones elsewhere. The default machine's UUIDs end in zeros.
pub fn uuid(machine: &str, index: u32) -> [u8; 16] {
    let mut u = *b"FAKECUDA\0\0\0\0\0\0\0\0";
    u[8..12].copy_from_slice(&index.to_be_bytes());
    if !machine.is_empty() {
        // FNV-1a: any stable spread of the name does.
        let hash = machine.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        u[12..].copy_from_slice(&hash.to_be_bytes());
    }
    u
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints UUIDs.
pub fn uuid_string(u: &[u8; 16]) -> String {
    cuinterpose_abi::uuid::gpu_uuid_text(u)
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The devices this process sees, by ordinal.
    pub devices: Vec<Physical>,
    /// Host NUMA nodes (`CU_MEM_LOCATION_TYPE_HOST_NUMA` ids `0..numa_nodes`).
    pub numa_nodes: u32,
    /// Which machine devices may reach each other's memory (`FAKECUDA_PEERS`).
    pub peers: Peers,
}

/// Peer capability: islands of machine indices whose members may access each other's memory
/// directly (an NVLink domain), and only between devices of one model, as on the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peers {
    /// Every pair of devices of one model (an NVSwitch machine: the default).
    All,
    /// Masks of machine indices: `none` is no island, `0+1,2+3` two of two devices.
    Islands(Vec<u64>),
}

impl Peers {
    /// `FAKECUDA_PEERS` (unset: all): `all`, `none`, or islands of `+`-joined machine indices
    /// separated by commas, each index in at most one island.
    pub fn parse(spec: &str, devices: u32) -> Result<Peers, String> {
        match spec.trim() {
            "" | "all" => return Ok(Peers::All),
            "none" => return Ok(Peers::Islands(Vec::new())),
            _ => {}
        }
        let mut seen = 0u64;
        let mut islands = Vec::new();
        for island in spec.split(',').map(str::trim) {
            let mut mask = 0u64;
            for index in island.split('+').map(str::trim) {
                let i: u32 = index
                    .parse()
                    .ok()
                    .filter(|i| *i < devices)
                    .ok_or_else(|| format!("{index:?} is no machine index below {devices}"))?;
                if seen & (1 << i) != 0 {
                    return Err(format!("device {i} is in two islands"));
                }
                seen |= 1 << i;
                mask |= 1 << i;
            }
            islands.push(mask);
        }
        Ok(Peers::Islands(islands))
    }
}

impl Config {
    /// The machine (`Machine::from_env`) as `CUDA_VISIBLE_DEVICES` shows it, and
    /// `FAKECUDA_NUMA_NODES` (default 1). Also sets the process's allocation granularity
    /// (`FAKECUDA_GRANULARITY_KIB`, a power of two from 4 KiB to 1 GiB, default 2 MiB: small
    /// ones let a test or bench hold thousands of allocations) and how many threads a large
    /// copy is split over (`FAKECUDA_COPY_THREADS`, 1 to 64, default the cores up to 4: a
    /// GPU's copy engines are not the CPU, so fakecuda's copies use what the host has).
    pub fn from_env() -> CuResult<Config> {
        let machine = Machine::from_env()?;
        let kib = parse_env("FAKECUDA_GRANULARITY_KIB", 2048, 4..=(1 << 20))?;
        if !kib.is_power_of_two() {
            eprintln!(
                "fakecuda: cuInit failed: FAKECUDA_GRANULARITY_KIB={kib} is not a power of two"
            );
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        let threads = parse_env("FAKECUDA_COPY_THREADS", cores as u64, 1..=64)?;
        crate::sys::configure(kib << 10, threads as usize);
        let numa_nodes = parse_env(
            "FAKECUDA_NUMA_NODES",
            u64::from(DEFAULT_NUMA_NODES),
            1..=u64::from(MAX_NUMA_NODES),
        )?;
        let raw = std::env::var("FAKECUDA_PEERS").unwrap_or_default();
        let peers = Peers::parse(&raw, machine.devices.len() as u32).map_err(|why| {
            eprintln!("fakecuda: cuInit failed: FAKECUDA_PEERS={raw:?}: {why}");
            CuError::CUDA_ERROR_INVALID_VALUE
        })?;
        let list = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        Ok(Config {
            devices: machine.visible(list.as_deref()),
            numa_nodes: numa_nodes as u32,
            peers,
        })
    }

    pub fn count(&self) -> u32 {
        self.devices.len() as u32
    }

    pub fn check_device(&self, dev: i32) -> CuResult<u32> {
        u32::try_from(dev)
            .ok()
            .filter(|d| *d < self.count())
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)
    }

    /// The device behind a checked ordinal.
    pub fn device(&self, dev: u32) -> &Physical {
        &self.devices[dev as usize]
    }

    /// The ordinal this process gives the machine's GPU `index`, if it sees that GPU.
    pub fn ordinal_of(&self, index: u32) -> Option<u32> {
        (0u32..)
            .zip(&self.devices)
            .find_map(|(ordinal, d)| (d.index == index).then_some(ordinal))
    }

    pub fn memory(&self, dev: u32) -> u64 {
        self.devices.get(dev as usize).map_or(0, |d| d.memory)
    }

    pub fn name(&self, dev: u32) -> String {
        format!("fakecuda {}", self.device(dev).model)
    }

    /// Whether ordinal `dev` may access `peer`'s memory directly (`cuDeviceCanAccessPeer`):
    /// two distinct devices of one model in one island. A device is never its own peer.
    pub fn can_access_peer(&self, dev: u32, peer: u32) -> bool {
        let (a, b) = (self.device(dev), self.device(peer));
        let together = match &self.peers {
            Peers::All => true,
            Peers::Islands(islands) => islands
                .iter()
                .any(|m| m & (1 << a.index) != 0 && m & (1 << b.index) != 0),
        };
        dev != peer && a.model == b.model && together
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

/// Attribute values modelled on an H100/H200-class GPU with VMM, POSIX-FD sharing and
/// multicast, but no fabric (IMEX) handles. Unknown attributes below the enum's end read 0,
/// as on the real driver for features a device lacks.
pub fn attribute(attr: u32, physical_index: u32) -> CuResult<i32> {
    let v = match attr {
        x if x == A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as u32 => 1024,
        x if x == A::CU_DEVICE_ATTRIBUTE_WARP_SIZE as u32 => 32,
        x if x == A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as u32 => 132,
        x if x == A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as u32 => physical_index as i32 + 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as u32 => 9,
        x if x == A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED as u32 => 0,
        x if x == A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED as u32 => 1,
        // Interprocess events: their records in a memfd page each opener maps.
        x if x == A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED as u32 => 1,
        // As on a Hopper, memory may be marked GPUDirect RDMA capable (there is no NIC here to
        // use it; the mark is kept and read back).
        x if x == A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED as u32 => 1,
        // Stream-ordered pools of device memory, shareable as POSIX FDs.
        x if x == A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES as u32 => 1,
        // Managed memory (cuMemAllocManaged, managed pools) every device and the CPU reach at
        // once: there is nothing to migrate.
        x if x == A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS as u32 => 1,
        // Pinned host pools, on any node or one (a node's may be shared as POSIX FDs).
        x if x == A::CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED as u32 => 1,
        x if x == A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED as u32 => 1,
        // Every device is attached to host node 0.
        x if x == A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID as u32 => 0,
        x if x < A::CU_DEVICE_ATTRIBUTE_MAX as u32 && x > 0 => 0,
        _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: &str, visible: Option<&str>, expect: &[(u32, &str, u64)]) {
        let machine = Machine::parse(spec, 8 << 20, "").expect(spec);
        let got: Vec<(u32, String, u64)> = machine
            .visible(visible)
            .into_iter()
            .map(|d| (d.index, d.model, d.memory >> 20))
            .collect();
        let want: Vec<(u32, String, u64)> = expect
            .iter()
            .map(|(i, m, mib)| (*i, (*m).to_owned(), *mib))
            .collect();
        assert_eq!(got, want, "{spec} / {visible:?}");
    }

    #[test]
    fn machines_are_counts_or_model_lists() {
        check("2", None, &[(0, "H200", 8), (1, "H200", 8)]);
        check("H100:64, A100", None, &[(0, "H100", 64), (1, "A100", 8)]);
        check("0", None, &[]);
        for bad in [
            "65",
            "H100,",
            "H100:1",
            "H100:x",
            "bad/name",
            &"X".repeat(33),
        ] {
            assert!(Machine::parse(bad, 8 << 20, "").is_err(), "{bad}");
        }
    }

    #[test]
    fn visible_devices_select_and_order_and_stop_at_a_bad_entry() {
        check("4", Some("2,0"), &[(2, "H200", 8), (0, "H200", 8)]);
        check("4", Some("1,9,2"), &[(1, "H200", 8)]);
        check("4", Some("1,1,2"), &[(1, "H200", 8)]);
        check("4", Some(""), &[]);
        let one = uuid_string(&uuid("", 3));
        check("4", Some(&one), &[(3, "H200", 8)]);
        check("4", Some(&one[..33]), &[(3, "H200", 8)]);
        // "GPU-46414b45" is the prefix every fakecuda UUID shares: ambiguous.
        check("4", Some("GPU-46414b45"), &[]);
    }

    #[test]
    fn peers_are_islands_of_one_model() {
        let config = |spec: &str, peers: &str| Config {
            devices: Machine::parse(spec, 8 << 20, "").expect(spec).devices,
            numa_nodes: 1,
            peers: Peers::parse(peers, 4).expect(peers),
        };
        let all = config("4", "");
        assert!(all.can_access_peer(0, 3) && all.can_access_peer(3, 0));
        assert!(!all.can_access_peer(1, 1), "a device is not its own peer");
        let mixed = config("H200,H200,A100,A100", "all");
        assert!(mixed.can_access_peer(0, 1) && mixed.can_access_peer(2, 3));
        assert!(!mixed.can_access_peer(1, 2), "another model");
        let islands = config("4", "0+1, 2+3");
        assert!(islands.can_access_peer(1, 0) && !islands.can_access_peer(1, 2));
        assert!(!config("4", "none").can_access_peer(0, 1));
        for bad in ["0+4", "0+1,1+2", "x", "0+"] {
            assert!(Peers::parse(bad, 4).is_err(), "{bad}");
        }
    }

    #[test]
    fn machines_with_other_names_have_other_uuids() {
        assert_eq!(uuid("", 1), uuid("", 1));
        assert_ne!(uuid("", 1), uuid("node-b", 1));
        assert_ne!(uuid("node-b", 0), uuid("node-b", 1));
        assert_eq!(
            uuid_string(&uuid("", 1)),
            "GPU-46414b45-4355-4441-0000-000100000000"
        );
    }
}
