//! Host-carrier throughput at model scale: `save_allocations` and `load_allocations` of one
//! shared allocation through the shim (its own control socket, in this process) over
//! fakecuda, swept over sizes (`CUINTERPOSE_BENCH_MIB`, default `64,256,1024,2048`), each
//! against the machine's limit for the same bytes measured in the same run:
//!
//! - a save against a copy into memory prepared the way the arena must be (a fresh anonymous
//!   mapping with transparent huge pages, populated by one thread per core, then filled by one
//!   thread per core, as fakecuda copies);
//! - a load against a copy into a fresh memfd mapping by one thread per core (fakecuda's device
//!   memory, recreated by the load, is fresh shmem that Linux faults in 4 KiB at a time);
//! - the checksum: XXH3-64 of the same bytes by one thread, against the save's transfers
//!   (`hash/copy`: what the hash would cost if nothing overlapped it), and what it really adds
//!   (`hash cost`): the save's chunked transfers (`cuMemcpyDtoHAsync` per 64 MiB chunk on one
//!   stream, as the shim issues them) into one prepared arena with and without hashing each
//!   chunk while the next is copied.
//!
//! With `CUINTERPOSE_BENCH_CARRIER=storage` the copies go through the storage carrier into
//! `CUINTERPOSE_BENCH_DIR` (default `target/cuinterpose-bench-storage`; put it on the disk to
//! measure) with a window of `CUINTERPOSE_BENCH_STAGING_MIB` (default 256), against a plain
//! sequential write of the same bytes to a file in the same directory (64 MiB writes, then
//! fsync, as `dd bs=64M conv=fsync` does) and a sequential `O_DIRECT` read of it (as `dd
//! iflag=direct bs=64M`) and, since the load also fills fresh device memory, against the
//! slower of that read and the memfd copy below (`load/floor`); the table gives each copy's
//! peak host memory.
//!
//! Each cycle times the whole exchange and the shim's transfers (`copy_ns`) of the same
//! operation, so "copy ≤ whole" holds sample by sample. Each size is warmed up first (one
//! untimed cycle and one of each baseline), and criterion's own warm-up run is left out of the
//! figures. After criterion's lines the bench prints one table of medians and ratios from the
//! samples of this run.

mod common;
#[path = "carrier/storage.rs"]
mod storage;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{POSIX, Prop};
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use cuinterpose_protocol::transport::{Endpoint, call};
use cuinterpose_protocol::{ExecuteRequest, NamespacePid, Operation, Reply, Request};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use storage::{Carrier, carrier, plain_read, plain_write};

const MIB: usize = 1 << 20;

fn sizes() -> Vec<usize> {
    std::env::var("CUINTERPOSE_BENCH_MIB")
        .unwrap_or_else(|_| "64,256,1024,2048".into())
        .split(',')
        .map(|mib| {
            mib.trim()
                .parse::<usize>()
                .expect("CUINTERPOSE_BENCH_MIB: MiB, comma-separated")
                * MIB
        })
        .collect()
}

fn ask(endpoint: &Endpoint, request: Request) -> Reply {
    let folder = request.carries_fd().then(|| {
        let Carrier::Storage { dir, .. } = carrier() else {
            unreachable!("only storage copies carry the folder")
        };
        std::os::fd::OwnedFd::from(std::fs::File::open(dir.join("carrier")).unwrap())
    });
    call(endpoint, &request, folder, Duration::from_secs(600))
        .unwrap()
        .0
}

/// The exchange's time, the shim's time for the transfers alone, and the carrier's peak.
fn execute(endpoint: &Endpoint, operation: Operation) -> (Duration, Duration, u64) {
    let started = Instant::now();
    let request = match carrier() {
        Carrier::Host => ExecuteRequest::host(operation),
        Carrier::Storage { staging, .. } => ExecuteRequest::storage(operation, staging),
    };
    match ask(endpoint, Request::Execute(request)) {
        Reply::Completed(done) => (
            started.elapsed(),
            Duration::from_nanos(done.copy_ns),
            done.peak_carrier_bytes,
        ),
        other => panic!("{operation}: {other:?}"),
    }
}

/// Each size's peak carrier memory (the same every cycle).
static PEAKS: Mutex<BTreeMap<usize, u64>> = Mutex::new(BTreeMap::new());

/// Every sample of this run, by (size, what).
static SAMPLES: Mutex<BTreeMap<(usize, &'static str), Vec<Duration>>> = Mutex::new(BTreeMap::new());

fn record(size: usize, what: &'static str, took: Duration) -> Duration {
    SAMPLES
        .lock()
        .unwrap()
        .entry((size, what))
        .or_default()
        .push(took);
    took
}

/// `len` bytes of a fresh mapping: anonymous private with huge pages and populated by
/// `threads` (as the arena is), or a memfd mapped shared (as fakecuda's device memory is).
/// Unmapped on drop.
struct Fresh {
    base: *mut u8,
    len: usize,
    fd: c_int,
}

impl Fresh {
    fn anonymous(len: usize, threads: usize) -> Self {
        // SAFETY: a new anonymous private mapping; advice within it.
        let base = unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            libc::madvise(base, len, libc::MADV_HUGEPAGE);
            base
        };
        let part = len.div_ceil(threads).next_multiple_of(2 * MIB);
        let at = base as usize;
        std::thread::scope(|scope| {
            for offset in (0..len).step_by(part) {
                scope.spawn(move || {
                    // SAFETY: advice on a part of the mapping above.
                    unsafe {
                        libc::madvise(
                            (at + offset) as *mut c_void,
                            part.min(len - offset),
                            libc::MADV_POPULATE_WRITE,
                        )
                    };
                });
            }
        });
        Fresh {
            base: base.cast(),
            len,
            fd: -1,
        }
    }

    fn memfd(len: usize) -> Self {
        // SAFETY: a new memfd of `len` bytes mapped shared read-write.
        unsafe {
            let fd = libc::memfd_create(c"carrier-bench".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0 && libc::ftruncate(fd, len as libc::off_t) == 0);
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            Fresh {
                base: base.cast(),
                len,
                fd,
            }
        }
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` writable bytes, borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        // SAFETY: the mapping (and memfd) made by this value.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            if self.fd >= 0 {
                libc::close(self.fd);
            }
        }
    }
}

/// Copies `source` into `to` in `threads` parts at once.
fn parallel_copy(to: &mut [u8], source: &[u8], threads: usize) {
    let part = source.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (to, from) in to.chunks_mut(part).zip(source.chunks(part)) {
            scope.spawn(move || to.copy_from_slice(from));
        }
    });
    black_box(to);
}

/// The shim's entry points this bench calls, and device 0's context made current.
struct Calls<'a> {
    shim: &'a libloading::Library,
    driver: &'a libloading::Library,
}

impl Calls<'_> {
    /// Creates, maps and exports one allocation of `size` bytes filled from `bytes`; returns
    /// its address.
    fn shared(&self, size: usize, bytes: &[u8]) -> u64 {
        let access: [u32; 3] = [1, 0, 3];
        let (mut handle, mut va, mut fd): (u64, u64, c_int) = (0, 0, -1);
        // SAFETY: every call below uses cuda.h's prototype and valid pointers to locals.
        unsafe {
            let create: libloading::Symbol<
                unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> u32,
            > = self.shim.get(b"cuMemCreate\0").unwrap();
            let reserve: libloading::Symbol<
                unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> u32,
            > = self.driver.get(b"cuMemAddressReserve\0").unwrap();
            let map: libloading::Symbol<unsafe extern "C" fn(u64, usize, usize, u64, u64) -> u32> =
                self.shim.get(b"cuMemMap\0").unwrap();
            let set_access: libloading::Symbol<
                unsafe extern "C" fn(u64, usize, *const u32, usize) -> u32,
            > = self.shim.get(b"cuMemSetAccess\0").unwrap();
            let export: libloading::Symbol<
                unsafe extern "C" fn(*mut c_int, u64, c_uint, u64) -> u32,
            > = self.shim.get(b"cuMemExportToShareableHandle\0").unwrap();
            let htod: libloading::Symbol<unsafe extern "C" fn(u64, *const c_void, usize) -> u32> =
                self.driver.get(b"cuMemcpyHtoD_v2\0").unwrap();
            assert_eq!(create(&mut handle, size, &POSIX, 0), 0);
            assert_eq!(reserve(&mut va, size, 0, 0, 0), 0);
            assert_eq!(map(va, size, 0, handle, 0), 0);
            assert_eq!(set_access(va, size, access.as_ptr(), 1), 0);
            assert_eq!(htod(va, bytes.as_ptr().cast(), size), 0);
            assert_eq!(export(&mut fd, handle, 1, 0), 0);
        }
        va
    }

    /// Unmaps and frees the allocation at `va` (through the shim: it stops tracking it).
    fn release(&self, va: u64, size: usize) {
        // SAFETY: cuda.h's prototypes; `va` maps `size` bytes of one handle.
        unsafe {
            let retain: libloading::Symbol<unsafe extern "C" fn(*mut u64, u64) -> u32> =
                self.shim.get(b"cuMemRetainAllocationHandle\0").unwrap();
            let unmap: libloading::Symbol<unsafe extern "C" fn(u64, usize) -> u32> =
                self.shim.get(b"cuMemUnmap\0").unwrap();
            let release: libloading::Symbol<unsafe extern "C" fn(u64) -> u32> =
                self.shim.get(b"cuMemRelease\0").unwrap();
            let free: libloading::Symbol<unsafe extern "C" fn(u64, usize) -> u32> =
                self.driver.get(b"cuMemAddressFree\0").unwrap();
            let mut handle = 0;
            assert_eq!(retain(&mut handle, va), 0);
            assert_eq!(unmap(va, size), 0);
            assert_eq!(release(handle), 0);
            assert_eq!(release(handle), 0);
            assert_eq!(free(va, size), 0);
        }
    }

    /// The save's transfers without the shim around them: `to.len()` bytes from `va` into
    /// `to` by one `cuMemcpyDtoHAsync` per carrier chunk on one stream, each synchronized
    /// before the next; with `hash`, each chunk is hashed while the next one is copied, as the
    /// shim's save does. The difference between the two is what the checksum costs.
    fn chunked_save(&self, va: u64, to: &mut [u8], hash: bool) -> Vec<u64> {
        let chunk = cuinterpose_protocol::CARRIER_CHUNK_BYTES;
        let mut hashes = Vec::new();
        let mut fold = |bytes: &[u8]| hashes.push(twox_hash::XxHash3_64::oneshot(bytes));
        // SAFETY: cuda.h's prototypes; each copy writes inside `to`, which outlives the
        // stream's synchronization after it.
        unsafe {
            let create: libloading::Symbol<unsafe extern "C" fn(*mut u64, c_uint) -> u32> =
                self.driver.get(b"cuStreamCreate\0").unwrap();
            let copy: libloading::Symbol<
                unsafe extern "C" fn(*mut c_void, u64, usize, u64) -> u32,
            > = self.driver.get(b"cuMemcpyDtoHAsync_v2\0").unwrap();
            let sync: libloading::Symbol<unsafe extern "C" fn(u64) -> u32> =
                self.driver.get(b"cuStreamSynchronize\0").unwrap();
            let destroy: libloading::Symbol<unsafe extern "C" fn(u64) -> u32> =
                self.driver.get(b"cuStreamDestroy_v2\0").unwrap();
            let mut stream = 0;
            assert_eq!(create(&mut stream, 0), 0);
            let mut previous: Option<&[u8]> = None;
            let mut address = va;
            for part in to.chunks_mut(chunk) {
                let len = part.len();
                assert_eq!(copy(part.as_mut_ptr().cast(), address, len, stream), 0);
                if let Some(copied) = previous.filter(|_| hash) {
                    fold(copied);
                }
                assert_eq!(sync(stream), 0);
                previous = Some(part);
                address += len as u64;
            }
            if let Some(copied) = previous.filter(|_| hash) {
                fold(copied);
            }
            assert_eq!(destroy(stream), 0);
        }
        hashes
    }

    /// Reads all of `va` into `scratch` (the application using its memory between toggles).
    fn touch(&self, va: u64, scratch: &mut [u8]) {
        // SAFETY: cuda.h's prototype; `scratch` holds as many bytes as `va` maps.
        unsafe {
            let dtoh: libloading::Symbol<unsafe extern "C" fn(*mut c_void, u64, usize) -> u32> =
                self.driver.get(b"cuMemcpyDtoH_v2\0").unwrap();
            assert_eq!(dtoh(scratch.as_mut_ptr().cast(), va, scratch.len()), 0);
        }
    }
}

/// One toggle of the allocation, the native checkpoint left out (fakecuda's memory stays):
/// records the save's and the load's whole exchange and transfers; returns both wholes.
fn cycle(endpoint: &Endpoint, size: usize) -> Duration {
    assert!(matches!(
        ask(endpoint, Request::BeginCheckpoint),
        Reply::Inspection(_)
    ));
    execute(endpoint, Operation::PrepareMulticast);
    let (save, save_copy, peak) = execute(endpoint, Operation::SaveAllocations);
    match carrier() {
        Carrier::Host => assert_eq!(peak, size as u64, "the arena holds the carried bytes"),
        Carrier::Storage { staging, .. } => assert!(peak <= staging, "{peak} within the window"),
    }
    PEAKS.lock().unwrap().insert(size, peak);
    execute(endpoint, Operation::PrepareUnicast);
    let (load, load_copy, _) = execute(endpoint, Operation::LoadAllocations);
    for operation in [
        Operation::RestoreUnicast,
        Operation::RestoreMulticastCreators,
        Operation::RestoreMulticastImporters,
        Operation::RestoreMulticastDevices,
        Operation::RestoreMulticastBindings,
    ] {
        execute(endpoint, operation);
    }
    assert!(matches!(
        ask(endpoint, Request::Inspect),
        Reply::Inspection(_)
    ));
    assert!(
        save_copy <= save && load_copy <= load,
        "transfers within their exchange"
    );
    record(size, "save", save);
    record(size, "save_copy", save_copy);
    record(size, "load", load);
    record(size, "load_copy", load_copy);
    save + load
}

/// The median of `samples` without the first, which is criterion's warm-up run.
fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples[1.min(samples.len() - 1)..].to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn report() {
    let samples = SAMPLES.lock().unwrap();
    let get = |size: usize, what: &str| {
        samples
            .iter()
            .find(|((s, w), _)| *s == size && *w == what)
            .map_or(Duration::ZERO, |(_, v)| median(v))
    };
    let gbps = |size: usize, took: Duration| size as f64 / 1e9 / took.as_secs_f64();
    if let Carrier::Storage { dir, staging } = carrier() {
        let sizes = samples.keys().map(|(s, _)| *s).collect();
        return storage::report(&dir, staging, &sizes, get, &PEAKS.lock().unwrap());
    }
    println!("\ncarrier sweep (medians of this run; GB/s; ratio = limit time / carrier time):");
    println!(
        "{:>9} | {:>6} {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>10} {:>10} | {:>6} {:>9} {:>9}",
        "MiB",
        "save",
        "copy",
        "load",
        "copy",
        "arena",
        "memfd",
        "save/limit",
        "load/limit",
        "xxh3",
        "hash/copy",
        "hash cost"
    );
    let sizes: std::collections::BTreeSet<usize> = samples.keys().map(|(s, _)| *s).collect();
    for size in sizes {
        let (save, save_copy) = (get(size, "save"), get(size, "save_copy"));
        let (load, load_copy) = (get(size, "load"), get(size, "load_copy"));
        let (arena, memfd, hash) = (
            get(size, "limit_arena"),
            get(size, "limit_memfd"),
            get(size, "xxh3"),
        );
        let (plain, hashed) = (get(size, "chunked"), get(size, "chunked_hashed"));
        println!(
            "{:>9} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} | {:>6.2} {:>6.2} | {:>9.2}x {:>9.2}x | {:>6.2} {:>8.0}% {:>8.0}%",
            size / MIB,
            gbps(size, save),
            gbps(size, save_copy),
            gbps(size, load),
            gbps(size, load_copy),
            gbps(size, arena),
            gbps(size, memfd),
            arena.as_secs_f64() / save.as_secs_f64(),
            memfd.as_secs_f64() / load.as_secs_f64(),
            gbps(size, hash),
            100.0 * hash.as_secs_f64() / save_copy.as_secs_f64(),
            100.0 * (hashed.as_secs_f64() / plain.as_secs_f64() - 1.0),
        );
    }
}

/// A baseline: `run` timed and recorded as `what`; what it returns (a mapping) is dropped
/// after the clock stops, as the carrier keeps its arena.
fn limit<T>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: String,
    size: usize,
    what: &'static str,
    run: impl Fn() -> T,
) {
    group.bench_function(name, |b| {
        b.iter_custom(|n| {
            (0..n)
                .map(|_| {
                    let started = Instant::now();
                    let kept = run();
                    let took = record(size, what, started.elapsed());
                    drop(kept);
                    took
                })
                .sum()
        })
    });
}

fn bench(c: &mut Criterion) {
    let loaded = support::in_process("carrier-bench");
    let (sandbox, driver, shim) = (&loaded.sandbox, &loaded.driver, &loaded.shim);
    common::init(shim, driver);
    let calls = Calls { shim, driver };
    let endpoint = Endpoint::for_pid(
        &sandbox.control_dir(),
        NamespacePid::new(std::process::id()).unwrap(),
    )
    .unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Carrier::Storage { dir, .. } = carrier() {
        std::fs::create_dir_all(dir.join("carrier")).unwrap();
    }
    for size in sizes() {
        let source: Vec<u8> = (0..size).map(|i| (i * 13) as u8).collect();
        let va = calls.shared(size, &source);
        let mut scratch = vec![0u8; size];
        // Warm-up, untimed: this VM backs memory on first touch, so the first cycle and the
        // first fresh mappings of a size are slower than every later one.
        calls.touch(va, &mut scratch);
        cycle(&endpoint, size);
        parallel_copy(Fresh::anonymous(size, cores).slice(), &source, cores);
        parallel_copy(Fresh::memfd(size).slice(), &source, cores);
        SAMPLES.lock().unwrap().retain(|(s, _), _| *s != size);
        let mut group = c.benchmark_group(format!("carrier_{}MiB", size / MIB));
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(1))
            .throughput(criterion::Throughput::Bytes(size as u64));
        // Between toggles the application uses its memory (reads all of it, untimed), so a
        // save reads memory in use, not a mapping nobody touched since the last restore.
        group.bench_function("save_and_load", |b| {
            b.iter_custom(|n| {
                (0..n)
                    .map(|_| {
                        calls.touch(va, &mut scratch);
                        cycle(&endpoint, size)
                    })
                    .sum()
            })
        });
        // A load's floor with either carrier: fakecuda's recreated device memory is fresh
        // shmem.
        limit(
            &mut group,
            format!("limit_memfd_{cores}_threads"),
            size,
            "limit_memfd",
            || {
                let mut fresh = Fresh::memfd(size);
                parallel_copy(fresh.slice(), &source, cores);
                fresh
            },
        );
        if let Carrier::Storage { dir, .. } = carrier() {
            let plain = dir.join("plain");
            limit(
                &mut group,
                "plain_write".into(),
                size,
                "limit_write",
                || plain_write(&plain, &source),
            );
            limit(
                &mut group,
                "plain_read_direct".into(),
                size,
                "limit_read",
                || plain_read(&plain, size),
            );
            group.finish();
            let _ = std::fs::remove_file(&plain);
            calls.release(va, size);
            continue;
        }
        limit(
            &mut group,
            format!("limit_arena_{cores}_threads"),
            size,
            "limit_arena",
            || {
                let mut fresh = Fresh::anonymous(size, cores);
                parallel_copy(fresh.slice(), &source, cores);
                fresh
            },
        );
        limit(&mut group, "xxh3_1_thread".into(), size, "xxh3", || {
            black_box(twox_hash::XxHash3_64::oneshot(&source))
        });
        // The save's chunked transfers into one prepared arena (populated, as the shim's is
        // before it copies), without and then with the hash.
        let mut arena = Fresh::anonymous(size, cores);
        // The baseline copies the same bytes: the chunks' hashes are those of the source.
        let expected: Vec<u64> = source
            .chunks(cuinterpose_protocol::CARRIER_CHUNK_BYTES)
            .map(twox_hash::XxHash3_64::oneshot)
            .collect();
        assert_eq!(calls.chunked_save(va, arena.slice(), true), expected);
        for (name, what, hash) in [
            ("chunked_dtoh", "chunked", false),
            ("chunked_dtoh_hashed", "chunked_hashed", true),
        ] {
            group.bench_function(name, |b| {
                b.iter_custom(|n| {
                    (0..n)
                        .map(|_| {
                            let started = Instant::now();
                            black_box(calls.chunked_save(va, arena.slice(), hash));
                            record(size, what, started.elapsed())
                        })
                        .sum()
                })
            });
        }
        drop(arena);
        group.finish();
        calls.release(va, size);
    }
    report();
}

criterion_group!(benches, bench);
criterion_main!(benches);
