//! Native legacy IPC between processes, and the call counter that lets tests prove an
//! interposer never reached these entry points.

mod support;
use support::*;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("opener", opener)]);
}

fn parse_handle(s: &str) -> [u8; 64] {
    let mut h = [0u8; 64];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    h
}

/// Child: opens the parent's handle twice (same pointer), reads, writes, closes.
fn opener() {
    let cu = cuda();
    cu.setup(1);
    assert_eq!(cu.native_ipc_calls(), 0);
    let handle = parse_handle(&hear());
    let (mut p, mut q) = (0u64, 0u64);
    ok(cu.cuIpcOpenMemHandle_v2(&mut p, handle, 1));
    ok(cu.cuIpcOpenMemHandle_v2(&mut q, handle, 0));
    say("SAME", u8::from(p == q));
    say("SAW", u8::from(cu.read(p, 4096) == pattern(4, 4096)));
    cu.write(p + 8192, b"from the opener");
    say("WROTE", 1);
    hear();
    ok(cu.cuIpcCloseMemHandle(p));
    ok(cu.cuIpcCloseMemHandle(q));
    assert_eq!(cu.cuIpcCloseMemHandle(p), INVALID_VALUE);
    say("CALLS", cu.native_ipc_calls());
}

#[test]
fn native_ipc_between_processes_is_counted() {
    let cu = cuda();
    cu.setup(0);
    let before = cu.native_ipc_calls();
    let mut d = 0u64;
    ok(cu.cuMemAlloc_v2(&mut d, 1 << 20));
    cu.write(d, &pattern(4, 4096));
    let (mut h1, mut h2) = ([0u8; 64], [0u8; 64]);
    ok(cu.cuIpcGetMemHandle(&mut h1, d));
    ok(cu.cuIpcGetMemHandle(&mut h2, d));
    assert_eq!(h1, h2, "the same bytes for the same allocation");
    assert_eq!(
        cu.cuIpcGetMemHandle(&mut h2, d + 4096),
        INVALID_VALUE,
        "not an allocation base"
    );
    let mut own = 0;
    assert_eq!(
        cu.cuIpcOpenMemHandle_v2(&mut own, h1, 0),
        INVALID_CONTEXT,
        "own handle"
    );
    let mut junk = h1;
    junk[0] ^= 0xff;
    assert_eq!(cu.cuIpcOpenMemHandle_v2(&mut own, junk, 0), INVALID_VALUE);
    let mut child = Child::spawn(role_command("opener"));
    child.send(&h1.iter().map(|b| format!("{b:02x}")).collect::<String>());
    assert_eq!(
        child.expect("SAME", 30),
        "1",
        "re-opening returns the same pointer"
    );
    assert_eq!(child.expect("SAW", 30), "1");
    child.expect("WROTE", 30);
    assert_eq!(cu.read(d + 8192, 15), b"from the opener");
    child.send("close");
    assert_eq!(
        child.expect("CALLS", 30),
        "5",
        "two opens and three closes in the child"
    );
    assert!(child.wait().success());
    // This thread made 5 calls (three gets, two opens); other tests in this binary make none.
    assert_eq!(cu.native_ipc_calls() - before, 5);
    ok(cu.cuMemFree_v2(d));
}
