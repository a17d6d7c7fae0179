//! What the shim adds to a driver call, measured against fakecuda called directly in the same
//! run: a pass-through call (`cuMemGetAllocationGranularity`) and a tracked `cuMemMap` +
//! `cuMemUnmap` pair.
//!
//! Both libraries are `dlopen`ed into this process (the shim `RTLD_LOCAL`, so nothing else is
//! interposed); the shim finds fakecuda through `CUINTERPOSE_DRIVER`.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{POSIX, Prop};
use criterion::{Criterion, criterion_group, criterion_main};
use std::ffi::c_uint;
use std::hint::black_box;

const SIZE: usize = 2 << 20;

type Granularity = unsafe extern "C" fn(*mut usize, *const Prop, c_uint) -> u32;
type Create = unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> u32;
type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> u32;
type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> u32;
type Unmap = unsafe extern "C" fn(u64, usize) -> u32;

struct Api {
    granularity: Granularity,
    create: Create,
    reserve: Reserve,
    map: Map,
    unmap: Unmap,
}

fn load(library: &libloading::Library, driver: &libloading::Library) -> Api {
    common::init(library, driver);
    // SAFETY: each name is looked up with its cuda.h prototype; the reservation goes to the
    // driver itself (the shim does not wrap it).
    unsafe {
        Api {
            granularity: *library.get(b"cuMemGetAllocationGranularity\0").unwrap(),
            create: *library.get(b"cuMemCreate\0").unwrap(),
            reserve: *driver.get(b"cuMemAddressReserve\0").unwrap(),
            map: *library.get(b"cuMemMap\0").unwrap(),
            unmap: *library.get(b"cuMemUnmap\0").unwrap(),
        }
    }
}

fn bench(c: &mut Criterion) {
    let loaded = support::in_process("bench");
    let direct = load(&loaded.driver, &loaded.driver);
    let shimmed = load(&loaded.shim, &loaded.driver);

    let mut group = c.benchmark_group("pass_through_granularity");
    for (name, api) in [("fakecuda", &direct), ("shim", &shimmed)] {
        group.bench_function(name, |b| {
            let mut g = 0usize;
            // SAFETY: valid output and property pointers.
            b.iter(|| unsafe { black_box((api.granularity)(&mut g, &POSIX, 0)) })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("tracked_map_unmap");
    for (name, api) in [("fakecuda", &direct), ("shim", &shimmed)] {
        let mut handle = 0;
        let mut va = 0;
        // SAFETY: valid outputs; a 2 MiB POSIX-exportable allocation and a reservation.
        unsafe {
            assert_eq!((api.create)(&mut handle, SIZE, &POSIX, 0), 0);
            assert_eq!((api.reserve)(&mut va, SIZE, 0, 0, 0), 0);
        }
        group.bench_function(name, |b| {
            // SAFETY: maps the allocation into its own reservation and unmaps it again.
            b.iter(|| unsafe {
                assert_eq!((api.map)(va, SIZE, 0, handle, 0), 0);
                assert_eq!((api.unmap)(va, SIZE), 0);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
