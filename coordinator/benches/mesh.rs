//! The control plane of a whole checkpoint with real shims: 8 `cuinterpose-worker` processes
//! under the shim over fakecuda, each creating `N` small shared allocations (fakecuda's
//! granularity set to 64 KiB) that the next process imports and maps, plus private memory
//! (`cuMemAlloc` blocks and an unshared VMM allocation). One iteration is `prepare` then
//! `restore` (every capture and restore phase, the state published and loaded, the final
//! comparison; no native checkpoint, which is the driver's time). Timed: every phase except
//! the two copies, whose time is the carrier's (see the shim's `carrier` bench). The baseline,
//! in the same run, is one `inspect` broadcast to the same shims: the messaging and record
//! handling no checkpoint can avoid. After each group, each phase's median is printed.
//!
//! `cargo bench --bench mesh -- 8x1000` (or `8x4000`) runs one size.

#[path = "../tests/support/mod.rs"]
mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::session::Session;
use cuinterpose_protocol::NamespacePid;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_workload::Worker;
use support::sandbox::Sandbox;

const PROCESSES: usize = 8;
const GRANULARITY_KIB: u64 = 64;
const SIZE: u64 = GRANULARITY_KIB << 10;
const PRIVATE_BLOCKS: usize = 16;
/// The phases that copy bytes; everything else is the control plane.
const COPIES: [&str; 2] = ["save_allocations", "load_allocations"];

/// The processes, their sockets' directory, and a session over them.
struct Mesh {
    _workers: Vec<Worker>,
    session: Session,
    sandbox: Sandbox,
}

fn mesh(allocations: usize) -> Mesh {
    let sandbox = Sandbox::new("mesh-bench");
    let root = sandbox.dir.path().to_path_buf();
    let env = [("FAKECUDA_GRANULARITY_KIB", "64")];
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|_| sandbox.worker_with(&root, None, &env))
        .collect();
    for creator in 0..PROCESSES {
        let importer = (creator + 1) % PROCESSES;
        for _ in 0..allocations {
            let w = &mut workers[creator];
            let handle = w.create(SIZE, 0, 1).expect("create");
            w.map_rw(handle, SIZE, 0).expect("map");
            let fd = w.export(handle).expect("export");
            let w = &mut workers[importer];
            let imported = w.import(fd.as_fd()).expect("import");
            w.map_rw(imported, SIZE, 0).expect("importer maps");
            w.release(imported).expect("the mapping keeps it");
        }
        let w = &mut workers[creator];
        for _ in 0..PRIVATE_BLOCKS {
            w.mem_alloc(SIZE).expect("cuMemAlloc");
        }
        let private = w.create(SIZE, 0, 0).expect("private");
        w.map_rw(private, SIZE, 0).expect("map private");
    }
    let pids: Vec<NamespacePid> = workers
        .iter()
        .map(|w| NamespacePid::new(w.pid()).expect("pid"))
        .collect();
    let session = Session::open(
        &Sandbox::control_dir(&root),
        &pids,
        Timeouts::from_env().expect("timeouts"),
    )
    .expect("session");
    Mesh {
        _workers: workers,
        session,
        sandbox,
    }
}

/// One prepare + restore; each phase's time.
fn cycle(mesh: &Mesh) -> Vec<(String, Duration)> {
    let dir = mesh.sandbox.fresh("state");
    let mut quiet = |_: &cuinterpose_coordinator::events::Event| {};
    let mut report = commands::prepare(&mesh.session, &dir, &mut quiet).expect("prepare");
    report.absorb(commands::restore(&mesh.session, &dir, &mut quiet).expect("restore"));
    std::fs::remove_dir_all(&dir).expect("remove the state");
    report
        .phases
        .into_iter()
        .map(|phase| (phase.name, phase.duration))
        .collect()
}

fn control_time(phases: &[(String, Duration)]) -> Duration {
    phases
        .iter()
        .filter(|(name, _)| !COPIES.contains(&name.as_str()))
        .map(|(_, duration)| *duration)
        .sum()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

fn group(c: &mut Criterion, allocations: usize) {
    let name = format!("mesh_{PROCESSES}x{allocations}");
    let built: RefCell<Option<Mesh>> = RefCell::new(None);
    let with = |f: &mut dyn FnMut(&Mesh) -> Duration| {
        let mut built = built.borrow_mut();
        f(built.get_or_insert_with(|| mesh(allocations)))
    };
    let seen: RefCell<BTreeMap<String, Vec<Duration>>> = RefCell::new(BTreeMap::new());
    let mut group = c.benchmark_group(&name);
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    group.bench_function("inspect_broadcast_baseline", |b| {
        b.iter_custom(|n| {
            with(&mut |mesh| {
                let started = std::time::Instant::now();
                for _ in 0..n {
                    assert_eq!(mesh.session.inspect().len(), PROCESSES);
                }
                started.elapsed()
            })
        })
    });
    group.bench_function("toggle_control_phases", |b| {
        b.iter_custom(|n| {
            with(&mut |mesh| {
                (0..n)
                    .map(|_| {
                        let phases = cycle(mesh);
                        let mut seen = seen.borrow_mut();
                        for (phase, time) in &phases {
                            seen.entry(phase.clone()).or_default().push(*time);
                        }
                        control_time(&phases)
                    })
                    .sum()
            })
        })
    });
    group.finish();
    let seen = seen.into_inner();
    if !seen.is_empty() {
        println!(
            "{name}: median of each phase over {} cycles",
            seen.values().map(Vec::len).max().unwrap_or(0)
        );
        for (phase, times) in seen {
            let copy = if COPIES.contains(&phase.as_str()) {
                "  (copy)"
            } else {
                ""
            };
            println!(
                "  {phase:<28} {:>9.1} ms{copy}",
                median(times).as_secs_f64() * 1e3
            );
        }
    }
}

fn bench(c: &mut Criterion) {
    group(c, 1000);
    group(c, 4000);
}

criterion_group!(benches, bench);
criterion_main!(benches);
