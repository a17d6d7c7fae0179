//! Unit tests of `compose`: who died while a step ran, from a made-up `/proc`.

use super::*;
use cuinterpose_testkit::fixtures::{TempDir, shared_topology, state_file};

/// A `/proc` with `root` (namespace PID 1) and children of the given namespace PIDs, each
/// `(host pid, namespace pid, state)`.
fn fake_proc(dir: &Path, root: u32, children: &[(u32, u32, &str)]) {
    let process = |pid: u32, parent: u32, nspid: u32, state: &str| {
        let at = dir.join(pid.to_string());
        fs::create_dir_all(&at).unwrap();
        fs::write(
            at.join("stat"),
            format!("{pid} (w) {state} {parent} 1 1 0 -1 0 0"),
        )
        .unwrap();
        fs::write(
            at.join("status"),
            format!("Name:\tw\nNSpid:\t{pid}\t{nspid}\n"),
        )
        .unwrap();
    };
    process(root, 1, 1, "S");
    for &(pid, nspid, state) in children {
        process(pid, root, nspid, state);
    }
}

fn check(children: &[(u32, u32, &str)], with_root: bool, expected: Option<&str>) {
    let proc_dir = TempDir::new("proc").unwrap();
    let dir = TempDir::new("ckpt").unwrap();
    if with_root {
        fake_proc(proc_dir.path(), 500, children);
    }
    // The shared topology's participants: namespace PIDs 2, 3 and 4.
    state::publish(dir.path(), &state_file(&shared_topology(2))).unwrap();
    let workload = Workload {
        control_dir: dir.path().join("control"),
        timeouts: Timeouts::default(),
        lock_timeout_ms: 0,
        proc_dir: proc_dir.path().to_path_buf(),
        device_map: None,
        carriage: crate::plan::Carriage::Host,
        driver: crate::native::driver_path(None),
    };
    let said = died_since(&workload, 500, dir.path(), "criu dump").map(|e| e.to_string());
    assert_eq!(said.as_deref(), expected);
}

#[test]
fn participants_that_died_are_named() {
    let all = [(501, 2, "S"), (502, 3, "R"), (503, 4, "S")];
    check(&all, true, None);
    check(
        &[(501, 2, "S"), (503, 4, "Z")],
        true,
        Some("participants 3, 4 died during criu dump, so the workload cannot be put back"),
    );
    check(
        &[(501, 2, "S"), (502, 3, "S"), (503, 4, "X")],
        true,
        Some("participant 4 died during criu dump, so the workload cannot be put back"),
    );
    // The root gone: the whole tree with it.
    check(
        &all,
        false,
        Some("participants 2, 3, 4 died during criu dump, so the workload cannot be put back"),
    );
}
