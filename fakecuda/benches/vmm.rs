//! The driver's share of a checkpoint's control plane on fakecuda: what the VMM calls of
//! `prepare_unicast` and of `load_allocations` + `restore_unicast` cost one process when made
//! directly, with no shim, for `N` shared 64 KiB allocations of which the process holds both
//! views (the creator's and an importer's, as in the coordinator's `mesh` bench, where each
//! process creates N and imports N). `unshare` unmaps both views and releases both handles;
//! `reshare` creates, exports, imports, maps and grants both again. The printed floor is what
//! the mesh bench's 8 processes need from this machine's cores for those calls alone.
//!
//! `cargo bench -p fakecuda --bench vmm`

#[path = "../tests/support/mod.rs"]
mod support;

use criterion::Criterion;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use support::*;

const SIZE: usize = 64 << 10;
const COUNTS: [usize; 2] = [1000, 4000];
const PROCESSES: usize = 8;

/// One shared allocation, both views mapped and written.
struct Shared {
    creator: u64,
    importer: u64,
    views: [u64; 2],
}

fn share(cu: &Cuda, views: [u64; 2]) -> Shared {
    let creator = cu.create(SIZE, 0, POSIX_FD);
    let mut fd: i32 = -1;
    ok(cu.cuMemExportToShareableHandle((&raw mut fd).cast(), creator, POSIX_FD, 0));
    let mut importer = 0;
    ok(cu.cuMemImportFromShareableHandle(&mut importer, fd as usize as *mut _, POSIX_FD));
    // SAFETY: the export handed this process a descriptor of its own; nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    for (view, handle) in views.into_iter().zip([creator, importer]) {
        ok(cu.cuMemMap(view, SIZE, 0, handle, 0));
        ok(cu.grant(view, SIZE, 0, 3));
    }
    Shared {
        creator,
        importer,
        views,
    }
}

fn unshare(cu: &Cuda, shared: &Shared) {
    for (view, handle) in shared
        .views
        .into_iter()
        .zip([shared.creator, shared.importer])
    {
        ok(cu.cuMemUnmap(view, SIZE));
        ok(cu.cuMemRelease(handle));
    }
}

fn views(base: u64, index: usize) -> [u64; 2] {
    let at = |view: usize| base + ((2 * index + view) * SIZE) as u64;
    [at(0), at(1)]
}

/// `n` shared allocations, written, in `base`; the time of unsharing them, then of sharing
/// them again (left shared, then unshared untimed so the next round starts clean).
fn round(cu: &Cuda, base: u64, n: usize) -> (Duration, Duration) {
    let bytes = pattern(5, SIZE);
    let all: Vec<Shared> = (0..n).map(|i| share(cu, views(base, i))).collect();
    for shared in &all {
        cu.write(shared.views[0], &bytes);
    }
    let started = Instant::now();
    all.iter().for_each(|s| unshare(cu, s));
    let unshared = started.elapsed();
    let started = Instant::now();
    let again: Vec<Shared> = (0..n).map(|i| share(cu, views(base, i))).collect();
    let reshared = started.elapsed();
    again.iter().for_each(|s| unshare(cu, s));
    (unshared, reshared)
}

fn main() {
    // SAFETY: set before any thread starts and before the driver reads it at cuInit.
    unsafe { std::env::set_var("FAKECUDA_GRANULARITY_KIB", "64") };
    let cu = cuda();
    cu.setup(0);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for n in COUNTS {
        let base = cu.reserve(2 * n * SIZE);
        let mut group = c.benchmark_group(format!("vmm_{n}_shared"));
        group.bench_function("unshare", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| round(cu, base, n).0).sum())
        });
        group.bench_function("reshare", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| round(cu, base, n).1).sum())
        });
        group.finish();
        // The figure the mesh bench is read against, from a few rounds of its own.
        let rounds: Vec<_> = (0..5).map(|_| round(cu, base, n)).collect();
        let median = |pick: fn(&(Duration, Duration)) -> Duration| {
            let mut times: Vec<_> = rounds.iter().map(pick).collect();
            times.sort_unstable();
            times[times.len() / 2]
        };
        let (unshared, reshared) = (median(|r| r.0), median(|r| r.1));
        let floor = |t: Duration| t * PROCESSES as u32 / PROCESSES.min(cores) as u32;
        println!(
            "{n} shared, both views in one process: unshare {:.1} ms ({:.1} us per allocation), \
             reshare {:.1} ms ({:.1} us); {PROCESSES} such processes on {cores} cores need at \
             least {:.0} ms for prepare_unicast's calls and {:.0} ms for load + restore_unicast's",
            ms(unshared),
            ms(unshared) * 1e3 / n as f64,
            ms(reshared),
            ms(reshared) * 1e3 / n as f64,
            ms(floor(unshared)),
            ms(floor(reshared)),
        );
        ok(cu.cuMemAddressFree(base, 2 * n * SIZE));
    }
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}
