//! Property-based end to end: random sharing topologies, built for real by worker processes
//! (`cuinterpose-worker` under the shim, over fakecuda), toggled in place by the `cuinterpose`
//! binary, then verified byte for byte at the same addresses, record by record against the
//! state captured at `begin_checkpoint`, for live sharing and for leaked descriptors.
//!
//! A topology: 1–6 processes; 1–20 VMM allocations (1–4 granules, random creator and device),
//! private ones (never exported, with or without a POSIX handle type), exported ones nobody
//! imports, and shared ones imported by random other processes (the same process possibly
//! several times, some tickets relayed through an importer's re-export), each import mapping
//! the whole allocation or a granule-aligned sub-range with random per-device access
//! (read-write or read-only), some importers releasing their handle right after mapping, some
//! creators releasing theirs once the imports are done, some creators mapping a second range;
//! legacy IPC (`cuMemAlloc` + `cuIpcGetMemHandle`, opened by others, possibly twice); and
//! multicast teams of 2–4 processes on distinct devices (four fakecuda devices when the case
//! asks for them), every member adding its device first, then binding each granule with
//! `cuMulticastBindMem`/`BindAddr`, v1 or v2, or leaving it unbound, some members mapping the
//! multicast object.
//!
//! Each case is toggled in place (`cuinterpose toggle --pid <this process> --dir ...`) twice by
//! default. After each toggle: the state captured at `begin_checkpoint` equals the inspection
//! taken before the first toggle and the inspection after restore equals the state, record by
//! record (multicast records included); the records match what the case built (each mapping at
//! its address with its range and access, one allocation id per allocation, host carriers on
//! the creators of shared allocations only, handle counts, each team's object, devices,
//! bindings and mappings); the host-carrier bytes are saved once and loaded once, between the
//! bytes of the allocations that must be carried and those that may be; every byte is where it
//! was (every mapping of every allocation, granule by granule, the IPC pointers and their
//! `cuMemGetAddressRange`, member memory and multicast views); the driver's access per device
//! is what was granted; a write through one process is seen by every other; and nothing
//! leaked: each worker keeps as many fakecuda memfds alive as before, its open descriptors
//! (by target) are those it had before the first toggle, except one more per multicast member
//! allocation after the first (a duplicate of the recreated backing, not the old one), and
//! exactly those of the previous toggle after later ones.
//!
//! Environment: `CUINTERPOSE_SOAK_CASES` (cases, default 12), `CUINTERPOSE_PROPTEST_SEED` (a
//! u64, decimal or 0x-hex; default fixed, so CI is reproducible), `CUINTERPOSE_PROPTEST_CASE=N`
//! (run case N of that seed only), `CUINTERPOSE_PROPTEST_SHRINK` (shrinking runs after a
//! failure, default 8, 0 turns shrinking off), `CUINTERPOSE_PROPTEST_TOGGLES` (toggles per
//! case, default 2), `CUINTERPOSE_PROPTEST_VERBOSE` (a line per case). Every case runs even
//! after a failure; the test then fails, printing each failing case (seed, index, topology,
//! error, the workers' stderr) and the smallest failing topology shrinking found. The last
//! line of output sums up: cases, failures, bytes verified, processes, allocations, IPC
//! allocations, multicast groups.
//!
//! One `#[test]` only: `toggle --pid <this process>` takes the whole process tree rooted here,
//! so two cases must never run at once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cuinterpose_coordinator::fixtures::TempDir;
use cuinterpose_coordinator::session::{self, Session};
use cuinterpose_coordinator::{render, state};
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    AccessFlags, AllocationReference, BindingSource, BindingVersion, NamespacePid, Phase, Record,
};
use cuinterpose_workload::pattern::splitmix64;
use cuinterpose_workload::{
    EntryPath, Grant, Output, Worker, WorkerConfig, WorkloadError, build_shim, build_worker,
    fakecuda_lib_dir,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use serde_json::Value;

const GRAN: u64 = 2 << 20;
use cuinterpose_workload::cuda::{
    ACCESS_READ as READ, ACCESS_READWRITE as READ_WRITE, HANDLE_TYPE_POSIX_FD as POSIX,
};
const DEFAULT_CASES: u32 = 12;
const DEFAULT_SEED: u64 = 0x00c0_ffee_2024_0001;
const DEFAULT_SHRINK: u32 = 8;
const DEFAULT_TOGGLES: u32 = 2;

// ---------------------------------------------------------------------------------------------
// Raw generated values. Every field is free; `Plan::new` turns them into a valid topology
// (indices taken modulo the process count, ranges clamped), so shrinking any field keeps the
// case valid.

#[derive(Debug, Clone)]
struct MapSpec {
    whole: bool,
    offset: u8,
    len: u8,
    writable: bool,
    /// Access of devices 0 and 1 besides the worker's own: 0 none, 1 read, 2 read-write.
    others: [u8; 2],
    release: bool,
}

#[derive(Debug, Clone)]
struct ImportSpec {
    importer: u8,
    relay: bool,
    map: MapSpec,
}

#[derive(Debug, Clone)]
struct AllocSpec {
    creator: u8,
    device: u8,
    granules: u8,
    private: bool,
    private_posix: bool,
    creator_release: bool,
    creator_extra: Option<MapSpec>,
    imports: Vec<ImportSpec>,
    writer: u8,
}

#[derive(Debug, Clone)]
struct IpcSpec {
    creator: u8,
    quarter_mib: u8,
    shared: bool,
    opens: Vec<u8>,
}

#[derive(Debug, Clone)]
struct GroupSpec {
    members: Vec<u8>,
    granules: u8,
    /// Per (member, granule): 0 BindMem v1, 1 BindMem v2, 2 BindAddr v1, 3 BindAddr v2,
    /// 4 unbound.
    binds: Vec<u8>,
    rotation: u8,
    views: Vec<bool>,
}

#[derive(Debug, Clone)]
struct Spec {
    processes: u8,
    four_devices: bool,
    /// Process `p` on device `p % devices` (the most distinct devices, for multicast teams),
    /// else on `devices[p] % devices`.
    round_robin: bool,
    devices: Vec<u8>,
    allocations: Vec<AllocSpec>,
    /// How many of `allocations` the case uses (at least one).
    allocation_count: u8,
    ipc: Vec<IpcSpec>,
    groups: Vec<GroupSpec>,
}

fn map_spec() -> impl Strategy<Value = MapSpec> {
    (
        any::<bool>(),
        0u8..4,
        1u8..=4,
        prop::bool::weighted(0.75),
        prop::array::uniform2(0u8..3),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(whole, offset, len, writable, others, release)| MapSpec {
            whole,
            offset,
            len,
            writable,
            others,
            release,
        })
}

fn alloc_spec() -> impl Strategy<Value = AllocSpec> {
    let import =
        (0u8..6, prop::bool::weighted(0.25), map_spec()).prop_map(|(importer, relay, map)| {
            ImportSpec {
                importer,
                relay,
                map,
            }
        });
    (
        (0u8..6, 0u8..2, 1u8..=4),
        prop::bool::weighted(0.3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, map_spec()),
        prop::collection::vec(import, 0..=4),
        any::<u8>(),
    )
        .prop_map(
            |(
                (creator, device, granules),
                private,
                private_posix,
                creator_release,
                creator_extra,
                imports,
                writer,
            )| AllocSpec {
                creator,
                device,
                granules,
                private,
                private_posix,
                creator_release,
                creator_extra,
                imports,
                writer,
            },
        )
}

fn ipc_spec() -> impl Strategy<Value = IpcSpec> {
    (
        0u8..6,
        1u8..=24,
        prop::bool::weighted(0.8),
        prop::collection::vec(0u8..6, 0..=3),
    )
        .prop_map(|(creator, quarter_mib, shared, opens)| IpcSpec {
            creator,
            quarter_mib,
            shared,
            opens,
        })
}

fn group_spec() -> impl Strategy<Value = GroupSpec> {
    (
        prop::collection::vec(0u8..6, 2..=4),
        1u8..=3,
        prop::collection::vec(0u8..5, 12),
        0u8..3,
        prop::collection::vec(any::<bool>(), 4),
    )
        .prop_map(|(members, granules, binds, rotation, views)| GroupSpec {
            members,
            granules,
            binds,
            rotation,
            views,
        })
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![1 => Just(1u8), 5 => 2u8..=6],
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.5),
        prop::collection::vec(0u8..4, 6),
        prop::collection::vec(alloc_spec(), 1..=20),
        // Mostly few: each allocation costs every later check a pass over its bytes.
        prop_oneof![3 => 1u8..=8, 1 => 9u8..=20],
        prop::collection::vec(ipc_spec(), 0..=3),
        prop::collection::vec(group_spec(), 0..=2),
    )
        .prop_map(
            |(
                processes,
                four_devices,
                round_robin,
                devices,
                allocations,
                allocation_count,
                ipc,
                groups,
            )| Spec {
                processes,
                four_devices,
                round_robin,
                devices,
                allocations,
                allocation_count,
                ipc,
                groups,
            },
        )
}

// ---------------------------------------------------------------------------------------------
// The normalized topology.

#[derive(Debug, Clone)]
struct MapPlan {
    /// In granules.
    offset: u64,
    len: u64,
    /// The worker's own device has read-write access (else read-only): fills go through it.
    writable: bool,
    /// (device, flags), sorted by device, flags READ or READ_WRITE.
    grants: Vec<(i32, u32)>,
}

#[derive(Debug, Clone)]
struct ImportPlan {
    process: usize,
    /// An earlier import (index) whose handle re-exports the ticket, else the creator's.
    relay_from: Option<usize>,
    map: MapPlan,
    release: bool,
}

#[derive(Debug, Clone)]
struct AllocPlan {
    creator: usize,
    device: i32,
    granules: u64,
    handle_types: u32,
    export: bool,
    creator_release: bool,
    creator_maps: Vec<MapPlan>,
    imports: Vec<ImportPlan>,
    writer: u8,
}

impl AllocPlan {
    fn shared(&self) -> bool {
        !self.imports.is_empty()
    }
}

#[derive(Debug, Clone)]
struct IpcPlan {
    creator: usize,
    size: u64,
    get: bool,
    /// One process per open (a process may open twice).
    opens: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bind {
    Mem(bool),
    Addr(bool),
}

#[derive(Debug, Clone)]
struct GroupPlan {
    members: Vec<usize>,
    granules: u64,
    /// Per member, per multicast granule: how it is bound (None: unbound). Multicast granule
    /// `i` binds member granule `(i + rotation) % granules`.
    binds: Vec<Vec<Option<Bind>>>,
    rotation: u64,
    views: Vec<bool>,
}

#[derive(Debug, Clone)]
struct Plan {
    processes: usize,
    device_count: i32,
    devices: Vec<i32>,
    allocations: Vec<AllocPlan>,
    ipc: Vec<IpcPlan>,
    groups: Vec<GroupPlan>,
}

fn map_plan(spec: &MapSpec, granules: u64, own_device: i32) -> MapPlan {
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
    fn new(spec: &Spec) -> Plan {
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

// ---------------------------------------------------------------------------------------------
// Running one case.

/// The built binaries, shared by every case.
struct Env {
    shim: PathBuf,
    worker: PathBuf,
    fakecuda: PathBuf,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    bytes_verified: u64,
    processes: usize,
    allocations: usize,
    shared_allocations: usize,
    ipc: usize,
    groups: usize,
    carried: u64,
}

type CaseResult<T> = Result<T, String>;

trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> CaseResult<T>;
}

impl<T> Context<T> for Result<T, WorkloadError> {
    fn ctx(self, what: impl FnOnce() -> String) -> CaseResult<T> {
        self.map_err(|error| format!("{}: {error}", what()))
    }
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

/// One VMM mapping held by a process.
#[derive(Debug, Clone)]
struct Held {
    process: usize,
    alloc: usize,
    address: u64,
    map: MapPlan,
}

#[derive(Debug)]
struct McMember {
    process: usize,
    handle: u64,
    memory_va: u64,
    view: Option<u64>,
}

/// The live workload and what its memory must hold.
struct Case<'a> {
    plan: &'a Plan,
    tag: u64,
    dir: TempDir,
    workers: Vec<Worker>,
    /// Per VMM allocation, per granule: the pattern seed it holds.
    seeds: Vec<Vec<u64>>,
    held: Vec<Held>,
    /// Per VMM allocation: the creator's handle until it releases it.
    creator_handles: Vec<Option<u64>>,
    /// Per VMM allocation: live import handles per importing process.
    import_handles: Vec<BTreeMap<usize, u64>>,
    /// Per IPC allocation: the creator's pointer, per-chunk seeds, each opener's pointer.
    ipc: Vec<(u64, Vec<u64>, BTreeMap<usize, u64>)>,
    /// Per group, per member; per group, per member granule: seeds.
    groups: Vec<Vec<McMember>>,
    group_seeds: Vec<Vec<Vec<u64>>>,
    generation: u64,
    stats: Stats,
}

impl Case<'_> {
    fn name(&self, p: usize) -> String {
        format!("p{p} (pid {})", self.workers[p].worker_pid())
    }

    fn seed(&mut self, kind: u64, object: usize, granule: u64) -> u64 {
        self.generation += 1;
        splitmix64(
            self.tag ^ (kind << 56) ^ ((object as u64) << 40) ^ (granule << 24) ^ self.generation,
        )
    }

    fn verify(&mut self, p: usize, address: u64, size: u64, seed: u64) -> CaseResult<()> {
        self.workers[p]
            .verify(address, size, seed)
            .ctx(|| format!("{}: verify {size:#x} bytes at {address:#x}", self.name(p)))?;
        self.stats.bytes_verified += size;
        Ok(())
    }

    fn fill(&mut self, p: usize, address: u64, size: u64, seed: u64) -> CaseResult<()> {
        self.workers[p]
            .fill(address, size, seed)
            .ctx(|| format!("{}: fill {size:#x} bytes at {address:#x}", self.name(p)))
    }

    fn spawn(env: &Env, plan: &Plan, dir: &Path) -> CaseResult<Vec<Worker>> {
        let mut workers = Vec::new();
        for p in 0..plan.processes {
            let config = WorkerConfig::new(&env.worker)
                .entry(EntryPath::Dlsym)
                .env("LD_LIBRARY_PATH", &env.fakecuda)
                .env("LD_PRELOAD", &env.shim)
                .env("CUINTERPOSE_CONTROL_DIR", dir.join("ctl"))
                .env("FAKECUDA_CONTROL_DIR", dir.join("fakecuda"))
                .env("FAKECUDA_DEVICES", plan.device_count.to_string())
                .env("FAKECUDA_MULTICAST_BIND_TIMEOUT_MS", "5000")
                .stderr(Output::File(dir.join(format!("worker-{p}.log"))))
                .timeout(Duration::from_secs(30));
            let mut worker = Worker::spawn(&config).map_err(|e| format!("spawn p{p}: {e}"))?;
            let info = worker.init(0).ctx(|| format!("p{p}: init"))?;
            ensure!(
                info.device_count == plan.device_count,
                "p{p}: {} devices, expected {}",
                info.device_count,
                plan.device_count
            );
            if plan.devices[p] != 0 {
                worker
                    .set_device(plan.devices[p])
                    .ctx(|| format!("p{p}: set device {}", plan.devices[p]))?;
            }
            workers.push(worker);
        }
        Ok(workers)
    }

    /// Reserve, map `map`'s granules of `handle` and grant its access.
    fn map(&mut self, p: usize, handle: u64, map: &MapPlan) -> CaseResult<u64> {
        let size = map.len * GRAN;
        let name = self.name(p);
        let worker = &mut self.workers[p];
        let address = worker
            .reserve(size)
            .ctx(|| format!("{name}: reserve {size:#x}"))?;
        worker
            .map(address, size, map.offset * GRAN, handle)
            .ctx(|| format!("{name}: map {handle:#x} at {address:#x}"))?;
        let grants: Vec<Grant> = map
            .grants
            .iter()
            .map(|&(device, flags)| {
                if flags == READ_WRITE {
                    Grant::readwrite(device)
                } else {
                    Grant::read(device)
                }
            })
            .collect();
        worker
            .set_access(address, size, &grants)
            .ctx(|| format!("{name}: set access {:?} at {address:#x}", map.grants))?;
        Ok(address)
    }

    fn verify_held(&mut self, held: &Held) -> CaseResult<()> {
        for g in held.map.offset..held.map.offset + held.map.len {
            let seed = self.seeds[held.alloc][g as usize];
            self.verify(
                held.process,
                held.address + (g - held.map.offset) * GRAN,
                GRAN,
                seed,
            )
            .map_err(|e| format!("allocation {} granule {g}: {e}", held.alloc))?;
        }
        Ok(())
    }

    /// Driver-side access of a mapping, device by device, equals its grants.
    fn check_access(&mut self, held: &Held) -> CaseResult<()> {
        for device in 0..self.plan.device_count {
            let expected = held
                .map
                .grants
                .iter()
                .find(|(d, _)| *d == device)
                .map_or(0, |(_, flags)| u64::from(*flags));
            let name = self.name(held.process);
            let found = self.workers[held.process]
                .get_access(held.address, device)
                .ctx(|| format!("{name}: get access at {:#x}", held.address))?;
            ensure!(
                found == expected,
                "{name}: access of device {device} at {:#x} (allocation {}) is {found}, \
                 expected {expected}",
                held.address,
                held.alloc
            );
        }
        Ok(())
    }

    fn build_vmm(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (a, alloc) in plan.allocations.iter().enumerate() {
            let c = alloc.creator;
            let size = alloc.granules * GRAN;
            let name = self.name(c);
            let handle = self.workers[c]
                .create(size, alloc.device, alloc.handle_types)
                .ctx(|| format!("{name}: create allocation {a} ({size:#x})"))?;
            self.creator_handles[a] = Some(handle);
            let seeds: Vec<u64> = (0..alloc.granules).map(|g| self.seed(1, a, g)).collect();
            self.seeds[a] = seeds;
            for map in &alloc.creator_maps {
                let address = self.map(c, handle, map)?;
                self.held.push(Held {
                    process: c,
                    alloc: a,
                    address,
                    map: map.clone(),
                });
            }
            let whole = self.held[self.held.len() - alloc.creator_maps.len()].address;
            for g in 0..alloc.granules {
                let seed = self.seeds[a][g as usize];
                self.fill(c, whole + g * GRAN, GRAN, seed)?;
            }
            if !alloc.export {
                if alloc.creator_release {
                    self.release(c, a)?;
                }
                continue;
            }
            let ticket: OwnedFd = self.workers[c]
                .export(handle)
                .ctx(|| format!("{name}: export allocation {a}"))?;
            let mut import_handles: Vec<u64> = Vec::new();
            for (i, import) in alloc.imports.iter().enumerate() {
                let p = import.process;
                let relayed: Option<OwnedFd> = match import.relay_from {
                    Some(j) => {
                        let from = alloc.imports[j].process;
                        let from_name = self.name(from);
                        Some(self.workers[from].export(import_handles[j]).ctx(|| {
                            format!("{from_name}: re-export allocation {a} (import {j})")
                        })?)
                    }
                    None => None,
                };
                let fd = relayed.as_ref().unwrap_or(&ticket);
                let name = self.name(p);
                let h = self.workers[p]
                    .import(fd.as_fd())
                    .ctx(|| format!("{name}: import allocation {a} (import {i})"))?;
                import_handles.push(h);
                let address = self.map(p, h, &import.map)?;
                let held = Held {
                    process: p,
                    alloc: a,
                    address,
                    map: import.map.clone(),
                };
                self.held.push(held);
                if import.release {
                    self.workers[p]
                        .release(h)
                        .ctx(|| format!("{name}: release import {i} of allocation {a}"))?;
                } else {
                    *self.import_handles[a].entry(p).or_insert(0) += 1;
                }
            }
            drop(ticket);
            if alloc.creator_release {
                self.release(c, a)?;
            }
        }
        Ok(())
    }

    fn release(&mut self, c: usize, a: usize) -> CaseResult<()> {
        let handle = self.creator_handles[a].take().expect("creator handle");
        let name = self.name(c);
        self.workers[c]
            .release(handle)
            .ctx(|| format!("{name}: release allocation {a}"))
    }

    fn chunks(size: u64) -> impl Iterator<Item = (u64, u64)> {
        (0..size.div_ceil(GRAN)).map(move |g| (g * GRAN, GRAN.min(size - g * GRAN)))
    }

    fn verify_ipc(&mut self, i: usize, p: usize, pointer: u64) -> CaseResult<()> {
        let size = self.plan.ipc[i].size;
        for (n, (offset, len)) in Self::chunks(size).enumerate() {
            let seed = self.ipc[i].1[n];
            self.verify(p, pointer + offset, len, seed)
                .map_err(|e| format!("IPC allocation {i}: {e}"))?;
        }
        let name = self.name(p);
        let range = self.workers[p]
            .address_range(pointer + size / 2)
            .ctx(|| format!("{name}: address range of IPC allocation {i}"))?;
        ensure!(
            range == (pointer, size),
            "{name}: IPC allocation {i}: address range {range:x?}, expected ({pointer:#x}, \
             {size:#x})"
        );
        Ok(())
    }

    fn build_ipc(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (i, ipc) in plan.ipc.iter().enumerate() {
            let c = ipc.creator;
            let name = self.name(c);
            let pointer = self.workers[c]
                .mem_alloc(ipc.size)
                .ctx(|| format!("{name}: cuMemAlloc IPC allocation {i}"))?;
            let seeds: Vec<u64> = Self::chunks(ipc.size)
                .map(|(offset, _)| self.seed(2, i, offset / GRAN))
                .collect();
            for ((offset, len), seed) in Self::chunks(ipc.size).zip(seeds.clone()) {
                self.fill(c, pointer + offset, len, seed)?;
            }
            self.ipc.push((pointer, seeds, BTreeMap::new()));
            if !ipc.get {
                continue;
            }
            let handle = self.workers[c]
                .ipc_get(pointer)
                .ctx(|| format!("{name}: cuIpcGetMemHandle IPC allocation {i}"))?;
            for &p in &ipc.opens {
                let name = self.name(p);
                let opened = self.workers[p]
                    .ipc_open(&handle)
                    .ctx(|| format!("{name}: cuIpcOpenMemHandle IPC allocation {i}"))?;
                if let Some(&first) = self.ipc[i].2.get(&p) {
                    ensure!(
                        first == opened,
                        "{name}: IPC allocation {i} opened twice: {first:#x}, then {opened:#x}"
                    );
                }
                self.ipc[i].2.insert(p, opened);
                self.verify_ipc(i, p, opened)?;
            }
        }
        Ok(())
    }

    fn verify_group(&mut self, g: usize) -> CaseResult<()> {
        let group = &self.plan.groups[g];
        for m in 0..group.members.len() {
            let (p, memory, view) = {
                let member = &self.groups[g][m];
                (member.process, member.memory_va, member.view)
            };
            for j in 0..group.granules {
                let seed = self.group_seeds[g][m][j as usize];
                self.verify(p, memory + j * GRAN, GRAN, seed)
                    .map_err(|e| format!("group {g} member {m} memory: {e}"))?;
            }
            if let Some(view) = view {
                for i in 0..group.granules {
                    if group.binds[m][i as usize].is_none() {
                        continue;
                    }
                    let j = (i + group.rotation) % group.granules;
                    let seed = self.group_seeds[g][m][j as usize];
                    self.verify(p, view + i * GRAN, GRAN, seed)
                        .map_err(|e| format!("group {g} member {m} view granule {i}: {e}"))?;
                }
            }
        }
        Ok(())
    }

    fn build_groups(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (g, group) in plan.groups.iter().enumerate() {
            let size = group.granules * GRAN;
            let creator = group.members[0];
            let name = self.name(creator);
            let mc = self.workers[creator]
                .mc_create(group.members.len() as u32, size, u64::from(POSIX))
                .ctx(|| format!("{name}: cuMulticastCreate group {g}"))?;
            let ticket = self.workers[creator]
                .export(mc)
                .ctx(|| format!("{name}: export multicast group {g}"))?;
            let mut handles = vec![mc];
            for &p in &group.members[1..] {
                let name = self.name(p);
                handles.push(
                    self.workers[p]
                        .import(ticket.as_fd())
                        .ctx(|| format!("{name}: import multicast group {g}"))?,
                );
            }
            drop(ticket);
            // Every device first: a bind waits for the whole team.
            for (m, &p) in group.members.iter().enumerate() {
                let name = self.name(p);
                let device = plan.devices[p];
                self.workers[p]
                    .mc_add_device(handles[m], device)
                    .ctx(|| format!("{name}: add device {device} to group {g}"))?;
            }
            let mut members = Vec::new();
            let mut seeds = Vec::new();
            for (m, &p) in group.members.iter().enumerate() {
                let name = self.name(p);
                let device = plan.devices[p];
                let memory = self.workers[p]
                    .create(size, device, POSIX)
                    .ctx(|| format!("{name}: create member memory of group {g}"))?;
                let va = self.workers[p]
                    .map_rw(memory, size, device)
                    .ctx(|| format!("{name}: map member memory of group {g}"))?;
                let member_seeds: Vec<u64> = (0..group.granules)
                    .map(|j| self.seed(3, g * 8 + m, j))
                    .collect();
                for (j, &seed) in (0..).zip(&member_seeds) {
                    self.fill(p, va + j * GRAN, GRAN, seed)?;
                }
                seeds.push(member_seeds);
                for i in 0..group.granules {
                    let j = (i + group.rotation) % group.granules;
                    let (mc_offset, mem_offset) = (i * GRAN, j * GRAN);
                    let bound = match group.binds[m][i as usize] {
                        None => continue,
                        Some(Bind::Mem(v2)) => self.workers[p].mc_bind_mem(
                            handles[m],
                            mc_offset,
                            memory,
                            mem_offset,
                            GRAN,
                            v2.then_some(device),
                        ),
                        Some(Bind::Addr(v2)) => self.workers[p].mc_bind_addr(
                            handles[m],
                            mc_offset,
                            va + mem_offset,
                            GRAN,
                            v2.then_some(device),
                        ),
                    };
                    bound.ctx(|| {
                        format!(
                            "{name}: bind {:?} at multicast offset {mc_offset:#x} of group {g}",
                            group.binds[m][i as usize]
                        )
                    })?;
                }
                members.push(McMember {
                    process: p,
                    handle: handles[m],
                    memory_va: va,
                    view: None,
                });
            }
            for (m, member) in members.iter_mut().enumerate() {
                if group.views[m] {
                    let p = member.process;
                    let name = format!("p{p} (pid {})", self.workers[p].worker_pid());
                    member.view = Some(
                        self.workers[p]
                            .map_rw(member.handle, size, plan.devices[p])
                            .ctx(|| format!("{name}: map multicast group {g}"))?,
                    );
                }
            }
            self.groups.push(members);
            self.group_seeds.push(seeds);
        }
        Ok(())
    }

    fn verify_all(&mut self) -> CaseResult<()> {
        for held in self.held.clone() {
            self.verify_held(&held)?;
            self.check_access(&held)?;
        }
        for i in 0..self.ipc.len() {
            let (pointer, _, opens) = self.ipc[i].clone();
            self.verify_ipc(i, self.plan.ipc[i].creator, pointer)?;
            for (p, opened) in opens {
                self.verify_ipc(i, p, opened)?;
            }
        }
        for g in 0..self.groups.len() {
            self.verify_group(g)?;
        }
        Ok(())
    }

    /// Sharing is live: a write through one process's mapping is seen through every other.
    fn check_live_sharing(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (a, alloc) in plan.allocations.iter().enumerate() {
            if !alloc.shared() {
                continue;
            }
            let writers: Vec<Held> = self
                .held
                .iter()
                .filter(|held| held.alloc == a && held.map.writable)
                .cloned()
                .collect();
            // One granule of a writable mapping, then every mapping holding that granule.
            let writer = &writers[usize::from(alloc.writer) % writers.len()];
            let g = writer.map.offset + u64::from(alloc.writer) % writer.map.len;
            let seed = self.seed(4, a, g);
            self.seeds[a][g as usize] = seed;
            let at = writer.address + (g - writer.map.offset) * GRAN;
            self.fill(writer.process, at, GRAN, seed)
                .map_err(|e| format!("live write to allocation {a}: {e}"))?;
            let readers: Vec<Held> = self
                .held
                .iter()
                .filter(|held| {
                    held.alloc == a
                        && (held.map.offset..held.map.offset + held.map.len).contains(&g)
                })
                .cloned()
                .collect();
            for held in readers {
                let address = held.address + (g - held.map.offset) * GRAN;
                self.verify(held.process, address, GRAN, seed)
                    .map_err(|e| {
                        format!(
                            "allocation {a} granule {g} after {}'s write at {at:#x}: {e}",
                            self.name(writer.process)
                        )
                    })?;
            }
        }
        for i in 0..self.ipc.len() {
            let (pointer, _, opens) = self.ipc[i].clone();
            let Some((&writer, &at)) = opens.iter().next() else {
                continue;
            };
            let len = GRAN.min(plan.ipc[i].size);
            let seed = self.seed(5, i, 0);
            self.ipc[i].1[0] = seed;
            self.fill(writer, at, len, seed)?;
            let creator = plan.ipc[i].creator;
            let holders = std::iter::once((creator, pointer)).chain(opens);
            for (p, address) in holders {
                self.verify(p, address, len, seed).map_err(|e| {
                    format!(
                        "IPC allocation {i} after {}'s write: {e}",
                        self.name(writer)
                    )
                })?;
            }
        }
        for g in 0..self.groups.len() {
            let group = &plan.groups[g];
            for m in 0..group.members.len() {
                let (p, memory, view) = {
                    let member = &self.groups[g][m];
                    (member.process, member.memory_va, member.view)
                };
                // Through the member memory, seen in the view.
                let i = 0;
                let j = (i + group.rotation) % group.granules;
                let seed = self.seed(6, g * 8 + m, j);
                self.group_seeds[g][m][j as usize] = seed;
                self.fill(p, memory + j * GRAN, GRAN, seed)?;
                // Through the view, seen in the member memory.
                if let Some(view) = view
                    && let Some(i) =
                        (0..group.granules).find(|&i| group.binds[m][i as usize].is_some())
                {
                    let j = (i + group.rotation) % group.granules;
                    let seed = self.seed(7, g * 8 + m, j);
                    self.group_seeds[g][m][j as usize] = seed;
                    self.fill(p, view + i * GRAN, GRAN, seed)?;
                }
            }
            self.verify_group(g)
                .map_err(|e| format!("after live writes: {e}"))?;
        }
        Ok(())
    }

    /// [`Case::resources`] once two looks 25 ms apart agree (connections the shims just
    /// served close asynchronously).
    fn settled_resources(&mut self) -> CaseResult<Vec<Resources>> {
        let mut last = self.resources()?;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(25));
            let now = self.resources()?;
            if now == last {
                return Ok(now);
            }
            last = now;
        }
        Err(format!("open descriptors never settled: {last:?}"))
    }

    fn resources(&mut self) -> CaseResult<Vec<Resources>> {
        use std::os::unix::fs::MetadataExt;
        (0..self.workers.len())
            .map(|p| {
                let name = self.name(p);
                let fds = self.workers[p]
                    .fd_targets()
                    .ctx(|| format!("{name}: open descriptors"))?;
                let mut descriptors: BTreeMap<String, usize> = BTreeMap::new();
                for fd in &fds {
                    *descriptors.entry(normalize_target(&fd.target)).or_default() += 1;
                }
                let pid = self.workers[p].worker_pid();
                let mut inodes = BTreeSet::new();
                for fd in fds
                    .iter()
                    .filter(|fd| fd.target.starts_with("/memfd:fakecuda-"))
                {
                    let path = format!("/proc/{pid}/fd/{}", fd.fd);
                    // The control socket's own descriptors come and go; memfds stay.
                    if let Ok(metadata) = std::fs::metadata(&path) {
                        inodes.insert(metadata.ino());
                    }
                }
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .map_err(|e| format!("{name}: read its maps: {e}"))?;
                for line in maps
                    .lines()
                    .filter(|line| line.contains("/memfd:fakecuda-"))
                {
                    if let Some(inode) = line.split_whitespace().nth(4) {
                        inodes.insert(inode.parse().unwrap_or(0));
                    }
                }
                Ok(Resources {
                    descriptors,
                    backing: inodes.len(),
                })
            })
            .collect()
    }

    fn pids(&self) -> BTreeSet<NamespacePid> {
        self.workers
            .iter()
            .map(|w| NamespacePid::new(w.worker_pid() as u32).expect("pid"))
            .collect()
    }

    fn inspect(&self) -> CaseResult<BTreeMap<NamespacePid, Vec<Record>>> {
        let control = self.dir.path().join("ctl");
        let session = Session::open(&control, &[], Timeouts::default())
            .map_err(|e| format!("open a session: {e}"))?;
        let inspection = session::inspect(&session);
        let mut records = BTreeMap::new();
        for (pid, reply) in inspection.replies {
            let reply = reply.map_err(|e| format!("inspect {pid}: {e}"))?;
            ensure!(
                reply.phase == Phase::Active && reply.raw_imports == 0,
                "inspect {pid}: phase {:?}, {} raw imports",
                reply.phase,
                reply.raw_imports
            );
            records.insert(pid, reply.records.to_vec());
        }
        let found: BTreeSet<NamespacePid> = records.keys().copied().collect();
        ensure!(
            found == self.pids(),
            "participants {found:?}, expected the workers {:?}",
            self.pids()
        );
        match inspection.validation {
            Some(Ok(_)) => Ok(records),
            Some(Err(errors)) => Err(format!(
                "the topology is invalid: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            None => Err("inspection incomplete".into()),
        }
    }

    fn toggle(&self, env: &Env, checkpoint: &Path) -> CaseResult<Value> {
        let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
            .args(["toggle", "--pid", &std::process::id().to_string(), "--dir"])
            .arg(checkpoint)
            .arg("--json")
            .env("CUINTERPOSE_DRIVER", env.fakecuda.join("libcuda.so.1"))
            .env("CUINTERPOSE_CONTROL_DIR", self.dir.path().join("ctl"))
            .env("FAKECUDA_CONTROL_DIR", self.dir.path().join("fakecuda"))
            .env("FAKECUDA_DEVICES", self.plan.device_count.to_string())
            .env_remove("LD_PRELOAD")
            .output()
            .map_err(|e| format!("run cuinterpose: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success(),
            "cuinterpose toggle: {}\nstdout:\n{stdout}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str(&stdout).map_err(|e| format!("toggle JSON: {e}: {stdout}"))
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for p in 0..self.plan.processes {
            let text = std::fs::read_to_string(self.dir.path().join(format!("worker-{p}.log")))
                .unwrap_or_default();
            if !text.trim().is_empty() {
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                out.push_str(&format!("--- p{p} stderr (last lines) ---\n"));
                for line in tail.iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

fn records_diff(
    what: &str,
    expected: &BTreeMap<NamespacePid, Vec<Record>>,
    found: &BTreeMap<NamespacePid, Vec<Record>>,
) -> CaseResult<()> {
    let pids: BTreeSet<&NamespacePid> = expected.keys().chain(found.keys()).collect();
    let mut problems = Vec::new();
    for pid in pids {
        let none = Vec::new();
        let differences = state::compare(
            expected.get(pid).unwrap_or(&none),
            found.get(pid).unwrap_or(&none),
        );
        problems.extend(
            differences
                .iter()
                .map(|difference| format!("participant {pid}: {difference}")),
        );
    }
    ensure!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
    Ok(())
}

fn render_records(records: &BTreeMap<NamespacePid, Vec<Record>>) -> String {
    let mut out = String::from("records:\n");
    for (pid, records) in records {
        for record in records {
            out.push_str(&format!("  {pid}: {}\n", render::record(record)));
        }
    }
    out
}

fn access_of(record: &[cuinterpose_protocol::AccessDescriptor]) -> Vec<(i32, u32)> {
    let mut access: Vec<(i32, u32)> = record
        .iter()
        .map(|descriptor| {
            let flags = match descriptor.flags {
                AccessFlags::ProtNone => 0,
                AccessFlags::ProtRead => READ,
                AccessFlags::ProtReadWrite => READ_WRITE,
            };
            (descriptor.location.id, flags)
        })
        .filter(|(_, flags)| *flags != 0)
        .collect();
    access.sort_unstable();
    access
}

/// The records say what the case built: each mapping at its address, with its range and
/// access; one allocation reference per allocation, created by its creator; host carriers on
/// the creators of shared allocations only; handle counts; each multicast team's records.
fn check_model(case: &Case<'_>, records: &BTreeMap<NamespacePid, Vec<Record>>) -> CaseResult<()> {
    let plan = case.plan;
    let pid = |p: usize| NamespacePid::new(case.workers[p].worker_pid() as u32).expect("pid");
    let mapping_at = |p: usize, address: u64| {
        records[&pid(p)].iter().find_map(|record| match record {
            Record::Mapping(mapping) if mapping.address == address => Some(mapping),
            _ => None,
        })
    };
    let mut references: Vec<Option<AllocationReference>> = vec![None; plan.allocations.len()];
    for held in &case.held {
        let name = case.name(held.process);
        if plan.allocations[held.alloc].handle_types == 0 {
            // Without a shareable handle type it can never be shared: not tracked, left to the
            // native checkpoint.
            ensure!(
                mapping_at(held.process, held.address).is_none(),
                "{name}: a mapping record at {:#x} of untracked allocation {}",
                held.address,
                held.alloc
            );
            continue;
        }
        let Some(mapping) = mapping_at(held.process, held.address) else {
            return Err(format!(
                "{name}: no mapping record at {:#x} (allocation {})",
                held.address, held.alloc
            ));
        };
        ensure!(
            mapping.size == held.map.len * GRAN && mapping.offset == held.map.offset * GRAN,
            "{name}: mapping at {:#x}: size {:#x} offset {:#x}, expected {:#x} at {:#x}",
            held.address,
            mapping.size,
            mapping.offset,
            held.map.len * GRAN,
            held.map.offset * GRAN
        );
        let access = access_of(&mapping.access);
        ensure!(
            access == held.map.grants,
            "{name}: mapping at {:#x}: access {access:?}, expected {:?}",
            held.address,
            held.map.grants
        );
        match &references[held.alloc] {
            None => references[held.alloc] = Some(mapping.allocation.clone()),
            Some(reference) => ensure!(
                *reference == mapping.allocation,
                "{name}: mapping at {:#x} names {:?}, other mappings of allocation {} name {:?}",
                held.address,
                mapping.allocation,
                held.alloc,
                reference
            ),
        }
    }
    let distinct: BTreeSet<_> = references.iter().flatten().map(|r| r.id).collect();
    let tracked = references.iter().flatten().count();
    ensure!(
        distinct.len() == tracked,
        "{tracked} allocations share {} ids",
        distinct.len()
    );
    for (a, alloc) in plan.allocations.iter().enumerate() {
        let Some(reference) = references[a].clone() else {
            continue;
        };
        ensure!(
            reference.creator_pid == pid(alloc.creator),
            "allocation {a}: records name creator {}, expected {}",
            reference.creator_pid,
            pid(alloc.creator)
        );
        let mut holders: BTreeSet<usize> = alloc.imports.iter().map(|i| i.process).collect();
        holders.insert(alloc.creator);
        for p in 0..plan.processes {
            let name = case.name(p);
            let found: Vec<_> = records[&pid(p)]
                .iter()
                .filter_map(|record| match record {
                    Record::Allocation(record) if record.allocation == reference => Some(record),
                    _ => None,
                })
                .collect();
            if !holders.contains(&p) {
                ensure!(
                    found.is_empty(),
                    "{name}: holds an allocation record of allocation {a} it never imported"
                );
                continue;
            }
            let [record] = found[..] else {
                return Err(format!(
                    "{name}: {} allocation records of allocation {a}",
                    found.len()
                ));
            };
            ensure!(
                record.size == alloc.granules * GRAN,
                "{name}: allocation {a} record size {:#x}",
                record.size
            );
            let handles = if p == alloc.creator {
                u64::from(!alloc.creator_release)
            } else {
                case.import_handles[a].get(&p).copied().unwrap_or(0)
            };
            ensure!(
                record.handle_count == handles,
                "{name}: allocation {a}: handle count {}, expected {handles}",
                record.handle_count
            );
            if p != alloc.creator || !alloc.export {
                ensure!(
                    !record.host_carrier,
                    "{name}: allocation {a}: host carrier on a record that must not carry"
                );
            } else if alloc.shared() {
                ensure!(
                    record.host_carrier,
                    "{name}: allocation {a}: shared, but its creator record carries nothing"
                );
            }
            let mappings = records[&pid(p)]
                .iter()
                .filter(|record| matches!(record, Record::Mapping(m) if m.allocation == reference))
                .count();
            let expected = case
                .held
                .iter()
                .filter(|held| held.alloc == a && held.process == p)
                .count();
            ensure!(
                mappings == expected,
                "{name}: {mappings} mapping records of allocation {a}, expected {expected}"
            );
        }
    }
    for (g, group) in plan.groups.iter().enumerate() {
        let mut object: Option<AllocationReference> = None;
        for (m, member) in case.groups[g].iter().enumerate() {
            let p = member.process;
            let name = case.name(p);
            let device = plan.devices[p];
            let Some(memory) = mapping_at(p, member.memory_va) else {
                return Err(format!("{name}: group {g}: no record of the member memory"));
            };
            let memory = memory.allocation.clone();
            let bindings: Vec<_> = records[&pid(p)]
                .iter()
                .filter_map(|record| match record {
                    Record::MulticastBinding(binding) => Some(binding),
                    _ => None,
                })
                .filter(|binding| match &binding.source {
                    BindingSource::Memory(source) => source.member.allocation == memory,
                    BindingSource::Address(source) => (member.memory_va
                        ..member.memory_va + group.granules * GRAN)
                        .contains(&source.address),
                })
                .collect();
            let expected: Vec<_> = (0..group.granules)
                .filter_map(|i| group.binds[m][i as usize].map(|bind| (i, bind)))
                .collect();
            ensure!(
                bindings.len() == expected.len(),
                "{name}: group {g}: {} binding records, expected {}",
                bindings.len(),
                expected.len()
            );
            for (i, bind) in expected {
                let j = (i + group.rotation) % group.granules;
                let Some(binding) = bindings
                    .iter()
                    .find(|binding| binding.multicast_offset == i * GRAN)
                else {
                    return Err(format!(
                        "{name}: group {g}: no binding record at multicast offset {:#x}",
                        i * GRAN
                    ));
                };
                let (kind_ok, v2) = match (bind, &binding.source) {
                    (Bind::Mem(v2), BindingSource::Memory(source)) => {
                        (source.member.offset == j * GRAN, v2)
                    }
                    (Bind::Addr(v2), BindingSource::Address(source)) => {
                        (source.address == member.memory_va + j * GRAN, v2)
                    }
                    _ => (false, false),
                };
                let version = if v2 {
                    BindingVersion::V2
                } else {
                    BindingVersion::V1
                };
                ensure!(
                    kind_ok
                        && binding.size == GRAN
                        && binding.version == version
                        && binding.device == device,
                    "{name}: group {g}: binding at {:#x} is {binding:?}, expected {bind:?} of \
                     member granule {j} on device {device}",
                    i * GRAN
                );
                match &object {
                    None => object = Some(binding.object.clone()),
                    Some(reference) => ensure!(
                        *reference == binding.object,
                        "{name}: group {g}: bindings name {:?} and {reference:?}",
                        binding.object
                    ),
                }
            }
        }
        let object = object.expect("every member binds");
        ensure!(
            object.creator_pid == pid(group.members[0]),
            "group {g}: created by {}, records say {}",
            pid(group.members[0]),
            object.creator_pid
        );
        for member in &case.groups[g] {
            let p = member.process;
            let name = case.name(p);
            let mine = &records[&pid(p)];
            let multicast: Vec<_> = mine
                .iter()
                .filter_map(|record| match record {
                    Record::Multicast(record) if record.object == object => Some(record),
                    _ => None,
                })
                .collect();
            ensure!(
                multicast.len() == 1
                    && multicast[0].properties.device_count == group.members.len() as u32
                    && multicast[0].properties.size == group.granules * GRAN
                    && multicast[0].handle_count == 1,
                "{name}: group {g}: multicast records {multicast:?}"
            );
            let devices: Vec<i32> = mine
                .iter()
                .filter_map(|record| match record {
                    Record::MulticastDevice(record) if record.object == object => {
                        Some(record.device)
                    }
                    _ => None,
                })
                .collect();
            ensure!(
                devices == [plan.devices[p]],
                "{name}: group {g}: devices {devices:?}, expected [{}]",
                plan.devices[p]
            );
            let views: Vec<_> = mine
                .iter()
                .filter_map(|record| match record {
                    Record::MulticastMapping(record) if record.object == object => Some(record),
                    _ => None,
                })
                .collect();
            match member.view {
                None => ensure!(views.is_empty(), "{name}: group {g}: views {views:?}"),
                Some(view) => ensure!(
                    views.len() == 1
                        && views[0].address == view
                        && views[0].size == group.granules * GRAN
                        && access_of(&views[0].access) == [(plan.devices[p], READ_WRITE)],
                    "{name}: group {g}: views {views:?}, expected one at {view:#x}"
                ),
            }
        }
    }
    Ok(())
}

/// Builds the case's workload, toggles it and checks everything.
fn run_case(env: &Env, plan: &Plan, tag: u64, toggles: u32) -> CaseResult<Stats> {
    let dir = TempDir::new("property").map_err(|e| format!("sandbox: {e}"))?;
    let workers = Case::spawn(env, plan, dir.path())?;
    let mut case = Case {
        plan,
        tag,
        dir,
        workers,
        seeds: vec![Vec::new(); plan.allocations.len()],
        held: Vec::new(),
        creator_handles: vec![None; plan.allocations.len()],
        import_handles: vec![BTreeMap::new(); plan.allocations.len()],
        ipc: Vec::new(),
        groups: Vec::new(),
        group_seeds: Vec::new(),
        generation: 0,
        stats: Stats {
            processes: plan.processes,
            allocations: plan.allocations.len(),
            shared_allocations: plan.allocations.iter().filter(|a| a.shared()).count(),
            ipc: plan.ipc.len(),
            groups: plan.groups.len(),
            ..Stats::default()
        },
    };
    let result = check_case(env, &mut case, toggles);
    match result {
        Ok(()) => Ok(case.stats),
        Err(error) => Err(format!("{error}\n{}", case.logs())),
    }
}

fn check_case(env: &Env, case: &mut Case<'_>, toggles: u32) -> CaseResult<()> {
    case.build_vmm()?;
    case.build_ipc()?;
    case.build_groups()?;
    case.verify_all()?;
    let before = case.inspect()?;
    check_model(case, &before).map_err(|e| format!("{e}\n{}", render_records(&before)))?;
    let resources_before = case.settled_resources()?;
    let mut resources_previous = resources_before.clone();
    for round in 1..=toggles {
        toggle_and_check(env, case, round, &before).map_err(|e| format!("toggle {round}: {e}"))?;
        // A control connection the shim just served may still be closing: look again for a
        // while before calling a difference a leak.
        let mut attempts = 0;
        let resources = loop {
            let resources = case.resources()?;
            attempts += 1;
            match check_resources(
                case,
                round,
                &resources_before,
                &resources_previous,
                &resources,
            ) {
                Ok(()) => break resources,
                Err(e) if attempts >= 40 => return Err(format!("after toggle {round}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(25)),
            }
        };
        resources_previous = resources;
        case.check_live_sharing()
            .map_err(|e| format!("after toggle {round}: {e}"))?;
    }
    Ok(())
}

/// One toggle: host-carrier bytes within bounds, the captured state equal to the inspection
/// before, the inspection after equal to the captured state, every byte where it was.
fn toggle_and_check(
    env: &Env,
    case: &mut Case<'_>,
    round: u32,
    before: &BTreeMap<NamespacePid, Vec<Record>>,
) -> CaseResult<()> {
    let checkpoint = case.dir.path().join(format!("checkpoint-{round}"));
    let report = case.toggle(env, &checkpoint)?;
    let phase_bytes = |name: &str| {
        report["phases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|phase| phase["phase"] == name)
            .filter_map(|phase| phase["bytes"].as_u64())
            .sum::<u64>()
    };
    let (saved, loaded) = (
        phase_bytes("save_allocations"),
        phase_bytes("load_allocations"),
    );
    ensure!(
        saved == loaded,
        "saved {saved} bytes, loaded {loaded}: {report}"
    );
    // One content copy: every shared allocation's bytes, once; what else goes through host
    // carriers (exported but never imported, multicast members) is the shim's choice.
    let plan = case.plan;
    let vmm = |filter: &dyn Fn(&AllocPlan) -> bool| -> u64 {
        plan.allocations
            .iter()
            .filter(|a| filter(a))
            .map(|a| a.granules * GRAN)
            .sum()
    };
    let ipc = |filter: &dyn Fn(&IpcPlan) -> bool| -> u64 {
        plan.ipc
            .iter()
            .filter(|i| filter(i))
            .map(|i| i.size.div_ceil(GRAN) * GRAN)
            .sum()
    };
    let least = vmm(&|a| a.shared()) + ipc(&|i| !i.opens.is_empty());
    let most = vmm(&|a| a.export)
        + ipc(&|i| i.get)
        + plan
            .groups
            .iter()
            .map(|g| g.granules * GRAN * g.members.len() as u64)
            .sum::<u64>();
    ensure!(
        (least..=most).contains(&saved),
        "saved {saved} bytes, expected between {least} and {most}: {report}"
    );
    case.stats.carried += saved;

    let saved_state = state::load(&checkpoint).map_err(|e| format!("load the state: {e}"))?;
    let captured: BTreeMap<NamespacePid, Vec<Record>> = saved_state
        .participants
        .iter()
        .map(|(pid, records)| (*pid, records.to_vec()))
        .collect();
    records_diff(
        "the state captured at begin_checkpoint differs from the inspection before",
        before,
        &captured,
    )?;
    let after = case.inspect()?;
    records_diff(
        "the inspection after restore differs from the captured state",
        &captured,
        &after,
    )?;
    check_model(case, &after).map_err(|e| format!("{e}\n{}", render_records(&after)))?;
    case.verify_all()
}

/// What a worker holds: open descriptors by target (socket and pipe inode numbers left out),
/// and how many distinct fakecuda memfds (device memory, multicast teams) its descriptors and
/// mappings keep alive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resources {
    descriptors: BTreeMap<String, usize>,
    backing: usize,
}

/// `socket:[123]` → `socket:[]`.
fn normalize_target(target: &str) -> String {
    match target.split_once(":[") {
        Some((kind, _)) => format!("{kind}:[]"),
        None => target.to_string(),
    }
}

/// Targets `more` holds more often than `fewer`, with the excess.
fn target_excess(
    more: &BTreeMap<String, usize>,
    fewer: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    more.iter()
        .filter_map(|(target, &n)| {
            let m = fewer.get(target).copied().unwrap_or(0);
            (n > m).then(|| (target.clone(), n - m))
        })
        .collect()
}

/// Nothing leaks: every toggle leaves exactly the descriptors the process had before the
/// first one, and the device memory kept alive never changes.
fn check_resources(
    case: &Case<'_>,
    round: u32,
    before: &[Resources],
    previous: &[Resources],
    now: &[Resources],
) -> CaseResult<()> {
    let mut problems = Vec::new();
    for p in 0..now.len() {
        let name = case.name(p);
        if now[p].backing != before[p].backing {
            problems.push(format!(
                "{name}: keeps {} fakecuda memfds alive, {} before the first toggle",
                now[p].backing, before[p].backing
            ));
        }
        let fewer = target_excess(&before[p].descriptors, &now[p].descriptors);
        let more = target_excess(&now[p].descriptors, &before[p].descriptors);
        if !fewer.is_empty() || !more.is_empty() {
            problems.push(format!(
                "{name}: descriptors by target, more than before the first toggle: {more:?}, \
                 fewer: {fewer:?}"
            ));
        }
        if round > 1 && now[p].descriptors != previous[p].descriptors {
            problems.push(format!(
                "{name}: descriptors by target, more than after toggle {}: {:?}, fewer: {:?}",
                round - 1,
                target_excess(&now[p].descriptors, &previous[p].descriptors),
                target_excess(&previous[p].descriptors, &now[p].descriptors),
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

fn describe_map(map: &MapPlan) -> String {
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
fn describe(plan: &Plan) -> String {
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

/// Runs `plan`, turning a panic into a failure.
fn attempt(env: &Env, plan: &Plan, tag: u64, toggles: u32) -> CaseResult<Stats> {
    catch_unwind(AssertUnwindSafe(|| run_case(env, plan, tag, toggles))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(format!("panicked: {message}"))
    })
}

#[test]
fn random_topologies_toggled_and_verified() {
    let cases = env_u64("CUINTERPOSE_SOAK_CASES").map_or(DEFAULT_CASES, |n| n as u32);
    let seed = env_u64("CUINTERPOSE_PROPTEST_SEED").unwrap_or(DEFAULT_SEED);
    let only = env_u64("CUINTERPOSE_PROPTEST_CASE");
    let shrink = env_u64("CUINTERPOSE_PROPTEST_SHRINK").map_or(DEFAULT_SHRINK, |n| n as u32);
    let toggles = env_u64("CUINTERPOSE_PROPTEST_TOGGLES").map_or(DEFAULT_TOGGLES, |n| n as u32);
    let env = Env {
        shim: build_shim().to_path_buf(),
        worker: build_worker().to_path_buf(),
        fakecuda: fakecuda_lib_dir().to_path_buf(),
    };
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: shrink,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = spec();
    let started = Instant::now();
    let mut total = Stats::default();
    let (mut ran, mut failures) = (0u64, Vec::new());
    let mut groups_built = 0usize;
    for index in 0..u64::from(cases) {
        let mut tree = strategy.new_tree(&mut runner).expect("generate a topology");
        if only.is_some_and(|only| only != index) {
            continue;
        }
        let tag = splitmix64(seed ^ index);
        let plan = Plan::new(&tree.current());
        let case_started = Instant::now();
        ran += 1;
        match attempt(&env, &plan, tag, toggles) {
            Ok(stats) => {
                total.bytes_verified += stats.bytes_verified;
                total.processes += stats.processes;
                total.allocations += stats.allocations;
                total.shared_allocations += stats.shared_allocations;
                total.ipc += stats.ipc;
                groups_built += stats.groups;
                total.carried += stats.carried;
                if std::env::var_os("CUINTERPOSE_PROPTEST_VERBOSE").is_some() {
                    println!(
                        "case {index}: ok in {:?}: {} processes, {} allocations ({} shared), \
                         {} IPC, {} groups, {} bytes verified",
                        case_started.elapsed(),
                        stats.processes,
                        stats.allocations,
                        stats.shared_allocations,
                        stats.ipc,
                        stats.groups,
                        stats.bytes_verified
                    );
                }
            }
            Err(error) => {
                eprintln!(
                    "case {index} FAILED (CUINTERPOSE_PROPTEST_SEED={seed} \
                     CUINTERPOSE_PROPTEST_CASE={index}) after {:?}:\n{error}\ntopology: {}",
                    case_started.elapsed(),
                    describe(&plan)
                );
                // Shrink within the budget: simplify while it fails, complicate when it passes.
                let mut smallest = (plan, error);
                let mut runs = 0;
                if tree.simplify() {
                    while runs < shrink {
                        runs += 1;
                        let candidate = Plan::new(&tree.current());
                        let outcome = attempt(&env, &candidate, tag, toggles);
                        let more = match outcome {
                            Err(error) => {
                                smallest = (candidate, error);
                                tree.simplify()
                            }
                            Ok(_) => tree.complicate(),
                        };
                        if !more {
                            break;
                        }
                    }
                }
                failures.push((index, smallest));
            }
        }
    }
    // Straight to stderr, past the harness's capture: CI logs always show the summary.
    let _ = writeln!(
        std::io::stderr(),
        "property: {ran} cases, {} failures, {} bytes verified, {} processes, {} VMM \
         allocations ({} shared), {} IPC allocations, {groups_built} multicast groups, {} \
         host-carrier bytes saved, seed {seed}, {:.1} s",
        failures.len(),
        total.bytes_verified,
        total.processes,
        total.allocations,
        total.shared_allocations,
        total.ipc,
        total.carried,
        started.elapsed().as_secs_f64()
    );
    if let Some((index, (plan, error))) = failures.first() {
        panic!(
            "{} of {ran} cases failed (first: case {index}, CUINTERPOSE_PROPTEST_SEED={seed} \
             CUINTERPOSE_PROPTEST_CASE={index}); smallest failing topology found:\n{}\n{error}",
            failures.len(),
            describe(plan)
        );
    }
}
