//! One case's live workload ([`Case`]: the workers and what their memory must hold), the
//! result type every check returns, and the checks of bytes, access and live sharing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_workload::pattern::splitmix64;
use cuinterpose_workload::{EntryPath, Grant, Output, Worker, WorkerConfig, WorkloadError};

use crate::topology::{GRAN, MapPlan, Plan, READ_WRITE};

/// The built binaries, shared by every case.
pub(crate) struct Env {
    pub(crate) shim: PathBuf,
    pub(crate) worker: PathBuf,
    pub(crate) fakecuda: PathBuf,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) bytes_verified: u64,
    pub(crate) processes: usize,
    pub(crate) allocations: usize,
    pub(crate) shared_allocations: usize,
    pub(crate) ipc: usize,
    pub(crate) groups: usize,
    pub(crate) carried: u64,
}

pub(crate) type CaseResult<T> = Result<T, String>;

pub(crate) trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> CaseResult<T>;
}

impl<T> Context<T> for Result<T, WorkloadError> {
    fn ctx(self, what: impl FnOnce() -> String) -> CaseResult<T> {
        self.map_err(|error| format!("{}: {error}", what()))
    }
}

/// Fails the enclosing check with `format!(...)` unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(format!($($arg)*));
        }
    };
}

pub(crate) use ensure;

/// One VMM mapping held by a process.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) process: usize,
    pub(crate) alloc: usize,
    pub(crate) address: u64,
    pub(crate) map: MapPlan,
}

#[derive(Debug)]
pub(crate) struct McMember {
    pub(crate) process: usize,
    pub(crate) handle: u64,
    pub(crate) memory_va: u64,
    pub(crate) view: Option<u64>,
}

/// The live workload and what its memory must hold.
pub(crate) struct Case<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) tag: u64,
    pub(crate) dir: TempDir,
    pub(crate) workers: Vec<Worker>,
    /// Per VMM allocation, per granule: the pattern seed it holds.
    pub(crate) seeds: Vec<Vec<u64>>,
    pub(crate) held: Vec<Held>,
    /// Per VMM allocation: the creator's handle until it releases it.
    pub(crate) creator_handles: Vec<Option<u64>>,
    /// Per VMM allocation: live import handles per importing process.
    pub(crate) import_handles: Vec<BTreeMap<usize, u64>>,
    /// Per IPC allocation: the creator's pointer, per-chunk seeds, each opener's pointer.
    pub(crate) ipc: Vec<(u64, Vec<u64>, BTreeMap<usize, u64>)>,
    /// Per group, per member; per group, per member granule: seeds.
    pub(crate) groups: Vec<Vec<McMember>>,
    pub(crate) group_seeds: Vec<Vec<Vec<u64>>>,
    pub(crate) generation: u64,
    pub(crate) stats: Stats,
}

impl Case<'_> {
    pub(crate) fn name(&self, p: usize) -> String {
        format!("p{p} (pid {})", self.workers[p].worker_pid())
    }

    pub(crate) fn seed(&mut self, kind: u64, object: usize, granule: u64) -> u64 {
        self.generation += 1;
        splitmix64(
            self.tag ^ (kind << 56) ^ ((object as u64) << 40) ^ (granule << 24) ^ self.generation,
        )
    }

    pub(crate) fn verify(
        &mut self,
        p: usize,
        address: u64,
        size: u64,
        seed: u64,
    ) -> CaseResult<()> {
        self.workers[p]
            .verify(address, size, seed)
            .ctx(|| format!("{}: verify {size:#x} bytes at {address:#x}", self.name(p)))?;
        self.stats.bytes_verified += size;
        Ok(())
    }

    pub(crate) fn fill(&mut self, p: usize, address: u64, size: u64, seed: u64) -> CaseResult<()> {
        self.workers[p]
            .fill(address, size, seed)
            .ctx(|| format!("{}: fill {size:#x} bytes at {address:#x}", self.name(p)))
    }

    pub(crate) fn spawn(env: &Env, plan: &Plan, dir: &Path) -> CaseResult<Vec<Worker>> {
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
    pub(crate) fn map(&mut self, p: usize, handle: u64, map: &MapPlan) -> CaseResult<u64> {
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

    pub(crate) fn verify_held(&mut self, held: &Held) -> CaseResult<()> {
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
    pub(crate) fn check_access(&mut self, held: &Held) -> CaseResult<()> {
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

    pub(crate) fn release(&mut self, c: usize, a: usize) -> CaseResult<()> {
        let handle = self.creator_handles[a].take().expect("creator handle");
        let name = self.name(c);
        self.workers[c]
            .release(handle)
            .ctx(|| format!("{name}: release allocation {a}"))
    }

    pub(crate) fn chunks(size: u64) -> impl Iterator<Item = (u64, u64)> {
        (0..size.div_ceil(GRAN)).map(move |g| (g * GRAN, GRAN.min(size - g * GRAN)))
    }

    pub(crate) fn verify_ipc(&mut self, i: usize, p: usize, pointer: u64) -> CaseResult<()> {
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

    pub(crate) fn verify_group(&mut self, g: usize) -> CaseResult<()> {
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

    pub(crate) fn verify_all(&mut self) -> CaseResult<()> {
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
    pub(crate) fn check_live_sharing(&mut self) -> CaseResult<()> {
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
}
