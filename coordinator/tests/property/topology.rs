//! The normalized topology a case builds ([`Plan`], from a generated spec), in granules of
//! [`GRAN`], and its one-line-per-object description for failure reports.

use crate::spec::{MapSpec, Spec};

/// The granule every allocation, mapping and binding is measured in.
pub(crate) const GRAN: u64 = 2 << 20;
pub(crate) use cuinterpose_workload::cuda::{
    ACCESS_READ as READ, ACCESS_READWRITE as READ_WRITE, HANDLE_TYPE_POSIX_FD as POSIX,
};

#[derive(Debug, Clone)]
pub(crate) struct MapPlan {
    /// In granules.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// The worker's own device has read-write access (else read-only): fills go through it.
    pub(crate) writable: bool,
    /// (device, flags), sorted by device, flags READ or READ_WRITE.
    pub(crate) grants: Vec<(i32, u32)>,
}

#[derive(Debug, Clone)]
pub(crate) struct ImportPlan {
    pub(crate) process: usize,
    /// An earlier import (index) whose handle re-exports the ticket, else the creator's.
    pub(crate) relay_from: Option<usize>,
    pub(crate) map: MapPlan,
    pub(crate) release: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct AllocPlan {
    pub(crate) creator: usize,
    pub(crate) device: i32,
    pub(crate) granules: u64,
    pub(crate) handle_types: u32,
    pub(crate) export: bool,
    pub(crate) creator_release: bool,
    pub(crate) creator_maps: Vec<MapPlan>,
    pub(crate) imports: Vec<ImportPlan>,
    pub(crate) writer: u8,
}

impl AllocPlan {
    pub(crate) fn shared(&self) -> bool {
        !self.imports.is_empty()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct IpcPlan {
    pub(crate) creator: usize,
    pub(crate) size: u64,
    pub(crate) get: bool,
    /// One process per open (a process may open twice).
    pub(crate) opens: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bind {
    Mem(bool),
    Addr(bool),
}

#[derive(Debug, Clone)]
pub(crate) struct GroupPlan {
    pub(crate) members: Vec<usize>,
    pub(crate) granules: u64,
    /// Per member, per multicast granule: how it is bound (None: unbound). Multicast granule
    /// `i` binds member granule `(i + rotation) % granules`.
    pub(crate) binds: Vec<Vec<Option<Bind>>>,
    pub(crate) rotation: u64,
    pub(crate) views: Vec<bool>,
}

#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) processes: usize,
    pub(crate) device_count: i32,
    pub(crate) devices: Vec<i32>,
    pub(crate) allocations: Vec<AllocPlan>,
    pub(crate) ipc: Vec<IpcPlan>,
    pub(crate) groups: Vec<GroupPlan>,
}

pub(crate) fn map_plan(spec: &MapSpec, granules: u64, own_device: i32) -> MapPlan {
    let (offset, len) = if spec.whole {
        (0, granules)
    } else {
        let offset = u64::from(spec.offset) % granules;
        let len = (u64::from(spec.len) - 1) % (granules - offset) + 1;
        (offset, len)
    };
    let mut grants = vec![(own_device, if spec.writable { READ_WRITE } else { READ })];
    for (device, flags) in (0i32..).zip(spec.others) {
        if device != own_device && flags > 0 {
            grants.push((device, if flags == 2 { READ_WRITE } else { READ }));
        }
    }
    grants.sort_unstable();
    MapPlan {
        offset,
        len,
        writable: spec.writable,
        grants,
    }
}

impl Plan {
    pub(crate) fn new(spec: &Spec) -> Plan {
        let processes = usize::from(spec.processes.clamp(1, 6));
        let device_count: i32 = if spec.four_devices { 4 } else { 2 };
        let devices: Vec<i32> = (0..processes)
            .map(|p| {
                let raw = if spec.round_robin {
                    p as i32
                } else {
                    i32::from(spec.devices.get(p).copied().unwrap_or(0))
                };
                raw % device_count
            })
            .collect();
        // Another process than `not`, chosen by `raw` (None with a single process).
        let other = |raw: u8, not: usize| -> Option<usize> {
            (processes > 1).then(|| (not + 1 + usize::from(raw) % (processes - 1)) % processes)
        };
        let allocations = spec
            .allocations
            .iter()
            .take(usize::from(spec.allocation_count.clamp(1, 20)))
            .map(|a| {
                let creator = usize::from(a.creator) % processes;
                let granules = u64::from(a.granules.clamp(1, 4));
                let own = devices[creator];
                let mut creator_maps = vec![MapPlan {
                    offset: 0,
                    len: granules,
                    writable: true,
                    grants: vec![(own, READ_WRITE)],
                }];
                if let Some(extra) = &a.creator_extra {
                    creator_maps.push(map_plan(extra, granules, own));
                }
                let mut imports: Vec<ImportPlan> = Vec::new();
                if !a.private {
                    for import in &a.imports {
                        let Some(process) = other(import.importer, creator) else {
                            break;
                        };
                        let relay_from = if import.relay {
                            imports.iter().rposition(|earlier| !earlier.release)
                        } else {
                            None
                        };
                        imports.push(ImportPlan {
                            process,
                            relay_from,
                            map: map_plan(&import.map, granules, devices[process]),
                            release: import.map.release,
                        });
                    }
                }
                AllocPlan {
                    creator,
                    device: i32::from(a.device % 2),
                    granules,
                    handle_types: if a.private && !a.private_posix {
                        0
                    } else {
                        POSIX
                    },
                    export: !a.private,
                    creator_release: a.creator_release,
                    creator_maps,
                    imports,
                    writer: a.writer,
                }
            })
            .collect();
        let ipc = spec
            .ipc
            .iter()
            .map(|i| {
                let creator = usize::from(i.creator) % processes;
                let opens = if i.shared {
                    i.opens
                        .iter()
                        .filter_map(|&raw| other(raw, creator))
                        .collect()
                } else {
                    Vec::new()
                };
                IpcPlan {
                    creator,
                    size: u64::from(i.quarter_mib.max(1)) << 18,
                    get: i.shared,
                    opens,
                }
            })
            .collect();
        let groups = spec
            .groups
            .iter()
            .filter_map(|g| {
                let mut members: Vec<usize> = Vec::new();
                for &raw in &g.members {
                    let p = usize::from(raw) % processes;
                    if !members.contains(&p) && !members.iter().any(|&m| devices[m] == devices[p]) {
                        members.push(p);
                    }
                }
                if members.len() < 2 {
                    return None;
                }
                let granules = u64::from(g.granules.clamp(1, 3));
                let binds = (0..members.len())
                    .map(|m| {
                        let mut row: Vec<Option<Bind>> = (0..granules as usize)
                            .map(|i| match g.binds.get(m * 3 + i).copied().unwrap_or(0) {
                                0 => Some(Bind::Mem(false)),
                                1 => Some(Bind::Mem(true)),
                                2 => Some(Bind::Addr(false)),
                                3 => Some(Bind::Addr(true)),
                                _ => None,
                            })
                            .collect();
                        // Every attached device needs a binding.
                        if row.iter().all(Option::is_none) {
                            row[0] = Some(Bind::Mem(false));
                        }
                        row
                    })
                    .collect();
                Some(GroupPlan {
                    granules,
                    binds,
                    rotation: u64::from(g.rotation) % granules,
                    views: (0..members.len())
                        .map(|m| g.views.get(m).copied().unwrap_or(false))
                        .collect(),
                    members,
                })
            })
            .collect();
        Plan {
            processes,
            device_count,
            devices,
            allocations,
            ipc,
            groups,
        }
    }
}

pub(crate) fn describe_map(map: &MapPlan) -> String {
    let grants: Vec<String> = map
        .grants
        .iter()
        .map(|(device, flags)| format!("d{device}={}", if *flags == READ { "r" } else { "rw" }))
        .collect();
    format!(
        "granules {}+{} [{}]{}",
        map.offset,
        map.len,
        grants.join(","),
        if map.writable { "" } else { " read-only" }
    )
}

/// The topology, one line per object.
pub(crate) fn describe(plan: &Plan) -> String {
    let mut out = format!(
        "{} processes on devices {:?} (of {})\n",
        plan.processes, plan.devices, plan.device_count
    );
    for (a, alloc) in plan.allocations.iter().enumerate() {
        let kind = match (alloc.export, alloc.shared(), alloc.handle_types) {
            (false, _, 0) => "private untracked",
            (false, _, _) => "private posix",
            (true, false, _) => "exported, never imported",
            (true, true, _) => "shared",
        };
        let maps: Vec<String> = alloc.creator_maps.iter().map(describe_map).collect();
        out.push_str(&format!(
            "  vmm {a}: p{} device {} {} granules, {kind}{}, creator maps {}\n",
            alloc.creator,
            alloc.device,
            alloc.granules,
            if alloc.creator_release {
                ", creator releases"
            } else {
                ""
            },
            maps.join("; ")
        ));
        for (i, import) in alloc.imports.iter().enumerate() {
            out.push_str(&format!(
                "    import {i}: p{} {}{}{}\n",
                import.process,
                describe_map(&import.map),
                import
                    .relay_from
                    .map_or(String::new(), |j| format!(", ticket relayed by import {j}")),
                if import.release { ", released" } else { "" }
            ));
        }
    }
    for (i, ipc) in plan.ipc.iter().enumerate() {
        out.push_str(&format!(
            "  ipc {i}: p{} {:#x} bytes, {}, opened by {:?}\n",
            ipc.creator,
            ipc.size,
            if ipc.get { "handle taken" } else { "no handle" },
            ipc.opens
        ));
    }
    for (g, group) in plan.groups.iter().enumerate() {
        out.push_str(&format!(
            "  multicast {g}: {} granules, rotation {}\n",
            group.granules, group.rotation
        ));
        for (m, &p) in group.members.iter().enumerate() {
            out.push_str(&format!(
                "    member p{p} device {}: binds {:?}{}\n",
                plan.devices[p],
                group.binds[m],
                if group.views[m] {
                    ", maps the object"
                } else {
                    ""
                }
            ));
        }
    }
    out
}
