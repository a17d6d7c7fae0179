//! Native checkpoint driven from another process: state machine, the lock gate, refusal of
//! live sharing, toggles that keep addresses and bytes, and the fakecuda-checkpoint CLI.

mod support;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use support::*;

use cuinterpose_abi::consts::{
    PROCESS_STATE_CHECKPOINTED as CHECKPOINTED, PROCESS_STATE_LOCKED as LOCKED,
    PROCESS_STATE_RUNNING as RUNNING,
};
const VMM_SIZE: usize = 2 * GRAN;
const CLASSIC_SIZE: usize = 3 << 20;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[
        ("target", || target(None)),
        ("target-exported", || target(Some("exported"))),
        ("target-imported", || target(Some("imported"))),
        ("target-ipc", || target(Some("ipc"))),
        ("target-multicast", || target(Some("multicast"))),
    ]);
}

/// Child: two private allocations (one VMM, one cuMemAlloc) with known bytes, optionally one
/// kind of sharing, then commands from the parent.
fn target(sharing: Option<&str>) {
    let cu = cuda();
    cu.setup(0);
    let h = cu.create(VMM_SIZE, 0, POSIX_FD);
    let a = cu.map_rw(h, VMM_SIZE, 0);
    cu.write(a, &pattern(11, VMM_SIZE));
    let mut b = 0u64;
    ok(cu.cuMemAlloc_v2(&mut b, CLASSIC_SIZE));
    cu.write(b, &pattern(22, CLASSIC_SIZE));
    let mut keep: Vec<OwnedFd> = Vec::new();
    match sharing {
        Some("exported") => {
            let mut fd = -1;
            ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, POSIX_FD, 0));
            // SAFETY: the export returned an FD we own.
            keep.push(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        Some("imported") => {
            let other = cu.create(GRAN, 0, POSIX_FD);
            let mut fd = -1;
            ok(cu.cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), other, POSIX_FD, 0));
            // SAFETY: as above.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut imp = 0;
            ok(cu.cuMemImportFromShareableHandle(
                &mut imp,
                fd.as_raw_fd() as usize as *mut c_void,
                POSIX_FD,
            ));
            // Drop the FD and the creator handle: the importer's handle alone is the sharing.
            drop(fd);
        }
        Some("ipc") => {
            let mut handle = [0u8; 64];
            ok(cu.cuIpcGetMemHandle(&mut handle, b));
        }
        Some("multicast") => {
            cu.mc_create(1, GRAN, 0);
        }
        _ => {}
    }
    say("ADDRS", format!("{a} {b}"));
    loop {
        match hear().as_str() {
            "verify" => {
                let vmm = cu.read(a, VMM_SIZE) == pattern(11, VMM_SIZE);
                let classic = cu.read(b, CLASSIC_SIZE) == pattern(22, CLASSIC_SIZE);
                // SAFETY: both ranges are mapped with read access (the point of the check).
                let direct = unsafe {
                    *(a as *const u8).add(5) == pattern(11, 6)[5]
                        && *(b as *const u8).add(7) == pattern(22, 8)[7]
                };
                let (mut base, mut size) = (0u64, 0usize);
                ok(cu.cuMemGetAddressRange_v2(&mut base, &mut size, b + 1));
                let range = base == b && size == CLASSIC_SIZE;
                say("VERIFY", u8::from(vmm && classic && direct && range));
            }
            "call" => {
                std::thread::spawn(move || {
                    let cu = cuda();
                    let mut ctx = 0;
                    let r = cu.cuDevicePrimaryCtxRetain(&mut ctx, 0);
                    say("CALLED", r);
                });
            }
            _ => break,
        }
    }
    keep.clear();
}

/// A `target` child once it has printed its two addresses.
fn spawn_target() -> (Child, (u64, u64)) {
    lib_dir();
    let child = Child::spawn(role_command("target"));
    let addrs = addrs(&child);
    (child, addrs)
}

fn addrs(child: &Child) -> (u64, u64) {
    let line = child.expect("ADDRS", 30);
    let mut it = line.split_whitespace().map(|x| x.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

fn state(pid: i32) -> u32 {
    let mut s = 99;
    ok(cuda().cuCheckpointProcessGetState(pid, &mut s));
    s
}

fn lock(pid: i32, timeout_ms: u32) -> u32 {
    let mut args = [0u64; 8];
    args[0] = u64::from(timeout_ms);
    cuda().cuCheckpointProcessLock(pid, &mut args)
}

/// fakecuda memfds open in process `pid`.
fn device_memfds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("/memfd:fakecuda-alloc"))
        .count()
}

/// (d) lock, checkpoint, restore, unlock from another process keep addresses and bytes, and
/// the lock really blocks the target's driver calls.
#[test]
fn toggle_through_the_api_keeps_addresses_and_bytes() {
    let cu = cuda();
    let (mut child, (a, b)) = spawn_target();
    let pid = child.pid();
    assert_eq!(state(pid), RUNNING);
    let n = std::ptr::null_mut();
    assert_eq!(
        cu.cuCheckpointProcessCheckpoint(pid, n),
        ILLEGAL_STATE,
        "checkpoint needs LOCKED"
    );
    assert_eq!(
        cu.cuCheckpointProcessUnlock(pid, n),
        ILLEGAL_STATE,
        "unlock needs LOCKED"
    );
    assert_eq!(
        cu.cuCheckpointProcessRestore(pid, n),
        ILLEGAL_STATE,
        "restore needs CHECKPOINTED"
    );
    ok(lock(pid, 5000));
    assert_eq!(state(pid), LOCKED);
    assert_eq!(lock(pid, 0), ILLEGAL_STATE, "lock needs RUNNING");
    child.send("call");
    assert_eq!(
        child.try_line("CALLED", 300),
        None,
        "a driver call blocks while locked"
    );
    ok(cu.cuCheckpointProcessCheckpoint(pid, n));
    assert_eq!(state(pid), CHECKPOINTED);
    assert_eq!(
        device_memfds(pid),
        0,
        "checkpoint released the device memory"
    );
    ok(cu.cuCheckpointProcessRestore(pid, n));
    assert_eq!(state(pid), LOCKED, "restore leaves the process locked");
    assert_eq!(device_memfds(pid), 2);
    ok(cu.cuCheckpointProcessUnlock(pid, n));
    assert_eq!(state(pid), RUNNING);
    assert_eq!(
        child.expect("CALLED", 30),
        "0",
        "the blocked call completes after unlock"
    );
    child.send("verify");
    assert_eq!(
        child.expect("VERIFY", 30),
        "1",
        "same addresses {a:#x} {b:#x}, same bytes"
    );
    child.finish();
}

/// (c) Checkpoint refuses while sharing is live, and the state stays LOCKED.
#[test]
fn checkpoint_refuses_live_sharing() {
    let cu = cuda();
    lib_dir();
    for role in [
        "target-exported",
        "target-imported",
        "target-ipc",
        "target-multicast",
    ] {
        let mut child = Child::spawn(role_command(role));
        let pid = child.pid();
        addrs(&child);
        ok(lock(pid, 5000));
        assert_eq!(
            cu.cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()),
            NOT_SUPPORTED,
            "{role}"
        );
        assert_eq!(state(pid), LOCKED, "{role}: state unchanged by the refusal");
        assert_eq!(
            device_memfds(pid),
            match role {
                "target-imported" => 4,
                "target-exported" => 3,
                _ => 2,
            },
            "{role}: nothing released"
        );
        ok(cu.cuCheckpointProcessUnlock(pid, std::ptr::null_mut()));
        child.send("verify");
        assert_eq!(child.expect("VERIFY", 30), "1", "{role}");
        child.send("exit");
        assert!(child.wait().success(), "{role}");
    }
}

#[test]
fn checkpoint_calls_check_their_target() {
    let cu = cuda();
    lib_dir();
    // A process that never initialised the driver has no control socket.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let mut s = 0;
    assert_eq!(
        cu.cuCheckpointProcessGetState(sleeper.id() as i32, &mut s),
        NOT_INITIALIZED
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(cu.cuCheckpointProcessGetState(-1, &mut s), INVALID_VALUE);
    assert_eq!(
        cu.cuCheckpointProcessGetState(std::process::id() as i32, std::ptr::null_mut()),
        INVALID_VALUE
    );
    // Non-zero reserved fields are rejected.
    let mut args = [0u64; 8];
    args[3] = 1;
    assert_eq!(
        cu.cuCheckpointProcessLock(std::process::id() as i32, &mut args),
        INVALID_VALUE
    );
}

fn cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fakecuda-checkpoint"))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .expect("run fakecuda-checkpoint")
}

/// (f) `fakecuda-checkpoint --toggle` round-trips a two-allocation process, bytes verified.
#[test]
fn cli_toggle_round_trips_a_two_allocation_process() {
    let (mut child, _) = spawn_target();
    let pid = child.pid().to_string();
    let get = |label: &str| {
        let out = cli(&["--get-state", "--pid", &pid]);
        assert!(
            out.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(get("before"), "running");
    let out = cli(&["--toggle", "--pid", &pid, "--timeout", "5000"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(get("suspended"), "checkpointed");
    assert_eq!(device_memfds(child.pid()), 0);
    let out = cli(&["--toggle", "--pid", &pid]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(get("resumed"), "running");
    child.send("verify");
    assert_eq!(child.expect("VERIFY", 30), "1");
    // Single steps and a clear error naming the pid and the step.
    let out = cli(&["--action", "unlock", "--pid", &pid]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("pid {pid}"))
            && err.contains("unlock")
            && err.contains("CUDA_ERROR_ILLEGAL_STATE"),
        "{err}"
    );
    for step in ["lock", "checkpoint", "restore", "unlock"] {
        let out = cli(&["--action", step, "--pid", &pid]);
        assert!(
            out.status.success(),
            "{step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child.send("verify");
    assert_eq!(child.expect("VERIFY", 30), "1");
    child.finish();
}

/// The command line CRIU's CUDA plugin uses (CRIU 4.1.1 `plugins/cuda/cuda_plugin.c`): `-h`
/// mentions `--action`; `--get-restore-tid` prints the thread that serves checkpoint
/// requests; `--get-state` accepts that thread id for its process; `--action STEP --pid PID
/// [--timeout MS]`; a process without the driver is an error, named.
#[test]
fn the_cuda_plugin_command_line_works() {
    let (mut child, _) = spawn_target();
    let pid = child.pid().to_string();
    let help = cli(&["-h"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--action"));
    let out = cli(&["--get-restore-tid", "--pid", &pid]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).expect("a thread");
    assert_eq!(comm.trim_end(), "fakecuda-ctl");
    let state = |who: &str| {
        let out = cli(&["--get-state", "--pid", who]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(state(&tid), "running");
    for (step, after) in [
        ("lock", "locked"),
        ("checkpoint", "checkpointed"),
        ("restore", "locked"),
        ("unlock", "running"),
    ] {
        let mut args = vec!["--action", step, "--pid", &pid];
        if step == "lock" {
            args.extend(["--timeout", "5000"]);
        }
        let out = cli(&args);
        assert!(
            out.status.success(),
            "{step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(state(&tid), after, "after {step}");
    }
    child.send("verify");
    assert_eq!(child.expect("VERIFY", 30), "1");
    // A process that never initialised the driver has no restore thread.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep");
    let out = cli(&["--get-restore-tid", "--pid", &sleeper.id().to_string()]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CUDA_ERROR_NOT_INITIALIZED"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    child.finish();
}

/// A refused checkpoint in `--toggle` leaves the target running, not locked (its next driver
/// call would hang); the target's control socket goes away when it exits.
#[test]
fn a_refused_toggle_unlocks_and_sockets_go_at_exit() {
    lib_dir();
    let mut cmd = role_command("target");
    cmd.env("FAKECUDA_REFUSE_CHECKPOINT", "checkpoint");
    let mut child = Child::spawn(cmd);
    let pid = child.pid().to_string();
    addrs(&child);
    let dir = std::env::var_os("FAKECUDA_CONTROL_DIR").unwrap_or_else(|| "/tmp/fakecuda".into());
    let socket = std::path::Path::new(&dir).join(format!("fakecuda-{pid}.sock"));
    assert!(
        socket.exists(),
        "{} while the target runs",
        socket.display()
    );
    let out = cli(&["--toggle", "--pid", &pid, "--timeout", "5000"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checkpoint failed")
            && err.contains("CUDA_ERROR_NOT_SUPPORTED")
            && err.contains("the process was unlocked again"),
        "{err}"
    );
    let state = cli(&["--get-state", "--pid", &pid]);
    assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "running");
    child.send("verify");
    assert_eq!(child.expect("VERIFY", 30), "1", "the target still works");
    child.finish();
    assert!(!socket.exists(), "{} removed at exit", socket.display());
}
