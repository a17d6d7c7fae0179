//! Stream-ordered memory pools: default and current pools per device, created pools with
//! their attributes and access, allocation and stream-ordered free, and what a pool cannot do
//! yet (shareable handles), as NVIDIA's `cuda.core` uses them.

mod support;

use support::*;

/// `CU_MEMPOOL_ATTR_*`.
const REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
const RELEASE_THRESHOLD: u32 = 4;
const USED_MEM_CURRENT: u32 = 7;
const USED_MEM_HIGH: u32 = 8;
/// `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`.
const MEMPOOL_HANDLE: u32 = 17;

/// `CUmemPoolProps` (88 bytes): pinned device memory on `device`, `handle_types`.
fn props(device: u32, handle_types: u32) -> [u64; 11] {
    let mut p = [0u64; 11];
    p[0] = 1 | (u64::from(handle_types) << 32); // allocType PINNED, handleTypes
    p[1] = 1 | (u64::from(device) << 32); // location DEVICE, id
    p
}

fn attribute(cu: &Cuda, pool: usize, attr: u32) -> u64 {
    let mut v = 0u64;
    ok(cu.cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()));
    v
}

#[test]
fn pools_allocate_in_stream_order_and_count_their_memory() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
    let mut default = 0;
    ok(cu.cuDeviceGetDefaultMemPool(&mut default, 0));
    let mut current = 0;
    ok(cu.cuDeviceGetMemPool(&mut current, 0));
    assert_eq!(
        current, default,
        "the current pool starts as the default one"
    );
    assert_eq!(
        cu.cuMemPoolCreate(&mut 0, &props(0, 1)),
        NOT_SUPPORTED,
        "shareable pools are not modelled yet"
    );
    let mut pool = 0;
    ok(cu.cuMemPoolCreate(&mut pool, &props(0, 0)));
    let mut threshold = u64::MAX;
    ok(cu.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, (&mut threshold as *mut u64).cast()));
    assert_eq!(attribute(cu, pool, RELEASE_THRESHOLD), u64::MAX);
    let mut reuse = 0i32;
    ok(cu.cuMemPoolSetAttribute(
        pool,
        REUSE_FOLLOW_EVENT_DEPENDENCIES,
        (&mut reuse as *mut i32).cast(),
    ));
    let mut s = 0;
    ok(cu.cuStreamCreate(&mut s, 1));
    let mut p = 0;
    ok(cu.cuMemAllocFromPoolAsync(&mut p, 1000, pool, s));
    assert_eq!(attribute(cu, pool, USED_MEM_CURRENT), GRAN as u64);
    ok(cu.cuMemsetD8_v2(p, 0x3C, 1000));
    assert_eq!(cu.read(p, 4), [0x3C; 4]);
    let mut owner = 0u64;
    ok(cu.cuPointerGetAttribute((&mut owner as *mut u64).cast(), MEMPOOL_HANDLE, p));
    assert_eq!(owner, pool as u64);
    ok(cu.cuMemFreeAsync(p, s));
    ok(cu.cuStreamSynchronize(s));
    assert_eq!(attribute(cu, pool, USED_MEM_CURRENT), 0);
    assert_eq!(attribute(cu, pool, USED_MEM_HIGH), GRAN as u64);
    assert_eq!(cu.cuMemFreeAsync(p, s), INVALID_VALUE, "freed twice");
    // cuMemAllocAsync takes the device's current pool.
    ok(cu.cuDeviceSetMemPool(0, pool));
    ok(cu.cuMemAllocAsync(&mut p, 1 << 20, s));
    ok(cu.cuPointerGetAttribute((&mut owner as *mut u64).cast(), MEMPOOL_HANDLE, p));
    assert_eq!(owner, pool as u64);
    // Destroyed with an allocation outstanding: the allocation stays valid until freed.
    ok(cu.cuMemPoolDestroy(pool));
    ok(cu.cuMemsetD8_v2(p, 1, 16));
    ok(cu.cuMemFree_v2(p));
    ok(cu.cuDeviceGetMemPool(&mut current, 0));
    assert_eq!(current, default, "the default pool is current again");
    assert_eq!(
        cu.cuMemPoolDestroy(default),
        INVALID_VALUE,
        "default pools stay"
    );
    ok(cu.cuStreamDestroy_v2(s));
}

#[test]
fn pool_access_extends_to_its_allocations() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
    let mut pool = 0;
    ok(cu.cuMemPoolCreate(&mut pool, &props(0, 0)));
    let mut p = 0;
    ok(cu.cuMemAllocFromPoolAsync(&mut p, GRAN, pool, 0));
    let grant = AccessDesc {
        location: Location { type_: 1, id: 1 },
        flags: 3,
    };
    ok(cu.cuMemPoolSetAccess(pool, &grant, 1));
    let mut flags = 0;
    let mut peer = Location { type_: 1, id: 1 };
    ok(cu.cuMemPoolGetAccess(&mut flags, pool, &mut peer));
    assert_eq!(flags, 3);
    let own = AccessDesc {
        location: Location { type_: 1, id: 0 },
        flags: 1,
    };
    assert_eq!(
        cu.cuMemPoolSetAccess(pool, &own, 1),
        INVALID_DEVICE,
        "the owning device keeps read-write"
    );
    // Device 1 may now copy into the pool's memory.
    let ctx1 = {
        let mut c = 0usize;
        ok(cu.cuDevicePrimaryCtxRetain(&mut c, 1));
        c
    };
    ok(cu.cuCtxSetCurrent(ctx1));
    cu.write(p, &[9u8; 8]);
    assert_eq!(cu.read(p, 8), [9u8; 8]);
    ok(cu.cuMemFreeAsync(p, 0));
    ok(cu.cuMemPoolDestroy(pool));
}
