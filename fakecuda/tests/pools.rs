//! Stream-ordered memory pools: default and current pools per device, created pools with
//! their attributes and access, allocation and stream-ordered free, and what a pool cannot do
//! yet (shareable handles), as NVIDIA's `cuda.core` uses them.

mod support;

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use support::*;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("pool-importer", pool_importer)]);
}

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

/// A new pool of `props`.
fn create_pool(cu: &Cuda, props: &[u64; 11]) -> usize {
    let mut pool = 0;
    ok(cu.cuMemPoolCreate(&mut pool, props));
    pool
}

fn attribute(cu: &Cuda, pool: usize, attr: u32) -> u64 {
    let mut v = 0u64;
    ok(cu.cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()));
    v
}

#[test]
fn pools_allocate_in_stream_order_and_count_their_memory() {
    let (_serial, cu) = begin(0);
    let mut default = 0;
    ok(cu.cuDeviceGetDefaultMemPool(&mut default, 0));
    let mut current = 0;
    ok(cu.cuDeviceGetMemPool(&mut current, 0));
    assert_eq!(
        current, default,
        "the current pool starts as the default one"
    );
    assert_eq!(
        cu.cuMemPoolCreate(&mut 0, &props(0, 8)),
        NOT_SUPPORTED,
        "fabric pools need IMEX"
    );
    let pool = create_pool(cu, &props(0, 0));
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

/// A pool's `maxSize` limits what its allocations ask for: many small ones fit in one
/// granule's worth, as in the driver's suballocating pools.
#[test]
fn a_pools_max_size_bounds_what_its_allocations_ask_for() {
    let (_serial, cu) = begin(0);
    let mut limited = props(0, 0);
    limited[3] = GRAN as u64; // maxSize
    let pool = create_pool(cu, &limited);
    let mut small = [0u64; 4];
    for p in &mut small {
        ok(cu.cuMemAllocFromPoolAsync(p, 64, pool, 0));
    }
    let mut big = 0;
    assert_eq!(
        cu.cuMemAllocFromPoolAsync(&mut big, GRAN, pool, 0),
        OUT_OF_MEMORY,
        "4 x 512 charged already"
    );
    for p in small {
        ok(cu.cuMemFreeAsync(p, 0));
    }
    ok(cu.cuMemAllocFromPoolAsync(&mut big, GRAN, pool, 0));
    ok(cu.cuMemFreeAsync(big, 0));
    ok(cu.cuMemPoolDestroy(pool));
}

#[test]
fn pool_access_extends_to_its_allocations() {
    let (_serial, cu) = begin(0);
    let pool = create_pool(cu, &props(0, 0));
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

/// Child: imports the pool (its FD inherited, the number in the environment) and the pointer
/// (its 64 bytes on stdin), checks the creator's bytes, writes its own, frees the import.
fn pool_importer() {
    let cu = cuda();
    cu.setup(1);
    let number: i32 = std::env::var("FAKECUDA_TEST_POOL_FD")
        .unwrap()
        .parse()
        .unwrap();
    let mut pool = 0;
    ok(cu.cuMemPoolImportFromShareableHandle(&mut pool, number as usize as *mut c_void, 1, 0));
    // The pool is device 0's: this process's device 1 copies only once granted access.
    let grant = AccessDesc {
        location: Location { type_: 1, id: 1 },
        flags: 3,
    };
    ok(cu.cuMemPoolSetAccess(pool, &grant, 1));
    let data = unhex(&hear());
    let mut p = 0;
    ok(cu.cuMemPoolImportPointer(&mut p, pool, &data));
    let mut again = 0;
    ok(cu.cuMemPoolImportPointer(&mut again, pool, &data));
    say("SAME", u8::from(again == p));
    say("SAW", u8::from(cu.read(p, GRAN) == pattern(3, GRAN)));
    cu.write(p, &pattern(4, 64));
    say("WROTE", p);
    hear();
    ok(cu.cuMemFree_v2(p));
    ok(cu.cuMemPoolDestroy(pool));
}

#[test]
fn a_shared_pool_shares_bytes_between_processes_and_refuses_checkpoint() {
    let (_serial, cu) = begin(0);
    let pool = create_pool(cu, &props(0, 1));
    let access = AccessDesc {
        location: Location { type_: 1, id: 1 },
        flags: 3,
    };
    ok(cu.cuMemPoolSetAccess(pool, &access, 1));
    let mut p = 0;
    ok(cu.cuMemAllocFromPoolAsync(&mut p, GRAN, pool, 0));
    cu.write(p, &pattern(3, GRAN));
    let mut fd: i32 = -1;
    assert_eq!(
        cu.cuMemPoolExportToShareableHandle((&mut fd as *mut i32).cast(), pool, 8, 0),
        INVALID_VALUE,
        "only the pool's own handle type"
    );
    ok(cu.cuMemPoolExportToShareableHandle((&mut fd as *mut i32).cast(), pool, 1, 0));
    // SAFETY: the export returned a descriptor this test owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut data = [0u8; 64];
    ok(cu.cuMemPoolExportPointer(&mut data, p));
    // The child inherits a duplicate (dup clears close-on-exec).
    // SAFETY: dup of a descriptor this test owns; the duplicate is owned below.
    let inherited =
        unsafe { OwnedFd::from_raw_fd(libc::dup(std::os::fd::AsRawFd::as_raw_fd(&fd))) };
    let mut cmd = role_command("pool-importer");
    cmd.env(
        "FAKECUDA_TEST_POOL_FD",
        std::os::fd::AsRawFd::as_raw_fd(&inherited).to_string(),
    );
    let mut child = Child::spawn(cmd);
    drop(inherited);
    child.send(&hex(&data));
    assert_eq!(child.expect("SAME", 30), "1", "one import per pointer");
    assert_eq!(
        child.expect("SAW", 30),
        "1",
        "the importer saw the creator's bytes"
    );
    child.expect("WROTE", 30);
    assert_eq!(
        cu.read(p, 64),
        pattern(4, 64),
        "the creator sees the importer's write"
    );
    // Native checkpoint refuses while the pool is shared, changing nothing.
    let pid = std::process::id() as i32;
    let mut args = [0u64; 8];
    ok(cu.cuCheckpointProcessLock(pid, &mut args));
    assert_eq!(
        cu.cuCheckpointProcessCheckpoint(pid, &mut [0u64; 8]),
        NOT_SUPPORTED
    );
    ok(cu.cuCheckpointProcessUnlock(pid, &mut [0u64; 8]));
    assert_eq!(cu.read(p, 64), pattern(4, 64));
    child.send("done");
    assert!(child.wait().success());
    drop(fd);
    ok(cu.cuMemFreeAsync(p, 0));
    ok(cu.cuMemPoolDestroy(pool));
}

/// `props` for pinned host memory: location type 2 (any node) or 3 (host NUMA `node`).
fn host_props(location_type: u64, node: u32, handle_types: u32) -> [u64; 11] {
    let mut p = props(0, handle_types);
    p[1] = location_type | (u64::from(node) << 32);
    p
}

/// Pinned host pools: the CPU's memory, a device's once the pool grants it access; never IPC
/// capable; host memory to `cuPointerGetAttribute`; a default pool per host location.
#[test]
fn host_pools_are_the_cpus_until_a_device_is_granted() {
    let (_serial, cu) = begin(0);
    let mut v = 0;
    for attr in [142, 144] {
        ok(cu.cuDeviceGetAttribute(&mut v, attr, 0));
        assert_eq!(v, 1, "host pools supported (attribute {attr})");
    }
    let mut pool = 0;
    assert_eq!(
        cu.cuMemPoolCreate(&mut pool, &host_props(2, 0, POSIX_FD)),
        INVALID_VALUE,
        "a host pool of any node is never IPC capable"
    );
    ok(cu.cuMemPoolCreate(&mut pool, &host_props(3, 0, POSIX_FD)));
    let mut fd: i32 = -1;
    ok(cu.cuMemPoolExportToShareableHandle((&mut fd as *mut i32).cast(), pool, POSIX_FD, 0));
    assert!(fd >= 0, "a NUMA node's pool is IPC capable");
    // SAFETY: the export returned a descriptor this test owns.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    ok(cu.cuMemPoolDestroy(pool));
    assert_eq!(
        cu.cuMemPoolCreate(&mut pool, &host_props(3, 7, 0)),
        INVALID_VALUE,
        "no such node"
    );
    assert_eq!(
        cu.cuMemPoolCreate(&mut pool, &host_props(4, 0, 0)),
        INVALID_VALUE
    );
    for location_type in [2, 3] {
        ok(cu.cuMemPoolCreate(&mut pool, &host_props(location_type, 0, 0)));
        let mut p = 0;
        ok(cu.cuMemAllocFromPoolAsync(&mut p, GRAN, pool, 0));
        let mut kind = 0u32;
        ok(cu.cuPointerGetAttribute((&mut kind as *mut u32).cast(), 2, p));
        assert_eq!(kind, 1, "CU_MEMORYTYPE_HOST");
        let mut flags = 9;
        ok(cu.cuMemPoolGetAccess(&mut flags, pool, &mut Location { type_: 1, id: 0 }));
        assert_eq!(flags, 0, "no device has access at first");
        let bytes = [5u8; 64];
        assert_eq!(
            cu.cuMemcpyHtoD_v2(p, bytes.as_ptr().cast(), 64),
            ILLEGAL_ADDRESS,
            "device 0 was not granted the pool"
        );
        // SAFETY: host pool memory is the CPU's, mapped read-write at its address.
        unsafe { std::ptr::write_bytes(p as usize as *mut u8, 3, 64) };
        let grant = AccessDesc {
            location: Location { type_: 1, id: 0 },
            flags: 3,
        };
        ok(cu.cuMemPoolSetAccess(pool, &grant, 1));
        assert_eq!(cu.read(p, 64), [3u8; 64], "granted: the CPU's bytes");
        cu.write(p, &bytes);
        // SAFETY: as above.
        let seen = unsafe { std::slice::from_raw_parts(p as usize as *const u8, 64) };
        assert_eq!(seen, bytes, "the device's write, seen by the CPU");
        ok(cu.cuMemFreeAsync(p, 0));
        ok(cu.cuMemPoolDestroy(pool));
    }
    // Each host location has its current pool, a default one never destroyed.
    let (mut any, mut node) = (0, 0);
    ok(cu.cuMemGetMemPool(&mut any, &mut Location { type_: 2, id: 0 }, 1));
    ok(cu.cuMemGetMemPool(&mut node, &mut Location { type_: 3, id: 0 }, 1));
    assert!(any != 0 && node != 0 && any != node, "{any:#x} {node:#x}");
    assert_eq!(
        cu.cuMemPoolDestroy(any),
        INVALID_VALUE,
        "a default pool stays"
    );
    let mut again = 0;
    ok(cu.cuMemGetMemPool(&mut again, &mut Location { type_: 2, id: 0 }, 1));
    assert_eq!(again, any);
}

/// Managed pools: every device's and the CPU's memory at once, never IPC capable; a default
/// pool per preferred location.
#[test]
fn managed_pools_are_every_devices() {
    let (_serial, cu) = begin(0);
    let mut v = 0;
    ok(cu.cuDeviceGetAttribute(&mut v, 89, 0));
    assert_eq!(v, 1, "concurrent managed access");
    let managed = |location_type: u64, id: u32, handle_types: u32| {
        let mut p = props(0, handle_types);
        p[0] = 2 | (u64::from(handle_types) << 32); // allocType MANAGED
        p[1] = location_type | (u64::from(id) << 32);
        p
    };
    let mut pool = 0;
    assert_eq!(
        cu.cuMemPoolCreate(&mut pool, &managed(1, 0, POSIX_FD)),
        NOT_SUPPORTED,
        "fakecuda models no IPC managed pools"
    );
    assert_eq!(
        cu.cuMemPoolCreate(&mut pool, &managed(1, 9, 0)),
        INVALID_DEVICE
    );
    ok(cu.cuMemPoolCreate(&mut pool, &managed(1, 1, 0)));
    let mut p = 0;
    ok(cu.cuMemAllocFromPoolAsync(&mut p, GRAN, pool, 0));
    let mut is_managed = 0u32;
    ok(cu.cuPointerGetAttribute((&mut is_managed as *mut u32).cast(), 8, p));
    assert_eq!(is_managed, 1);
    cu.write(p, &[6u8; 32]);
    cu.setup(1);
    assert_eq!(cu.read(p, 32), [6u8; 32], "device 1 needs no grant");
    // SAFETY: managed memory is the CPU's too, mapped read-write at its address.
    assert_eq!(unsafe { *(p as usize as *const u8) }, 6);
    let less = AccessDesc {
        location: Location { type_: 1, id: 0 },
        flags: 1,
    };
    assert_eq!(cu.cuMemPoolSetAccess(pool, &less, 1), INVALID_VALUE);
    ok(cu.cuMemFreeAsync(p, 0));
    ok(cu.cuMemPoolDestroy(pool));
    let (mut none, mut dev0) = (0, 0);
    ok(cu.cuMemGetMemPool(&mut none, &mut Location { type_: 0, id: 0 }, 2));
    ok(cu.cuMemGetMemPool(&mut dev0, &mut Location { type_: 1, id: 0 }, 2));
    assert!(
        none != 0 && dev0 != 0 && none != dev0,
        "{none:#x} {dev0:#x}"
    );
    let mut pinned = 0;
    ok(cu.cuMemGetMemPool(&mut pinned, &mut Location { type_: 1, id: 0 }, 1));
    assert_ne!(
        pinned, dev0,
        "pinned and managed pools of one device differ"
    );
    cu.setup(0);
}
