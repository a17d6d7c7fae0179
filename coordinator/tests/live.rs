//! Live workloads over the real shim and fakecuda: application threads keep calling the driver
//! while `cuinterpose toggle` checkpoints and restores the processes in place. The gate holds
//! them from begin_checkpoint until the restore is verified, so nothing crashes, no call
//! fails, and no acknowledged write is lost. A thread parked inside a driver call makes
//! begin_checkpoint refuse, naming it, and the workload carries on. A native lock or checkpoint
//! the driver refuses after the sharing was released is aborted: the workload is put back in
//! place from the host carriers and resumes (exit 3).
//!
//! `harness = false`: the workers are this process's only children, so the process tree
//! rooted here is exactly the workload.

mod support;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use cuinterpose_workload::Worker;
use cuinterpose_workload::proto::{TrafficMode, TrafficReport, TrafficThread};
use support::cli::{self, check_exit};
use support::harness::Test;
use support::sandbox::{Sandbox, shared_by_all};
use support::tmpfs::{Tmpfs, unavailable};

const MIB: u64 = 1 << 20;
const SLOT: u64 = 64 * 1024;
const PROCESSES: usize = 4;
const THREADS: usize = 4;
/// Toggles under traffic (the figure).
const TOGGLES: usize = 20;

fn main() {
    let tests: [Test<Sandbox>; 6] = [
        ("toggles_under_traffic_lose_nothing", toggles_under_traffic),
        ("a_parked_call_makes_begin_refuse", parked_call),
        (
            "a_refused_native_step_is_aborted_and_resumed",
            refused_native_step,
        ),
        (
            "frozen_participants_resume_when_the_coordinator_vanishes",
            coordinator_vanishes,
        ),
        (
            "a_state_that_cannot_be_published_is_aborted_and_resumed",
            publication_fails,
        ),
        (
            "a_save_past_its_timeout_is_rolled_back_and_resumed",
            slow_save,
        ),
    ];
    support::harness::run(&tests, || Sandbox::new("live"));
}

/// `toggle --pid ROOT` of the workload under `root`, with `env`, exits `code`: its stdout and
/// stderr.
fn check_toggle(
    sandbox: &Sandbox,
    root: &Path,
    env: &[(&str, &str)],
    code: i32,
) -> (String, String) {
    let out = cuinterpose(sandbox, root, &["toggle", "--pid", &root_pid()], env);
    check_exit(&out, code)
}

fn cuinterpose(sandbox: &Sandbox, root: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = cli::command(args);
    command
        .env("CUINTERPOSE_DRIVER", sandbox.fakecuda.join("libcuda.so.1"))
        .env("CUINTERPOSE_CONTROL_DIR", Sandbox::control_dir(root))
        .env("FAKECUDA_CONTROL_DIR", Sandbox::fakecuda_control_dir(root))
        .env_remove("LD_PRELOAD");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run cuinterpose")
}

/// Two workers of `root` (with `env_a` and `env_b`) sharing a 2 MiB VMM allocation that the
/// first creates and the second imports: (creator, importer, their mappings).
fn pair(
    sandbox: &Sandbox,
    root: &Path,
    env_a: &[(&str, &str)],
    env_b: &[(&str, &str)],
) -> (Worker, Worker, u64, u64) {
    let mut a = sandbox.worker_with(root, None, env_a);
    let mut b = sandbox.worker_with(root, None, env_b);
    let handle = a.create(2 * MIB, 0, 1).expect("create");
    let va = a.map_rw(handle, 2 * MIB, 0).expect("map");
    let ticket = a.export(handle).expect("export");
    let imported = b.import(ticket.as_fd()).expect("import");
    let vb = b.map_rw(imported, 2 * MIB, 0).expect("map import");
    (a, b, va, vb)
}

/// Starts one traffic thread in `worker` on the slot at `address`.
fn one_thread(worker: &mut Worker, address: u64, mode: TrafficMode) {
    let threads = vec![TrafficThread {
        address,
        size: SLOT,
        mode,
    }];
    worker.traffic_start(0, threads).expect("start traffic");
}

/// Stops `worker`'s traffic: every thread ran, no call failed, no acknowledged write was lost.
fn check_traffic(what: &str, worker: &mut Worker) {
    for report in worker.traffic_stop().expect("stop traffic") {
        assert!(report.iterations > 0, "{what}: {report:?}");
        assert!(report.errors.is_empty(), "{what}: {report:?}");
        assert_eq!(report.inconsistencies, 0, "{what}: {report:?}");
    }
}

/// Waits until every participant of `root` is in `phase`, for at most `within`.
fn await_phases(sandbox: &Sandbox, root: &Path, phase: &str, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let now = cli::participant_phases(&cuinterpose(sandbox, root, &["inspect", "--json"], &[]));
        if now.iter().all(|p| p == phase) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not all {phase}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn root_pid() -> String {
    std::process::id().to_string()
}

/// Each thread's report: it ran, no driver call failed, no read contradicted a write the
/// driver had acknowledged.
fn check_reports(process: usize, reports: &[TrafficReport]) {
    assert_eq!(reports.len(), THREADS);
    for (thread, report) in reports.iter().enumerate() {
        let who = format!("process {process} thread {thread} ({:?})", report.mode);
        assert!(report.iterations > 0, "{who} never ran: {report:?}");
        assert!(report.errors.is_empty(), "{who}: failed calls: {report:?}");
        assert_eq!(
            report.inconsistencies, 0,
            "{who}: acknowledged writes lost: {report:?}"
        );
        assert!(report.last_acknowledged.is_some(), "{who}: {report:?}");
    }
}

/// 4 processes share one VMM allocation (created by the first, imported and mapped by the
/// others) and each holds private `cuMemAlloc` memory. In every process 4 threads write and
/// read back, continuously: synchronous copies and stream-ordered copies into the shared
/// allocation, memsets into private memory, stream-ordered memsets into the shared one; each
/// thread has its own 64 KiB slot. 20 toggles run meanwhile.
fn toggles_under_traffic(sandbox: &Sandbox) {
    let root = sandbox.fresh("traffic");
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|_| sandbox.worker(&root, None))
        .collect();
    let shared_size = 2 * MIB;
    assert!(SLOT * (PROCESSES * THREADS) as u64 <= shared_size);
    let shared = shared_by_all(&mut workers, shared_size);
    for (p, w) in workers.iter_mut().enumerate() {
        let private = w.mem_alloc(2 * MIB).expect("cuMemAlloc");
        let slot = |t: usize| shared[p] + ((p * THREADS + t) as u64) * SLOT;
        let threads = vec![
            TrafficThread {
                address: slot(0),
                size: SLOT,
                mode: TrafficMode::Copy,
            },
            TrafficThread {
                address: slot(1),
                size: SLOT,
                mode: TrafficMode::CopyAsync,
            },
            TrafficThread {
                address: private,
                size: SLOT,
                mode: TrafficMode::Memset,
            },
            TrafficThread {
                address: slot(3),
                size: SLOT,
                mode: TrafficMode::MemsetAsync,
            },
        ];
        w.traffic_start(0, threads).expect("start traffic");
    }
    std::thread::sleep(Duration::from_millis(100));
    for toggle in 0..TOGGLES {
        let (_, stderr) = check_toggle(sandbox, &root, &[], 0);
        assert!(!stderr.contains("FAIL-STOP"), "toggle {toggle}: {stderr}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut iterations = 0;
    for (p, w) in workers.iter_mut().enumerate() {
        let reports = w.traffic_stop().expect("stop traffic");
        check_reports(p, &reports);
        iterations += reports.iter().map(|r| r.iterations).sum::<u64>();
    }
    println!(
        "{TOGGLES} toggles under {} threads: {iterations} write-read iterations, no failed call, \
         no lost write",
        PROCESSES * THREADS
    );
    // The sharing is still live after the toggles: a write in one process is read in another.
    workers[3]
        .fill(shared[3], MIB, 77)
        .expect("fill through the last importer");
    workers[0]
        .verify(shared[0], MIB, 77)
        .expect("seen by the creator");
}

/// A thread inside `cuStreamSynchronize` (which fakecuda makes take 4 s) in one of two
/// processes when the toggle starts: its begin_checkpoint waits the control timeout (1 s),
/// refuses naming the thread and the function, and reopens its gate; the other process had
/// frozen and goes back to active on its own a control timeout later. Exit 1, not fail-stop,
/// no temporary directory left. Once the parked call returns, a toggle succeeds.
fn parked_call(sandbox: &Sandbox) {
    let root = sandbox.fresh("parked");
    let timeout = ("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "1");
    let parked = [("FAKECUDA_STREAM_SYNC_DELAY_MS", "4000"), timeout];
    let (mut worker, mut other, address, seen) = pair(sandbox, &root, &parked, &[timeout]);
    worker.fill(address, 2 * MIB, 5).expect("fill");
    worker.synchronize_in_thread(0).expect("park a thread");
    std::thread::sleep(Duration::from_millis(300));
    let tmp = sandbox.fresh("tmp");
    let tmp = tmp.to_str().expect("UTF-8");
    let env = [timeout, ("TMPDIR", tmp)];
    let (_, stderr) = check_toggle(sandbox, &root, &env, 1);
    let left: Vec<_> = std::fs::read_dir(tmp).expect("TMPDIR").collect();
    assert!(left.is_empty(), "a refused toggle left {left:?} in TMPDIR");
    assert!(
        stderr.contains("(synchronize) is inside cuStreamSynchronize")
            && stderr.contains("did not leave their driver call within 1 s")
            && stderr.contains("nothing was changed")
            && stderr.contains("those that froze were put back at once")
            && !stderr.contains("FAIL-STOP"),
        "{stderr}"
    );
    // The refusing process's gate is open again at once; the frozen one's call waits for
    // its watchdog, then goes on.
    worker
        .verify(address, 2 * MIB, 5)
        .expect("bytes after the refusal");
    worker
        .fill(address, MIB, 6)
        .expect("a write after the refusal");
    other
        .verify(seen, MIB, 6)
        .expect("the frozen process resumes and reads it");
    let phases = cli::participant_phases(&cuinterpose(sandbox, &root, &["inspect", "--json"], &[]));
    assert_eq!(phases, ["active"; 2]);
    // Once the parked call has returned, the checkpoint goes through.
    std::thread::sleep(Duration::from_millis(4000));
    check_toggle(sandbox, &root, &[timeout], 0);
    worker
        .verify(address, MIB, 6)
        .expect("bytes after the toggle");
    other.verify(seen, MIB, 6).expect("shared after the toggle");
}

/// Two processes share memory with traffic running in both; the importer's driver refuses
/// the native `step` (fakecuda's hook). Each toggle fails with exit 3, "ABORTED", never
/// "FAIL-STOP": the sharing is rebuilt from the host carriers and verified, the traffic sees
/// no failed call and no lost write, and the temporary directory is gone.
fn refused_native_step(sandbox: &Sandbox) {
    for step in ["lock", "checkpoint"] {
        let root = sandbox.fresh(step);
        let refuse = [("FAKECUDA_REFUSE_CHECKPOINT", step)];
        let (mut creator, mut importer, va, vb) = pair(sandbox, &root, &[], &refuse);
        creator.fill(va + MIB, MIB, 41).expect("fill");
        one_thread(&mut creator, va, TrafficMode::Copy);
        one_thread(&mut importer, vb + SLOT, TrafficMode::CopyAsync);
        let tmp = sandbox.fresh("tmp");
        let tmp = tmp.to_str().expect("UTF-8");
        for attempt in 0..2 {
            let out = cuinterpose(
                sandbox,
                &root,
                &["toggle", "--pid", &root_pid(), "--json"],
                &[("TMPDIR", tmp)],
            );
            let (stdout, stderr) = check_exit(&out, 3);
            let what = format!("native {step} refused, attempt {attempt}");
            assert!(
                stderr.contains(&format!("native {step} failed"))
                    && stderr.contains("ABORTED: native checkpoint failed")
                    && !stderr.contains("FAIL-STOP"),
                "{what}: {stderr}"
            );
            let report: serde_json::Value = cli::final_json(&stdout);
            assert_eq!(report["status"], "aborted", "{what}: {report}");
            assert_eq!(report["exit_code"], 3, "{what}: {report}");
            let phases = cli::phase_names(&report["resumed"]);
            assert!(
                phases.first() == Some(&"native_undo") && phases.ends_with(&["verify"]),
                "{what}: {phases:?}"
            );
            let left: Vec<_> = std::fs::read_dir(tmp).expect("TMPDIR").collect();
            assert!(left.is_empty(), "{what}: left {left:?} in TMPDIR");
        }
        check_traffic(&format!("{step} refused: creator"), &mut creator);
        check_traffic(&format!("{step} refused: importer"), &mut importer);
        importer
            .verify(vb + MIB, MIB, 41)
            .expect("bytes after the abort");
        importer
            .fill(vb + MIB, MIB, 42)
            .expect("write through the importer");
        creator.verify(va + MIB, MIB, 42).expect("still shared");
    }
}

/// Sends `request` to the shim of `pid` and vanishes (see [`support::send_and_vanish`]).
fn send_and_vanish(root: &Path, pid: i32, request: &cuinterpose_protocol::Request) {
    let socket = Sandbox::control_dir(root).join(format!("cuinterpose-{pid}.sock"));
    support::send_and_vanish(&socket, request);
}

/// The coordinator dies right after `begin_checkpoint` reached two sharing processes with
/// traffic running: both stay frozen (their calls wait) until their quiet window (three control
/// timeouts, 6 s) passes without a further request, then go back to active on their own; the
/// traffic saw no failed call and no lost write, and a toggle afterwards succeeds.
fn coordinator_vanishes(sandbox: &Sandbox) {
    let root = sandbox.fresh("vanish");
    let timeout = [("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "2")];
    let (mut a, mut b, va, vb) = pair(sandbox, &root, &timeout, &timeout);
    one_thread(&mut a, va, TrafficMode::Copy);
    one_thread(&mut b, vb + SLOT, TrafficMode::Copy);
    for w in [&a, &b] {
        send_and_vanish(
            &root,
            w.worker_pid(),
            &cuinterpose_protocol::Request::BeginCheckpoint,
        );
    }
    await_phases(sandbox, &root, "frozen", Duration::from_millis(1500));
    await_phases(sandbox, &root, "active", Duration::from_secs(10));
    check_traffic("creator", &mut a);
    check_traffic("importer", &mut b);
    check_toggle(sandbox, &root, &timeout, 0);
    b.fill(vb + MIB, MIB, 9)
        .expect("write through the importer");
    a.verify(va + MIB, MIB, 9).expect("still shared");
}

/// `checkpoint --dir --carrier host` into a directory whose disk is full: every participant
/// has released its sharing when the state cannot be written. The workload is put back from
/// the state in memory (restore phases, record comparison) and resumes: exit 3, "ABORTED:
/// publishing the state failed", no "FAIL-STOP", nothing left in the directory, traffic
/// unharmed. With the storage carrier (the default) the save fails first, naming its file:
/// rolled back, exit 3, nothing left either.
fn publication_fails(sandbox: &Sandbox) {
    let root = sandbox.fresh("publish");
    let disk = match Tmpfs::mount(sandbox.fresh("full"), "256k") {
        Ok(disk) => disk,
        Err(why) => {
            return unavailable(
                "a_state_that_cannot_be_published_is_aborted_and_resumed",
                &why,
            );
        }
    };
    std::fs::create_dir(disk.0.join("checkpoint")).expect("checkpoint dir");
    disk.fill();
    let (mut a, mut b, va, vb) = pair(sandbox, &root, &[], &[]);
    a.fill(va + MIB, MIB, 51).expect("fill");
    one_thread(&mut a, va, TrafficMode::MemsetAsync);
    one_thread(&mut b, vb + SLOT, TrafficMode::MemsetAsync);
    let dir = disk.0.join("checkpoint");
    let dir = dir.to_str().expect("UTF-8");
    let checkpoint = |carrier: &str| {
        let args = [
            "checkpoint",
            "--pid",
            &root_pid(),
            "--dir",
            dir,
            "--carrier",
            carrier,
        ];
        let out = cuinterpose(sandbox, &root, &args, &[]);
        let (_, stderr) = check_exit(&out, 3);
        let left: Vec<_> = std::fs::read_dir(dir).expect("checkpoint dir").collect();
        assert!(
            left.is_empty(),
            "{carrier}: left {left:?} in the checkpoint directory"
        );
        stderr
    };
    let stderr = checkpoint("host");
    assert!(
        stderr.contains("publish")
            && stderr.contains("ABORTED: publishing the state failed")
            && !stderr.contains("FAIL-STOP"),
        "{stderr}"
    );
    let stderr = checkpoint("storage");
    assert!(
        stderr.contains("save_allocations")
            && stderr.contains(&format!("carrier file {dir}/carrier/"))
            && stderr.contains("No space left on device")
            && !stderr.contains("FAIL-STOP"),
        "{stderr}"
    );
    check_traffic("creator", &mut a);
    check_traffic("importer", &mut b);
    b.verify(vb + MIB, MIB, 51).expect("bytes after the abort");
    b.fill(vb + MIB, MIB, 52)
        .expect("write through the importer");
    a.verify(va + MIB, MIB, 52).expect("still shared");
    drop(disk);
}

/// The creator's save takes longer than the copy timeout (fakecuda's stream synchronization
/// slowed to 1.5 s, the copy timeout 1 s), with traffic running in both processes: the toggle
/// rolls the capture back instead of fail-stopping (the creator's `roll_back` waits behind its
/// save, then puts it back): exit 3, `ABORTED`, every participant active, the traffic saw no
/// failed call and no lost write, the sharing is live, and a toggle with time enough succeeds.
fn slow_save(sandbox: &Sandbox) {
    let root = sandbox.fresh("slow-save");
    let control = ("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "2");
    let slow = [("FAKECUDA_STREAM_SYNC_DELAY_MS", "1500"), control];
    let (mut a, mut b, va, vb) = pair(sandbox, &root, &slow, &[control]);
    a.fill(va + MIB, MIB, 61).expect("fill");
    one_thread(&mut b, vb + SLOT, TrafficMode::MemsetAsync);
    let tmp = sandbox.fresh("tmp");
    let tmp = tmp.to_str().expect("UTF-8");
    let env = [
        control,
        ("CUINTERPOSE_COPY_TIMEOUT_SECONDS", "1"),
        ("TMPDIR", tmp),
    ];
    let out = cuinterpose(
        sandbox,
        &root,
        &["toggle", "--pid", &root_pid(), "--json"],
        &env,
    );
    let (stdout, stderr) = check_exit(&out, 3);
    assert!(
        stderr.contains("prepare failed in phase save_allocations")
            && stderr.contains("timed out after 1s")
            && stderr.contains("ABORTED")
            && !stderr.contains("FAIL-STOP"),
        "{stderr}"
    );
    let report = cli::final_json(&stdout);
    assert_eq!(report["status"], "aborted", "{report}");
    assert_eq!(report["rolled_back"], true, "{report}");
    let left: Vec<_> = std::fs::read_dir(tmp).expect("TMPDIR").collect();
    assert!(
        left.is_empty(),
        "a rolled-back toggle left {left:?} in TMPDIR"
    );
    let phases = cli::participant_phases(&cuinterpose(sandbox, &root, &["inspect", "--json"], &[]));
    assert_eq!(phases, ["active"; 2]);
    check_traffic("importer", &mut b);
    b.verify(vb + MIB, MIB, 61)
        .expect("bytes after the rollback");
    b.fill(vb + MIB, MIB, 62)
        .expect("write through the importer");
    a.verify(va + MIB, MIB, 62).expect("still shared");
    check_toggle(sandbox, &root, &[control], 0);
    a.verify(va + MIB, MIB, 62).expect("bytes after the toggle");
}
