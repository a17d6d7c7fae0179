//! Classic allocations and copies, entry points and error names, host NUMA memory, context resets.

use super::*;

#[test]
fn classic_allocations_copies_and_host_registration() {
    let (_serial, cu) = begin(1);
    let (mut a, mut b) = (0u64, 0u64);
    ok(cu.cuMemAlloc_v2(&mut a, 3 << 20));
    ok(cu.cuMemAlloc_v2(&mut b, 1000));
    let (mut base, mut size) = (0u64, 0usize);
    ok(cu.cuMemGetAddressRange_v2(&mut base, &mut size, a + 12345));
    assert_eq!((base, size), (a, 3 << 20));
    assert_eq!(
        cu.cuMemGetAddressRange_v2(&mut base, &mut size, 16),
        NOT_FOUND
    );
    ok(cu.cuMemsetD8_v2(a, 0xab, 3 << 20));
    assert!(cu.read(a, 3 << 20).iter().all(|x| *x == 0xab));
    cu.write(b, &pattern(3, 1000));
    ok(cu.cuMemcpyDtoD_v2(a + 10, b, 1000));
    assert_eq!(cu.read(a + 10, 1000), pattern(3, 1000));
    let mut s = 0;
    ok(cu.cuStreamCreate(&mut s, 0));
    let mut host = pattern(5, 4096);
    ok(cu.cuMemHostRegister_v2(host.as_mut_ptr().cast(), host.len(), 0));
    assert_eq!(
        cu.cuMemHostRegister_v2(host.as_mut_ptr().cast(), host.len(), 0),
        712,
        "already registered"
    );
    ok(cu.cuMemcpyHtoDAsync_v2(b, host.as_ptr().cast(), 1000, s));
    let mut back = vec![0u8; 1000];
    ok(cu.cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), b, 1000, s));
    ok(cu.cuStreamSynchronize(s));
    assert_eq!(back, host[..1000]);
    ok(cu.cuMemHostUnregister(host.as_mut_ptr().cast()));
    assert_eq!(
        cu.cuMemHostUnregister(host.as_mut_ptr().cast()),
        713,
        "not registered"
    );
    ok(cu.cuStreamDestroy_v2(s));
    assert_eq!(
        cu.cuMemcpyDtoH_v2(std::ptr::null_mut(), a, 10),
        INVALID_VALUE
    );
    ok(cu.cuMemFree_v2(a));
    ok(cu.cuMemFree_v2(b));
    assert_eq!(cu.cuMemFree_v2(a), INVALID_VALUE);
}

#[test]
fn proc_address_and_error_names() {
    let (_serial, cu) = begin(0);
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = 9;
    ok(cu.cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut pfn, 13010, 0, &mut status));
    assert_eq!(status, 0);
    // SAFETY: looks up the exported symbol for comparison.
    let direct = unsafe {
        *libloading::Library::new(lib_path())
            .unwrap()
            .get::<*mut c_void>(b"cuMemAlloc_v2\0")
            .unwrap()
    };
    assert_eq!(
        pfn, direct,
        "unsuffixed name resolves to the _v2 entry point"
    );
    assert_eq!(
        cu.cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut pfn, 3000, 0, &mut status),
        NOT_FOUND
    );
    assert_eq!(status, 2, "version not sufficient");
    assert_eq!(
        cu.cuGetProcAddress_v2(c"cuMemCreate".as_ptr(), &mut pfn, 10000, 0, &mut status),
        NOT_FOUND
    );
    assert_eq!(status, 2);
    ok(cu.cuGetProcAddress_v2(c"cuMemCreate".as_ptr(), &mut pfn, 12000, 0, &mut status));
    assert_eq!(
        cu.cuGetProcAddress_v2(c"cuNoSuchThing".as_ptr(), &mut pfn, 13010, 0, &mut status),
        NOT_FOUND
    );
    assert_eq!(status, 1);
    assert!(pfn.is_null());
    // Asked for by its unsuffixed name, cuGetProcAddress is the 5-argument _v2 from CUDA 12.0
    // on (cuda.h's mapping; NVIDIA's Python bindings call it so), the legacy one before.
    let mut legacy: *mut c_void = std::ptr::null_mut();
    let mut v2: *mut c_void = std::ptr::null_mut();
    let mut found: *mut c_void = std::ptr::null_mut();
    ok(cu.cuGetProcAddress_v2(
        c"cuGetProcAddress".as_ptr(),
        &mut legacy,
        11030,
        0,
        &mut status,
    ));
    ok(cu.cuGetProcAddress_v2(
        c"cuGetProcAddress_v2".as_ptr(),
        &mut v2,
        13000,
        0,
        &mut status,
    ));
    ok(cu.cuGetProcAddress_v2(
        c"cuGetProcAddress".as_ptr(),
        &mut found,
        12000,
        0,
        &mut status,
    ));
    assert_eq!(status, 0);
    assert_eq!(found, v2, "unsuffixed at 12.0 is the _v2 ABI");
    assert_ne!(legacy, v2, "11.3 gets the legacy 4-argument function");
    let mut s: *const u8 = std::ptr::null();
    ok(cu.cuGetErrorName(ILLEGAL_STATE, &mut s));
    // SAFETY: cuGetErrorName returned a static C string.
    let name = unsafe { std::ffi::CStr::from_ptr(s.cast()) };
    assert_eq!(name.to_str().unwrap(), "CUDA_ERROR_ILLEGAL_STATE");
    // Every code of the headers has its name, not only those fakecuda returns.
    for (code, expected) in [
        (47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL"),
        (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
        (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"),
    ] {
        ok(cu.cuGetErrorName(code, &mut s));
        // SAFETY: as above.
        let name = unsafe { std::ffi::CStr::from_ptr(s.cast()) };
        assert_eq!(name.to_str().unwrap(), expected);
    }
    ok(cu.cuGetErrorString(INVALID_VALUE, &mut s));
    // SAFETY: as above.
    let text = unsafe { std::ffi::CStr::from_ptr(s.cast()) };
    assert_eq!(text.to_str().unwrap(), "invalid argument");
    assert_eq!(cu.cuGetErrorName(123_456, &mut s), INVALID_VALUE);
    assert!(s.is_null());
}

/// Host NUMA VMM memory (NCCL's cuMem host buffers): created at a node, mapped with access for
/// devices and for the node, exportable and importable like device memory; the node must
/// exist; host grants are for host memory only; multicast binds device memory only.
#[test]
fn host_numa_allocations() {
    let (_serial, cu) = begin(0);
    let numa = |node: i32, types: u32| AllocProp {
        location: Location { type_: 3, id: node },
        ..AllocProp::device(0, types)
    };
    let mut g = 0usize;
    ok(cu.cuMemGetAllocationGranularity(&mut g, &numa(0, POSIX_FD), 0));
    assert_eq!(g, GRAN);
    let mut h = 0;
    assert_eq!(
        cu.cuMemCreate(&mut h, GRAN, &numa(1, POSIX_FD), 0),
        INVALID_VALUE,
        "one node"
    );
    let host = AllocProp {
        location: Location { type_: 2, id: 0 },
        ..AllocProp::device(0, POSIX_FD)
    };
    assert_eq!(cu.cuMemCreate(&mut h, GRAN, &host, 0), NOT_SUPPORTED);
    ok(cu.cuMemCreate(&mut h, GRAN, &numa(0, POSIX_FD), 0));
    let mut prop = AllocProp::device(0, 0);
    ok(cu.cuMemGetAllocationPropertiesFromHandle(&mut prop, h));
    assert_eq!((prop.location.type_, prop.location.id), (3, 0));
    assert_eq!(prop.flags[1], 0, "not GPUDirect RDMA capable unless asked");
    // Asked for, the GPUDirect RDMA mark is kept and read back.
    let mut marked = 0;
    let rdma = AllocProp {
        flags: [0, 1, 0, 0, 0, 0, 0, 0],
        ..AllocProp::device(0, POSIX_FD)
    };
    ok(cu.cuMemCreate(&mut marked, GRAN, &rdma, 0));
    ok(cu.cuMemGetAllocationPropertiesFromHandle(&mut prop, marked));
    assert_eq!(prop.flags[1], 1);
    ok(cu.cuMemRelease(marked));
    let p = cu.reserve(GRAN);
    ok(cu.cuMemMap(p, GRAN, 0, h, 0));
    let grants = [
        AccessDesc {
            location: Location { type_: 1, id: 0 },
            flags: 3,
        },
        AccessDesc {
            location: Location { type_: 3, id: 0 },
            flags: 3,
        },
    ];
    ok(cu.cuMemSetAccess(p, GRAN, grants.as_ptr(), 2));
    for location in [Location { type_: 3, id: 0 }, Location { type_: 1, id: 0 }] {
        let mut flags = 0u64;
        ok(cu.cuMemGetAccess(&mut flags, &location, p));
        assert_eq!(flags, 3);
    }
    cu.write(p, &pattern(5, GRAN));
    // Exported and imported like device memory; the location travels with it.
    let mut fd: i32 = -1;
    ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, POSIX_FD, 0));
    let mut imported = 0;
    ok(cu.cuMemImportFromShareableHandle(&mut imported, fd as usize as *mut c_void, POSIX_FD));
    // SAFETY: the export gave us this descriptor.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    ok(cu.cuMemGetAllocationPropertiesFromHandle(&mut prop, imported));
    assert_eq!((prop.location.type_, prop.location.id), (3, 0));
    let q = cu.reserve(GRAN);
    ok(cu.cuMemMap(q, GRAN, 0, imported, 0));
    ok(cu.cuMemSetAccess(q, GRAN, &grants[1], 1));
    let mut buf = [0u8; 4];
    assert_eq!(
        cu.cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), q, 4),
        ILLEGAL_ADDRESS,
        "the node's grant is the CPU's, not device 0's"
    );
    ok(cu.cuMemSetAccess(q, GRAN, grants.as_ptr(), 2));
    assert_eq!(cu.read(q, GRAN), pattern(5, GRAN));
    // A node grant on device memory is refused; so is binding host memory into multicast.
    let d = cu.create(GRAN, 0, POSIX_FD);
    let pd = cu.map_rw(d, GRAN, 0);
    assert_eq!(cu.cuMemSetAccess(pd, GRAN, &grants[1], 1), INVALID_VALUE);
    let mc = cu.mc_create(1, GRAN, 0);
    ok(cu.cuMulticastAddDevice(mc, 0));
    assert_eq!(cu.cuMulticastBindMem(mc, 0, h, 0, GRAN, 0), INVALID_VALUE);
    ok(cu.cuMemRelease(mc));
    for (ptr, handle) in [(p, h), (q, imported), (pd, d)] {
        cu.unmap_free(ptr, GRAN, handle);
    }
}

/// cudaDeviceReset / cuCtxDestroy free what the context owned (its cuMemAlloc memory); VMM
/// allocations belong to the process and stay.
#[test]
fn resetting_a_context_frees_its_memory() {
    let (_serial, cu) = begin(0);
    let mut p = 0;
    ok(cu.cuMemAlloc_v2(&mut p, 3 << 20));
    let (mut base, mut size) = (0u64, 0usize);
    ok(cu.cuMemGetAddressRange_v2(&mut base, &mut size, p + 5));
    assert_eq!((base, size), (p, 3 << 20), "the requested size");
    let h = cu.create(GRAN, 0, 0);
    let v = cu.map_rw(h, GRAN, 0);
    cu.write(v, &pattern(3, GRAN));
    ok(cu.cuDevicePrimaryCtxReset_v2(0));
    cu.setup(0);
    assert_eq!(
        cu.cuMemGetAddressRange_v2(&mut base, &mut size, p),
        NOT_FOUND
    );
    assert_eq!(cu.cuMemFree_v2(p), INVALID_VALUE);
    assert_eq!(cu.read(v, GRAN), pattern(3, GRAN), "VMM memory stays");
    // A created context's memory goes with it.
    let mut ctx = 0usize;
    ok(cu.cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, 0));
    ok(cu.cuMemAlloc_v2(&mut p, GRAN));
    ok(cu.cuCtxDestroy_v2(ctx));
    cu.setup(0);
    assert_eq!(
        cu.cuMemGetAddressRange_v2(&mut base, &mut size, p),
        NOT_FOUND
    );
    cu.unmap_free(v, GRAN, h);
}
