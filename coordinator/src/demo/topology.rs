//! The demo's sharing topology: the regions it fills with known patterns, how it builds them
//! across the workers, and the checks that every byte is back and the sharing is live.

use std::os::fd::OwnedFd;

use cuinterpose_workload::Worker;
use cuinterpose_workload::cuda::HANDLE_TYPE_POSIX_FD as POSIX;

use super::types::{DemoError, worker_error};

/// One filled region: which process, where, how much, and the seed of its pattern.
#[derive(Debug, Clone)]
struct Region {
    worker: usize,
    address: u64,
    size: u64,
    seed: u64,
    what: String,
}

pub(super) struct Demo {
    pub(super) workers: Vec<Worker>,
    regions: Vec<Region>,
    pub(super) topology: Vec<String>,
    pub(super) granularity: u64,
    shared_bytes: u64,
    /// Small shared allocations each process creates for the next to import.
    mesh: usize,
}

impl Demo {
    /// A demo over `workers`, nothing filled yet (the granularity is set once CUDA is up).
    pub(super) fn new(workers: Vec<Worker>, shared_bytes: u64, mesh: usize) -> Self {
        Self {
            workers,
            regions: Vec::new(),
            topology: Vec::new(),
            granularity: 0,
            shared_bytes,
            mesh,
        }
    }

    pub(super) fn w(&mut self, i: usize) -> &mut Worker {
        &mut self.workers[i]
    }

    /// Fills `[address, address + size)` chunk by chunk (one seed per granule), so any
    /// granule-aligned sub-range can be verified on its own.
    fn fill(
        &mut self,
        worker: usize,
        address: u64,
        size: u64,
        seed: u64,
        what: &str,
    ) -> Result<(), DemoError> {
        let gran = self.granularity;
        for k in 0..size.div_ceil(gran) {
            let len = gran.min(size - k * gran);
            self.w(worker)
                .fill(address + k * gran, len, seed + k)
                .map_err(worker_error(format!("filling {what}")))?;
        }
        Ok(())
    }

    fn expect(&mut self, worker: usize, address: u64, size: u64, seed: u64, what: String) {
        self.regions.push(Region {
            worker,
            address,
            size,
            seed,
            what,
        });
    }

    /// Creates `size` bytes of `worker` on `device` with the handle `types` and maps them
    /// read-write; returns the handle and the address. `what` names them in errors.
    fn create_mapped(
        &mut self,
        worker: usize,
        size: u64,
        device: i32,
        types: u32,
        what: &str,
    ) -> Result<(u64, u64), DemoError> {
        let handle = self
            .w(worker)
            .create(size, device, types)
            .map_err(worker_error(format!("creating {what}")))?;
        let va = self
            .w(worker)
            .map_rw(handle, size, device)
            .map_err(worker_error(format!("mapping {what}")))?;
        Ok((handle, va))
    }

    /// Creates `name`: `size` bytes of `worker` on `device`, mapped, filled from `seed` and
    /// expected there; returns the ticket that exports it.
    fn create_shared(
        &mut self,
        worker: usize,
        size: u64,
        device: i32,
        seed: u64,
        name: &str,
    ) -> Result<OwnedFd, DemoError> {
        let (handle, va) = self.create_mapped(worker, size, device, POSIX, name)?;
        self.fill(worker, va, size, seed, name)?;
        self.expect(worker, va, size, seed, format!("{name} in its creator"));
        self.w(worker)
            .export(handle)
            .map_err(worker_error(format!("exporting {name}")))
    }

    /// Worker `i` imports `name`, exported as `ticket`: the imported handle.
    fn import(&mut self, i: usize, ticket: &OwnedFd, name: &str) -> Result<u64, DemoError> {
        self.w(i)
            .import(std::os::fd::AsFd::as_fd(ticket))
            .map_err(worker_error(format!("importing {name}")))
    }

    /// Worker `i` imports `name` (`size` bytes, exported as `ticket`) and maps it whole on
    /// `device`; returns the address. The handle is released at once, as imported handles
    /// often are: the mapping keeps the memory.
    fn import_mapped(
        &mut self,
        i: usize,
        ticket: &OwnedFd,
        size: u64,
        device: i32,
        name: &str,
    ) -> Result<u64, DemoError> {
        let h = self.import(i, ticket, name)?;
        let va = self
            .w(i)
            .map_rw(h, size, device)
            .map_err(worker_error(format!("mapping {name}")))?;
        self.w(i)
            .release(h)
            .map_err(worker_error(format!("releasing {name}'s handle")))?;
        Ok(va)
    }

    /// Asks every worker to exit, ignoring those that are gone.
    pub(super) fn exit_all(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.call(&cuinterpose_workload::Command::Exit { code: 0 });
        }
    }

    pub(super) fn verify_all(&mut self) -> Result<(usize, u64), DemoError> {
        let gran = self.granularity;
        let regions = self.regions.clone();
        let mut bytes = 0;
        for r in &regions {
            for k in 0..r.size.div_ceil(gran) {
                let len = gran.min(r.size - k * gran);
                self.w(r.worker)
                    .verify(r.address + k * gran, len, r.seed + k)
                    .map_err(|e| {
                        DemoError::Verification(format!("{} in process {}: {e}", r.what, r.worker))
                    })?;
                bytes += len;
            }
        }
        Ok((regions.len(), bytes))
    }
}

/// `bytes` in MiB when whole MiB (the driver's 2 MiB granule), else in KiB (a small fakecuda
/// granularity).
fn size_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The devices `worker` sees (at least one).
pub(super) fn device_count(worker: &Worker) -> i32 {
    worker
        .init_info()
        .map_or(1, |info| info.device_count.max(1))
}

pub(super) fn build_topology(demo: &mut Demo) -> Result<(), DemoError> {
    let n = demo.workers.len();
    let gran = demo.granularity;
    let devices: Vec<i32> = (0..n)
        .map(|i| (i as i32) % device_count(&demo.workers[i]))
        .collect();
    // S0: created by process 0, imported whole by every other process.
    let s0_size = demo.shared_bytes.max(gran).next_multiple_of(gran);
    let ticket = demo.create_shared(0, s0_size, devices[0], 1000, "S0")?;
    for (i, &device) in devices.iter().enumerate().skip(1) {
        let va = demo.import_mapped(i, &ticket, s0_size, device, "S0")?;
        demo.expect(i, va, s0_size, 1000, format!("S0 imported by process {i}"));
    }
    demo.topology.push(format!(
        "S0: {} created by process 0, imported by processes 1..{}",
        size_text(s0_size),
        n - 1
    ));
    // S1: created by process 1, its second half imported by the others from process 2 on.
    if n >= 3 {
        let ticket = demo.create_shared(1, 2 * gran, devices[1], 2000, "S1")?;
        for (i, &device) in devices.iter().enumerate().skip(2) {
            let h = demo.import(i, &ticket, "S1")?;
            let part = demo
                .w(i)
                .reserve(gran)
                .map_err(worker_error("reserving for S1"))?;
            demo.w(i)
                .map(part, gran, gran, h)
                .map_err(worker_error("mapping half of S1"))?;
            demo.w(i)
                .grant_rw(part, gran, device)
                .map_err(worker_error("granting S1"))?;
            demo.expect(
                i,
                part,
                gran,
                2001,
                format!("second half of S1 in process {i}"),
            );
        }
        demo.topology.push(format!(
            "S1: {} created by process 1, second half imported by processes 2..{}",
            size_text(2 * gran),
            n - 1
        ));
    }
    // Private memory: tracked but never shared, and untracked (not exportable) memory.
    for (i, &device) in devices.iter().enumerate() {
        for (types, name, seed) in [(POSIX, "private", 3000), (0, "native", 4000)] {
            let (_, va) = demo.create_mapped(i, gran, device, types, &format!("{name} memory"))?;
            let seed = seed + 10 * i as u64;
            demo.fill(i, va, gran, seed, name)?;
            demo.expect(
                i,
                va,
                gran,
                seed,
                format!("{name} allocation of process {i}"),
            );
        }
    }
    demo.topology.push(format!(
        "every process: one private tracked and one untracked allocation of {}",
        size_text(gran)
    ));
    // Memory IPC: cuMemAlloc + cuIpcGetMemHandle in process 0, cuIpcOpenMemHandle in the last.
    let last = n - 1;
    let p = demo
        .w(0)
        .mem_alloc(gran)
        .map_err(worker_error("cuMemAlloc"))?;
    demo.fill(0, p, gran, 5000, "IPC buffer")?;
    demo.expect(0, p, gran, 5000, "IPC buffer in its producer".into());
    let handle = demo
        .w(0)
        .ipc_get(p)
        .map_err(worker_error("cuIpcGetMemHandle"))?;
    let c = demo
        .w(last)
        .ipc_open(&handle)
        .map_err(worker_error("cuIpcOpenMemHandle"))?;
    demo.expect(
        last,
        c,
        gran,
        5000,
        format!("IPC buffer opened by process {last}"),
    );
    demo.topology.push(format!("IPC: a {} cuMemAlloc buffer of process 0 opened by process {last} through cuIpcOpenMemHandle", size_text(gran)));
    build_mesh(demo, &devices)?;
    // Before the checkpoint, everything reads back as written (sharing works).
    demo.verify_all()?;
    Ok(())
}

/// `--mesh`: every process creates `demo.mesh` allocations of one granule, each imported,
/// mapped and its handle released by the next process (as engines hold thousands of blocks).
fn build_mesh(demo: &mut Demo, devices: &[i32]) -> Result<(), DemoError> {
    let (n, gran, count) = (demo.workers.len(), demo.granularity, demo.mesh);
    if count == 0 {
        return Ok(());
    }
    for creator in 0..n {
        let importer = (creator + 1) % n;
        for k in 0..count {
            let seed = 1_000_000 + (creator * count + k) as u64;
            let name = format!("mesh allocation {k} of process {creator}");
            let ticket = demo.create_shared(creator, gran, devices[creator], seed, &name)?;
            let va = demo.import_mapped(importer, &ticket, gran, devices[importer], &name)?;
            demo.expect(
                importer,
                va,
                gran,
                seed,
                format!("{name} in process {importer}"),
            );
        }
    }
    demo.topology.push(format!(
        "mesh: {count} allocations of {} created by each process and imported by the next",
        size_text(gran)
    ));
    Ok(())
}

/// A write through an importer's mapping, read by the creator (and the IPC pair).
pub(super) fn check_sharing(demo: &mut Demo) -> Result<usize, DemoError> {
    let gran = demo.granularity;
    let regions = demo.regions.clone();
    let mut checks = 0;
    let s0_creator = regions
        .iter()
        .find(|r| r.what == "S0 in its creator")
        .cloned();
    let ipc_creator = regions
        .iter()
        .find(|r| r.what == "IPC buffer in its producer")
        .cloned();
    // The first mesh allocation of each process: its importer's writes reach the creator.
    let mesh_creator = |what: &str| {
        let name = what.strip_prefix("mesh allocation 0 of process ")?;
        let (creator, _) = name.split_once(" in process ")?;
        let of_creator = format!("mesh allocation 0 of process {creator} in its creator");
        regions.iter().find(|r| r.what == of_creator).cloned()
    };
    for r in &regions {
        let mesh = mesh_creator(&r.what);
        let creator = if r.what.starts_with("S0 imported") {
            &s0_creator
        } else if r.what.starts_with("IPC buffer opened") {
            &ipc_creator
        } else if mesh.is_some() {
            &mesh
        } else {
            continue;
        };
        let Some(creator) = creator else { continue };
        let seed = 9000 + r.worker as u64;
        demo.w(r.worker)
            .fill(r.address, gran, seed)
            .map_err(worker_error("writing through an imported mapping"))?;
        demo.w(creator.worker)
            .verify(creator.address, gran, seed)
            .map_err(|e| {
                DemoError::Verification(format!(
                    "{} is not shared with process {} after restore: {e}",
                    creator.what, r.worker
                ))
            })?;
        checks += 1;
    }
    Ok(checks)
}
