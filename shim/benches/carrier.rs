//! Host-carrier throughput: `save_allocations` + `load_allocations` of one shared 64 MiB
//! allocation through the shim (its own control socket, in this process) over fakecuda,
//! against plain `memcpy` of the same bytes in the same run: into a fresh anonymous mapping
//! (what the carrier's arena is) and into warm memory.

#[path = "../tests/support/mod.rs"]
mod support;

use criterion::{Criterion, criterion_group, criterion_main};
use cuinterpose_protocol::transport::{Endpoint, call};
use cuinterpose_protocol::{ExecuteRequest, NamespacePid, Operation, Reply, Request};
use std::ffi::{c_int, c_uint, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[repr(C)]
#[derive(Clone, Copy)]
struct Prop {
    type_: u32,
    handle_types: u32,
    location: [i32; 2],
    win32: *mut c_void,
    flags: [u8; 8],
}

const SIZE: usize = 64 << 20;

fn ask(endpoint: &Endpoint, request: Request) -> Reply {
    call(endpoint, &request, None, Duration::from_secs(60))
        .unwrap()
        .0
}

fn execute(endpoint: &Endpoint, operation: Operation) -> Duration {
    let started = Instant::now();
    match ask(endpoint, Request::Execute(ExecuteRequest { operation })) {
        Reply::Completed(_) => started.elapsed(),
        other => panic!("{operation}: {other:?}"),
    }
}

/// Copies `SIZE` bytes twice (out and back), as save + load do.
fn memcpy_twice(source: &[u8], fresh: bool, warm: &mut [u8]) -> Duration {
    let started = Instant::now();
    if fresh {
        let mut out = vec![0u8; 0];
        out.reserve_exact(SIZE);
        // SAFETY: `reserve_exact` gave SIZE bytes of capacity; they are written before use.
        unsafe {
            std::ptr::copy_nonoverlapping(source.as_ptr(), out.as_mut_ptr(), SIZE);
            out.set_len(SIZE);
        }
        let mut back = Vec::with_capacity(SIZE);
        back.extend_from_slice(&out);
        black_box(&back);
    } else {
        warm.copy_from_slice(source);
        let (a, b) = warm.split_at_mut(SIZE / 2);
        b.copy_from_slice(&source[..SIZE / 2]);
        a.copy_from_slice(&source[SIZE / 2..]);
        black_box(&warm);
    }
    started.elapsed()
}

fn bench(c: &mut Criterion) {
    let loaded = support::in_process("carrier-bench");
    let (sandbox, driver, shim) = (&loaded.sandbox, &loaded.driver, &loaded.shim);
    let prop = Prop {
        type_: 1,
        handle_types: 1,
        location: [1, 0],
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    };
    let access: [u32; 3] = [1, 0, 3];
    // SAFETY: every call below uses cuda.h's prototype and valid pointers to locals.
    unsafe {
        let init: libloading::Symbol<unsafe extern "C" fn(c_uint) -> u32> =
            shim.get(b"cuInit\0").unwrap();
        assert_eq!(init(0), 0);
        let retain: libloading::Symbol<unsafe extern "C" fn(*mut usize, c_int) -> u32> =
            driver.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
        let set: libloading::Symbol<unsafe extern "C" fn(usize) -> u32> =
            driver.get(b"cuCtxSetCurrent\0").unwrap();
        let mut ctx = 0;
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set(ctx), 0);
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
        let (mut handle, mut va, mut fd) = (0, 0, -1);
        assert_eq!(create(&mut handle, SIZE, &prop, 0), 0);
        assert_eq!(reserve(&mut va, SIZE, 0, 0, 0), 0);
        assert_eq!(map(va, SIZE, 0, handle, 0), 0);
        assert_eq!(set_access(va, SIZE, access.as_ptr(), 1), 0);
        let bytes: Vec<u8> = (0..SIZE).map(|i| (i * 7) as u8).collect();
        assert_eq!(htod(va, bytes.as_ptr().cast(), SIZE), 0);
        assert_eq!(export(&mut fd, handle, 1, 0), 0);
    }
    let endpoint = Endpoint::for_pid(
        &sandbox.control_dir(),
        NamespacePid::new(std::process::id()).unwrap(),
    )
    .unwrap();
    let cycle = || {
        assert!(matches!(
            ask(&endpoint, Request::BeginCheckpoint),
            Reply::Inspection(_)
        ));
        execute(&endpoint, Operation::PrepareMulticast);
        let save = execute(&endpoint, Operation::SaveAllocations);
        execute(&endpoint, Operation::PrepareUnicast);
        let load = execute(&endpoint, Operation::LoadAllocations);
        for operation in [
            Operation::RestoreUnicast,
            Operation::RestoreMulticastCreators,
            Operation::RestoreMulticastImporters,
            Operation::RestoreMulticastDevices,
            Operation::RestoreMulticastBindings,
        ] {
            execute(&endpoint, operation);
        }
        save + load
    };
    let source: Vec<u8> = (0..SIZE).map(|i| (i * 13) as u8).collect();
    let mut warm = vec![1u8; SIZE];
    let mut group = c.benchmark_group("carrier_64MiB_save_plus_load");
    group.sample_size(10);
    group.throughput(criterion::Throughput::Bytes(2 * SIZE as u64));
    group.bench_function("shim_carrier", |b| {
        b.iter_custom(|n| (0..n).map(|_| cycle()).sum())
    });
    group.bench_function("memcpy_fresh_memory", |b| {
        b.iter_custom(|n| (0..n).map(|_| memcpy_twice(&source, true, &mut warm)).sum())
    });
    group.bench_function("memcpy_warm_memory", |b| {
        b.iter_custom(|n| {
            (0..n)
                .map(|_| memcpy_twice(&source, false, &mut warm))
                .sum()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
