//! What checkpoint and restore do to the device state: the driver's side of the native
//! checkpoint steps the control socket serves (the gate's lock and unlock are the gate's own,
//! `crate::state::gate`).

use crate::abi::consts as c;
use crate::device::{self, Physical};
use crate::driver::DriverState;
use crate::error::{CuError, CuResult};
use crate::state::gate::{Outcome, gate, refused_by_hook};
use crate::state::vmm::{Backing, Target};
use crate::sys;

pub fn checkpoint() -> CuResult<()> {
    refused_by_hook("checkpoint")?;
    let mut g = gate();
    if g.state != c::PROCESS_STATE_LOCKED {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    match crate::driver::with(|d| Ok(d.checkpoint_device()))? {
        Ok(()) => {
            g.state = c::PROCESS_STATE_CHECKPOINTED;
            Ok(())
        }
        Err(Outcome::Refused(e)) => Err(e),
        Err(Outcome::Broken(e)) => {
            g.state = c::PROCESS_STATE_FAILED;
            Err(e)
        }
    }
}

/// Restore onto the restorer's machine: `body` says its devices and the old→new pairs. A
/// refusal (a device missing, unpaired or of another chip, too little memory) leaves the
/// process checkpointed.
pub fn restore(body: super::wire::RestoreBody) -> CuResult<()> {
    let mut g = gate();
    if g.state != c::PROCESS_STATE_CHECKPOINTED {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    let devices = crate::driver::with(|d| d.restored_devices(&body))?;
    let restored = crate::driver::with(|d| {
        // The new devices first: the memory recreated on them is named by them.
        let old = std::mem::replace(&mut d.config.devices, devices);
        let result = d.restore_device();
        if result.is_err() {
            d.config.devices = old;
        }
        Ok(result)
    });
    match restored {
        Ok(Ok(())) => {
            // Restore leaves the process locked; unlock resumes it.
            g.state = c::PROCESS_STATE_LOCKED;
            Ok(())
        }
        Ok(Err(e)) | Err(e) => {
            g.state = c::PROCESS_STATE_FAILED;
            Err(e)
        }
    }
}

impl DriverState {
    /// Why native checkpoint cannot proceed, if it cannot: any sharing the driver cannot save
    /// in one process.
    fn sharing_in_use(&self) -> Option<String> {
        if let Some((h, a)) = self.vmm.allocs.iter().find(|(_, a)| a.shared()) {
            let what = if a.exported {
                "was exported to a shareable handle"
            } else if a.imported {
                "was imported from a shareable handle"
            } else if a.ipc_handle {
                "has a native IPC handle"
            } else {
                "is a peer allocation opened by native IPC"
            };
            return Some(format!("allocation {h:#x} {what}"));
        }
        if self.ipc.live() {
            return Some("a native IPC handle of a peer is open".to_owned());
        }
        if let Some(h) = self.mc.objects.keys().next() {
            return Some(format!("multicast object {h:#x} is alive"));
        }
        if let Some(why) = self.pools.shared() {
            return Some(why);
        }
        None
    }

    fn checkpoint_device(&mut self) -> Result<(), Outcome> {
        if let Some(why) = self.sharing_in_use() {
            eprintln!(
                "fakecuda: pid {}: checkpoint refused: {why}",
                std::process::id()
            );
            return Err(Outcome::Refused(CuError::CUDA_ERROR_NOT_SUPPORTED));
        }
        // Copy every allocation to host memory first: nothing is destroyed if this fails.
        let mut saved = Vec::with_capacity(self.vmm.allocs.len());
        for (h, a) in &self.vmm.allocs {
            let fd = a.fd().map_err(Outcome::Refused)?;
            saved.push((*h, sys::read_all(fd, a.size).map_err(Outcome::Refused)?));
        }
        // Release the device: views become inaccessible PROT_NONE reservations (the address ranges
        // stay reserved), memfds are closed.
        for (start, m) in &self.vmm.mappings {
            // SAFETY: every mapping lies in a fakecuda reservation.
            unsafe { sys::unmap_to_reservation(*start, m.size) }.map_err(Outcome::Broken)?;
        }
        for (h, bytes) in saved {
            if let Some(a) = self.vmm.allocs.get_mut(&h) {
                a.backing = Backing::Host(bytes);
            }
        }
        Ok(())
    }

    /// The devices this process's ordinals get on the restorer's machine, refusing as the
    /// driver does: with pairs, every device of the process paired once, onto a device of the
    /// machine of the same chip with room for what it held, no two onto one; without pairs,
    /// every device present as it was.
    fn restored_devices(&self, body: &super::wire::RestoreBody) -> CuResult<Vec<Physical>> {
        let refuse = |e: CuError, why: String| {
            eprintln!(
                "fakecuda: pid {}: restore refused: {why}",
                std::process::id()
            );
            Err(e)
        };
        let mut devices: Vec<Physical> = Vec::with_capacity(self.config.devices.len());
        for (ordinal, old) in (0u32..).zip(&self.config.devices) {
            let name = device::uuid_string(&old.uuid);
            let new_uuid = if body.pairs.is_empty() {
                old.uuid
            } else {
                let mut paired = body.pairs.iter().filter(|(o, _)| *o == old.uuid);
                match (paired.next(), paired.next()) {
                    (Some((_, new)), None) => *new,
                    (None, _) => {
                        return refuse(
                            CuError::CUDA_ERROR_INVALID_VALUE,
                            format!("device {ordinal} ({name}) has no GPU pair"),
                        );
                    }
                    _ => {
                        return refuse(
                            CuError::CUDA_ERROR_INVALID_VALUE,
                            format!("device {ordinal} ({name}) is paired twice"),
                        );
                    }
                }
            };
            let Some(new) = body.machine.iter().find(|d| d.uuid == new_uuid) else {
                return refuse(
                    CuError::CUDA_ERROR_INVALID_DEVICE,
                    format!(
                        "device {ordinal} ({name}): {} is not on this machine",
                        device::uuid_string(&new_uuid)
                    ),
                );
            };
            if new.model != old.model {
                return refuse(
                    CuError::CUDA_ERROR_INVALID_DEVICE,
                    format!(
                        "device {ordinal} ({name}) is a {}, {} a {}",
                        old.model,
                        device::uuid_string(&new.uuid),
                        new.model
                    ),
                );
            }
            let used = self.vmm.used(ordinal);
            if used > new.memory {
                return refuse(
                    CuError::CUDA_ERROR_OUT_OF_MEMORY,
                    format!(
                        "device {ordinal} ({name}) held {used} bytes, {} has {}",
                        device::uuid_string(&new.uuid),
                        new.memory
                    ),
                );
            }
            if devices.iter().any(|d| d.uuid == new.uuid) {
                return refuse(
                    CuError::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "two devices are paired onto {}",
                        device::uuid_string(&new.uuid)
                    ),
                );
            }
            devices.push(new.clone());
        }
        Ok(devices)
    }

    fn restore_device(&mut self) -> CuResult<()> {
        for a in self.vmm.allocs.values_mut() {
            if let Backing::Host(bytes) = &a.backing {
                let name = crate::state::vmm::alloc_memfd_name(
                    &self.config,
                    a.location_type,
                    a.device,
                    a.handle_types,
                )?;
                let fd = sys::new_memfd(&name, a.size)?;
                sys::write_all(&fd, bytes)?;
                a.backing = Backing::Device(fd);
            }
        }
        for (start, m) in &self.vmm.mappings {
            if let Target::Alloc(h) = m.target {
                let a = self
                    .vmm
                    .allocs
                    .get(&h)
                    .ok_or(CuError::CUDA_ERROR_ILLEGAL_STATE)?;
                // SAFETY: the mapping's range is still reserved by fakecuda (a PROT_NONE reservation
                // since checkpoint).
                unsafe { sys::map_shared(*start, m.size, a.fd()?, m.offset, m.prot())? };
            }
        }
        Ok(())
    }
}
