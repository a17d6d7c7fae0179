//! Host-carrier throughput, each direction on its own: `save_allocations` and
//! `load_allocations` of one shared 64 MiB allocation through the shim (its own control socket,
//! in this process) over fakecuda, as the whole exchange and as the transfers alone (the
//! shim's `copy_ns`), against the copy limit measured in the same run: `memcpy` of the same
//! bytes between warm (already faulted-in) buffers, by one thread and by one thread per core.
//! The exchange minus the transfers is the preparation: laying out the arena for a save,
//! recreating the device memory for a load.
//!
//! A load writes into device memory recreated moments before. fakecuda's device memory is
//! shmem that Linux allocates, zeroes and maps 4 KiB at a time on first touch (a GPU has no
//! such cost), so the floor of a load over fakecuda is the last baseline: the same bytes
//! copied into a fresh memfd mapping by one thread per core.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{POSIX, Prop};
use criterion::{Criterion, criterion_group, criterion_main};
use cuinterpose_protocol::transport::{Endpoint, call};
use cuinterpose_protocol::{ExecuteRequest, NamespacePid, Operation, Reply, Request};
use std::ffi::{c_int, c_uint, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZE: usize = 64 << 20;

fn ask(endpoint: &Endpoint, request: Request) -> Reply {
    call(endpoint, &request, None, Duration::from_secs(60))
        .unwrap()
        .0
}

/// The exchange's time and the shim's time for the transfers alone.
fn execute(endpoint: &Endpoint, operation: Operation) -> (Duration, Duration) {
    let started = Instant::now();
    match ask(endpoint, Request::Execute(ExecuteRequest { operation })) {
        Reply::Completed(done) => (started.elapsed(), Duration::from_nanos(done.copy_ns)),
        other => panic!("{operation}: {other:?}"),
    }
}

/// One direction of a cycle: the whole exchange and the transfers in it.
#[derive(Clone, Copy)]
struct Timed {
    whole: Duration,
    copy: Duration,
}

/// Copies `SIZE` bytes into a new memfd mapping (first touch, as fakecuda's recreated device
/// memory is), in `threads` parts at once; mapping and freeing it included.
fn memcpy_fresh_memfd(source: &[u8], threads: usize) -> Duration {
    let part = SIZE.div_ceil(threads);
    let started = Instant::now();
    // SAFETY: a new memfd of SIZE bytes mapped shared read-write at a kernel-chosen address;
    // the slice over it is dropped before the mapping is removed.
    unsafe {
        let fd = libc::memfd_create(c"carrier-bench".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0 && libc::ftruncate(fd, SIZE as libc::off_t) == 0);
        let base = libc::mmap(
            std::ptr::null_mut(),
            SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        let fresh = std::slice::from_raw_parts_mut(base.cast::<u8>(), SIZE);
        std::thread::scope(|scope| {
            for (to, from) in fresh.chunks_mut(part).zip(source.chunks(part)) {
                scope.spawn(move || to.copy_from_slice(from));
            }
        });
        libc::munmap(base, SIZE);
        libc::close(fd);
    }
    started.elapsed()
}

/// Copies `SIZE` warm bytes in `threads` parts at once.
fn memcpy_warm(source: &[u8], warm: &mut [u8], threads: usize) -> Duration {
    let part = SIZE.div_ceil(threads);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for (to, from) in warm.chunks_mut(part).zip(source.chunks(part)) {
            scope.spawn(move || to.copy_from_slice(from));
        }
    });
    black_box(&warm);
    started.elapsed()
}

fn bench(c: &mut Criterion) {
    let loaded = support::in_process("carrier-bench");
    let (sandbox, driver, shim) = (&loaded.sandbox, &loaded.driver, &loaded.shim);
    let access: [u32; 3] = [1, 0, 3];
    let (mut handle, mut va, mut fd): (u64, u64, c_int);
    va = 0;
    common::init(shim, driver);
    // SAFETY: every call below uses cuda.h's prototype and valid pointers to locals.
    unsafe {
        let create: libloading::Symbol<
            unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> u32,
        > = shim.get(b"cuMemCreate\0").unwrap();
        let reserve: libloading::Symbol<
            unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> u32,
        > = driver.get(b"cuMemAddressReserve\0").unwrap();
        let map: libloading::Symbol<unsafe extern "C" fn(u64, usize, usize, u64, u64) -> u32> =
            shim.get(b"cuMemMap\0").unwrap();
        let set_access: libloading::Symbol<
            unsafe extern "C" fn(u64, usize, *const u32, usize) -> u32,
        > = shim.get(b"cuMemSetAccess\0").unwrap();
        let export: libloading::Symbol<unsafe extern "C" fn(*mut c_int, u64, c_uint, u64) -> u32> =
            shim.get(b"cuMemExportToShareableHandle\0").unwrap();
        let htod: libloading::Symbol<unsafe extern "C" fn(u64, *const c_void, usize) -> u32> =
            driver.get(b"cuMemcpyHtoD_v2\0").unwrap();
        (handle, fd) = (0, -1);
        assert_eq!(create(&mut handle, SIZE, &POSIX, 0), 0);
        assert_eq!(reserve(&mut va, SIZE, 0, 0, 0), 0);
        assert_eq!(map(va, SIZE, 0, handle, 0), 0);
        assert_eq!(set_access(va, SIZE, access.as_ptr(), 1), 0);
        let bytes: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
        assert_eq!(htod(va, bytes.as_ptr().cast(), SIZE), 0);
        assert_eq!(export(&mut fd, handle, 1, 0), 0);
    }
    // SAFETY: cuda.h's prototype.
    let dtoh: libloading::Symbol<unsafe extern "C" fn(*mut c_void, u64, usize) -> u32> =
        unsafe { driver.get(b"cuMemcpyDtoH_v2\0").unwrap() };
    let mut scratch = vec![0u8; SIZE];
    let mut touch = || {
        // SAFETY: `scratch` holds SIZE writable bytes; `va` maps SIZE bytes.
        assert_eq!(unsafe { dtoh(scratch.as_mut_ptr().cast(), va, SIZE) }, 0);
    };
    let endpoint = Endpoint::for_pid(
        &sandbox.control_dir(),
        NamespacePid::new(std::process::id()).unwrap(),
    )
    .unwrap();
    // Between toggles the application uses its memory (reads all of it, untimed), so a save
    // reads memory that is in use, not a mapping nobody touched since the last restore.
    let mut cycle = || {
        touch();
        assert!(matches!(
            ask(&endpoint, Request::BeginCheckpoint),
            Reply::Inspection(_)
        ));
        execute(&endpoint, Operation::PrepareMulticast);
        let (whole, copy) = execute(&endpoint, Operation::SaveAllocations);
        let save = Timed { whole, copy };
        execute(&endpoint, Operation::PrepareUnicast);
        let (whole, copy) = execute(&endpoint, Operation::LoadAllocations);
        let load = Timed { whole, copy };
        for operation in [
            Operation::RestoreUnicast,
            Operation::RestoreMulticastCreators,
            Operation::RestoreMulticastImporters,
            Operation::RestoreMulticastDevices,
            Operation::RestoreMulticastBindings,
        ] {
            execute(&endpoint, operation);
        }
        (save, load)
    };
    let source: Vec<u8> = (0..SIZE).map(|i| (i * 13) as u8).collect();
    let mut warm = vec![1u8; SIZE];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("carrier_64MiB");
    group.sample_size(10);
    group.throughput(criterion::Throughput::Bytes(SIZE as u64));
    type Pick = fn(&(Timed, Timed)) -> Duration;
    let picks: [(&str, Pick); 4] = [
        ("save_copy", |(save, _)| save.copy),
        ("save_whole", |(save, _)| save.whole),
        ("load_copy", |(_, load)| load.copy),
        ("load_whole", |(_, load)| load.whole),
    ];
    for (name, pick) in picks {
        group.bench_function(name, |b| {
            b.iter_custom(|n| (0..n).map(|_| pick(&cycle())).sum())
        });
    }
    group.bench_function("memcpy_warm_1_thread", |b| {
        b.iter_custom(|n| (0..n).map(|_| memcpy_warm(&source, &mut warm, 1)).sum())
    });
    group.bench_function(format!("memcpy_warm_{cores}_threads"), |b| {
        b.iter_custom(|n| (0..n).map(|_| memcpy_warm(&source, &mut warm, cores)).sum())
    });
    group.bench_function(format!("memcpy_fresh_memfd_{cores}_threads"), |b| {
        b.iter_custom(|n| (0..n).map(|_| memcpy_fresh_memfd(&source, cores)).sum())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
