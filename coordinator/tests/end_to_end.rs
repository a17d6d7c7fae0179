//! End to end over the real shim and fakecuda: scriptable workers (cuinterpose-worker) share
//! VMM memory, legacy IPC memory and a multicast team; the `cuinterpose` binary toggles them
//! in place, then checkpoints and restores them in two invocations. Afterwards the bytes are
//! the same, at the same addresses, and still shared (a write in one process is seen in the
//! others).
//!
//! `harness = false`: the workers are this process's only children, so the process tree rooted
//! here is exactly the workload (plus the `cuinterpose` process itself, which is neither a CUDA
//! process nor a participant).

#[path = "end_to_end/quiet.rs"]
mod quiet;
#[path = "end_to_end/remap.rs"]
mod remap;
mod support;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Output;

use cuinterpose_workload::Worker;
use cuinterpose_workload::proto::{Command, Reply};
use serde_json::Value;
use std::time::Duration;
use support::cli::{self, check_exit};
use support::harness::Test;
use support::sandbox::{Sandbox, check_writes_cross, create_filled};

const MIB: u64 = 1 << 20;

fn main() {
    let tests: [Test<Sandbox>; 8] = [
        ("toggle_keeps_bytes_addresses_and_sharing", toggle_in_place),
        (
            "checkpoint_then_restore_in_two_invocations",
            checkpoint_then_restore,
        ),
        ("a_long_copy_reports_progress", long_copy_progress),
        (
            "a_coordinator_gone_mid_capture_is_rolled_back_by_the_shims",
            quiet::coordinator_gone,
        ),
        (
            "a_toggle_moves_the_workload_onto_other_gpus",
            remap::a_toggle_moves_the_workload_onto_other_gpus,
        ),
        (
            "a_checkpoint_is_restored_onto_another_machine",
            remap::a_checkpoint_is_restored_onto_another_machine,
        ),
        (
            "a_prepared_workload_restored_elsewhere_by_another_tool",
            remap::a_prepared_workload_restored_elsewhere_by_another_tool,
        ),
        (
            "processes_that_number_gpus_differently_share_one_gpu",
            remap::processes_that_number_gpus_differently_share_one_gpu,
        ),
    ];
    support::harness::run(&tests, || Sandbox::new("e2e"));
}

/// A worker of the sandbox's workload whose current device is `device`, with `env` added and
/// its stderr in `log` if given.
fn worker(sandbox: &Sandbox, device: i32, env: &[(&str, &str)], log: Option<&Path>) -> Worker {
    let mut worker = sandbox.worker_with(sandbox.dir.path(), log, env);
    if device != 0 {
        worker.set_device(device).expect("set device");
    }
    worker
}

/// Runs `cuinterpose` with the sandbox's driver and control directories.
fn cuinterpose(sandbox: &Sandbox, args: &[&str]) -> Output {
    let root = sandbox.dir.path();
    cli::command(args)
        .env("CUINTERPOSE_DRIVER", sandbox.fakecuda.join("libcuda.so.1"))
        .env("CUINTERPOSE_CONTROL_DIR", Sandbox::control_dir(root))
        .env("FAKECUDA_CONTROL_DIR", Sandbox::fakecuda_control_dir(root))
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run cuinterpose")
}

/// `cuinterpose ARGS --json` exits 0: its JSON report.
fn check_json(sandbox: &Sandbox, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let (stdout, _) = check_exit(&cuinterpose(sandbox, &args), 0);
    cli::final_json(&stdout)
}

/// Every participant's phase (inspect exits 1 unless all are active: that is fine here).
fn participant_phases(sandbox: &Sandbox) -> Vec<String> {
    cli::participant_phases(&cuinterpose(sandbox, &["inspect", "--json"]))
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
    build_with(sandbox, &[], &[None, None, None])
}

/// [`build`] with `env` in every worker and each worker's stderr in its entry of `logs`.
fn build_with(sandbox: &Sandbox, env: &[(&str, &str)], logs: &[Option<&Path>; 3]) -> Workload {
    build_each(sandbox, [env; 3], logs)
}

/// [`build_with`], each worker with an environment of its own.
fn build_each(
    sandbox: &Sandbox,
    envs: [&[(&str, &str)]; 3],
    logs: &[Option<&Path>; 3],
) -> Workload {
    let mut a = worker(sandbox, 0, envs[0], logs[0]);
    let mut b = worker(sandbox, 1, envs[1], logs[1]);
    let mut c = worker(sandbox, 0, envs[2], logs[2]);

    let (va, ticket) = create_filled(&mut a, SHARED, 11);
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
    check_writes_cross(workers, shared, SHARED, 100 + seed * 10);
}

/// Sends `worker` a `cuMemAlloc` and checks that it waits at the closed gate; its reply is
/// read once the gate reopens.
fn send_gated_alloc(worker: &mut Worker, what: &str) {
    worker
        .send(&Command::MemAlloc { size: GRAN }, None)
        .expect("send cuMemAlloc");
    assert!(
        !worker.reply_ready(Duration::from_millis(500)),
        "{what}: cuMemAlloc passed the closed gate"
    );
}

fn root() -> String {
    std::process::id().to_string()
}

fn toggle_in_place(sandbox: &Sandbox) {
    let mut workload = build(sandbox);
    let inspection = check_json(sandbox, &["inspect"]);
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

    let report = check_json(sandbox, &["toggle", "--pid", &root()]);
    assert_eq!(
        report["bytes"],
        2 * carried,
        "saved and loaded once: {report}"
    );
    // Each copy phase, participant by participant, adds up to the phase (GB/s per participant).
    for phase in ["save_allocations", "load_allocations"] {
        let copies: Vec<&Value> = report["copies"]
            .as_array()
            .expect("copies")
            .iter()
            .filter(|c| c["phase"] == phase)
            .collect();
        assert_eq!(copies.len(), 3, "{phase}: {report}");
        let bytes: u64 = copies.iter().map(|c| c["bytes"].as_u64().unwrap()).sum();
        assert_eq!(bytes, carried, "{phase}: {report}");
        assert!(
            copies
                .iter()
                .all(|c| c["elapsed_ms"].as_f64().unwrap() > 0.0 && c["gb_per_s"].is_number()),
            "{phase}: {report}"
        );
        // The shim times its transfers: part of the exchange, and a rate only where bytes moved.
        for copy in &copies {
            let (copy_ms, elapsed) = (copy["copy_ms"].as_f64(), copy["elapsed_ms"].as_f64());
            let moved = copy["bytes"].as_u64() > Some(0);
            assert!(
                copy_ms.is_some_and(|ms| ms <= elapsed.unwrap() && (ms > 0.0) == moved)
                    && (copy["copy_gb_per_s"].as_f64() > Some(0.0)) == moved,
                "{phase}: {copy}"
            );
        }
        let phase_entry = report["phases"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["phase"] == phase))
            .expect("the copy phase");
        assert!(
            phase_entry["copy_gb_per_s"].as_f64() > Some(0.0),
            "{phase_entry}"
        );
    }
    let phases = cli::phase_names(&report);
    assert!(
        phases.contains(&"native_checkpoint") && phases.ends_with(&["verify"]),
        "{phases:?}"
    );
    assert_eq!(participant_phases(sandbox), ["active"; 3]);
    check_restored(&mut workload, 11);
    drop(workload);
}

/// A copy that takes over a second (fakecuda's stream synchronization slowed to 1.2 s): with
/// `--json`, the toggle streams its phases as JSON lines, with progress lines during both copy
/// phases that name the creator and never go backwards, and ends with the report.
fn long_copy_progress(sandbox: &Sandbox) {
    let slow = [("FAKECUDA_STREAM_SYNC_DELAY_MS", "1200")];
    let dir = sandbox.dir.path();
    let mut a = sandbox.worker_with(dir, None, &slow);
    let mut b = sandbox.worker_with(dir, None, &slow);
    let size = 16 * MIB;
    let (va, ticket) = create_filled(&mut a, size, 21);
    let hb = b.import(ticket.as_fd()).expect("import");
    let vb = b.map_rw(hb, size, 0).expect("map b");
    drop(ticket);
    let creator = a.identity().pid;

    let output = cuinterpose(sandbox, &["toggle", "--pid", &root(), "--json"]);
    let (stdout, _) = check_exit(&output, 0);
    let (events, report) = cli::json_lines(&stdout);
    assert_eq!(report["command"], "toggle", "{report}");
    for phase in ["save_allocations", "load_allocations"] {
        let progress: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "progress" && e["phase"] == phase)
            .collect();
        assert!(
            !progress.is_empty(),
            "{phase}: no progress line in\n{stdout}"
        );
        let mut last = 0;
        for line in &progress {
            assert_eq!(line["bytes_total"], size, "{line}");
            let done = line["bytes_done"].as_u64().expect("bytes_done");
            assert!(
                last <= done && done <= size,
                "{phase} went from {last} to {done}"
            );
            last = done;
            let creators: Vec<&Value> = line["participants"]
                .as_array()
                .expect("participants")
                .iter()
                .filter(|p| p["bytes_total"] != 0)
                .collect();
            assert_eq!(creators.len(), 1, "{line}");
            assert_eq!(creators[0]["pid"], creator, "{line}");
        }
        let done = events
            .iter()
            .find(|e| e["event"] == "phase_done" && e["phase"] == phase)
            .expect("the phase ends");
        assert_eq!(done["bytes"], size, "{done}");
        assert!(done["elapsed_ms"].as_f64() > Some(1000.0), "{done}");
    }
    for (worker, address) in [(&mut a, va), (&mut b, vb)] {
        worker
            .verify(address, size, 21)
            .expect("bytes after the toggle");
    }
}

fn checkpoint_then_restore(sandbox: &Sandbox) {
    let mut workload = build(sandbox);
    let dir = sandbox.dir.path().join("checkpoint");
    let dir = dir.to_str().expect("UTF-8");
    let report = check_json(sandbox, &["checkpoint", "--pid", &root(), "--dir", dir]);
    assert_eq!(report["phases"][3]["phase"], "save_allocations");
    let carried = report["phases"][3]["bytes"].as_u64().expect("bytes");
    assert!(carried >= workload.shared_bytes, "{report}");
    assert_eq!(participant_phases(sandbox), ["released"; 3]);
    // While checkpointed, application calls wait at the gate for the restore.
    send_gated_alloc(&mut workload.workers[0], "checkpointed");

    let shown = cuinterpose(sandbox, &["state", "show", dir]);
    assert!(shown.status.success());
    let yaml = String::from_utf8_lossy(&shown.stdout);
    assert!(
        yaml.contains("kind: multicast_binding") && yaml.contains("host_carrier: true"),
        "{yaml}"
    );

    let report = check_json(sandbox, &["restore", "--dir", dir]);
    // The state is checked against the checkpointed processes first (real shims answer).
    assert_eq!(report["phases"][0]["phase"], "check_state");
    assert_eq!(report["phases"][1]["phase"], "native_restore");
    assert_eq!(report["bytes"], carried, "loaded what was saved: {report}");
    // Verified: the blocked call completes.
    let (reply, _) = workload.workers[0]
        .receive()
        .expect("cuMemAlloc after the restore");
    assert!(matches!(reply, Reply::Address { .. }), "{reply:?}");
    assert_eq!(participant_phases(sandbox), ["active"; 3]);
    check_restored(&mut workload, 11);
    drop(workload);
}
