//! VMM semantics: create/reserve/map/access/copy, handle reference rules, export/import
//! between two processes, faults without access, error codes.

#[path = "../support/mod.rs"]
mod support;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use support::*;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[
        ("importer", importer),
        ("touch-without-access", || touch(None)),
        ("write-read-only", || touch(Some(1))),
        ("uninitialised", uninitialised),
    ]);
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
    let (_serial, cu) = begin(0);
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
    cu.unmap_free(p, size, h);
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

mod rules;
mod surface;
