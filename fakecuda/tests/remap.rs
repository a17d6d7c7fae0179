//! Devices by identity and native restore onto other GPUs: machines of named models,
//! `CUDA_VISIBLE_DEVICES`, and `gpuPairs` honoured (and refused as the driver refuses) through
//! `fakecuda-checkpoint --device-map`, whose environment is the machine it restores onto.

mod support;
use support::*;

/// The machine every case starts on: two H200s, an A100, and a third H200.
const MACHINE: &str = "H200,H200,A100,H200";
/// The child sees machine devices 1 and 3 as its ordinals 0 and 1.
const VISIBLE: &str = "1,3";
const SIZE: usize = 2 * GRAN;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("remap-target", target)]);
}

/// Child: an allocation with known bytes on each of its two ordinals, then commands.
fn target() {
    let cu = cuda();
    cu.setup(0);
    let mut count = 0;
    ok(cu.cuDeviceGetCount(&mut count));
    assert_eq!(count, 2, "CUDA_VISIBLE_DEVICES={VISIBLE} shows two devices");
    let views: Vec<u64> = (0..2)
        .map(|dev| {
            cu.setup(dev);
            let h = cu.create(SIZE, dev, POSIX_FD);
            let p = cu.map_rw(h, SIZE, dev);
            cu.write(p, &pattern(dev as u8 + 40, SIZE));
            p
        })
        .collect();
    say("READY", "");
    loop {
        match hear().as_str() {
            "uuids" => {
                let uuids: Vec<String> = (0..2)
                    .map(|dev| {
                        let mut u = [0u8; 16];
                        ok(cu.cuDeviceGetUuid_v2(&mut u, dev));
                        u.iter().map(|b| format!("{b:02x}")).collect()
                    })
                    .collect();
                say("UUIDS", uuids.join(" "));
            }
            "verify" => {
                let same = (0..2).all(|dev| {
                    cu.setup(dev as i32);
                    cu.read(views[dev], SIZE) == pattern(dev as u8 + 40, SIZE)
                });
                say("VERIFY", u8::from(same));
            }
            _ => break,
        }
    }
}

/// `GPU-…` of machine `name`'s device `index`, as fakecuda makes them.
fn uuid(name: &str, index: u32) -> String {
    cuinterpose_testkit::fakecuda_gpu(name, index)
}

fn bare(uuid: &str) -> String {
    uuid.trim_start_matches("GPU-").replace('-', "")
}

/// `fakecuda-checkpoint ARGS` on machine `devices` named `name`.
fn cli(devices: &str, name: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fakecuda-checkpoint"))
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FAKECUDA_DEVICES", devices)
        .env("FAKECUDA_MACHINE", name)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .expect("run fakecuda-checkpoint")
}

struct Case {
    child: Child,
    pid: String,
}

impl Case {
    fn start() -> Case {
        lib_dir();
        let mut cmd = role_command("remap-target");
        cmd.env("FAKECUDA_DEVICES", MACHINE)
            .env("CUDA_VISIBLE_DEVICES", VISIBLE)
            .env_remove("FAKECUDA_MACHINE");
        let child = Child::spawn(cmd);
        child.expect("READY", 30);
        let pid = child.pid().to_string();
        let case = Case { child, pid };
        let out = cli(MACHINE, "", &["--toggle", "--pid", &case.pid]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        case
    }

    /// A restore on machine `devices` named `name` with `map`; its stderr when it fails.
    fn restore(&self, devices: &str, name: &str, map: &[(String, String)]) -> Result<(), String> {
        let map: Vec<String> = map.iter().map(|(o, n)| format!("{o}={n}")).collect();
        let map = map.join(",");
        let mut args = vec!["--toggle", "--pid", &self.pid];
        if !map.is_empty() {
            args.extend(["--device-map", &map]);
        }
        let out = cli(devices, name, &args);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn state(&self) -> String {
        let out = cli(MACHINE, "", &["--get-state", "--pid", &self.pid]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn uuids(&mut self) -> Vec<String> {
        self.child.send("uuids");
        let line = self.child.expect("UUIDS", 30);
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn verify(&mut self) {
        self.child.send("verify");
        assert_eq!(
            self.child.expect("VERIFY", 30),
            "1",
            "bytes survive the restore"
        );
    }

    /// `restore` is refused with `error`, and the process stays checkpointed.
    fn refused(&self, devices: &str, name: &str, map: &[(String, String)], error: &str) {
        let err = self
            .restore(devices, name, map)
            .expect_err("the restore should be refused");
        assert!(err.contains(error), "expected {error}: {err}");
        assert_eq!(self.state(), "checkpointed", "a refusal changes nothing");
    }
}

fn pair(old: (&str, u32), new: (&str, u32)) -> (String, String) {
    (uuid(old.0, old.1), uuid(new.0, new.1))
}

#[test]
fn visible_devices_are_the_process_ordinals() {
    let mut case = Case::start();
    case.restore(MACHINE, "", &[]).expect("restore in place");
    assert_eq!(case.uuids(), [bare(&uuid("", 1)), bare(&uuid("", 3))]);
    case.verify();
}

#[test]
fn pairs_swap_the_devices_behind_the_ordinals() {
    let mut case = Case::start();
    let swap = [pair(("", 1), ("", 3)), pair(("", 3), ("", 1))];
    case.restore(MACHINE, "", &swap).expect("restore swapped");
    assert_eq!(case.uuids(), [bare(&uuid("", 3)), bare(&uuid("", 1))]);
    case.verify();
}

#[test]
fn another_machine_needs_pairs_onto_its_own_devices() {
    let mut case = Case::start();
    let other = "H200,H200,H200,H200,H200";
    case.refused(other, "node-b", &[], "CUDA_ERROR_INVALID_DEVICE");
    let onto = [pair(("", 1), ("node-b", 4)), pair(("", 3), ("node-b", 0))];
    case.restore(other, "node-b", &onto)
        .expect("restore on node-b");
    assert_eq!(
        case.uuids(),
        [bare(&uuid("node-b", 4)), bare(&uuid("node-b", 0))]
    );
    case.verify();
}

#[test]
fn bad_pairs_are_refused_and_leave_the_process_checkpointed() {
    let mut case = Case::start();
    // One device unpaired.
    case.refused(
        MACHINE,
        "",
        &[pair(("", 1), ("", 0))],
        "CUDA_ERROR_INVALID_VALUE",
    );
    // Two onto one.
    let two = [pair(("", 1), ("", 0)), pair(("", 3), ("", 0))];
    case.refused(MACHINE, "", &two, "CUDA_ERROR_INVALID_VALUE");
    // Another chip.
    let chip = [pair(("", 1), ("", 2)), pair(("", 3), ("", 0))];
    case.refused(MACHINE, "", &chip, "CUDA_ERROR_INVALID_DEVICE");
    // A device not on the machine.
    let gone = [pair(("", 1), ("", 7)), pair(("", 3), ("", 0))];
    case.refused(MACHINE, "", &gone, "CUDA_ERROR_INVALID_DEVICE");
    // Too little memory for what the device held (one allocation of 4 MiB).
    let small = "H200:2,H200:2,A100,H200:2";
    let fit = [pair(("", 1), ("", 0)), pair(("", 3), ("", 1))];
    case.refused(small, "", &fit, "CUDA_ERROR_OUT_OF_MEMORY");
    // A malformed map never reaches the process.
    let out = cli(
        MACHINE,
        "",
        &["--toggle", "--pid", &case.pid, "--device-map", "GPU-12=x"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a GPU UUID"));
    assert_eq!(case.state(), "checkpointed");
    // And then a good one works.
    case.restore(MACHINE, "", &fit)
        .expect("restore onto 0 and 1");
    assert_eq!(case.uuids(), [bare(&uuid("", 0)), bare(&uuid("", 1))]);
    case.verify();
}
