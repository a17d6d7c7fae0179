//! End to end over the real shim and fakecuda: scriptable workers (cuinterpose-worker) share
//! VMM memory, legacy IPC memory and a multicast team; the `cuinterpose` binary toggles them
//! in place, then checkpoints and restores them in two invocations. Afterwards the bytes are
//! the same, at the same addresses, and still shared (a write in one process is seen in the
//! others).
//!
//! `harness = false`: the workers are this process's only children, so the process tree rooted
//! here is exactly the workload (plus the `cuinterpose` process itself, which is neither a CUDA
//! process nor a participant).

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Output};

use cuinterpose_coordinator::fixtures::TempDir;
use cuinterpose_workload::{
    EntryPath, Worker, WorkerConfig, build_shim, build_worker, fakecuda_lib_dir,
};
use serde_json::Value;

const MIB: u64 = 1 << 20;

type Test = fn(&Sandbox);

fn main() {
    let mut sandbox = None;
    let tests: [(&str, Test); 2] = [
        ("toggle_keeps_bytes_addresses_and_sharing", toggle_in_place),
        (
            "checkpoint_then_restore_in_two_invocations",
            checkpoint_then_restore,
        ),
    ];
    // Like libtest: positional arguments are name filters; flags (--nocapture, ...) are
    // accepted and ignored.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let mut passed = 0;
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|filter| name.contains(filter.as_str())) {
            continue;
        }
        passed += 1;
        println!("test {name} ...");
        test(sandbox.get_or_insert_with(Sandbox::new));
        println!("test {name} ... ok");
    }
    println!(
        "test result: ok. {passed} passed; {} filtered out",
        tests.len() - passed
    );
}

/// The shim, the worker, fakecuda and private control directories.
struct Sandbox {
    shim: PathBuf,
    worker: PathBuf,
    fakecuda: PathBuf,
    dir: TempDir,
}

impl Sandbox {
    fn new() -> Self {
        Self {
            shim: build_shim().to_path_buf(),
            worker: build_worker().to_path_buf(),
            fakecuda: fakecuda_lib_dir().to_path_buf(),
            dir: TempDir::new("e2e").expect("sandbox"),
        }
    }

    fn control_dir(&self) -> PathBuf {
        self.dir.path().join("ctl")
    }

    fn fakecuda_control_dir(&self) -> PathBuf {
        self.dir.path().join("fakecuda")
    }

    fn worker(&self, device: i32) -> Worker {
        let config = WorkerConfig::new(&self.worker)
            .entry(EntryPath::Dlsym)
            .env("LD_LIBRARY_PATH", &self.fakecuda)
            .env("LD_PRELOAD", &self.shim)
            .env("CUINTERPOSE_CONTROL_DIR", self.control_dir())
            .env("FAKECUDA_CONTROL_DIR", self.fakecuda_control_dir());
        let mut worker = Worker::spawn(&config).expect("spawn a worker");
        worker.init(0).expect("init");
        if device != 0 {
            worker.set_device(device).expect("set device");
        }
        worker
    }

    /// Runs `cuinterpose` with the sandbox's driver and control directories.
    fn cuinterpose(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
            .args(args)
            .env("CUINTERPOSE_DRIVER", self.fakecuda.join("libcuda.so.1"))
            .env("CUINTERPOSE_CONTROL_DIR", self.control_dir())
            .env("FAKECUDA_CONTROL_DIR", self.fakecuda_control_dir())
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run cuinterpose")
    }

    /// `cuinterpose ARGS --json` exits 0: its JSON report.
    fn check_json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.cuinterpose(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "cuinterpose {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str(&stdout).expect("JSON report")
    }

    /// Every participant's phase (inspect exits 1 unless all are active: that is fine here).
    fn phases(&self) -> Vec<String> {
        let output = self.cuinterpose(&["inspect", "--json"]);
        let value: Value = serde_json::from_slice(&output.stdout).expect("inspect JSON");
        value["participants"]
            .as_object()
            .expect("participants")
            .values()
            .map(|participant| participant["phase"].as_str().expect("phase").to_string())
            .collect()
    }
}

/// Three workers sharing one VMM allocation (created by the first), one legacy IPC allocation
/// (opened by the third), and a multicast team of the first two.
struct Workload {
    workers: Vec<Worker>,
    /// Each worker's mapping of the shared VMM allocation.
    shared: Vec<u64>,
    ipc: (u64, u64),
    private: u64,
    multicast_view: u64,
    member: (u64, u64),
    shared_bytes: u64,
}

const SHARED: u64 = 4 * MIB;
const GRAN: u64 = 2 * MIB;

fn build(sandbox: &Sandbox) -> Workload {
    let mut a = sandbox.worker(0);
    let mut b = sandbox.worker(1);
    let mut c = sandbox.worker(0);

    let shared = a.create(SHARED, 0, 1).expect("create");
    let va = a.map_rw(shared, SHARED, 0).expect("map");
    a.fill(va, SHARED, 11).expect("fill");
    let ticket = a.export(shared).expect("export");
    let hb = b.import(ticket.as_fd()).expect("import b");
    let vb = b.map_rw(hb, SHARED, 1).expect("map b");
    b.release(hb).expect("release b: the mapping keeps it");
    let hc = c.import(ticket.as_fd()).expect("import c");
    let vc = c.map_rw(hc, SHARED, 0).expect("map c");
    drop(ticket);

    let private = c.create(GRAN, 0, 0).expect("private");
    let vp = c.map_rw(private, GRAN, 0).expect("map private");
    c.fill(vp, GRAN, 12).expect("fill private");

    let dptr = b.mem_alloc(GRAN).expect("cuMemAlloc");
    b.fill(dptr, GRAN, 13).expect("fill ipc");
    let handle = b.ipc_get(dptr).expect("ipc handle");
    let opened = c.ipc_open(&handle).expect("ipc open");

    let mc = a.mc_create(2, GRAN, 1).expect("multicast");
    let ticket = a.export(mc).expect("export multicast");
    let mc_b = b.import(ticket.as_fd()).expect("import multicast");
    a.mc_add_device(mc, 0).expect("add device 0");
    b.mc_add_device(mc_b, 1).expect("add device 1");
    let ha = a.create(GRAN, 0, 1).expect("member a");
    let pa = a.map_rw(ha, GRAN, 0).expect("map member a");
    a.fill(pa, GRAN, 14).expect("fill member a");
    a.mc_bind_mem(mc, 0, ha, 0, GRAN, Some(0)).expect("bind a");
    let hm = b.create(GRAN, 1, 1).expect("member b");
    let pb = b.map_rw(hm, GRAN, 1).expect("map member b");
    b.fill(pb, GRAN, 14).expect("fill member b");
    b.mc_bind_mem(mc_b, 0, hm, 0, GRAN, None).expect("bind b");
    let view = a.map_rw(mc, GRAN, 0).expect("map multicast");
    a.verify(view, GRAN, 14).expect("multicast view");

    Workload {
        workers: vec![a, b, c],
        shared: vec![va, vb, vc],
        ipc: (dptr, opened),
        private: vp,
        multicast_view: view,
        member: (pa, pb),
        // At least the VMM allocation and the IPC allocation go through host carriers.
        shared_bytes: SHARED + GRAN,
    }
}

/// Same bytes at the same addresses, and the sharing is live: each worker writes its own
/// pattern through the shared mapping and the others read it.
fn check_restored(workload: &mut Workload, seed: u64) {
    let Workload {
        workers,
        shared,
        ipc,
        private,
        multicast_view,
        member,
        ..
    } = workload;
    for (worker, address) in workers.iter_mut().zip(shared.iter()) {
        worker.verify(*address, SHARED, seed).expect("shared bytes");
    }
    workers[2]
        .verify(*private, GRAN, 12)
        .expect("private bytes");
    workers[1]
        .verify(ipc.0, GRAN, 13)
        .expect("ipc bytes (creator)");
    workers[2]
        .verify(ipc.1, GRAN, 13)
        .expect("ipc bytes (importer)");
    workers[0].verify(member.0, GRAN, 14).expect("member a");
    workers[1].verify(member.1, GRAN, 14).expect("member b");
    workers[0]
        .verify(*multicast_view, GRAN, 14)
        .expect("multicast view");
    for writer in 0..workers.len() {
        let pattern = 100 + seed * 10 + writer as u64;
        workers[writer]
            .fill(shared[writer], SHARED, pattern)
            .expect("write");
        for reader in 0..workers.len() {
            workers[reader]
                .verify(shared[reader], SHARED, pattern)
                .unwrap_or_else(|error| panic!("{reader} reads {writer}'s write: {error}"));
        }
    }
}

fn root() -> String {
    std::process::id().to_string()
}

fn toggle_in_place(sandbox: &Sandbox) {
    let mut workload = build(sandbox);
    let inspection = sandbox.check_json(&["inspect"]);
    assert_eq!(inspection["valid"], true, "{inspection}");
    assert_eq!(inspection["summary"]["participants"], 3);
    // The VMM and IPC allocations at least; which multicast members go through host carriers
    // is the shim's choice.
    let carried = inspection["summary"]["bytes_to_save"]
        .as_u64()
        .expect("bytes");
    assert!(carried >= workload.shared_bytes, "{inspection}");
    assert!(inspection["summary"]["shared_allocations"].as_u64() >= Some(2));
    assert_eq!(inspection["summary"]["multicast_groups"], 1);

    let report = sandbox.check_json(&["toggle", "--pid", &root()]);
    assert_eq!(
        report["bytes"],
        2 * carried,
        "saved and loaded once: {report}"
    );
    let phases: Vec<&str> = report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|phase| phase["phase"].as_str().expect("name"))
        .collect();
    assert!(
        phases.contains(&"native_checkpoint") && phases.ends_with(&["verify"]),
        "{phases:?}"
    );
    assert_eq!(sandbox.phases(), ["active"; 3]);
    check_restored(&mut workload, 11);
    drop(workload);
}

fn checkpoint_then_restore(sandbox: &Sandbox) {
    let mut workload = build(sandbox);
    let dir = sandbox.dir.path().join("checkpoint");
    let dir = dir.to_str().expect("UTF-8");
    let report = sandbox.check_json(&["checkpoint", "--pid", &root(), "--dir", dir]);
    assert_eq!(report["phases"][3]["phase"], "save_allocations");
    let carried = report["phases"][3]["bytes"].as_u64().expect("bytes");
    assert!(carried >= workload.shared_bytes, "{report}");
    assert_eq!(sandbox.phases(), ["released"; 3]);
    // While checkpointed, tracked calls wait for the restore.
    assert!(workload.workers[0].create(GRAN, 0, 1).is_err());

    let shown = sandbox.cuinterpose(&["state", "show", dir]);
    assert!(shown.status.success());
    let yaml = String::from_utf8_lossy(&shown.stdout);
    assert!(
        yaml.contains("kind: multicast_binding") && yaml.contains("host_carrier: true"),
        "{yaml}"
    );

    let report = sandbox.check_json(&["restore", "--dir", dir]);
    assert_eq!(report["phases"][0]["phase"], "native_restore");
    assert_eq!(report["bytes"], carried, "loaded what was saved: {report}");
    assert_eq!(sandbox.phases(), ["active"; 3]);
    check_restored(&mut workload, 11);
    drop(workload);
}
