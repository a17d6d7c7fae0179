//! `cuinterpose` as CRIU's action script, run the way CRIU runs it (no arguments, the action
//! in the environment): what each action does without a workload, and the errors for
//! environments CRIU would never set up, and CRIU's CUDA plugin checkpointing a workload without
//! sharing on its own. The hook with a sharing workload under plain CRIU is tested through the
//! demo (`tests/demo.rs`).

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::slack;
use cuinterpose_workload::Worker;
use serde_json::Value;
use support::cli::{check_exit, path, text};
use support::criu;

/// `cuinterpose` with no arguments and `vars` as CRIU sets them.
fn hook(vars: &[(&str, &str)], control: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .env_remove("CRTOOLS_IMAGE_DIR")
        .env_remove("CRTOOLS_INIT_PID")
        .env("CUINTERPOSE_CONTROL_DIR", control)
        .env("CUINTERPOSE_DRIVER", "/nonexistent/libcuda.so.1")
        .envs(vars.iter().copied())
        .output()
        .expect("run cuinterpose")
}

fn status(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("cuinterpose-hook.status"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// One action: exits with `code`, says `expected` on stderr and records `recorded` as its
/// status in the image directory.
fn check(action: &str, images: &Path, pid: &str, code: i32, expected: &str, recorded: &str) {
    let control = TempDir::new("ctl").expect("control dir");
    let output = hook(
        &[
            ("CRTOOLS_SCRIPT_ACTION", action),
            ("CRTOOLS_IMAGE_DIR", path(images)),
            ("CRTOOLS_INIT_PID", pid),
        ],
        control.path(),
    );
    let (_, stderr) = check_exit(&output, code);
    assert!(
        stderr.contains(&format!("cuinterpose criu-hook: {action}: ")) && stderr.contains(expected),
        "{action}: {stderr}"
    );
    let last = status(images).pop().expect("a status line");
    assert_eq!(last["action"], action, "{last}");
    assert_eq!(last["status"], recorded, "{last}");
}

#[test]
fn without_participants_every_action_does_nothing() {
    let images = TempDir::new("images").expect("images");
    let me = std::process::id().to_string();
    check(
        "pre-dump",
        images.path(),
        &me,
        0,
        "no cuinterpose participant in the tree of",
        "skipped",
    );
    check(
        "post-dump",
        images.path(),
        &me,
        0,
        "the dump completed",
        "ok",
    );
    for action in ["pre-restore", "pre-resume"] {
        check(
            action,
            images.path(),
            &me,
            0,
            "no cuinterpose state in these images",
            "skipped",
        );
    }
    check(
        "network-lock",
        images.path(),
        &me,
        0,
        "nothing to do at network-lock",
        "skipped",
    );
    assert!(
        !images.path().join("cuinterpose.state").exists(),
        "nothing was prepared"
    );
}

#[test]
fn pre_restore_refuses_a_missing_or_corrupt_state() {
    let me = std::process::id().to_string();
    let images = TempDir::new("images").expect("images");
    std::fs::write(images.path().join("cuinterpose.processes"), "{}").unwrap();
    check(
        "pre-restore",
        images.path(),
        &me,
        1,
        "no checkpoint state here",
        "failed",
    );
    std::fs::write(images.path().join("cuinterpose.state"), b"not a state").unwrap();
    check(
        "pre-restore",
        images.path(),
        &me,
        1,
        "corrupt checkpoint state",
        "failed",
    );
}

#[test]
fn environments_criu_never_sets_up_are_named() {
    let control = TempDir::new("ctl").expect("control dir");
    // Not run by CRIU at all.
    let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .arg("criu-hook")
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .output()
        .unwrap();
    let (_, stderr) = check_exit(&output, 64);
    assert!(
        stderr.contains("CRTOOLS_SCRIPT_ACTION is not set") && stderr.contains("action-script"),
        "{stderr}"
    );
    // Without arguments and without CRIU: the usual usage message.
    let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    let images = TempDir::new("images").expect("images");
    for (vars, expected) in [
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "pre-dump"),
                ("CRTOOLS_INIT_PID", "abc"),
            ],
            "CRTOOLS_INIT_PID is \"abc\": not a process ID",
        ),
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "pre-dump"),
                ("CRTOOLS_IMAGE_DIR", "/nonexistent/images"),
            ],
            "CRTOOLS_IMAGE_DIR is \"/nonexistent/images\": not a directory this process can reach",
        ),
        (
            vec![
                ("CRTOOLS_SCRIPT_ACTION", "post-resume"),
                ("CRTOOLS_IMAGE_DIR", path(images.path())),
            ],
            "not a /proc/<criu pid>/fd/<n> path",
        ),
        (
            vec![("CRTOOLS_SCRIPT_ACTION", "pre-dump")],
            "CRTOOLS_IMAGE_DIR is \"\": not set",
        ),
    ] {
        let output = hook(&vars, control.path());
        let (_, stderr) = check_exit(&output, 64);
        assert!(stderr.contains(expected), "{vars:?}: {stderr}");
    }
}

/// A workload with no sharing (one CUDA process, no shim) under CRIU configured with the hook
/// and CRIU's CUDA plugin: the hook finds no participant and does nothing, the plugin alone
/// locks and checkpoints the process at the dump and restores it, and its device memory holds
/// the same bytes at the same address afterwards.
#[test]
fn a_workload_without_sharing_is_checkpointed_by_the_plugin_alone() {
    let test = "a_workload_without_sharing_is_checkpointed_by_the_plugin_alone";
    let Some((criu, plugins)) = criu::usable_with_cuda_plugin(test) else {
        return;
    };
    let lib = cuinterpose_testkit::fakecuda_lib_dir();
    let tool = cuinterpose_testkit::build_fakecuda_checkpoint();
    let work = TempDir::new("plugin-alone").expect("work dir");
    let dir = work.path();
    let bin = dir.join("bin");
    let images = dir.join("images");
    let control = dir.join("control");
    for d in [&bin, &images, &control] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(tool, bin.join("cuda-checkpoint")).unwrap();
    let driver = lib.join("libcuda.so.1");
    // CUDA without the shim: nothing for cuinterpose to take part in.
    let (unshare, root, sockets) = criu::listening_tree(dir, 1, false);
    let socket = &sockets[0];
    let mut reaper = criu::Reaper(vec![unshare.id(), root]);
    let (size, seed) = (3 << 20, 0x5eed);
    let mut cuda = Worker::connect(socket, slack(Duration::from_secs(30))).expect("connect");
    cuda.init(0).expect("init");
    let dptr = cuda.mem_alloc(size).expect("allocate");
    cuda.fill(dptr, size, seed).expect("fill");
    // Nothing outside the tree stays connected to it during the dump.
    drop(cuda);

    let config = dir.join("criu.conf");
    std::fs::write(
        &config,
        format!(
            "action-script {}\nlibdir {}\n",
            env!("CARGO_BIN_EXE_cuinterpose"),
            plugins.display()
        ),
    )
    .unwrap();
    let mut search = std::ffi::OsString::from(&bin);
    search.push(":");
    search.push(std::env::var_os("PATH").unwrap_or_default());
    let run = |args: &[&std::ffi::OsStr], log: &Path| {
        let output = Command::new(&criu)
            .args(args)
            .arg("-o")
            .arg(log)
            .args(["-v4", "--config"])
            .arg(&config)
            .env("PATH", &search)
            .env("CRIU_FAULT", "138") // the plugin looks for /proc/driver/nvidia/gpus/
            .env("FAKECUDA_LIBCUDA", &driver)
            .env("FAKECUDA_CONTROL_DIR", dir.join("fakecuda"))
            .env("CUINTERPOSE_CONTROL_DIR", &control)
            .env("CUINTERPOSE_DRIVER", &driver)
            .output()
            .expect("run criu");
        let logged = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            output.status.success(),
            "criu {args:?}: {}\n{}\nlog {}:\n{}",
            output.status,
            text(&output.stderr),
            log.display(),
            logged
                .lines()
                .filter(|l| l.contains("rror"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        logged
    };

    let root_arg = root.to_string();
    let dumped = run(
        &[
            "dump".as_ref(),
            "-t".as_ref(),
            root_arg.as_ref(),
            "-D".as_ref(),
            images.as_os_str(),
        ],
        &images.join("dump.log"),
    );
    let mut unshare = unshare;
    let _ = unshare.wait();
    // The plugin found the process running: it paused and checkpointed it itself.
    for said in [
        "cuda_plugin: pausing devices on pid",
        "cuda_plugin: Checkpointing CUDA devices on pid",
    ] {
        assert!(
            dumped.contains(said),
            "no {said:?} in the dump log:\n{dumped}"
        );
    }
    assert!(
        !dumped.contains("already in a checkpointed state"),
        "{dumped}"
    );
    let said = status(&images);
    assert!(
        said.iter().any(|l| l["action"] == "pre-dump"
            && l["status"] == "skipped"
            && l["message"]
                .as_str()
                .unwrap_or("")
                .contains("no cuinterpose participant")),
        "{said:?}"
    );
    assert!(
        !images.join("cuinterpose.state").exists(),
        "the hook prepared nothing"
    );

    let pidfile = images.join("restore.pid");
    let restored = run(
        &[
            "restore".as_ref(),
            "-D".as_ref(),
            images.as_os_str(),
            "-d".as_ref(),
            "--pidfile".as_ref(),
            pidfile.as_os_str(),
        ],
        &images.join("restore.log"),
    );
    let root: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    reaper.0 = vec![root];
    assert!(
        restored.contains("cuda_plugin: resuming devices on pid"),
        "{restored}"
    );
    let said = status(&images);
    assert!(
        said.iter().any(|l| l["action"] == "post-resume"
            && l["status"] == "skipped"
            && l["message"] == "no cuinterpose state in these images"),
        "{said:?}"
    );
    let mut cuda = Worker::connect(socket, slack(Duration::from_secs(30))).expect("reconnect");
    cuda.verify(dptr, size, seed)
        .expect("the same bytes at the same address");
    // And it runs on.
    let more = cuda.mem_alloc(size).expect("allocate after restore");
    cuda.fill(more, size, seed + 1).expect("fill after restore");
    cuda.verify(more, size, seed + 1)
        .expect("verify after restore");
}
