//! Restore onto other GPUs through CRIU: two workers of one PID namespace share a VMM
//! allocation across their devices 0 and 1 and form a multicast team of both; `cuinterpose
//! checkpoint --criu` dumps the tree (which ends it) on the default machine (two H200s), and
//! `cuinterpose restore --criu --device-map auto` brings it back on "node-b", a machine with
//! four H200s of other UUIDs. The restored processes see their ordinals on node-b's first two
//! GPUs, the bytes are back at their addresses, and the sharing and the team are live.

mod support;

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::{fakecuda_gpu, fakecuda_lib_dir, slack};
use cuinterpose_workload::Worker;
use serde_json::Value;
use support::cli::{self, check_exit, path};
use support::criu;

const MIB: u64 = 1 << 20;
const GRAN: u64 = 2 * MIB;

/// `cuinterpose ARGS` on the machine `env` describes; exits 0.
fn cuinterpose(work: &Path, env: &[(&str, &str)], args: &[&str]) -> Value {
    let (stdout, _) = check_exit(&run(work, env, args), 0);
    cli::final_json(&stdout)
}

/// The root CRIU restored from `images` (the namespace's init, as CRIU wrote it).
fn restored_root(images: &str) -> u32 {
    let pidfile = Path::new(images).join("criu/restore.pid");
    std::fs::read_to_string(&pidfile)
        .expect("restore.pid")
        .trim()
        .parse()
        .expect("a pid")
}

fn run(work: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    cli::command(args)
        .arg("--json")
        .env("CUINTERPOSE_CONTROL_DIR", work.join("control"))
        .env("FAKECUDA_CONTROL_DIR", work.join("fakecuda"))
        .env(
            "CUINTERPOSE_DRIVER",
            fakecuda_lib_dir().join("libcuda.so.1"),
        )
        .env_remove("FAKECUDA_DEVICES")
        .env_remove("FAKECUDA_MACHINE")
        .envs(env.iter().copied())
        .output()
        .expect("run cuinterpose")
}

/// What [`Tree::shared`] starts: CRIU, the work directory, the tree, its workers and the
/// addresses of their shared memory.
type Shared = (std::path::PathBuf, TempDir, Tree, Vec<Worker>, (u64, u64));

/// Two workers of one PID namespace under the shim, the first on its device 0, the second on
/// its device 1, with nothing connected to them once this returns.
struct Tree {
    unshare: std::process::Child,
    root: u32,
    sockets: Vec<std::path::PathBuf>,
    reaper: criu::Reaper,
}

impl Tree {
    fn start(dir: &Path) -> Tree {
        let (unshare, root, sockets) = criu::listening_tree(dir, 2, true);
        let reaper = criu::Reaper(vec![unshare.id(), root]);
        Tree {
            unshare,
            root,
            sockets,
            reaper,
        }
    }

    fn connect(&self) -> Vec<Worker> {
        self.sockets
            .iter()
            .map(|s| Worker::connect(s, slack(Duration::from_secs(30))).expect("connect"))
            .collect()
    }

    /// For test `test`: CRIU, a work directory named after the test, and there a tree whose
    /// workers share 4 MiB from `seed` ([`Tree::share`]); `None` after saying why CRIU cannot
    /// run.
    fn shared(test: &str, seed: u64) -> Option<Shared> {
        let binary = criu::usable(test)?;
        let work = TempDir::new(test).expect("work dir");
        let tree = Tree::start(work.path());
        let mut w = tree.connect();
        let addresses = Tree::share(&mut w, seed);
        Some((binary, work, tree, w, addresses))
    }

    /// Worker 0 creates 4 MiB filled from `seed` and worker 1 maps it on its device 1; the
    /// two addresses.
    fn share(w: &mut [Worker], seed: u64) -> (u64, u64) {
        w[0].init(0).expect("cuInit");
        w[1].init(1).expect("cuInit on device 1");
        let shared = w[0].create(4 * MIB, 0, 1).expect("create");
        let va = w[0].map_rw(shared, 4 * MIB, 0).expect("map");
        w[0].fill(va, 4 * MIB, seed).expect("fill");
        let ticket = w[0].export(shared).expect("export");
        let imported = w[1].import(ticket.as_fd()).expect("import");
        let vb = w[1].map_rw(imported, 4 * MIB, 1).expect("map on device 1");
        (va, vb)
    }
}

/// Every participant `inspect` finds sees its ordinals 0 and 1 on node-b's GPUs 0 and 1.
fn check_on_node_b(dir: &Path) {
    let inspection = cuinterpose(dir, &[], &["inspect"]);
    let want: Vec<Value> = (0..2)
        .map(|i| Value::String(fakecuda_gpu("node-b", i)))
        .collect();
    for (pid, participant) in inspection["participants"]
        .as_object()
        .expect("participants")
    {
        let seen: Vec<Value> = participant["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["uuid"].clone())
            .collect();
        assert_eq!(seen, want, "participant {pid}: {inspection}");
    }
}

#[test]
fn a_criu_image_is_restored_onto_another_machine() {
    let test = "a_criu_image_is_restored_onto_another_machine";
    let Some((binary, work, mut tree, mut w, (va, vb))) = Tree::shared(test, 31) else {
        return;
    };
    let dir = work.path();
    // A multicast team of device 0 (worker 0) and device 1 (worker 1), a member each.
    let mc = w[0].mc_create(2, GRAN, 1).expect("multicast");
    let ticket = w[0].export(mc).expect("export multicast");
    let mc_b = w[1].import(ticket.as_fd()).expect("import multicast");
    drop(ticket);
    w[0].mc_add_device(mc, 0).expect("add device 0");
    w[1].mc_add_device(mc_b, 1).expect("add device 1");
    let ha = w[0].create(GRAN, 0, 1).expect("member a");
    let pa = w[0].map_rw(ha, GRAN, 0).expect("map member a");
    w[0].fill(pa, GRAN, 32).expect("fill member a");
    w[0].mc_bind_mem(mc, 0, ha, 0, GRAN, Some(0))
        .expect("bind a");
    let hb = w[1].create(GRAN, 1, 1).expect("member b");
    let pb = w[1].map_rw(hb, GRAN, 1).expect("map member b");
    w[1].fill(pb, GRAN, 32).expect("fill member b");
    w[1].mc_bind_mem(mc_b, 0, hb, 0, GRAN, None)
        .expect("bind b");
    let view = w[0].map_rw(mc, GRAN, 0).expect("map multicast");
    // Nothing outside the tree stays connected to it during a dump.
    drop(w);

    let images = dir.join("checkpoint");
    let images = path(&images);
    let criu = binary.to_str().expect("a UTF-8 CRIU path");
    let root_arg = tree.root.to_string();
    let taken = cuinterpose(
        dir,
        &[],
        &criu::args(&["checkpoint", "--pid", &root_arg], criu, images, &[]),
    );
    assert_eq!(taken["command"], "checkpoint", "{taken}");
    let _ = tree.unshare.wait();

    // A map this machine cannot honour is refused before CRIU brings anything back.
    let refused = run(
        dir,
        &[],
        &criu::args(&["restore"], criu, images, &["--device-map", "0=0"]),
    );
    let (_, stderr) = check_exit(&refused, 1);
    assert!(
        stderr.contains("device map refused, nothing was changed")
            && stderr.contains("has no pair"),
        "{stderr}"
    );
    assert!(
        !Path::new(images).join("criu/restore.pid").exists(),
        "CRIU did not run"
    );

    let node_b = [("FAKECUDA_DEVICES", "4"), ("FAKECUDA_MACHINE", "node-b")];
    let restored = cuinterpose(
        dir,
        &node_b,
        &criu::args(&["restore"], criu, images, &["--device-map", "auto"]),
    );
    assert_eq!(restored["command"], "restore", "{restored}");
    let root = restored_root(images);
    tree.reaper.0 = vec![root];

    check_on_node_b(dir);
    let mut w = tree.connect();
    w[0].verify(va, 4 * MIB, 31).expect("creator's bytes");
    w[1].verify(vb, 4 * MIB, 31)
        .expect("importer's bytes on its device 1");
    w[0].verify(view, GRAN, 32).expect("the multicast view");
    w[1].fill(vb + MIB, MIB, 33)
        .expect("write through the importer");
    w[0].verify(va + MIB, MIB, 33).expect("seen by the creator");
    drop(w);

    // `toggle --criu` with a map node-b cannot honour (its GPU 1 unpaired): the dump happened,
    // so the tree comes back on its own GPUs (exit 3), bytes and sharing intact.
    let again = dir.join("toggle");
    let again = path(&again);
    let root_arg = root.to_string();
    let aborted = run(
        dir,
        &node_b,
        &criu::args(
            &["toggle", "--pid", &root_arg],
            criu,
            again,
            &["--device-map", "0=0"],
        ),
    );
    let (_, stderr) = check_exit(&aborted, 3);
    assert!(
        stderr.contains("ABORTED") && stderr.contains("has no pair"),
        "{stderr}"
    );
    tree.reaper.0 = vec![restored_root(again)];
    let mut w = tree.connect();
    w[0].verify(va, MIB, 31)
        .expect("creator's bytes after the aborted toggle");
    w[1].verify(vb + MIB, MIB, 33)
        .expect("importer's bytes after the aborted toggle");
    w[0].fill(va + 2 * MIB, MIB, 34)
        .expect("write through the creator");
    w[1].verify(vb + 2 * MIB, MIB, 34).expect("still shared");
}

/// Plain `criu dump` and `criu restore`, configured with the hook as CRIU's action script and
/// no CUDA plugin, onto another machine: `CUINTERPOSE_DEVICE_MAP` is the hook's
/// `--device-map`. A map node-b cannot honour stops CRIU at pre-restore, before any process
/// exists; `auto` brings the tree back on node-b's GPUs with bytes and sharing intact.
#[test]
fn plain_criu_with_the_hook_restores_onto_another_machine() {
    let test = "plain_criu_with_the_hook_restores_onto_another_machine";
    let Some((binary, work, mut tree, w, (va, vb))) = Tree::shared(test, 41) else {
        return;
    };
    let dir = work.path();
    drop(w);

    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let config = dir.join("criu.conf");
    std::fs::write(
        &config,
        format!("action-script {}\n", env!("CARGO_BIN_EXE_cuinterpose")),
    )
    .unwrap();
    let driver = fakecuda_lib_dir().join("libcuda.so.1");
    let criu = |args: &[&str], log: &str, env: &[(&str, &str)]| {
        std::process::Command::new(&binary)
            .args(args)
            .arg("-D")
            .arg(&images)
            .arg("-o")
            .arg(images.join(log))
            .args(["-v4", "--config"])
            .arg(&config)
            .env("CUINTERPOSE_CONTROL_DIR", dir.join("control"))
            .env("FAKECUDA_CONTROL_DIR", dir.join("fakecuda"))
            .env("CUINTERPOSE_DRIVER", &driver)
            .env_remove("FAKECUDA_DEVICES")
            .env_remove("FAKECUDA_MACHINE")
            .env_remove("CUINTERPOSE_DEVICE_MAP")
            .envs(env.iter().copied())
            .output()
            .expect("run criu")
    };
    let status = || -> Vec<Value> {
        std::fs::read_to_string(images.join("cuinterpose-hook.status"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON status line"))
            .collect()
    };

    let root_arg = tree.root.to_string();
    let dumped = criu(&["dump", "-t", &root_arg], "dump.log", &[]);
    assert!(
        dumped.status.success(),
        "criu dump: {dumped:?}\nhook status: {:?}\ndump log (tail):\n{}",
        status(),
        criu::log_tail(&images.join("dump.log"))
    );
    let _ = tree.unshare.wait();

    let node_b = [("FAKECUDA_DEVICES", "4"), ("FAKECUDA_MACHINE", "node-b")];
    let pidfile = images.join("restore.pid");
    let pidfile_arg = path(&pidfile);
    let restore = ["restore", "-d", "--pidfile", pidfile_arg];
    // Old GPU 1 unpaired: refused at pre-restore, so CRIU creates no process.
    let refused = criu(
        &restore,
        "refused.log",
        &[node_b[0], node_b[1], ("CUINTERPOSE_DEVICE_MAP", "0=0")],
    );
    assert!(!refused.status.success(), "criu restore: {refused:?}");
    assert!(!pidfile.exists(), "CRIU restored nothing");
    let said = status();
    let pre = said
        .iter()
        .rfind(|l| l["action"] == "pre-restore")
        .expect("a pre-restore line");
    assert_eq!(pre["status"], "failed", "{said:?}");
    assert!(pre["message"].to_string().contains("has no pair"), "{pre}");
    // A map that does not parse is named with its variable.
    let malformed = criu(
        &restore,
        "malformed.log",
        &[("CUINTERPOSE_DEVICE_MAP", "0:1")],
    );
    assert!(!malformed.status.success());
    let log = std::fs::read_to_string(images.join("malformed.log")).unwrap_or_default()
        + &cli::text(&malformed.stderr);
    assert!(
        log.contains("CUINTERPOSE_DEVICE_MAP=\"0:1\"") && log.contains("is not OLD=NEW"),
        "{log}"
    );
    assert!(!pidfile.exists(), "CRIU restored nothing");

    let restored = criu(
        &restore,
        "restore.log",
        &[node_b[0], node_b[1], ("CUINTERPOSE_DEVICE_MAP", "auto")],
    );
    assert!(restored.status.success(), "criu restore: {restored:?}");
    let root: u32 = std::fs::read_to_string(&pidfile)
        .expect("restore.pid")
        .trim()
        .parse()
        .expect("a pid");
    tree.reaper.0 = vec![root];
    let said = status();
    assert!(
        said.iter()
            .any(|l| l["action"] == "post-resume" && l["status"] == "ok"),
        "{said:?}"
    );
    check_on_node_b(dir);
    let mut w = tree.connect();
    w[0].verify(va, 4 * MIB, 41).expect("creator's bytes");
    w[1].verify(vb, 4 * MIB, 41).expect("importer's bytes");
    w[1].fill(vb, MIB, 42).expect("write through the importer");
    w[0].verify(va, MIB, 42).expect("seen by the creator");
}
