//! Restore onto other GPUs (`--device-map`) over the real shim and fakecuda: the workload of
//! `build_with` (VMM sharing, legacy IPC, a multicast team of two devices) moved onto other
//! GPUs of the same machine by `toggle`, and onto another machine (more GPUs, other UUIDs) by
//! `checkpoint` then `restore`; a map onto another model or an incomplete one refused with
//! nothing changed. Afterwards each participant sees its ordinals on the new GPUs (`inspect`),
//! and the bytes, addresses and sharing are those of before.

use std::os::fd::AsFd;
use std::process::Output;

use cuinterpose_testkit::fakecuda_gpu;
use serde_json::Value;

use super::support::cli::{self, check_contains, check_exit};
use super::support::sandbox::Sandbox;
use super::{SHARED, Workload, build_with, check_restored, root};

/// The shared allocation filled with `seed` again (a check's cross writes changed it).
fn refill(workload: &mut Workload, seed: u64) {
    let address = workload.shared[0];
    workload.workers[0]
        .fill(address, SHARED, seed)
        .expect("refill");
}

/// `cuinterpose ARGS` on the machine `env` describes (fakecuda's devices for its driver).
fn on_machine(sandbox: &Sandbox, env: &[(&str, &str)], args: &[&str]) -> Output {
    let root = sandbox.dir.path();
    let mut command = cli::command(args);
    command
        .env("CUINTERPOSE_DRIVER", sandbox.fakecuda.join("libcuda.so.1"))
        .env("CUINTERPOSE_CONTROL_DIR", Sandbox::control_dir(root))
        .env("FAKECUDA_CONTROL_DIR", Sandbox::fakecuda_control_dir(root))
        .env_remove("LD_PRELOAD")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("FAKECUDA_MACHINE");
    command.envs(env.iter().copied());
    command.output().expect("run cuinterpose")
}

/// `(ordinal, uuid)` pairs, as `inspect --json` shows them.
type Named = Vec<(i64, String)>;

/// Each participant's devices as `inspect --json` shows them, in participant order; and every
/// `(ordinal, uuid)` its records name.
fn devices(sandbox: &Sandbox) -> Vec<(Named, Named)> {
    let out = on_machine(sandbox, &[], &["inspect", "--json"]);
    let value: Value = cli::final_json(&String::from_utf8_lossy(&out.stdout));
    value["participants"]
        .as_object()
        .expect("participants")
        .values()
        .map(|p| {
            let listed = p["devices"]
                .as_array()
                .expect("devices")
                .iter()
                .map(|d| {
                    let ordinal = d["ordinal"].as_i64().expect("ordinal");
                    (ordinal, d["uuid"].as_str().expect("uuid").to_owned())
                })
                .collect();
            let mut named = Vec::new();
            named_devices(&p["records"], &mut named);
            (listed, named)
        })
        .collect()
}

/// The `(ordinal, uuid)` pairs a record's JSON names: device locations (`type`, `id`,
/// `uuid`), multicast devices (`device`, `uuid`), bindings and pools (`device`,
/// `device_uuid`).
fn named_devices(value: &Value, out: &mut Named) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| named_devices(v, out)),
        Value::Object(map) => {
            let uuid = map.get("uuid").or_else(|| map.get("device_uuid"));
            let ordinal = match map.get("type") {
                Some(kind) if kind == "device" => map.get("id"),
                Some(_) => None,
                None => map.get("device"),
            };
            if let (Some(ordinal), Some(uuid)) = (ordinal, uuid) {
                let uuid = uuid
                    .as_str()
                    .expect("a device record carries its GPU's UUID");
                out.push((ordinal.as_i64().expect("ordinal"), uuid.to_owned()));
            }
            map.values().for_each(|v| named_devices(v, out));
        }
        _ => {}
    }
}

/// Every participant sees ordinals 0 and 1 on machine `machine`'s GPUs `first` and `second`,
/// and its records name those GPUs beside the ordinals.
fn check_devices(sandbox: &Sandbox, machine: &str, first: u32, second: u32, when: &str) {
    let want = vec![
        (0, fakecuda_gpu(machine, first)),
        (1, fakecuda_gpu(machine, second)),
    ];
    let participants = devices(sandbox);
    assert_eq!(participants.len(), 3, "{when}");
    for (listed, named) in participants {
        assert_eq!(listed, want, "{when}");
        assert!(!named.is_empty(), "{when}: the records name devices");
        for pair in named {
            assert!(
                want.contains(&pair),
                "{when}: a record names {pair:?}, not one of {want:?}"
            );
        }
    }
}

/// Four H200s; the workers see machine GPUs 0 and 1. `toggle --device-map` moves them onto
/// 3 and 2 (the multicast team with them), `auto` keeps them there, an incomplete map is
/// refused and the workload resumes where it was.
pub fn a_toggle_moves_the_workload_onto_other_gpus(sandbox: &Sandbox) {
    let machine = [("FAKECUDA_DEVICES", "4")];
    let workers = [("FAKECUDA_DEVICES", "4"), ("CUDA_VISIBLE_DEVICES", "0,1")];
    let mut workload = build_with(sandbox, &workers, &[None, None, None]);
    check_devices(sandbox, "", 0, 1, "before");

    let toggle = |map: &str| {
        on_machine(
            sandbox,
            &machine,
            &["toggle", "--pid", &root(), "--device-map", map],
        )
    };
    check_exit(&toggle("0=3,1=2"), 0);
    check_devices(sandbox, "", 3, 2, "after 0=3,1=2");
    check_restored(&mut workload, 11);

    refill(&mut workload, 12);
    check_exit(&toggle("auto"), 0);
    check_devices(sandbox, "", 3, 2, "auto keeps GPUs that are still here");
    check_restored(&mut workload, 12);

    refill(&mut workload, 13);
    // Incomplete: the old GPU 1 (now machine GPU 2, which the state names by UUID) is unpaired.
    let gpu3 = fakecuda_gpu("", 3);
    let (_, stderr) = check_exit(&toggle(&format!("{gpu3}=0")), 3);
    assert!(
        stderr.contains("has no pair")
            && stderr.contains(&fakecuda_gpu("", 2))
            && stderr.contains("ABORTED"),
        "{stderr}"
    );
    check_devices(sandbox, "", 3, 2, "a refused map changes nothing");
    check_restored(&mut workload, 13);
}

/// Checkpointed on the default machine (two H200s), restored on "node-b" with four: a map
/// onto another model is refused with the processes still checkpointed; then one onto
/// node-b's GPUs 3 and 1, by UUID and by ordinal, restores them there.
pub fn a_checkpoint_is_restored_onto_another_machine(sandbox: &Sandbox) {
    let mut workload = build_with(sandbox, &[], &[None, None, None]);
    check_devices(sandbox, "", 0, 1, "before");
    let dir = sandbox.dir.path().join("remap-checkpoint");
    let dir = dir.to_str().expect("utf-8 path");
    check_exit(
        &on_machine(
            sandbox,
            &[],
            &["checkpoint", "--pid", &root(), "--dir", dir],
        ),
        0,
    );

    let other_model = [
        ("FAKECUDA_DEVICES", "A100,A100"),
        ("FAKECUDA_MACHINE", "node-c"),
    ];
    // Each map is refused, naming why.
    for (map, why) in [
        (
            "auto",
            [
                "device map refused, nothing was changed",
                "no GPU of model fakecuda H200",
            ],
        ),
        ("0=0,1=1", ["is a fakecuda H200 but", "is a fakecuda A100"]),
    ] {
        let restore = ["restore", "--dir", dir, "--device-map", map];
        let (_, stderr) = check_exit(&on_machine(sandbox, &other_model, &restore), 1);
        check_contains("stderr", &stderr, &why);
    }
    assert_eq!(
        cli::participant_phases(&on_machine(sandbox, &[], &["inspect", "--json"])),
        ["released"; 3],
        "refusals change nothing"
    );

    let node_b = [("FAKECUDA_DEVICES", "4"), ("FAKECUDA_MACHINE", "node-b")];
    let map = format!("{}={},1=1", fakecuda_gpu("", 0), fakecuda_gpu("node-b", 3));
    let out = on_machine(
        sandbox,
        &node_b,
        &["restore", "--dir", dir, "--device-map", &map, "--json"],
    );
    check_exit(&out, 0);
    check_devices(sandbox, "node-b", 3, 1, "restored on node-b");
    check_restored(&mut workload, 11);
}

/// `fakecuda-checkpoint --toggle --pid PID [ARGS]` on the default machine: what another tool
/// does to a process between `prepare` and `restore --checkpoint-dir`.
fn native_toggle(sandbox: &Sandbox, pid: i32, args: &[&str]) {
    cuinterpose_testkit::succeed(
        std::process::Command::new(cuinterpose_testkit::build_fakecuda_checkpoint())
            .args(["--toggle", "--pid", &pid.to_string()])
            .args(args)
            .env("LD_LIBRARY_PATH", &sandbox.fakecuda)
            .env(
                "FAKECUDA_CONTROL_DIR",
                Sandbox::fakecuda_control_dir(sandbox.dir.path()),
            )
            .env_remove("FAKECUDA_DEVICES")
            .env_remove("FAKECUDA_MACHINE")
            .env_remove("LD_PRELOAD"),
        &format!("fakecuda-checkpoint --toggle --pid {pid}"),
    );
}

/// `prepare`, then another tool restores every process natively with its GPUs swapped, then
/// `restore --checkpoint-dir --device-map` rebuilds the sharing on the swapped GPUs: the map
/// tells the final inspection where the processes went.
pub fn a_prepared_workload_restored_elsewhere_by_another_tool(sandbox: &Sandbox) {
    let mut workload = build_with(sandbox, &[], &[None, None, None]);
    let dir = sandbox.dir.path().join("remap-prepared");
    let dir = dir.to_str().expect("utf-8 path");
    check_exit(
        &on_machine(sandbox, &[], &["prepare", "--checkpoint-dir", dir]),
        0,
    );
    let swap = format!(
        "{}={},{}={}",
        fakecuda_gpu("", 0),
        fakecuda_gpu("", 1),
        fakecuda_gpu("", 1),
        fakecuda_gpu("", 0)
    );
    for worker in &workload.workers {
        let pid = worker.worker_pid();
        native_toggle(sandbox, pid, &[]);
        native_toggle(sandbox, pid, &["--device-map", &swap]);
    }
    let restore = |map: &[&str]| {
        let mut args = vec!["restore", "--checkpoint-dir", dir];
        args.extend(map);
        on_machine(sandbox, &[], &args)
    };
    // A map this machine cannot honour is refused before the restore starts.
    let (_, stderr) = check_exit(&restore(&["--device-map", "0=1"]), 1);
    assert!(stderr.contains("has no pair"), "{stderr}");
    check_exit(&restore(&["--device-map", "0=1,1=0"]), 0);
    check_devices(sandbox, "", 1, 0, "restored with the GPUs swapped");
    check_restored(&mut workload, 11);
}

/// The `(ordinal, uuid)` of the shared allocation's location in each participant's records,
/// in participant order.
fn allocation_locations(sandbox: &Sandbox) -> Vec<(i64, String)> {
    let out = on_machine(sandbox, &[], &["inspect", "--json"]);
    let value: Value = cli::final_json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(value["valid"], true, "{value}");
    value["participants"]
        .as_object()
        .expect("participants")
        .values()
        .flat_map(|p| p["records"].as_array().expect("records").clone())
        .filter(|r| r["kind"] == "allocation")
        .map(|r| {
            let location = &r["properties"]["location"];
            let uuid = location["uuid"]
                .as_str()
                .expect("a device location names its GPU");
            (location["id"].as_i64().expect("ordinal"), uuid.to_owned())
        })
        .collect()
}

/// Worker A sees the machine's GPUs as `0,1`, worker B as `1,0`: B imports A's memory on
/// machine GPU 0 as its own device 1. Both records name that GPU by UUID (under ordinals 0
/// and 1), the topology is valid, and a toggle keeps the bytes and the sharing.
pub fn processes_that_number_gpus_differently_share_one_gpu(sandbox: &Sandbox) {
    let mut a = super::worker(sandbox, 0, &[("CUDA_VISIBLE_DEVICES", "0,1")], None);
    let mut b = super::worker(sandbox, 1, &[("CUDA_VISIBLE_DEVICES", "1,0")], None);
    let shared = a.create(SHARED, 0, 1).expect("create on A's device 0");
    let va = a.map_rw(shared, SHARED, 0).expect("map in A");
    a.fill(va, SHARED, 21).expect("fill");
    let ticket = a.export(shared).expect("export");
    let hb = b.import(ticket.as_fd()).expect("import in B");
    drop(ticket);
    let vb = b.map_rw(hb, SHARED, 1).expect("map in B, on its device 1");
    b.verify(vb, SHARED, 21).expect("B sees A's bytes");

    let gpu0 = fakecuda_gpu("", 0);
    let want = vec![(0, gpu0.clone()), (1, gpu0)];
    assert_eq!(allocation_locations(sandbox), want, "before");
    check_exit(&on_machine(sandbox, &[], &["toggle", "--pid", &root()]), 0);
    assert_eq!(allocation_locations(sandbox), want, "after the toggle");
    a.verify(va, SHARED, 21)
        .expect("A's bytes after the toggle");
    b.fill(vb, SHARED, 22).expect("write through B");
    a.verify(va, SHARED, 22).expect("still shared");
}
