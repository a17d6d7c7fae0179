//! `cuinterpose demo`, the README's first command: in place, and with CRIU where it works
//! (a loud SKIPPED line where `criu check` fails, never a silent pass; under `CI=true` a
//! missing or failing CRIU fails the test).

mod support;

use std::process::{Command, Output};

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::{build_shim, build_worker, fakecuda_lib_dir};
use serde_json::Value;
use support::cli::{self, check_exit};
use support::criu;
use support::tmpfs::{Tmpfs, unavailable};

/// The binary, with the worker, the shim and fakecuda built next to it (as after
/// `cargo build --workspace`).
fn demo() -> Command {
    build_worker();
    build_shim();
    fakecuda_lib_dir();
    cli::command(&["demo"])
}

/// The demo's CRIU dump failed after prepare and the workload was put back (`how`), every byte
/// verified, exit 3, no fail-stop: its stderr.
fn check_aborted(output: &Output, how: &str) -> String {
    let (_, stderr) = check_exit(output, 3);
    assert!(
        stderr.contains("ABORTED: criu dump failed after the participants were prepared")
            && stderr.contains(how)
            && stderr.contains("verified at their original addresses")
            && !stderr.contains("FAIL-STOP"),
        "{stderr}"
    );
    stderr
}

/// The demo succeeded: its stdout.
fn check_success(output: &Output) -> String {
    check_exit(output, 0).0
}

fn check_report(json: &Value, processes: u64) {
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(json["processes"], processes);
    // Every process holds S0, its private and untracked memory; S1 and the IPC pair add more.
    assert!(
        json["regions_verified"].as_u64().unwrap() >= 3 * processes,
        "{json}"
    );
    assert!(json["bytes_verified"].as_u64().unwrap() > 0);
    // Each importer of S0 and the IPC consumer wrote through its mapping after restore.
    assert_eq!(json["sharing_checks"].as_u64().unwrap(), processes);
    let phases = json["report"]["phases"].as_array().unwrap();
    let saved = phases
        .iter()
        .find(|p| p["phase"] == "save_allocations")
        .expect("a save phase");
    assert!(saved["bytes"].as_u64().unwrap() > 0, "{saved}");
}

#[test]
fn demo_toggles_and_verifies_every_byte() {
    let output = demo().output().unwrap();
    let text = check_success(&output);
    assert!(text.contains("VERIFIED: "), "{text}");
    assert!(text.contains("sharing links live after restore"), "{text}");
    let output = demo()
        .args(["--processes", "4", "--json"])
        .output()
        .unwrap();
    let json: Value = cli::final_json(&check_success(&output));
    check_report(&json, 4);
}

#[test]
fn demo_mesh_adds_small_shared_allocations_each_verified_and_shared() {
    let (processes, mesh) = (3u64, 40u64);
    let output = demo()
        .env("FAKECUDA_GRANULARITY_KIB", "64")
        .args(["--processes", "3", "--mesh", "40", "--json"])
        .output()
        .unwrap();
    let json: Value = cli::final_json(&check_success(&output));
    let topology = json["topology"].to_string();
    assert!(
        topology.contains("mesh: 40 allocations of 64 KiB created by each process"),
        "{topology}"
    );
    // Each mesh allocation is verified in its creator and its importer, on top of the rest.
    let regions = json["regions_verified"].as_u64().unwrap();
    assert!(regions >= 2 * processes * mesh + 3 * processes, "{json}");
    // S0's importers and the IPC pair, then each process's first mesh allocation.
    assert_eq!(
        json["sharing_checks"].as_u64().unwrap(),
        2 * processes,
        "{json}"
    );
    let saved = cli::phase_names(&json["report"]);
    assert!(saved.contains(&"restore_unicast"), "{saved:?}");

    check_refused(&["--mesh", "4001"], "--mesh 4001 is too many: at most 4000");
}

/// The demo refuses `args` (exit 1), saying `why`.
fn check_refused(args: &[&str], why: &str) {
    let output = demo().args(args).output().unwrap();
    let (_, stderr) = check_exit(&output, 1);
    assert!(stderr.contains(why), "{stderr}");
}

#[test]
fn demo_refuses_a_single_process() {
    check_refused(&["--processes", "1"], "--processes must be at least 2");
}

#[test]
fn demo_survives_a_criu_dump_kill_and_restore() {
    let Some(binary) = criu::usable("demo_survives_a_criu_dump_kill_and_restore") else {
        return;
    };
    let output = demo()
        .args(["--criu", "--json", "--criu-binary"])
        .arg(&binary)
        .output()
        .unwrap();
    let json: Value = cli::final_json(&check_success(&output));
    check_report(&json, 3);
    let phases = cli::phase_names(&json["report"]);
    assert!(
        phases.contains(&"criu_dump") && phases.contains(&"criu_restore"),
        "{phases:?}"
    );
    // The CRIU phases count the participants they dumped and restored.
    for phase in json["report"]["phases"].as_array().expect("phases") {
        if phase["phase"] == "criu_dump" || phase["phase"] == "criu_restore" {
            assert_eq!(phase["participants"], 3, "{phase}");
        }
    }
    // The restored processes' new host PIDs, by namespace PID (what the user signals).
    let host_pids = json["report"]["host_pids"].as_object().expect("host_pids");
    assert_eq!(host_pids.len(), 3, "{host_pids:?}");
    assert!(
        host_pids
            .values()
            .all(|p| p.as_u64().is_some_and(|p| p > 1)),
        "{host_pids:?}"
    );
}

/// The demo's work directory (and with it the CRIU images) on a 2 MiB tmpfs, with the host
/// carrier: the state fits, the images do not, so `criu dump` fails with the disk full after
/// the sharing was released. (The storage carrier would fail sooner, at the save: see the
/// fault tests.)
/// The workload is put back in place from the host carriers (record comparison included) and
/// resumes: exit 3, "ABORTED: criu dump failed", never "FAIL-STOP".
#[test]
fn a_criu_dump_on_a_full_disk_is_aborted_and_the_workload_resumed() {
    let test = "a_criu_dump_on_a_full_disk_is_aborted_and_the_workload_resumed";
    check_full_disk(test, "full", &["--criu", "--carrier", "host"], |output| {
        let stderr = check_aborted(output, "put back in place");
        assert!(stderr.contains("after the abort, "), "{stderr}");
    });
}

/// Test `test`: the demo with `args` and CRIU, its work directory on a 2 MiB tmpfs
/// (`cuinterpose-<label>-<pid>`), its output checked by `check`; then nothing of the workload is
/// left running (the tmpfs unmounts). Says why where CRIU or the tmpfs is unavailable.
fn check_full_disk(test: &str, label: &str, args: &[&str], check: impl FnOnce(&Output)) {
    check_disk_of(test, label, "2m", args, check)
}

/// [`check_full_disk`] with a tmpfs of `size`.
fn check_disk_of(test: &str, label: &str, size: &str, args: &[&str], check: impl FnOnce(&Output)) {
    let Some(binary) = criu::usable(test) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("cuinterpose-{label}-{}", std::process::id()));
    let full = match Tmpfs::mount(dir, size) {
        Ok(full) => full,
        Err(why) => return unavailable(test, &why),
    };
    let output = demo()
        .args(args)
        .arg("--criu-binary")
        .arg(&binary)
        .env("TMPDIR", &full.0)
        .output()
        .unwrap();
    check(&output);
    if let Err(why) = full.unmount() {
        panic!("the workload still holds its directory: {why}");
    }
}

/// CRIU killed (SIGKILL) in the middle of a dump, once it has seized the whole tree and before
/// it injected anything into a task: the dump fails, CRIU's hold on the tree ends with it, and
/// the coordinator puts the workload back in place from the host carriers (exit 3), every byte
/// verified. The kill is placed exactly: CRIU's CUDA plugin asks `cuda-checkpoint` for each
/// task's state between seizing the tree and dumping the first task, and the `cuda-checkpoint`
/// the test puts on CRIU's `PATH` kills CRIU at that first question.
#[test]
fn a_criu_killed_mid_dump_is_aborted_and_the_workload_resumed() {
    let test = "a_criu_killed_mid_dump_is_aborted_and_the_workload_resumed";
    let Some((binary, plugins)) = criu::usable_with_cuda_plugin(test) else {
        return;
    };
    let work = TempDir::new("criu-killed").expect("work dir");
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let marker = work.path().join("killed");
    let executable = |path: &std::path::Path, text: String| {
        std::fs::write(path, text).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(path, mode).unwrap();
    };
    executable(
        &bin.join("cuda-checkpoint"),
        format!(
            "#!/bin/sh\n\
             # fakecuda-checkpoint, except that the first state question kills the CRIU asking.\n\
             case \" $* \" in *' --get-state '*) echo \"$*\" > '{marker}'; kill -KILL $PPID; exit 1;; esac\n\
             exec '{tool}' \"$@\"\n",
            marker = marker.display(),
            tool = cuinterpose_testkit::build_fakecuda_checkpoint().display()
        ),
    );
    let wrapper = work.path().join("criu");
    executable(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             # CRIU; a dump runs with the CUDA plugin forced on and the cuda-checkpoint above.\n\
             [ \"$1\" = dump ] || exec '{real}' \"$@\"\n\
             PATH='{bin}':$PATH CRIU_FAULT=138 FAKECUDA_LIBCUDA='{driver}' exec '{real}' \"$@\" -L '{plugins}'\n",
            real = binary.display(),
            bin = bin.display(),
            driver = fakecuda_lib_dir().join("libcuda.so.1").display(),
            plugins = plugins.display()
        ),
    );
    let output = demo()
        .args(["--criu", "--criu-binary"])
        .arg(&wrapper)
        .output()
        .unwrap();
    let stderr = check_aborted(&output, "put back in place");
    let asked = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        asked.contains("--get-state"),
        "CRIU was killed at the plugin's first state question: {asked:?}\n{stderr}"
    );
}

/// A demo that fails at start-up (no such driver) leaves nothing in `$TMPDIR`, and says how
/// to keep its work directory; with --keep the directory stays.
#[test]
fn a_failed_demo_leaves_no_work_directory_unless_kept() {
    let tmp = std::env::temp_dir().join(format!("cuinterpose-demo-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let run = |keep: bool| {
        let mut command = demo();
        command
            .args(["--driver", "/nonexistent/libcuda.so.1"])
            .env("TMPDIR", &tmp);
        if keep {
            command.arg("--keep");
        }
        command.output().unwrap()
    };
    let (_, stderr) = check_exit(&run(false), 1);
    assert!(
        stderr.contains("cannot resolve /nonexistent/libcuda.so.1"),
        "{stderr}"
    );
    assert!(stderr.contains("rerun with --keep"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "left {left:?}");
    check_exit(&run(true), 1);
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert_eq!(left.len(), 1, "--keep keeps the work directory: {left:?}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Plain `criu dump` and `criu restore`, configured with one line naming cuinterpose as the
/// action script, twice in a row (after a first dump with `--leave-running`): no cuinterpose
/// command runs between them, and every byte, address and sharing link is verified after each
/// restore.
#[test]
fn plain_criu_with_the_hook_checkpoints_the_sharing_twice() {
    let test = "plain_criu_with_the_hook_checkpoints_the_sharing_twice";
    let Some(binary) = criu::usable(test) else {
        return;
    };
    let output = demo()
        .args(["--criu", "--criu-hook", "--json", "--criu-binary"])
        .arg(&binary)
        .output()
        .unwrap();
    let json: Value = cli::final_json(&check_success(&output));
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(json["sharing_checks"], 3, "{json}");
    let phases = cli::phase_names(&json["report"]);
    assert_eq!(
        phases,
        [
            "criu_snapshot",
            "criu_dump_1",
            "criu_restore_1",
            "criu_dump_2",
            "criu_restore_2",
            "demo_verify"
        ]
    );
    assert_eq!(json["report"]["participants"], serde_json::json!([2, 3, 4]));
    let topology = json["topology"].to_string();
    for cycle in [1, 2] {
        for expected in [
            // The hook's default carrier: files beside CRIU's images, not in its page images.
            "pre-dump: the shared bytes went to 3 carrier files (14680064 bytes) beside \
             CRIU's images",
            "post-resume: the sharing was rebuilt and verified",
        ] {
            assert!(
                topology.contains(&format!("criu cycle {cycle}: {expected}")),
                "{topology}"
            );
        }
    }
    // First a dump with --leave-running: the hook's watcher restored the tree in place.
    assert!(
        topology.contains(
            "criu snapshot (--leave-running): the dump completed and CRIU left the tree \
             running: restored in place"
        ),
        "{topology}"
    );
}

/// The hook's dump on a full disk with the host carrier: CRIU fails after pre-dump (which
/// released the sharing) and calls no script; the hook's watcher sees CRIU end with the tree
/// still running and puts the workload back from the host carriers. (With the storage
/// carrier, the hook's default, the save itself fails on the full disk: see
/// `the_hooks_storage_carrier_on_a_full_disk_keeps_the_tree_running`.)
#[test]
fn a_failed_dump_under_the_hook_is_put_back_by_its_watcher() {
    let test = "a_failed_dump_under_the_hook_is_put_back_by_its_watcher";
    check_full_disk(
        test,
        "hookfull",
        &["--criu", "--criu-hook", "--carrier", "host"],
        |output| {
            check_aborted(output, "the hook's watcher put the workload back");
        },
    );
}

/// The hook's dump with its default carrier (storage) on a disk that holds the carrier's files
/// (14 MiB) but not CRIU's images: the pre-dump succeeds, CRIU fails, and the watcher puts
/// the workload back from the carrier files, every byte verified (exit 3).
#[test]
fn a_failed_dump_under_the_hook_is_put_back_from_the_carrier_files() {
    let test = "a_failed_dump_under_the_hook_is_put_back_from_the_carrier_files";
    check_disk_of(
        test,
        "hookfiles",
        "24m",
        &["--criu", "--criu-hook"],
        |output| {
            check_aborted(output, "the hook's watcher put the workload back");
        },
    );
}

/// The hook's default carrier (storage, its files beside CRIU's images) on a full disk: the
/// pre-dump's save fails naming the carrier file, the capture is rolled back before anyone is
/// frozen, CRIU stops before it dumps anything, and the tree keeps running with every byte
/// and sharing link (exit 3), nothing left holding the disk.
#[test]
fn the_hooks_storage_carrier_on_a_full_disk_keeps_the_tree_running() {
    let test = "the_hooks_storage_carrier_on_a_full_disk_keeps_the_tree_running";
    check_full_disk(test, "hookstore", &["--criu", "--criu-hook"], |output| {
        let stderr = check_aborted(
            output,
            "the hook's pre-dump failed and left the workload running",
        );
        assert!(
            stderr.contains("carrier file ")
                && stderr.contains("/carrier/")
                && stderr.contains("No space left on device")
                && stderr.contains("nothing was changed"),
            "{stderr}"
        );
    });
}

/// CRIU's own CUDA plugin (built by `tests/setup/criu` next to CRIU) together with the hook:
/// at the dump the plugin finds every CUDA process already checkpointed by the hook and
/// leaves it; at the restore the plugin restores them natively and the hook's post-resume
/// rebuilds the sharing. Its `cuda-checkpoint` is fakecuda-checkpoint.
#[test]
fn the_hook_and_the_criu_cuda_plugin_cooperate() {
    let test = "the_hook_and_the_criu_cuda_plugin_cooperate";
    let Some((binary, plugins)) = criu::usable_with_cuda_plugin(test) else {
        return;
    };
    let output = demo()
        .args(["--criu", "--criu-hook", "--json", "--criu-binary"])
        .arg(&binary)
        .arg("--criu-plugins")
        .arg(&plugins)
        .output()
        .unwrap();
    let json: Value = cli::final_json(&check_success(&output));
    assert_eq!(json["verified"], true, "{json}");
    let topology = json["topology"].to_string();
    for cycle in [1, 2] {
        assert!(
            topology.contains(&format!(
                "criu cycle {cycle}: CRIU's CUDA plugin found 3 processes checkpointed by the \
                 hook and restored 3"
            )),
            "{topology}"
        );
    }
}

/// A sharing workload in a Podman container (runc), checkpointed and restored twice by
/// `podman container checkpoint` / `podman container restore` with nothing but CRIU's
/// configuration naming the hook (`tests/run` sets up Podman, `/etc/criu/runc.conf` and the
/// hook's settings file).
#[test]
fn podman_checkpoints_and_restores_a_sharing_container() {
    let test = "podman_checkpoints_and_restores_a_sharing_container";
    let podman = Command::new("podman").arg("--version").output();
    if !podman.is_ok_and(|out| out.status.success()) {
        return unavailable(test, "podman is not installed (tests/run installs it)");
    }
    let output = demo().args(["--podman", "--json"]).output().unwrap();
    if !output.status.success() && String::from_utf8_lossy(&output.stderr).contains("must name") {
        return unavailable(
            test,
            &format!(
                "the CRIU or hook configuration is missing: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        );
    }
    let json: Value = cli::final_json(&check_success(&output));
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(json["sharing_checks"], 3, "{json}");
    let topology = json["topology"].to_string();
    for cycle in [1, 2] {
        for expected in [
            "the hook's pre-dump: the sharing was taken apart and every CUDA process \
             checkpointed natively",
            "the hook's post-resume: the sharing was rebuilt and verified",
            "the shared bytes went to 3 carrier files (14680064 bytes) beside CRIU's images",
        ] {
            assert!(
                topology.contains(&format!("podman cycle {cycle}: {expected}")),
                "{topology}"
            );
        }
    }
    assert_eq!(
        json["report"]["participants"].as_array().map(Vec::len),
        Some(3)
    );
}
