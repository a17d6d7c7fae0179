//! Native checkpoint emulation: the gate every entry point passes (so a lock really stops
//! the application's driver calls), the process state machine, and what checkpoint and
//! restore do to the device state.

pub mod client;
pub mod server;
pub mod wire;

use crate::abi::consts as c;
use crate::device::{self, Physical};
use crate::driver::Driver;
use crate::error::{CuError, CuResult};
use crate::sys;
use crate::vmm::{Backing, Target};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug)]
struct Gate {
    state: u32,
    /// A lock is waiting for in-flight calls to drain; new calls wait.
    draining: bool,
    in_flight: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    state: c::PROCESS_STATE_RUNNING,
    draining: false,
    in_flight: 0,
});
static GATE_CV: Condvar = Condvar::new();

fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Proof that the caller passed the gate; dropping it lets a pending lock proceed.
#[derive(Debug)]
pub struct Pass(());

impl Drop for Pass {
    fn drop(&mut self) {
        let mut g = gate();
        g.in_flight -= 1;
        if g.in_flight == 0 {
            GATE_CV.notify_all();
        }
    }
}

/// Another pass, for work that a call (which passed the gate and still holds its pass) queues
/// on a stream: the native lock then also waits for that work to run, as the driver's lock
/// waits for submitted work. Never waits: only called from inside a gated call.
pub fn extend() -> Pass {
    gate().in_flight += 1;
    Pass(())
}

/// Waits while the process is locked or checkpointed, as driver calls block on the real
/// driver between lock and unlock.
pub fn enter() -> Pass {
    let mut g = gate();
    while g.state != c::PROCESS_STATE_RUNNING || g.draining {
        g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.in_flight += 1;
    Pass(())
}

pub fn state() -> u32 {
    gate().state
}

/// Test hook: `FAKECUDA_REFUSE_CHECKPOINT=lock` (or `checkpoint`) in the target process makes
/// that native step refuse with `CUDA_ERROR_NOT_SUPPORTED`, leaving the state unchanged, as the
/// driver refuses a process it cannot checkpoint.
fn refused_by_hook(step: &str) -> CuResult<()> {
    match std::env::var("FAKECUDA_REFUSE_CHECKPOINT") {
        Ok(value) if value.split(',').any(|v| v == step) => Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
        _ => Ok(()),
    }
}

/// Lock: from RUNNING only; waits up to `timeout_ms` (0: no limit) for calls in flight.
pub fn lock(timeout_ms: u32) -> CuResult<()> {
    refused_by_hook("lock")?;
    let mut g = gate();
    if g.state != c::PROCESS_STATE_RUNNING || g.draining {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    g.draining = true;
    if timeout_ms == 0 {
        while g.in_flight > 0 {
            g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    } else {
        let (ng, res) = GATE_CV
            .wait_timeout_while(g, Duration::from_millis(u64::from(timeout_ms)), |g| {
                g.in_flight > 0
            })
            .unwrap_or_else(|e| e.into_inner());
        g = ng;
        if res.timed_out() && g.in_flight > 0 {
            g.draining = false;
            GATE_CV.notify_all();
            return Err(CuError::CUDA_ERROR_TIMEOUT);
        }
    }
    g.draining = false;
    g.state = c::PROCESS_STATE_LOCKED;
    Ok(())
}

pub fn unlock() -> CuResult<()> {
    let mut g = gate();
    if g.state != c::PROCESS_STATE_LOCKED {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    g.state = c::PROCESS_STATE_RUNNING;
    GATE_CV.notify_all();
    Ok(())
}

/// A failure after destructive work leaves the process FAILED; a refusal before it leaves the
/// state unchanged.
enum Outcome {
    Refused(CuError),
    Broken(CuError),
}

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
pub fn restore(body: wire::RestoreBody) -> CuResult<()> {
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

impl Driver {
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
    fn restored_devices(&self, body: &wire::RestoreBody) -> CuResult<Vec<Physical>> {
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
                let name = crate::vmm::alloc_memfd_name(
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
