//! Restore onto other GPUs: a `--device-map` resolved against the devices a checkpoint
//! recorded and the GPUs of the machine it is restored on, sans-I/O.
//!
//! A map pairs each GPU the checkpointed participants saw with a GPU of this machine, by
//! ordinal (the checkpointing coordinator's for the old side, this one's for the new) or by
//! UUID, or `auto`: a GPU still present keeps itself, the others pair with free GPUs of the
//! same model and memory size in relative order. Everything is checked before anything
//! changes: a map that is incomplete, not one-to-one, pairs different models or overfills a
//! GPU is refused naming the device. The native restore then gets each process's pairs
//! (`gpuPairs`); its ordinals stay its own, with the new GPUs behind them, so the shim
//! rebuilds the shared memory at the recorded ordinals, which are now the new GPUs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use cuinterpose_protocol::{Device, DeviceInventory, DeviceUuid, LocationType, Record, StateFile};

use crate::native::GpuPair;

/// One side of a pair as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRef {
    Ordinal(u32),
    Uuid(DeviceUuid),
}

/// What `--device-map` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceMapSpec {
    Auto,
    Pairs(Vec<(DeviceRef, DeviceRef)>),
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints a UUID.
pub fn uuid_text(uuid: &DeviceUuid) -> String {
    cuinterpose_abi::uuid::gpu_uuid_text(uuid.as_bytes())
}

fn parse_ref(text: &str) -> Result<DeviceRef, String> {
    let text = text.trim();
    if let Ok(ordinal) = text.parse::<u32>() {
        return Ok(DeviceRef::Ordinal(ordinal));
    }
    if !text.starts_with("GPU-") {
        return Err(format!(
            "{text:?} is neither an ordinal nor a GPU UUID (GPU-…)"
        ));
    }
    let bytes = cuinterpose_abi::uuid::parse_gpu_uuid(text)?;
    DeviceUuid::new(bytes)
        .map(DeviceRef::Uuid)
        .ok_or_else(|| format!("{text:?} is the all-zero UUID, which names no GPU"))
}

impl FromStr for DeviceMapSpec {
    type Err = String;

    /// `auto`, or `OLD=NEW[,OLD=NEW…]` with each side an ordinal or a `GPU-` UUID.
    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim() == "auto" {
            return Ok(Self::Auto);
        }
        let pairs = text
            .split(',')
            .map(|pair| {
                let (old, new) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("{pair:?} is not OLD=NEW (or the whole map `auto`)"))?;
                Ok((parse_ref(old)?, parse_ref(new)?))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self::Pairs(pairs))
    }
}

/// A GPU of the machine a restore runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetGpu {
    pub ordinal: i32,
    pub uuid: DeviceUuid,
    pub name: String,
    pub memory: u64,
    pub free: u64,
}

/// Why a device map is refused (nothing was changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemapError {
    #[error(
        "old ordinal {ordinal}: the checkpoint recorded no list of its machine's GPUs; name the \
         old GPUs by UUID"
    )]
    OrdinalsUnknown { ordinal: u32 },
    #[error("{device} is not a GPU of the checkpointed machine")]
    NoSuchOld { device: String },
    #[error("{device} is not a GPU of this machine")]
    NoSuchNew { device: String },
    #[error("{device} is paired twice")]
    PairedTwice { device: String },
    #[error("{first} and {second} are both paired onto {new}: a map is one-to-one")]
    NotOneToOne {
        first: String,
        second: String,
        new: String,
    },
    #[error("{device}, a {name} seen by participant(s) {participants}, has no pair")]
    Unmapped {
        device: String,
        name: String,
        participants: String,
    },
    #[error("{old} is a {old_name} but {new} is a {new_name}: a restore needs the same model")]
    DifferentModel {
        old: String,
        old_name: String,
        new: String,
        new_name: String,
    },
    #[error(
        "{new} has {free} bytes free, too little for the {needs} bytes of shared memory mapped \
         to it"
    )]
    TooLittleMemory { new: String, needs: u64, free: u64 },
    #[error(
        "auto: no GPU of model {name} with {memory} bytes is left on this machine for {device}"
    )]
    NoMatch {
        device: String,
        name: String,
        memory: u64,
    },
}

/// A resolved map: old GPU → new GPU for every GPU a participant saw (identity when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remap {
    pairs: BTreeMap<DeviceUuid, DeviceUuid>,
}

impl Remap {
    /// Every GPU stays itself.
    pub fn identity() -> Self {
        Self::default()
    }

    /// Whether any GPU moves.
    pub fn moves(&self) -> bool {
        self.pairs.iter().any(|(old, new)| old != new)
    }

    /// The GPU `old` is restored onto.
    pub fn new_of(&self, old: DeviceUuid) -> DeviceUuid {
        self.pairs.get(&old).copied().unwrap_or(old)
    }

    /// The native restore's pairs for a process that saw `devices` (empty: no remap).
    pub fn pairs_for(&self, devices: &[Device]) -> Vec<GpuPair> {
        if !self.moves() {
            return Vec::new();
        }
        devices
            .iter()
            .map(|d| GpuPair {
                old: *d.uuid.as_bytes(),
                new: *self.new_of(d.uuid).as_bytes(),
            })
            .collect()
    }

    /// Every pair, for a CUDA process that is not a participant (its devices are unknown).
    pub fn all_pairs(&self) -> Vec<GpuPair> {
        if !self.moves() {
            return Vec::new();
        }
        self.pairs
            .iter()
            .map(|(old, new)| GpuPair {
                old: *old.as_bytes(),
                new: *new.as_bytes(),
            })
            .collect()
    }

    /// `(ordinal, uuid)` a restored participant that saw `devices` must report.
    pub fn expected(&self, devices: &[Device]) -> Vec<(i32, DeviceUuid)> {
        devices
            .iter()
            .map(|d| (d.ordinal, self.new_of(d.uuid)))
            .collect()
    }

    /// `records` as a restored participant must report them: each device's UUID the one
    /// its GPU was paired with (ordinals stay the process's own), sorted again.
    pub fn records(&self, records: &[Record]) -> Vec<Record> {
        let mut remapped: Vec<Record> = records
            .iter()
            .cloned()
            .map(|mut record| {
                record.remap_devices(|uuid| self.new_of(uuid));
                record
            })
            .collect();
        remapped.sort();
        remapped
    }

    /// The pairs, for reports.
    pub fn pairs(&self) -> impl Iterator<Item = (DeviceUuid, DeviceUuid)> + '_ {
        self.pairs.iter().map(|(old, new)| (*old, *new))
    }
}

/// Bytes of shared memory each GPU holds in `state`: every allocation counted once, in its
/// creator, on the GPU its recorded ordinal names there.
pub fn shared_bytes(state: &StateFile) -> BTreeMap<DeviceUuid, u64> {
    let mut bytes = BTreeMap::new();
    for (pid, records) in state.participants.iter() {
        let Some(devices) = state.devices.participants.get(pid) else {
            continue;
        };
        for record in records.iter() {
            let Record::Allocation(a) = record else {
                continue;
            };
            let location = &a.properties.location;
            if a.allocation.creator_pid != *pid || location.location_type != LocationType::Device {
                continue;
            }
            if let Some(device) = devices.iter().find(|d| d.ordinal == location.id) {
                *bytes.entry(device.uuid).or_insert(0) += a.size;
            }
        }
    }
    bytes
}

/// An old GPU: its description and who saw it.
struct Seen {
    device: Device,
    participants: BTreeSet<u32>,
}

fn describe(device: &Device, machine: &[Device]) -> String {
    match machine.iter().find(|m| m.uuid == device.uuid) {
        Some(m) => format!("{} (old GPU {})", uuid_text(&device.uuid), m.ordinal),
        None => uuid_text(&device.uuid),
    }
}

fn describe_new(gpu: &TargetGpu) -> String {
    format!("{} (GPU {})", uuid_text(&gpu.uuid), gpu.ordinal)
}

/// The UUID of the GPU numbered `ordinal` among `gpus` (each its ordinal and UUID).
fn numbered(mut gpus: impl Iterator<Item = (i32, DeviceUuid)>, ordinal: u32) -> Option<DeviceUuid> {
    gpus.find(|(number, _)| i64::from(*number) == i64::from(ordinal))
        .map(|(_, uuid)| uuid)
}

/// Resolves `spec` for the checkpoint whose devices are `inventory` onto `target`; `needs` is
/// the shared memory per old GPU ([`shared_bytes`]).
pub fn resolve(
    spec: &DeviceMapSpec,
    inventory: &DeviceInventory,
    target: &[TargetGpu],
    needs: &BTreeMap<DeviceUuid, u64>,
) -> Result<Remap, RemapError> {
    let machine: Vec<Device> = inventory.machine.to_vec();
    let mut seen: BTreeMap<DeviceUuid, Seen> = BTreeMap::new();
    for (pid, devices) in inventory.participants.iter() {
        for device in devices.iter() {
            seen.entry(device.uuid)
                .or_insert_with(|| Seen {
                    device: device.clone(),
                    participants: BTreeSet::new(),
                })
                .participants
                .insert(pid.get());
        }
    }
    let old_device = |uuid: DeviceUuid| -> Option<Device> {
        seen.get(&uuid)
            .map(|s| s.device.clone())
            .or_else(|| machine.iter().find(|m| m.uuid == uuid).cloned())
    };
    let mut pairs: BTreeMap<DeviceUuid, DeviceUuid> = BTreeMap::new();
    match spec {
        DeviceMapSpec::Pairs(given) => {
            let mut onto: BTreeMap<DeviceUuid, DeviceUuid> = BTreeMap::new();
            for (old, new) in given {
                let old = match *old {
                    DeviceRef::Ordinal(ordinal) if machine.is_empty() => {
                        return Err(RemapError::OrdinalsUnknown { ordinal });
                    }
                    DeviceRef::Ordinal(ordinal) => {
                        numbered(machine.iter().map(|m| (m.ordinal, m.uuid)), ordinal).ok_or_else(
                            || RemapError::NoSuchOld {
                                device: format!("old GPU {ordinal}"),
                            },
                        )?
                    }
                    DeviceRef::Uuid(uuid) => {
                        old_device(uuid)
                            .map(|d| d.uuid)
                            .ok_or_else(|| RemapError::NoSuchOld {
                                device: uuid_text(&uuid),
                            })?
                    }
                };
                let new = match *new {
                    DeviceRef::Ordinal(ordinal) => {
                        numbered(target.iter().map(|t| (t.ordinal, t.uuid)), ordinal).ok_or_else(
                            || RemapError::NoSuchNew {
                                device: format!("GPU {ordinal}"),
                            },
                        )?
                    }
                    DeviceRef::Uuid(uuid) => target
                        .iter()
                        .find(|t| t.uuid == uuid)
                        .map(|t| t.uuid)
                        .ok_or_else(|| RemapError::NoSuchNew {
                            device: uuid_text(&uuid),
                        })?,
                };
                let old_text =
                    || old_device(old).map_or_else(|| uuid_text(&old), |d| describe(&d, &machine));
                if pairs.insert(old, new).is_some() {
                    return Err(RemapError::PairedTwice { device: old_text() });
                }
                if let Some(first) = onto.insert(new, old) {
                    let first = old_device(first)
                        .map_or_else(|| uuid_text(&first), |d| describe(&d, &machine));
                    let gpu = target.iter().find(|t| t.uuid == new).expect("found above");
                    return Err(RemapError::NotOneToOne {
                        first,
                        second: old_text(),
                        new: describe_new(gpu),
                    });
                }
            }
        }
        DeviceMapSpec::Auto => pairs = auto_pairs(&seen, &machine, target)?,
    }
    for (uuid, s) in &seen {
        if !pairs.contains_key(uuid) {
            return Err(RemapError::Unmapped {
                device: describe(&s.device, &machine),
                name: s.device.name.to_string(),
                participants: s
                    .participants
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    let mut load: BTreeMap<DeviceUuid, u64> = BTreeMap::new();
    for (old, new) in &pairs {
        let gpu = target
            .iter()
            .find(|t| t.uuid == *new)
            .expect("resolved on target");
        if let Some(d) = old_device(*old)
            && d.name.as_str() != gpu.name
        {
            return Err(RemapError::DifferentModel {
                old: describe(&d, &machine),
                old_name: d.name.to_string(),
                new: describe_new(gpu),
                new_name: gpu.name.clone(),
            });
        }
        *load.entry(*new).or_insert(0) += needs.get(old).copied().unwrap_or(0);
    }
    for (new, needs) in load {
        let gpu = target
            .iter()
            .find(|t| t.uuid == new)
            .expect("resolved on target");
        // The shim re-creates the shared memory after the native restore: it must fit in
        // what is free now (each process's private memory the driver checks itself).
        if needs > gpu.free {
            return Err(RemapError::TooLittleMemory {
                new: describe_new(gpu),
                needs,
                free: gpu.free,
            });
        }
    }
    Ok(Remap { pairs })
}

/// `auto`: every GPU still here keeps itself; each other old GPU takes the first free target
/// of the same model and memory, in the old machine's order.
fn auto_pairs(
    seen: &BTreeMap<DeviceUuid, Seen>,
    machine: &[Device],
    target: &[TargetGpu],
) -> Result<BTreeMap<DeviceUuid, DeviceUuid>, RemapError> {
    let mut pairs: BTreeMap<DeviceUuid, DeviceUuid> = BTreeMap::new();
    let mut free: Vec<&TargetGpu> = target.iter().collect();
    // A GPU still here keeps itself (an in-place restore changes nothing).
    for uuid in seen.keys() {
        if let Some(i) = free.iter().position(|t| t.uuid == *uuid) {
            free.remove(i);
            pairs.insert(*uuid, *uuid);
        }
    }
    // The others in the order of the old machine (else of their UUIDs).
    let mut rest: Vec<&Seen> = seen
        .values()
        .filter(|s| !pairs.contains_key(&s.device.uuid))
        .collect();
    rest.sort_by_key(|s| {
        machine
            .iter()
            .position(|m| m.uuid == s.device.uuid)
            .unwrap_or(usize::MAX)
    });
    for s in rest {
        let d = &s.device;
        let i = free
            .iter()
            .position(|t| t.name == d.name.as_str() && t.memory == d.memory)
            .ok_or_else(|| RemapError::NoMatch {
                device: describe(d, machine),
                name: d.name.to_string(),
                memory: d.memory,
            })?;
        pairs.insert(d.uuid, free.remove(i).uuid);
    }
    Ok(pairs)
}

impl fmt::Display for Remap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let moved: Vec<String> = self
            .pairs
            .iter()
            .filter(|(old, new)| old != new)
            .map(|(old, new)| format!("{}={}", uuid_text(old), uuid_text(new)))
            .collect();
        if moved.is_empty() {
            f.write_str("every GPU stays itself")
        } else {
            f.write_str(&moved.join(","))
        }
    }
}

#[cfg(test)]
#[path = "remap_tests.rs"]
mod tests;
