//! VMM semantics: create/reserve/map/access/copy, handle reference rules, export/import
//! between two processes, faults without access, error codes.

mod support;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use support::*;

/// Entry point of child processes (a no-op in the normal test run).
#[test]
fn child_role_dispatch() {
    let Some(role) = child_role() else { return };
    match role.as_str() {
        "importer" => importer(),
        "touch-without-access" => touch(None),
        "write-read-only" => touch(Some(1)),
        "uninitialised" => uninitialised(),
        other => panic!("unknown role {other}"),
    }
    std::process::exit(0);
}

fn recv_fd(sock: RawFd) -> OwnedFd {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::empty()).expect("recvmsg");
    for c in msg.cmsgs().expect("cmsgs") {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: SCM_RIGHTS gave us this new descriptor.
            return unsafe { OwnedFd::from_raw_fd(fds[0]) };
        }
    }
    panic!("no fd received");
}

fn send_fd(sock: RawFd, fd: RawFd) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [std::io::IoSlice::new(b"f")];
    sendmsg::<()>(
        sock,
        &iov,
        &[ControlMessage::ScmRights(&[fd])],
        MsgFlags::empty(),
        None,
    )
    .expect("sendmsg");
}

/// Child: imports the FD it receives, checks the creator's bytes, writes its own.
fn importer() {
    let cu = cuda();
    let sock: RawFd = std::env::var("FAKECUDA_TEST_SOCK")
        .unwrap()
        .parse()
        .unwrap();
    cu.setup(1);
    let fd = recv_fd(sock);
    let size = 4 * GRAN;
    let mut h = 0;
    ok(cu.cuMemImportFromShareableHandle(&mut h, fd.as_raw_fd() as usize as *mut c_void, POSIX_FD));
    drop(fd);
    let p = cu.map_rw(h, size, 1);
    // Imported handles may be released right after mapping: the mapping keeps it alive.
    ok(cu.cuMemRelease(h));
    let seen = cu.read(p, size);
    say("SAW", u8::from(seen == pattern(7, size)));
    cu.write(p + GRAN as u64, &pattern(9, GRAN));
    say("WROTE", p);
    hear();
    ok(cu.cuMemUnmap(p, size));
    ok(cu.cuMemAddressFree(p, size));
}

/// (a) Two processes share one allocation through export/import and see each other's writes.
#[test]
fn two_processes_share_an_allocation() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
    let size = 4 * GRAN;
    let fds_before = fd_count();
    let h = cu.create(size, 0, POSIX_FD);
    let p = cu.map_rw(h, size, 0);
    cu.write(p, &pattern(7, size));
    let mut fd: i32 = -1;
    ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, POSIX_FD, 0));
    let mut fd2: i32 = -1;
    ok(cu.cuMemExportToShareableHandle((&mut fd2 as *mut i32).cast(), h, POSIX_FD, 0));
    assert_ne!(fd, fd2, "each export returns a new FD");
    // SAFETY: the exports returned FDs this test owns.
    let (fd, fd2) = unsafe { (OwnedFd::from_raw_fd(fd), OwnedFd::from_raw_fd(fd2)) };
    drop(fd2);

    let (mine, theirs) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::empty(),
    )
    .unwrap();
    let mut cmd = role_command("importer");
    cmd.env("FAKECUDA_TEST_SOCK", theirs.as_raw_fd().to_string());
    let mut child = Child::spawn(cmd);
    drop(theirs);
    send_fd(mine.as_raw_fd(), fd.as_raw_fd());
    drop(fd);
    assert_eq!(
        child.expect("SAW", 30),
        "1",
        "importer saw the creator's bytes"
    );
    child.expect("WROTE", 30);
    let back = cu.read(p + GRAN as u64, GRAN);
    assert_eq!(back, pattern(9, GRAN), "creator sees the importer's write");
    assert_eq!(cu.read(p, GRAN), pattern(7, GRAN));
    child.send("done");
    assert!(child.wait().success());
    ok(cu.cuMemUnmap(p, size));
    ok(cu.cuMemAddressFree(p, size));
    ok(cu.cuMemRelease(h));
    drop(mine);
    check_fds_at_most(fds_before, "no descriptor leaked");
}

fn touch(grant: Option<u32>) {
    let cu = cuda();
    cu.setup(0);
    let h = cu.create(GRAN, 0, 0);
    let p = cu.reserve(GRAN);
    ok(cu.cuMemMap(p, GRAN, 0, h, 0));
    if let Some(flags) = grant {
        ok(cu.grant(p, GRAN, 0, flags));
        // SAFETY: read access was granted; reading is fine.
        let v = unsafe { std::ptr::read_volatile(p as *const u8) };
        say("READ", v);
    }
    say("TOUCHING", p);
    // SAFETY: deliberately not sound: the test expects the kernel to kill this process.
    unsafe { std::ptr::write_volatile(p as *mut u8, 1) };
    say("SURVIVED", p);
}

fn died_of_segv(role: &str) {
    use std::os::unix::process::ExitStatusExt;
    lib_dir();
    let child = Child::spawn(role_command(role));
    child.expect("TOUCHING", 30);
    let status = child.wait();
    assert_eq!(
        status.signal(),
        Some(libc::SIGSEGV),
        "{role}: child should die of SIGSEGV, got {status:?}"
    );
}

/// (b) Touching mapped memory without an access grant faults.
#[test]
fn touching_without_access_faults() {
    let _serial = serial();
    died_of_segv("touch-without-access");
}

/// A read-only grant faults on write.
#[test]
fn writing_read_only_memory_faults() {
    let _serial = serial();
    died_of_segv("write-read-only");
}

fn uninitialised() {
    let cu = cuda();
    let mut n = 0;
    say("COUNT", cu.cuDeviceGetCount(&mut n));
    let mut v = 0;
    say("VERSION", cu.cuDriverGetVersion(&mut v));
}

#[test]
fn calls_before_cuinit_are_not_initialized() {
    let _serial = serial();
    lib_dir();
    let child = Child::spawn(role_command("uninitialised"));
    assert_eq!(child.expect("COUNT", 30), NOT_INITIALIZED.to_string());
    assert_eq!(child.expect("VERSION", 30), SUCCESS.to_string());
    assert!(child.wait().success());
}

#[test]
fn devices_and_attributes() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    ok(cu.cuMemcpyHtoD_v2(p, buf.as_ptr().cast(), 16));
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
        ok(cu.cuMemUnmap(p, GRAN));
        ok(cu.cuMemAddressFree(p, GRAN));
        ok(cu.cuMemRelease(h));
    }
    ok(cu.cuMemRelease(both));
    ok(cu.cuMemRelease(plain));
}

#[test]
fn classic_allocations_copies_and_host_registration() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(1);
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    assert_eq!(cu.read(q, GRAN), pattern(5, GRAN));
    // A node grant on device memory is refused; so is binding host memory into multicast.
    let d = cu.create(GRAN, 0, POSIX_FD);
    let pd = cu.map_rw(d, GRAN, 0);
    assert_eq!(cu.cuMemSetAccess(pd, GRAN, &grants[1], 1), INVALID_VALUE);
    let mut mc = 0;
    let mc_prop = McProp {
        num_devices: 1,
        size: GRAN,
        handle_types: 0,
        flags: 0,
    };
    ok(cu.cuMulticastCreate(&mut mc, &mc_prop));
    ok(cu.cuMulticastAddDevice(mc, 0));
    assert_eq!(cu.cuMulticastBindMem(mc, 0, h, 0, GRAN, 0), INVALID_VALUE);
    ok(cu.cuMemRelease(mc));
    for (ptr, handle) in [(p, h), (q, imported), (pd, d)] {
        ok(cu.cuMemUnmap(ptr, GRAN));
        ok(cu.cuMemAddressFree(ptr, GRAN));
        ok(cu.cuMemRelease(handle));
    }
}

/// cudaDeviceReset / cuCtxDestroy free what the context owned (its cuMemAlloc memory); VMM
/// allocations belong to the process and stay.
#[test]
fn resetting_a_context_frees_its_memory() {
    let _serial = serial();
    let cu = cuda();
    cu.setup(0);
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
    ok(cu.cuMemUnmap(v, GRAN));
    ok(cu.cuMemAddressFree(v, GRAN));
    ok(cu.cuMemRelease(h));
}
