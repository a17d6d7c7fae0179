//! `cuinterpose demo`: the whole product on one screen, with nothing built at run time.
//!
//! It starts worker processes (`cuinterpose-worker`) under the shim over the embedded default
//! driver (fakecuda, next to this executable) or a real one, builds a sharing topology (a
//! creator whose allocation every other process imports, a partial import, private and
//! untracked allocations, a memory-IPC producer/consumer pair), fills every byte with a known
//! pattern, checkpoints and restores in place (or, with `--criu`, dumps the process tree,
//! kills it and restores it from the images), then verifies every byte at its original
//! address and that the sharing is live: a write by one process is seen by the others.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_workload::{EntryPath, Output, Worker, WorkerConfig};
use serde_json::{Value, json};

use crate::compose::{self, Workload};
use crate::criu::{self, Criu};
use crate::report::{PhaseReport, Report};
use crate::session::{self, Session};

/// Which driver the workers (and native checkpoint) use.
#[derive(Debug, Clone)]
pub enum DriverChoice {
    /// fakecuda's `libcuda.so` next to this executable (no GPU needed).
    Embedded,
    /// A driver library by path, or `libcuda.so.1` from the system's search path.
    Path(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Options {
    pub processes: usize,
    /// Size of the allocation every process imports (rounded up to the granularity).
    pub shared_mib: u64,
    pub criu: Option<Criu>,
    pub driver: DriverChoice,
    /// Keep the work directory (sockets, checkpoint, logs) instead of removing it.
    pub keep: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Worker {
        what: String,
        #[source]
        source: cuinterpose_workload::WorkloadError,
    },
    #[error(transparent)]
    Command(#[from] crate::commands::CommandError),
    #[error("verification failed: {0}")]
    Verification(String),
}

impl DemoError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DemoError::Command(e) => e.exit_code(),
            _ => 1,
        }
    }
}

/// What the demo did, for the report.
#[derive(Debug, Default)]
pub struct Outcome {
    pub report: Report,
    pub processes: usize,
    pub topology: Vec<String>,
    pub regions_verified: usize,
    pub bytes_verified: u64,
    pub sharing_checks: usize,
    pub work_dir: PathBuf,
}

impl Outcome {
    pub fn text(&self) -> String {
        let mut out = String::from("cuinterpose demo\n\ntopology:\n");
        for line in &self.topology {
            out.push_str(&format!("  {line}\n"));
        }
        out.push('\n');
        out.push_str(&self.report.text());
        out.push_str(&format!(
            "\nVERIFIED: {} regions, {} bytes at their original addresses in {} processes; {} sharing links live after restore\n",
            self.regions_verified, self.bytes_verified, self.processes, self.sharing_checks
        ));
        out
    }

    pub fn json(&self) -> Value {
        json!({
            "verified": true,
            "processes": self.processes,
            "topology": self.topology,
            "regions_verified": self.regions_verified,
            "bytes_verified": self.bytes_verified,
            "sharing_checks": self.sharing_checks,
            "report": self.report.json(),
        })
    }
}

fn setup(message: impl Into<String>) -> DemoError {
    DemoError::Setup(message.into())
}

fn worker_error(
    what: impl Into<String>,
) -> impl FnOnce(cuinterpose_workload::WorkloadError) -> DemoError {
    let what = what.into();
    move |source| DemoError::Worker { what, source }
}

/// Files the demo needs next to the `cuinterpose` executable.
struct Artifacts {
    worker: PathBuf,
    shim: PathBuf,
    fakecuda: PathBuf,
}

fn artifacts() -> Result<Artifacts, DemoError> {
    let exe =
        std::env::current_exe().map_err(|e| setup(format!("cannot find this executable: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| setup("this executable has no directory"))?;
    let found = Artifacts {
        worker: dir.join("cuinterpose-worker"),
        shim: dir.join("libcuinterpose.so"),
        fakecuda: dir.join("libcuda.so"),
    };
    for path in [&found.worker, &found.shim] {
        if !path.exists() {
            return Err(setup(format!(
                "{} not found next to cuinterpose: build the workspace first (`cargo build --workspace`)",
                path.display()
            )));
        }
    }
    Ok(found)
}

/// One filled region: which process, where, how much, and the seed of its pattern.
#[derive(Debug, Clone)]
struct Region {
    worker: usize,
    address: u64,
    size: u64,
    seed: u64,
    what: String,
}

struct Demo {
    workers: Vec<Worker>,
    regions: Vec<Region>,
    topology: Vec<String>,
    granularity: u64,
    shared_bytes: u64,
}

impl Demo {
    fn w(&mut self, i: usize) -> &mut Worker {
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

    fn verify_all(&mut self) -> Result<(usize, u64), DemoError> {
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

use cuinterpose_workload::cuda::HANDLE_TYPE_POSIX_FD as POSIX;

fn build_topology(demo: &mut Demo) -> Result<(), DemoError> {
    let n = demo.workers.len();
    let gran = demo.granularity;
    let devices: Vec<i32> = (0..n)
        .map(|i| {
            let count = demo.workers[i]
                .init_info()
                .map_or(1, |info| info.device_count.max(1));
            (i as i32) % count
        })
        .collect();
    // S0: created by process 0, imported whole by every other process.
    let s0_size = demo.shared_bytes.max(gran).next_multiple_of(gran);
    let s0 = demo
        .w(0)
        .create(s0_size, devices[0], POSIX)
        .map_err(worker_error("creating S0"))?;
    let s0_va = demo
        .w(0)
        .map_rw(s0, s0_size, devices[0])
        .map_err(worker_error("mapping S0"))?;
    demo.fill(0, s0_va, s0_size, 1000, "S0")?;
    demo.expect(0, s0_va, s0_size, 1000, "S0 in its creator".into());
    let ticket = demo.w(0).export(s0).map_err(worker_error("exporting S0"))?;
    for (i, &device) in devices.iter().enumerate().skip(1) {
        let h = demo
            .w(i)
            .import(std::os::fd::AsFd::as_fd(&ticket))
            .map_err(worker_error("importing S0"))?;
        let va = demo
            .w(i)
            .map_rw(h, s0_size, device)
            .map_err(worker_error("mapping S0"))?;
        // Imported handles are often released at once: the mapping keeps the memory.
        demo.w(i)
            .release(h)
            .map_err(worker_error("releasing S0's handle"))?;
        demo.expect(i, va, s0_size, 1000, format!("S0 imported by process {i}"));
    }
    demo.topology.push(format!(
        "S0: {} MiB created by process 0, imported by processes 1..{}",
        (s0_size) >> 20,
        n - 1
    ));
    // S1: created by process 1, its second half imported by the others from process 2 on.
    if n >= 3 {
        let s1 = demo
            .w(1)
            .create(2 * gran, devices[1], POSIX)
            .map_err(worker_error("creating S1"))?;
        let va = demo
            .w(1)
            .map_rw(s1, 2 * gran, devices[1])
            .map_err(worker_error("mapping S1"))?;
        demo.fill(1, va, 2 * gran, 2000, "S1")?;
        demo.expect(1, va, 2 * gran, 2000, "S1 in its creator".into());
        let ticket = demo.w(1).export(s1).map_err(worker_error("exporting S1"))?;
        for (i, &device) in devices.iter().enumerate().skip(2) {
            let h = demo
                .w(i)
                .import(std::os::fd::AsFd::as_fd(&ticket))
                .map_err(worker_error("importing S1"))?;
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
            "S1: {} MiB created by process 1, second half imported by processes 2..{}",
            (2 * gran) >> 20,
            n - 1
        ));
    }
    // Private memory: tracked but never shared, and untracked (not exportable) memory.
    for (i, &device) in devices.iter().enumerate() {
        for (types, name, seed) in [(POSIX, "private", 3000), (0, "native", 4000)] {
            let h = demo
                .w(i)
                .create(gran, device, types)
                .map_err(worker_error(format!("creating {name} memory")))?;
            let va = demo
                .w(i)
                .map_rw(h, gran, device)
                .map_err(worker_error(format!("mapping {name} memory")))?;
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
        "every process: one private tracked and one untracked allocation of {} MiB",
        gran >> 20
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
    demo.topology.push(format!("IPC: a {} MiB cuMemAlloc buffer of process 0 opened by process {last} through cuIpcOpenMemHandle", gran >> 20));
    // Before the checkpoint, everything reads back as written (sharing works).
    demo.verify_all()?;
    Ok(())
}

/// A write through an importer's mapping, read by the creator (and the IPC pair).
fn check_sharing(demo: &mut Demo) -> Result<usize, DemoError> {
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
    for r in &regions {
        let creator = if r.what.starts_with("S0 imported") {
            &s0_creator
        } else if r.what.starts_with("IPC buffer opened") {
            &ipc_creator
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

fn config(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
    entry: EntryPath,
) -> WorkerConfig {
    let config = WorkerConfig::new(&artifacts.worker)
        .entry(entry)
        .env("LD_PRELOAD", &artifacts.shim)
        .env("CUINTERPOSE_CONTROL_DIR", work.join("control"))
        .env("FAKECUDA_CONTROL_DIR", work.join("fakecuda"))
        .stdout(Output::Null)
        .stderr(Output::File(work.join("workers.log")));
    match driver {
        DriverChoice::Embedded => config.env("LD_LIBRARY_PATH", work.join("lib")),
        DriverChoice::Path(p) => config.driver(p),
    }
}

fn entry_for(i: usize) -> EntryPath {
    // Different processes reach the driver differently, as real programs do.
    match i % 3 {
        0 => EntryPath::Dlsym,
        1 => EntryPath::ProcAddress(12030),
        _ => EntryPath::Default,
    }
}

/// Starts the workers as one PID namespace (`unshare -fp setsid sh`), each listening on a
/// socket in the work directory, so that CRIU can dump the tree. Returns the spawned
/// `unshare` and the socket paths.
fn start_namespace(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
    n: usize,
) -> Result<(std::process::Child, Vec<PathBuf>), DemoError> {
    let sockets: Vec<PathBuf> = (0..n)
        .map(|i| work.join(format!("worker-{i}.sock")))
        .collect();
    // The tree writes its own log: a file another process (here `unshare` itself) also writes
    // would change size between dump and restore, which CRIU refuses.
    let mut script = format!(
        "exec </dev/null >/dev/null 2>>'{}'; ",
        work.join("workload.log").display()
    );
    let driver_flag = match driver {
        DriverChoice::Path(p) => format!(" --driver '{}'", p.display()),
        DriverChoice::Embedded => String::new(),
    };
    for (i, socket) in sockets.iter().enumerate() {
        script.push_str(&format!(
            "\"$0\" --listen '{}' --entry {}{driver_flag} & ",
            socket.display(),
            entry_for(i)
        ));
    }
    script.push_str("wait");
    let template = config(artifacts, work, driver, EntryPath::Dlsym);
    let mut command = std::process::Command::new("unshare");
    command
        .args(["-fp", "setsid", "sh", "-c", &script])
        .arg(&artifacts.worker)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::File::create(work.join("unshare.log"))
                .map_err(|e| setup(format!("creating unshare.log: {e}")))?,
        );
    for (key, value) in &template.env {
        command.env(key, value);
    }
    let child = command
        .spawn()
        .map_err(|e| setup(format!("starting `unshare -fp setsid sh`: {e}")))?;
    Ok((child, sockets))
}

/// The namespace init (`sh`) the spawned `unshare` forked.
fn namespace_root(unshare: u32) -> Result<u32, DemoError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            return Err(setup("the workload's namespace init did not start"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn connect_all(sockets: &[PathBuf]) -> Result<Vec<Worker>, DemoError> {
    sockets
        .iter()
        .map(|s| {
            Worker::connect(s, Duration::from_secs(30))
                .map_err(worker_error(format!("connecting to {}", s.display())))
        })
        .collect()
}

/// Runs the demo.
pub fn run(
    options: &Options,
    progress: &mut dyn FnMut(&PhaseReport),
) -> Result<Outcome, DemoError> {
    if options.processes < 2 {
        return Err(setup(
            "--processes must be at least 2 (sharing needs two processes)",
        ));
    }
    let artifacts = artifacts()?;
    let work = std::env::temp_dir().join(format!("cuinterpose-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    for sub in ["control", "fakecuda", "lib"] {
        std::fs::create_dir_all(work.join(sub))
            .map_err(|e| setup(format!("creating {}: {e}", work.display())))?;
    }
    let result = prepare_and_run(options, &artifacts, &work, progress);
    if !options.keep {
        // Nothing the demo made outlives it unless --keep asked for it.
        let _ = std::fs::remove_dir_all(&work);
        if result.is_err() {
            eprintln!(
                "cuinterpose: demo: its work directory was removed; rerun with --keep to keep it \
                 (logs, state, CRIU images)"
            );
        }
    }
    result.map(|mut outcome| {
        outcome.work_dir = work;
        outcome
    })
}

/// Links the driver into `work`, points the coordinator's own native calls at it, and runs.
fn prepare_and_run(
    options: &Options,
    artifacts: &Artifacts,
    work: &Path,
    progress: &mut dyn FnMut(&PhaseReport),
) -> Result<Outcome, DemoError> {
    let driver_path = match &options.driver {
        DriverChoice::Embedded => {
            if !artifacts.fakecuda.exists() {
                return Err(setup(format!(
                    "{} not found next to cuinterpose: build the workspace first",
                    artifacts.fakecuda.display()
                )));
            }
            let link = work.join("lib/libcuda.so.1");
            std::os::unix::fs::symlink(&artifacts.fakecuda, &link)
                .map_err(|e| setup(format!("linking {}: {e}", link.display())))?;
            link
        }
        DriverChoice::Path(p) => p.clone(),
    };
    // The coordinator's own native-checkpoint calls reach the same driver and, for fakecuda,
    // the same control directory as the workers.
    // SAFETY: the demo runs on the main thread before it starts any thread of its own.
    unsafe {
        std::env::set_var(crate::native::DRIVER_VARIABLE, &driver_path);
        std::env::set_var("FAKECUDA_CONTROL_DIR", work.join("fakecuda"));
    }
    run_in(options, artifacts, work, progress)
}

fn run_in(
    options: &Options,
    artifacts: &Artifacts,
    work: &Path,
    progress: &mut dyn FnMut(&PhaseReport),
) -> Result<Outcome, DemoError> {
    let n = options.processes;
    let mut namespace = None;
    let workers = match &options.criu {
        None => (0..n)
            .map(|i| {
                Worker::spawn(&config(artifacts, work, &options.driver, entry_for(i)))
                    .map_err(worker_error(format!("starting worker {i}")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(criu) => {
            criu::check(criu).map_err(|e| setup(format!("CRIU cannot run here: {e}")))?;
            let (unshare, sockets) = start_namespace(artifacts, work, &options.driver, n)?;
            let root = namespace_root(unshare.id())?;
            namespace = Some((unshare, sockets.clone(), root));
            connect_all(&sockets)?
        }
    };
    let mut demo = Demo {
        workers,
        regions: Vec::new(),
        topology: Vec::new(),
        granularity: 0,
        shared_bytes: options.shared_mib << 20,
    };
    for i in 0..n {
        let device = 0;
        demo.w(i)
            .init(device)
            .map_err(worker_error(format!("initialising CUDA in worker {i}")))?;
    }
    let count = demo.workers[0]
        .init_info()
        .map_or(1, |info| info.device_count.max(1));
    for i in 0..n {
        let device = (i as i32) % count;
        demo.w(i)
            .set_device(device)
            .map_err(worker_error("selecting the device"))?;
    }
    demo.granularity = demo
        .w(0)
        .granularity(0, POSIX, 0)
        .map_err(worker_error("granularity"))?;
    build_topology(&mut demo)?;

    let workload = Workload {
        control_dir: work.join("control"),
        timeouts: Timeouts::from_env().map_err(|e| setup(e.to_string()))?,
        lock_timeout_ms: 10_000,
        proc_dir: PathBuf::from("/proc"),
    };
    let session = Session::open(&workload.control_dir, &[], workload.timeouts)
        .map_err(crate::commands::CommandError::from)?;
    let inspection = session::inspect(&session);
    match &inspection.validation {
        Some(Ok(topology)) => demo.topology.push(format!(
            "inspect: {} participants, {} records, {} shared allocations ({} bytes to save)",
            topology.participants.len(),
            topology.records,
            topology.shared_allocations.len(),
            topology.bytes_to_save
        )),
        other => return Err(setup(format!("the topology does not validate: {other:?}"))),
    }

    let report = match (&options.criu, namespace.take()) {
        (Some(criu), Some((mut unshare, sockets, root))) => {
            // Nothing outside the tree may stay connected to it during the dump.
            demo.workers.clear();
            let dir = work.join("checkpoint");
            let mut report = Report::new("demo --criu");
            match criu::checkpoint(&workload, criu, root, &dir, progress) {
                Ok(checkpointed) => report.absorb(checkpointed),
                Err(error) => {
                    // Aborted: the tree still runs with its sharing rebuilt; check that, then
                    // end it. Otherwise end it as it is. Either way nothing is left running.
                    if error.exit_code() == 3 {
                        demo.workers = connect_all(&sockets)?;
                        let (regions, bytes) = demo.verify_all()?;
                        let links = check_sharing(&mut demo)?;
                        eprintln!(
                            "cuinterpose: demo: after the abort, {regions} regions ({bytes} bytes) \
                             verified at their original addresses and {links} sharing links live"
                        );
                        for worker in &mut demo.workers {
                            let _ = worker.call(&cuinterpose_workload::Command::Exit { code: 0 });
                        }
                    } else {
                        // Killing the namespace init ends the whole PID namespace.
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(root as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    let _ = unshare.wait();
                    return Err(error.into());
                }
            }
            let _ = unshare.wait();
            report.absorb(criu::restore(&workload, criu, &dir, progress)?);
            demo.workers = connect_all(&sockets)?;
            namespace = Some((unshare, sockets, root));
            report
        }
        _ => {
            let keep = options.keep.then(|| work.join("checkpoint"));
            compose::toggle(&workload, std::process::id(), keep.as_deref(), progress)?
        }
    };
    let started = Instant::now();
    let (regions, bytes) = demo.verify_all()?;
    let sharing = check_sharing(&mut demo)?;
    let mut report = report;
    let verify = PhaseReport {
        name: "demo_verify".into(),
        duration: started.elapsed(),
        bytes: 0,
        participants: n,
    };
    progress(&verify);
    report.phases.push(verify);
    if let Some((_, sockets, _)) = namespace {
        // Tell every restored worker to exit; the namespace then ends with them.
        for worker in &mut demo.workers {
            let _ = worker.call(&cuinterpose_workload::Command::Exit { code: 0 });
        }
        drop(sockets);
    }
    Ok(Outcome {
        report,
        processes: n,
        topology: demo.topology,
        regions_verified: regions,
        bytes_verified: bytes,
        sharing_checks: sharing,
        work_dir: PathBuf::new(),
    })
}
