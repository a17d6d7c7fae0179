//! What the checkpoint gate adds to a pass-through call, measured against the same driver
//! function called directly in the same run. The driver is tests/c/nulldriver.c, whose
//! functions return at once and take no lock, so the difference is the shim's own cost
//! (name resolution is cached; the gate is one per-thread slot and a read of the state word).
//!
//! - `gate_single_thread`: direct call; the shim's open pass-through (`cuDriverGetVersion`,
//!   no gate); the shim's gated pass-through (`cuCtxGetDevice`).
//! - `gate_threads`: the gated pass-through's CPU time per call on each of 1 and 8 threads
//!   calling at once (thread CPU time, so a 2-core machine running 8 threads does not count
//!   waiting for a core; what remains is contention, e.g. a shared counter's cache line).

#[path = "../tests/support/mod.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use std::ffi::c_int;
use std::hint::black_box;
use std::time::Duration;

type Version = unsafe extern "C" fn(*mut c_int) -> u32;
type Device = unsafe extern "C" fn(*mut c_int) -> u32;

fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-parameter.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Mean CPU time per thread for `iters` calls of `f` on each of `threads` threads at once.
fn per_thread_cpu(threads: usize, iters: u64, f: Device) -> Duration {
    let start = std::sync::Barrier::new(threads);
    let total: Duration = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut d = 0;
                    // SAFETY: one warm-up call registers the thread's gate slot.
                    unsafe { f(&mut d) };
                    start.wait();
                    let before = thread_cpu();
                    for _ in 0..iters {
                        // SAFETY: a valid output pointer.
                        black_box(unsafe { f(&mut d) });
                    }
                    thread_cpu() - before
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total / threads as u32
}

fn bench(c: &mut Criterion) {
    let sandbox = support::Sandbox::new("gate-bench");
    let null = support::null_driver();
    // SAFETY: no other thread exists yet; the shim reads these when it loads its driver.
    unsafe {
        std::env::set_var("CUINTERPOSE_DRIVER", null);
        std::env::set_var("CUINTERPOSE_CONTROL_DIR", sandbox.control_dir());
    }
    // SAFETY: loading runs no initialisers with preconditions; RTLD_LOCAL keeps the shim's
    // exports out of the global scope.
    let (driver, shim) = unsafe {
        let driver = libloading::Library::new(null).unwrap();
        let shim: libloading::Library = libloading::os::unix::Library::open(
            Some(support::shim()),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
        .unwrap()
        .into();
        (driver, shim)
    };
    // SAFETY: each name is looked up with its cuda.h prototype.
    let (direct_version, direct_device, open, gated) = unsafe {
        (
            *driver.get::<Version>(b"cuDriverGetVersion\0").unwrap(),
            *driver.get::<Device>(b"cuCtxGetDevice\0").unwrap(),
            *shim.get::<Version>(b"cuDriverGetVersion\0").unwrap(),
            *shim.get::<Device>(b"cuCtxGetDevice\0").unwrap(),
        )
    };
    let mut group = c.benchmark_group("gate_single_thread");
    for (name, f) in [
        ("direct_cuCtxGetDevice", direct_device),
        ("direct_cuDriverGetVersion", direct_version),
        ("shim_open_cuDriverGetVersion", open),
        ("shim_gated_cuCtxGetDevice", gated),
    ] {
        group.bench_function(name, |b| {
            let mut v = 0;
            // SAFETY: a valid output pointer.
            b.iter(|| black_box(unsafe { f(&mut v) }))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("gate_threads");
    for threads in [1usize, 8] {
        group.bench_function(format!("shim_gated_{threads}_threads"), |b| {
            b.iter_custom(|iters| per_thread_cpu(threads, iters, gated))
        });
        group.bench_function(format!("direct_{threads}_threads"), |b| {
            b.iter_custom(|iters| per_thread_cpu(threads, iters, direct_device))
        });
    }
    group.finish();
    drop(shim);
}

criterion_group!(benches, bench);
criterion_main!(benches);
