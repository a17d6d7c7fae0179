//! Devices, contexts and the VMM rules: handles, mappings, access, exports.

use super::*;

#[test]
fn devices_and_attributes() {
    let (_serial, cu) = begin(0);
    let mut n = 0;
    ok(cu.cuDeviceGetCount(&mut n));
    assert_eq!(n, 2);
    let mut v = 0;
    ok(cu.cuDriverGetVersion(&mut v));
    assert_eq!(v, 13010);
    let mut d = 0;
    assert_eq!(cu.cuDeviceGet(&mut d, 2), INVALID_DEVICE);
    ok(cu.cuDeviceGet(&mut d, 1));
    let attr = |a: u32| {
        let mut x = -1;
        ok(cu.cuDeviceGetAttribute(&mut x, a, 1));
        x
    };
    assert_eq!(attr(102), 1, "VMM supported");
    assert_eq!(attr(103), 1, "POSIX FD handles supported");
    assert_eq!(attr(128), 0, "no fabric handles");
    assert_eq!(attr(132), 1, "multicast supported");
    let mut x = 0;
    assert_eq!(cu.cuDeviceGetAttribute(&mut x, 100_000, 0), INVALID_VALUE);
    assert_eq!(
        cu.cuDeviceGetAttribute(std::ptr::null_mut(), 102, 0),
        INVALID_VALUE
    );
    let mut name = [0u8; 64];
    ok(cu.cuDeviceGetName(name.as_mut_ptr(), 64, 1));
    assert!(name.starts_with(b"fakecuda H200\0"));
    let (mut u0, mut u1) = ([0u8; 16], [0u8; 16]);
    ok(cu.cuDeviceGetUuid_v2(&mut u0, 0));
    ok(cu.cuDeviceGetUuid_v2(&mut u1, 1));
    assert_ne!(u0, u1);
    let mut total = 0;
    ok(cu.cuDeviceTotalMem_v2(&mut total, 0));
    assert!(total > 0);
}

#[test]
fn contexts_and_streams() {
    let _serial = serial();
    let cu = cuda();
    ok(cu.cuInit(0));
    let t = std::thread::spawn(|| {
        let cu = cuda();
        let mut d = 0;
        assert_eq!(
            cu.cuCtxGetDevice(&mut d),
            INVALID_CONTEXT,
            "no current context yet"
        );
        assert_eq!(cu.cuCtxSynchronize(), INVALID_CONTEXT);
        let mut ctx = 0;
        ok(cu.cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, 1));
        let mut cur = 0;
        ok(cu.cuCtxGetCurrent(&mut cur));
        assert_eq!(cur, ctx);
        ok(cu.cuCtxGetDevice(&mut d));
        assert_eq!(d, 1);
        let mut s = 0;
        ok(cu.cuStreamCreate(&mut s, 0));
        ok(cu.cuStreamSynchronize(s));
        ok(cu.cuStreamDestroy_v2(s));
        assert_eq!(cu.cuStreamSynchronize(s), INVALID_HANDLE);
        ok(cu.cuCtxDestroy_v2(ctx));
        assert_eq!(cu.cuCtxSynchronize(), INVALID_CONTEXT);
        let mut p1 = 0;
        let mut p2 = 0;
        ok(cu.cuDevicePrimaryCtxRetain(&mut p1, 0));
        ok(cu.cuDevicePrimaryCtxRetain(&mut p2, 0));
        assert_eq!(p1, p2, "one primary context per device");
        ok(cu.cuDevicePrimaryCtxRelease_v2(0));
        ok(cu.cuDevicePrimaryCtxRelease_v2(0));
    });
    t.join().unwrap();
}

#[test]
fn handle_reference_rules() {
    let (_serial, cu) = begin(0);
    let size = 2 * GRAN;
    let h = cu.create(size, 0, POSIX_FD);
    let fds = fd_count();
    let p = cu.map_rw(h, size, 0);
    cu.write(p, &pattern(1, size));
    let mut r = 0;
    ok(cu.cuMemRetainAllocationHandle(&mut r, (p + 100) as *mut c_void));
    assert_eq!(r, h, "retain returns the value cuMemCreate returned");
    ok(cu.cuMemRelease(r));
    ok(cu.cuMemRelease(h));
    // Released handle: the mapping keeps the memory alive, the handle is gone.
    assert_eq!(cu.read(p, size), pattern(1, size));
    assert_eq!(cu.cuMemRelease(h), INVALID_HANDLE);
    let mut prop = AllocProp::device(0, 0);
    assert_eq!(
        cu.cuMemGetAllocationPropertiesFromHandle(&mut prop, h),
        INVALID_HANDLE
    );
    // Retaining through the mapping brings the same value back.
    ok(cu.cuMemRetainAllocationHandle(&mut r, p as *mut c_void));
    assert_eq!(r, h);
    ok(cu.cuMemGetAllocationPropertiesFromHandle(&mut prop, h));
    assert_eq!(
        (
            prop.type_,
            prop.requested_handle_types,
            prop.location.type_,
            prop.location.id
        ),
        (1, POSIX_FD, 1, 0)
    );
    ok(cu.cuMemRelease(r));
    ok(cu.cuMemUnmap(p, size));
    check_fds_at_most(fds - 1, "the last mapping gone frees the memfd");
    ok(cu.cuMemAddressFree(p, size));
}

#[test]
fn map_and_access_rules() {
    let (_serial, cu) = begin(0);
    let mut g = 0;
    ok(cu.cuMemGetAllocationGranularity(&mut g, &AllocProp::device(0, 0), 0));
    assert_eq!(g, GRAN);
    ok(cu.cuMemGetAllocationGranularity(&mut g, &AllocProp::device(0, 0), 1));
    assert_eq!(g, GRAN);
    let mut h = 0;
    assert_eq!(
        cu.cuMemCreate(&mut h, GRAN + 1, &AllocProp::device(0, 0), 0),
        INVALID_VALUE
    );
    assert_eq!(
        cu.cuMemCreate(&mut h, GRAN, &AllocProp::device(7, 0), 0),
        INVALID_DEVICE
    );
    assert_eq!(
        cu.cuMemCreate(&mut h, GRAN, std::ptr::null(), 0),
        INVALID_VALUE
    );
    assert_eq!(
        cu.cuMemCreate(&mut h, 1 << 50, &AllocProp::device(0, 0), 0),
        OUT_OF_MEMORY
    );
    let h = cu.create(2 * GRAN, 0, 0);
    let p = cu.reserve(4 * GRAN);
    assert_eq!(
        cu.cuMemMap(p + 1, GRAN, 0, h, 0),
        INVALID_VALUE,
        "unaligned address"
    );
    assert_eq!(
        cu.cuMemMap(p, 4 * GRAN, 0, h, 0),
        INVALID_VALUE,
        "larger than the allocation"
    );
    assert_eq!(cu.cuMemMap(p, GRAN, 0, 0xdead, 0), INVALID_HANDLE);
    ok(cu.cuMemMap(p, 2 * GRAN, 0, h, 0));
    assert_eq!(cu.cuMemMap(p, GRAN, 0, h, 0), ALREADY_MAPPED);
    // Copies need access: mapped but not granted is an illegal address.
    let buf = [1u8; 16];
    assert_eq!(
        cu.cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 16),
        ILLEGAL_ADDRESS
    );
    ok(cu.grant(p, 2 * GRAN, 0, 1));
    assert_eq!(
        cu.cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 16),
        ILLEGAL_ADDRESS,
        "read-only"
    );
    ok(cu.grant(p, 2 * GRAN, 1, 3));
    let mut f = 0;
    ok(cu.cuMemGetAccess(&mut f, &Location { type_: 1, id: 1 }, p));
    assert_eq!(f, 3);
    assert_eq!(
        cu.cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 16),
        ILLEGAL_ADDRESS,
        "device 1's grant is not device 0's: a copy is its context's device's work"
    );
    cu.setup(1);
    ok(cu.cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 16));
    cu.setup(0);
    // Unmapped device memory is an invalid value.
    assert_eq!(
        cu.cuMemcpyHtoD_v2(p + 2 * GRAN as u64, buf.as_ptr().cast(), 16),
        INVALID_VALUE
    );
    assert_eq!(
        cu.grant(p, 4 * GRAN, 0, 3),
        INVALID_VALUE,
        "range not fully mapped"
    );
    assert_eq!(
        cu.cuMemAddressFree(p, 4 * GRAN),
        INVALID_VALUE,
        "still mapped"
    );
    ok(cu.cuMemUnmap(p, 2 * GRAN));
    ok(cu.cuMemRelease(h));
    ok(cu.cuMemAddressFree(p, 4 * GRAN));
    assert_eq!(cu.cuMemAddressFree(p, 4 * GRAN), INVALID_VALUE);
}

#[test]
fn reserve_honours_a_free_hint() {
    let (_serial, cu) = begin(0);
    let p = cu.reserve(8 * GRAN);
    ok(cu.cuMemAddressFree(p, 8 * GRAN));
    let mut q = 0;
    ok(cu.cuMemAddressReserve(&mut q, 8 * GRAN, 0, p, 0));
    assert_eq!(q, p, "a free hinted range is used");
    let mut r = 0;
    ok(cu.cuMemAddressReserve(&mut r, 2 * GRAN, 0, p, 0));
    assert_ne!(r, p, "an occupied hint is only a hint");
    ok(cu.cuMemAddressFree(q, 8 * GRAN));
    ok(cu.cuMemAddressFree(r, 2 * GRAN));
}

#[test]
fn export_and_import_rules() {
    let (_serial, cu) = begin(0);
    let plain = cu.create(GRAN, 0, 0);
    let mut fd: i32 = -1;
    let out = (&mut fd as *mut i32).cast::<c_void>();
    assert_eq!(
        cu.cuMemExportToShareableHandle(out, plain, POSIX_FD, 0),
        INVALID_VALUE,
        "POSIX FD not requested"
    );
    let both = cu.create(GRAN, 0, POSIX_FD | FABRIC);
    let mut blob = [0u8; 64];
    assert_eq!(
        cu.cuMemExportToShareableHandle(blob.as_mut_ptr().cast(), both, FABRIC, 0),
        NOT_SUPPORTED,
        "no IMEX"
    );
    ok(cu.cuMemExportToShareableHandle(out, both, POSIX_FD, 0));
    // SAFETY: the export returned an FD this test owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (mut a, mut b) = (0, 0);
    ok(cu.cuMemImportFromShareableHandle(&mut a, fd.as_raw_fd() as usize as *mut c_void, POSIX_FD));
    ok(cu.cuMemImportFromShareableHandle(&mut b, fd.as_raw_fd() as usize as *mut c_void, POSIX_FD));
    assert_ne!(a, b, "a new handle per import");
    // Imports share the bytes with the original.
    let pa = cu.map_rw(a, GRAN, 0);
    let pb = cu.map_rw(b, GRAN, 0);
    cu.write(pa, b"shared");
    assert_eq!(cu.read(pb, 6), b"shared");
    let file = std::fs::File::open("/dev/null").unwrap();
    let mut c = 0;
    assert_eq!(
        cu.cuMemImportFromShareableHandle(
            &mut c,
            file.as_raw_fd() as usize as *mut c_void,
            POSIX_FD
        ),
        INVALID_VALUE,
        "not a fakecuda FD"
    );
    assert_eq!(
        cu.cuMemImportFromShareableHandle(&mut c, 99_999usize as *mut c_void, POSIX_FD),
        INVALID_VALUE,
        "closed FD"
    );
    // A fabric handle is 64 bytes behind the pointer, not a number: no IMEX here.
    let blob = [0x5au8; 64];
    assert_eq!(
        cu.cuMemImportFromShareableHandle(&mut c, blob.as_ptr() as *mut c_void, FABRIC),
        NOT_SUPPORTED
    );
    for (p, h) in [(pa, a), (pb, b)] {
        cu.unmap_free(p, GRAN, h);
    }
    ok(cu.cuMemRelease(both));
    ok(cu.cuMemRelease(plain));
}
