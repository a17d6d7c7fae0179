//! Live traffic through CRIU: workers of one PID namespace share a VMM allocation and keep
//! writing and reading it (and private memory) on threads of their own, synchronous and
//! stream-ordered, while `cuinterpose checkpoint --criu` dumps the tree (which ends it) and
//! `cuinterpose restore --criu` brings it back, twice. The threads carry on after each restore:
//! no driver call failed, no acknowledged write was lost, and the sharing is live.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::{fakecuda_lib_dir, slack};
use cuinterpose_workload::Worker;
use cuinterpose_workload::proto::{TrafficMode, TrafficThread};
use support::cli::{self, check_exit, path};
use support::criu;
use support::sandbox::shared_by_all;

const MIB: u64 = 1 << 20;
const SLOT: u64 = 64 * 1024;
const PROCESSES: usize = 3;
const CYCLES: usize = 2;

/// The CLI with the workload's control directories and the embedded driver.
fn cuinterpose(work: &Path, args: &[&str]) -> serde_json::Value {
    // Exit 0 is the verdict; the last JSON line is the report.
    let driver = fakecuda_lib_dir().join("libcuda.so.1");
    let output = cli::command(args)
        .arg("--json")
        .env("CUINTERPOSE_CONTROL_DIR", work.join("control"))
        .env("FAKECUDA_CONTROL_DIR", work.join("fakecuda"))
        .env("CUINTERPOSE_DRIVER", &driver)
        .output()
        .expect("run cuinterpose");
    let (stdout, _) = check_exit(&output, 0);
    cli::final_json(&stdout)
}

fn connect_all(sockets: &[PathBuf]) -> Vec<Worker> {
    sockets
        .iter()
        .map(|s| Worker::connect(s, slack(Duration::from_secs(30))).expect("connect"))
        .collect()
}

#[test]
fn traffic_runs_on_through_criu_dumps_and_restores() {
    let test = "traffic_runs_on_through_criu_dumps_and_restores";
    let Some(binary) = criu::usable(test) else {
        return;
    };
    let work = TempDir::new("criu-traffic").expect("work dir");
    let dir = work.path();
    let (unshare, mut root, sockets) = criu::listening_tree(dir, PROCESSES, true);
    let mut reaper = criu::Reaper(vec![unshare.id(), root]);

    // One shared allocation (created by the first worker, imported by the others), private
    // memory in each, and in each process three threads: copies into its slot of the shared
    // allocation, stream-ordered memsets into another, memsets into private memory.
    let mut workers = connect_all(&sockets);
    for w in workers.iter_mut() {
        w.init(0).expect("cuInit");
    }
    let shared_size = 2 * MIB;
    let shared = shared_by_all(&mut workers, shared_size);
    for (p, w) in workers.iter_mut().enumerate() {
        let private = w.mem_alloc(2 * MIB).expect("cuMemAlloc");
        let slot = |t: usize| shared[p] + ((p * 3 + t) as u64) * SLOT;
        let thread = |address, mode| TrafficThread {
            address,
            size: SLOT,
            mode,
        };
        let threads = vec![
            thread(slot(0), TrafficMode::Copy),
            thread(slot(1), TrafficMode::MemsetAsync),
            thread(private, TrafficMode::Memset),
        ];
        w.traffic_start(0, threads).expect("start traffic");
    }
    std::thread::sleep(Duration::from_millis(100));
    // Nothing outside the tree stays connected to it during a dump.
    drop(workers);

    let mut unshare = unshare;
    for cycle in 1..=CYCLES {
        let images = dir.join(format!("checkpoint-{cycle}"));
        let images = path(&images);
        let root_arg = root.to_string();
        let criu = binary.to_str().expect("a UTF-8 CRIU path");
        let taken = cuinterpose(
            dir,
            &criu::args(&["checkpoint", "--pid", &root_arg], criu, images, &[]),
        );
        assert_eq!(taken["command"], "checkpoint", "cycle {cycle}: {taken}");
        if cycle == 1 {
            let _ = unshare.wait();
        }
        let restored = cuinterpose(dir, &criu::args(&["restore"], criu, images, &[]));
        assert_eq!(restored["command"], "restore", "cycle {cycle}: {restored}");
        // The restored tree's root (the namespace's init), as CRIU wrote it.
        let pidfile = Path::new(images).join("criu/restore.pid");
        root = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("{}: {e}: {restored}", pidfile.display()))
            .trim()
            .parse()
            .expect("a pid");
        reaper.0 = vec![root];
        // The threads ran on in the restored processes.
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut workers = connect_all(&sockets);
    let mut iterations = 0;
    for (p, w) in workers.iter_mut().enumerate() {
        let reports = w.traffic_stop().expect("stop traffic");
        assert_eq!(reports.len(), 3);
        for report in &reports {
            let who = format!("process {p} ({:?})", report.mode);
            assert!(report.iterations > 0, "{who} never ran: {report:?}");
            assert!(report.errors.is_empty(), "{who}: failed calls: {report:?}");
            assert_eq!(report.inconsistencies, 0, "{who}: lost writes: {report:?}");
        }
        iterations += reports.iter().map(|r| r.iterations).sum::<u64>();
    }
    println!("{CYCLES} CRIU cycles under traffic: {iterations} write-read iterations");
    // Still shared: a write through the last importer is read by the creator.
    let last = PROCESSES - 1;
    workers[last]
        .fill(shared[last] + MIB, MIB, 77)
        .expect("fill through the last importer");
    workers[0]
        .verify(shared[0] + MIB, MIB, 77)
        .expect("seen by the creator");
}
