//! Peer access for the adapter's `cuMemAlloc` regions. The driver's `cuCtxEnablePeerAccess`
//! lets the current context reach everything the peer context allocates with `cuMemAlloc`,
//! before and after; VMM memory ignores it and obeys `cuMemSetAccess` alone. The adapter's
//! regions are VMM memory, so the shim does the driver's part: after a successful enable it
//! grants the accessing device read-write on the peer context's regions, and every region the
//! peer context makes later gets that grant too. The grants are ordinary mapping access in
//! the registry, so a checkpoint restores them with the mappings; the links live in the
//! registry (process memory) and so survive it as well.

use crate::driver::{Driver, context, driver};
use crate::log;
use crate::state::process;
use crate::state::registry::{Kind, Registry};
use crate::sys::abi::{RawAccessDesc, RawLocation, consts};
use crate::sys::convert::{self, device_grant as grant};
use crate::sys::error::CuResult;
use cuinterpose_protocol::{AccessDescriptor, AccessFlags, LocationType};

fn descriptor(device: i32, flags: u32) -> RawAccessDesc {
    RawAccessDesc {
        location: RawLocation {
            type_: consts::LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags,
    }
}

/// (base, extent) of the adapter's regions that context `ctx` owns and peer access reaches:
/// `cuMemAlloc` memory and opened IPC handles (pool memory obeys its pool's access instead).
fn regions_of(r: &Registry, ctx: usize) -> Vec<(u64, u64)> {
    r.mappings
        .iter()
        .filter(|(_, m)| m.kind == Kind::Unicast)
        .filter_map(|(&base, m)| {
            let a = r.allocations.get(&m.id)?;
            let plain = a.malloc.is_some_and(|info| info.pool == 0);
            (plain && a.context == ctx).then_some((base, m.size))
        })
        .collect()
}

/// The devices other than `device` that have peer access to context `ctx`: what a new region
/// of `ctx` on `device` must grant besides its own device.
pub fn peer_devices(r: &Registry, ctx: usize, device: i32) -> Vec<i32> {
    let mut devices: Vec<i32> = r
        .peer_links
        .iter()
        .filter(|((_, peer), d)| *peer == ctx && **d != device)
        .map(|(_, d)| *d)
        .collect();
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// Grants `devices` read-write on the region at `address` (a fresh one: nothing to undo
/// beyond the call itself). Returns the access to record beside the owner's.
pub fn grant_new_region(
    d: &Driver,
    address: u64,
    extent: u64,
    devices: &[i32],
) -> CuResult<Vec<AccessDescriptor>> {
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    let raw: Vec<RawAccessDesc> = devices
        .iter()
        .map(|&dev| descriptor(dev, consts::ACCESS_READWRITE))
        .collect();
    d.mem_set_access(address, extent as usize, &raw)?;
    Ok(devices
        .iter()
        .map(|&dev| grant(dev, AccessFlags::ProtReadWrite))
        .collect())
}

fn record(r: &mut Registry, base: u64, access: AccessDescriptor) {
    if let Some(m) = r.mappings.get_mut(&base) {
        m.access = convert::merge_access(&m.access, &[access]);
    }
}

/// `cuCtxEnablePeerAccess`: the driver's call, then read-write for the current device on each
/// of the peer context's regions. If a grant fails, the grants made are taken back and the
/// peer access disabled again, and the error returned: nothing changed.
pub fn enable(peer: usize, flags: u32) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let ctx = context::current(d);
        let device = context::current_device(d)?;
        let regions = regions_of(r, peer);
        if !regions.is_empty() {
            r.require_active()?;
        }
        d.ctx_enable_peer_access(peer, flags)?;
        let mut granted = Vec::with_capacity(regions.len());
        for &(base, size) in &regions {
            let already = r.mappings[&base].access.iter().any(|a| {
                a.location.location_type == LocationType::Device
                    && a.location.id == device
                    && a.flags == AccessFlags::ProtReadWrite
            });
            if already {
                continue;
            }
            let rw = descriptor(device, consts::ACCESS_READWRITE);
            if let Err(e) = d.mem_set_access(base, size as usize, &[rw]) {
                for &(b, s) in &granted {
                    let _ = d.mem_set_access(b, s, &[descriptor(device, consts::ACCESS_NONE)]);
                }
                let _ = d.ctx_disable_peer_access(peer);
                log!(
                    "cuCtxEnablePeerAccess: granting device {device} the region at {base:#x} \
                     failed ({e}); peer access disabled again"
                );
                return Err(e);
            }
            granted.push((base, size as usize));
        }
        for (base, _) in granted {
            record(r, base, grant(device, AccessFlags::ProtReadWrite));
        }
        r.peer_links.insert((ctx, peer), device);
        Ok(())
    })
}

/// Takes `device`'s grants on `peer`'s regions back, unless another context of that device
/// still has peer access to `peer`. Best effort after the driver's own call succeeded: a grant
/// left behind is only more access than the driver would give, and is logged.
fn revoke(d: &Driver, r: &mut Registry, peer: usize, device: i32) {
    if r.peer_links
        .iter()
        .any(|((_, p), dev)| *p == peer && *dev == device)
    {
        return;
    }
    for (base, size) in regions_of(r, peer) {
        let owner = r
            .mappings
            .get(&base)
            .and_then(|m| r.allocations.get(&m.id))
            .map(|a| a.properties.location.id);
        if owner == Some(device) {
            continue;
        }
        match d.mem_set_access(
            base,
            size as usize,
            &[descriptor(device, consts::ACCESS_NONE)],
        ) {
            Ok(()) => record(r, base, grant(device, AccessFlags::ProtNone)),
            Err(e) => log!(
                "peer access of device {device} to the region at {base:#x} could not be taken \
                 back ({e}); it keeps its access"
            ),
        }
    }
}

/// `cuCtxDisablePeerAccess`: the driver's call, then the grants it ends.
pub fn disable(peer: usize) -> CuResult<()> {
    let d = driver()?;
    process::with(|r| {
        let ctx = context::current(d);
        d.ctx_disable_peer_access(peer)?;
        if let Some(device) = r.peer_links.remove(&(ctx, peer)) {
            revoke(d, r, peer, device);
        }
        Ok(())
    })
}

/// Context `ctx` is gone (destroyed, or reset as a primary context): its peer access ends both
/// ways, and with it the grants it made on other contexts' regions.
pub fn forget_context(d: &Driver, r: &mut Registry, ctx: usize) {
    let ended: Vec<((usize, usize), i32)> = r
        .peer_links
        .iter()
        .filter(|((from, to), _)| *from == ctx || *to == ctx)
        .map(|(k, v)| (*k, *v))
        .collect();
    for ((from, to), device) in ended {
        r.peer_links.remove(&(from, to));
        if from == ctx {
            revoke(d, r, to, device);
        }
    }
}
