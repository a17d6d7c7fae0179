//! Multicast team rules, views through a member's device, a team shared between two
//! processes, and a lock that times out behind a bind waiting for the team.

mod support;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use support::*;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("member", member), ("waiting-binder", waiting_binder)]);
}

/// (e) Team rules: every device joins before any bind; sizes and offsets are multiples of the
/// granularity; bytes written through a member are visible through that device's view.
#[test]
fn team_rules_and_member_views() {
    let (_serial, cu) = begin(0);
    let mut g = 0;
    let prop = McProp {
        num_devices: 2,
        size: 2 * GRAN,
        handle_types: 0,
        flags: 0,
    };
    ok(cu.cuMulticastGetGranularity(&mut g, &prop, 0));
    assert_eq!(g, GRAN);
    ok(cu.cuMulticastGetGranularity(&mut g, &prop, 1));
    assert_eq!(
        cu.cuMulticastGetGranularity(&mut g, &prop, 7),
        INVALID_VALUE
    );
    let mut bad = 0;
    let odd = McProp {
        num_devices: 2,
        size: GRAN + 4096,
        handle_types: 0,
        flags: 0,
    };
    assert_eq!(
        cu.cuMulticastCreate(&mut bad, &odd),
        INVALID_VALUE,
        "size not a multiple of the granularity"
    );
    let none = McProp {
        num_devices: 0,
        size: GRAN,
        handle_types: 0,
        flags: 0,
    };
    assert_eq!(cu.cuMulticastCreate(&mut bad, &none), INVALID_VALUE);

    let size = 2 * GRAN;
    let mc = cuda().mc_create(2, size, 0);
    let m0 = cu.create(size, 0, 0);
    let m1 = cu.create(size, 1, 0);
    ok(cu.cuMulticastAddDevice(mc, 0));
    assert_eq!(
        cu.cuMulticastAddDevice(mc, 0),
        INVALID_DEVICE,
        "already a member"
    );
    assert_eq!(cu.cuMulticastAddDevice(mc, 9), INVALID_DEVICE);
    assert_eq!(
        cu.cuMulticastBindMem(mc, 0, m0, 0, size, 0),
        ILLEGAL_STATE,
        "bind before all devices joined"
    );
    ok(cu.cuMulticastAddDevice(mc, 1));
    assert_eq!(
        cu.cuMulticastBindMem(mc, 0, m0, 0, GRAN + 4096, 0),
        INVALID_VALUE,
        "misaligned size"
    );
    assert_eq!(
        cu.cuMulticastBindMem(mc, 4096, m0, 0, GRAN, 0),
        INVALID_VALUE,
        "misaligned offset"
    );
    assert_eq!(
        cu.cuMulticastBindMem(mc, 0, m0, 0, 4 * GRAN, 0),
        INVALID_VALUE,
        "larger than the object"
    );
    assert_eq!(
        cu.cuMulticastBindMem_v2(mc, 1, 0, m0, 0, size, 0),
        INVALID_DEVICE,
        "memory is on device 0"
    );
    ok(cu.cuMulticastBindMem(mc, 0, m0, 0, size, 0));
    assert_eq!(
        cu.cuMulticastAddDevice(mc, 1),
        ILLEGAL_STATE,
        "team fixed after a bind"
    );
    // Device 1's memory is bound by address.
    let p1 = cu.map_rw(m1, size, 1);
    ok(cu.cuMulticastBindAddr(mc, 0, p1, size, 0));

    // Member writes, then the multicast view through each member's device.
    let p0 = cu.map_rw(m0, size, 0);
    cu.write(p0, &pattern(1, size));
    // A copy is the work of the current context's device, which needs access.
    cu.setup(1);
    cu.write(p1, &pattern(2, size));
    cu.setup(0);
    let v = cu.reserve(size);
    ok(cu.cuMemMap(v, size, 0, mc, 0));
    ok(cu.grant(v, size, 0, 3));
    assert_eq!(
        cu.read(v, size),
        pattern(1, size),
        "device 0's view shows device 0's member"
    );
    cu.write(p0 + 100, b"fresh");
    assert_eq!(
        cu.read(v + 100, 5),
        b"fresh",
        "a later member write is visible"
    );
    let v1 = cu.reserve(size);
    ok(cu.cuMemMap(v1, size, 0, mc, 0));
    ok(cu.grant(v1, size, 1, 3));
    cu.setup(1);
    assert_eq!(
        cu.read(v1, size),
        pattern(2, size),
        "device 1's view shows device 1's member"
    );
    cu.setup(0);

    // Unbinding leaves the view inaccessible.
    assert_eq!(cu.cuMulticastUnbind(mc, 0, 0, GRAN + 1), INVALID_VALUE);
    ok(cu.cuMulticastUnbind(mc, 0, 0, size));
    let mut buf = [0u8; 4];
    assert_eq!(
        cu.cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), v, 4),
        ILLEGAL_ADDRESS,
        "nothing bound for device 0"
    );
    cu.setup(1);
    assert_eq!(
        cu.read(v1, 4),
        pattern(2, 4),
        "device 1's binding is untouched"
    );
    cu.setup(0);

    for (p, s) in [(v, size), (v1, size), (p0, size), (p1, size)] {
        ok(cu.cuMemUnmap(p, s));
        ok(cu.cuMemAddressFree(p, s));
    }
    ok(cu.cuMemRelease(mc));
    ok(cu.cuMemRelease(m0));
    ok(cu.cuMemRelease(m1));
    assert_eq!(cu.cuMemRelease(mc), INVALID_HANDLE);
}

/// Child: imports the team, adds device 1, binds its memory (waiting for the creator's
/// device), maps the view and reports what it sees.
fn member() {
    let cu = cuda();
    cu.setup(1);
    let fd: i32 = hear().parse().unwrap();
    let mut mc = 0;
    ok(cu.cuMemImportFromShareableHandle(&mut mc, fd as usize as *mut c_void, POSIX_FD));
    ok(cu.cuMulticastAddDevice(mc, 1));
    let m = cu.create(GRAN, 1, 0);
    let p = cu.map_rw(m, GRAN, 1);
    cu.write(p, b"member one");
    say("BINDING", 1);
    ok(cu.cuMulticastBindMem(mc, 0, m, 0, GRAN, 0));
    let v = cu.reserve(GRAN);
    ok(cu.cuMemMap(v, GRAN, 0, mc, 0));
    ok(cu.grant(v, GRAN, 1, 3));
    say("VIEW", String::from_utf8_lossy(&cu.read(v, 10)));
}

/// A team exported to another process: the bind there waits until this process adds its
/// device.
#[test]
fn team_shared_between_processes() {
    let (_serial, cu) = begin(0);
    let mc = cuda().mc_create(2, GRAN, u64::from(POSIX_FD));
    let mut fd = -1;
    ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), mc, POSIX_FD, 0));
    // SAFETY: the export returned an FD this test owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The child inherits the descriptor: clear close-on-exec on a duplicate for it.
    let inherit = nix::unistd::dup(&fd).unwrap();
    let mut child = Child::spawn(role_command("member"));
    child.send(&inherit.as_raw_fd().to_string());
    child.expect("BINDING", 30);
    assert_eq!(
        child.try_line("VIEW", 200),
        None,
        "the bind waits for the team"
    );
    ok(cu.cuMulticastAddDevice(mc, 0));
    assert_eq!(child.expect("VIEW", 30), "member one");
    assert!(child.wait().success());
    ok(cu.cuMemRelease(mc));
}

/// Child: a bind that waits for a device that never joins.
fn waiting_binder() {
    let cu = cuda();
    cu.setup(0);
    let mc = cuda().mc_create(2, GRAN, u64::from(POSIX_FD));
    let mut fd = -1;
    ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), mc, POSIX_FD, 0));
    ok(cu.cuMulticastAddDevice(mc, 0));
    let m = cu.create(GRAN, 0, 0);
    say("BINDING", 1);
    let r = cu.cuMulticastBindMem(mc, 0, m, 0, GRAN, 0);
    say("BOUND", r);
    hear();
}

/// A lock cannot complete while a driver call is in flight; it times out and the process
/// stays RUNNING.
#[test]
fn lock_times_out_behind_a_call_in_flight() {
    let cu = cuda();
    lib_dir();
    let mut cmd = role_command("waiting-binder");
    cmd.env("FAKECUDA_MULTICAST_BIND_TIMEOUT_MS", "3000");
    let child = Child::spawn(cmd);
    child.expect("BINDING", 30);
    // The child announces the bind just before making it: retry until the lock meets the
    // call in flight rather than racing it.
    let mut result = SUCCESS;
    for _ in 0..50 {
        let mut args = [0u64; 8];
        args[0] = 200;
        result = cu.cuCheckpointProcessLock(child.pid(), &mut args);
        if result != SUCCESS {
            break;
        }
        ok(cu.cuCheckpointProcessUnlock(child.pid(), std::ptr::null_mut()));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(result, 909, "CUDA_ERROR_TIMEOUT");
    let mut s = 9;
    ok(cu.cuCheckpointProcessGetState(child.pid(), &mut s));
    assert_eq!(s, 0, "still running");
    assert_eq!(
        child.expect("BOUND", 30),
        "909",
        "the bind itself gives up with a timeout"
    );
    child.finish();
}
