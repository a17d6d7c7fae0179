//! Interception paths, pass-through faithfulness and fork, with C programs over fakecuda.

mod support;

use std::process::Stdio;
use support::{Sandbox, fake_runtime, share_program, stdout_of};

fn runtime_path() -> String {
    format!("runtime:{}", fake_runtime().display())
}

/// Every entry path the application may use to reach the driver.
fn entry_paths() -> Vec<String> {
    let mut paths: Vec<String> = [
        "direct",
        "dlsym",
        "default",
        "next",
        "proc:12030",
        "proc:12000",
        "proc:10020",
        "procv1:12000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    paths.push(runtime_path());
    paths
}

/// The stdout of the `share` program run with `args` (the shim preloaded when `shim` is set),
/// which must succeed (`what` names the run when it does not).
fn share(sandbox: &Sandbox, shim: bool, args: &[&str], what: &str) -> String {
    let out = sandbox
        .command(share_program(), shim)
        .args(args)
        .output()
        .unwrap();
    stdout_of(what, out)
}

/// A creator and an importer process share one allocation through `path`: the importer sees
/// the creator's bytes, the creator sees the importer's write.
fn check_sharing(path: &str) {
    let sandbox = Sandbox::new("share");
    let socket = sandbox.root.join("pair.sock");
    let creator = sandbox
        .command(share_program(), true)
        .args(["creator"])
        .arg(&socket)
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let importer = sandbox
        .command(share_program(), true)
        .args(["importer"])
        .arg(&socket)
        .arg(path)
        .output()
        .unwrap();
    let importer = stdout_of(&format!("importer over {path}"), importer);
    let creator = stdout_of(
        &format!("creator over {path}"),
        creator.wait_with_output().unwrap(),
    );
    // Tracked allocations are handed to the application as logical handles.
    assert!(creator.contains("handle=0xc0de"), "{path}: {creator}");
    assert!(importer.contains("handle=0xc0de"), "{path}: {importer}");
}

#[test]
fn every_entry_path_shares_memory_between_processes() {
    for path in entry_paths() {
        check_sharing(&path);
    }
}

/// Which library answers each name through `path`: the shim, for tracked names and for the
/// pass-throughs alike (every driver entry point passes the checkpoint gate).
fn check_resolution(path: &str) {
    let sandbox = Sandbox::new("resolve");
    let out = share(
        &sandbox,
        true,
        &["resolve", path],
        &format!("resolve over {path}"),
    );
    for line in out.lines() {
        let (name, library) = line.split_once(' ').unwrap();
        assert!(
            library.starts_with("libcuinterpose.so"),
            "{name} through {path}: {library}"
        );
    }
    assert_eq!(out.lines().count(), 9, "{out}");
}

#[test]
fn every_driver_entry_point_resolves_to_the_shim() {
    for path in entry_paths() {
        check_resolution(&path);
    }
}

#[test]
fn without_the_shim_every_path_reaches_the_driver() {
    let sandbox = Sandbox::new("noshim");
    let out = share(
        &sandbox,
        false,
        &["resolve", "dlsym"],
        "resolve without shim",
    );
    assert!(out.lines().all(|l| l.contains(" libcuda.so")), "{out}");
}

#[test]
fn pass_through_results_equal_the_unshimmed_driver() {
    let sandbox = Sandbox::new("probe");
    for path in ["direct", "proc:12030"] {
        let plain = share(&sandbox, false, &["probe", path], "probe");
        let shimmed = share(&sandbox, true, &["probe", path], "probe");
        assert_eq!(plain, shimmed, "results differ under the shim ({path})");
        assert!(plain.lines().count() >= 30, "{plain}");
        // The probe reaches the driver's refusals, not just successes.
        assert!(plain.contains("map_again 208"), "{plain}");
        assert!(plain.contains("export_fabric 801"), "{plain}");
    }
}

#[test]
fn a_forked_child_holds_neither_the_control_socket_nor_cached_exports() {
    let sandbox = Sandbox::new("fork");
    let out = share(&sandbox, true, &["fork", "direct"], "fork");
    let value = |key: &str| -> i64 {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no `{key}` in:\n{out}"))
            .trim()
            .parse()
            .unwrap()
    };
    // The parent holds its socket, the allocation's memfd, the cached export and the ticket;
    // the child lost exactly the socket and the cached export.
    assert!(out.contains("parent socket cuinterpose-"), "{out}");
    assert!(!out.contains("child socket"), "{out}");
    assert_eq!(value("parent memfds"), value("child memfds") + 1, "{out}");
    // The child cannot use its parent's driver (as with CUDA) and starts no runtime of its own.
    assert_eq!(value("child cuInit"), 3, "{out}");
    assert_eq!(value("child cuMemCreate"), 3, "{out}");
    let sockets: Vec<_> = std::fs::read_dir(sandbox.control_dir()).unwrap().collect();
    assert!(sockets.len() <= 1, "{sockets:?}");
}
