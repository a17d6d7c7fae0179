//! `demo --podman`: the workload in a Podman container, checkpointed and restored twice by
//! `podman container checkpoint` and `podman container restore`, with nothing but CRIU's
//! configuration naming the hook (`action-script` in `/etc/criu/runc.conf`, which runc hands
//! to CRIU). The demo runs no cuinterpose command between them.
//!
//! The container: a root directory of its own (the host's `/usr` bind-mounted read-only for
//! the shell and the libraries), the work directory and the directory of the binaries
//! bind-mounted at their own paths, so the worker sockets and the control directory have the
//! same path on both sides. The hook runs in the host's namespaces and reaches the control
//! directory through `/proc/<container init>/root`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::topology::Demo;
use super::types::{DemoError, DriverChoice, phase, setup};
use super::workers::{Artifacts, connect_all, tree_script, worker_binary, worker_env};
use crate::events::Event;
use crate::report::Report;

/// Dump and restore cycles.
pub const CYCLES: usize = 2;
/// Where runc-based engines read CRIU options from.
pub const RUNC_CONF: &str = "/etc/criu/runc.conf";

/// The demo's container, removed (with everything in it) when dropped.
pub(super) struct Container {
    pub name: String,
    env: Vec<(OsString, OsString)>,
    /// `--keep`: left in place (stopped) with its logs, for a look.
    keep: bool,
}

impl Container {
    fn podman(&self) -> Command {
        let mut command = Command::new("podman");
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    fn run(&self, args: &[&str], during: &str) -> Result<String, DemoError> {
        let output = self
            .podman()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| setup(format!("{during}: running podman: {e}")))?;
        if !output.status.success() {
            return Err(DemoError::Verification(format!(
                "{during}: podman {}: {}: {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl Container {
    /// Where Podman keeps the container's checkpoint (with `--keep`), the hook's image
    /// directory.
    fn checkpoint_dir(&self) -> Result<PathBuf, DemoError> {
        let dir = self.run(
            &["inspect", "--format", "{{.StaticDir}}", &self.name],
            "finding the container's directory",
        )?;
        Ok(PathBuf::from(dir).join("checkpoint"))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.keep {
            let _ = self
                .podman()
                .args(["stop", "--time", "0", &self.name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            return;
        }
        let _ = self
            .podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Refuses early, with what to do, when Podman or the CRIU configuration is missing.
fn check_setup() -> Result<(), DemoError> {
    let version = Command::new("podman").arg("--version").output();
    if !version.is_ok_and(|out| out.status.success()) {
        return Err(setup(
            "podman is not installed (apt-get install podman runc)",
        ));
    }
    let conf = std::fs::read_to_string(RUNC_CONF).unwrap_or_default();
    let exe = std::env::current_exe().map_err(|e| setup(format!("this executable: {e}")))?;
    let named = conf.lines().any(|line| {
        line.trim()
            .strip_prefix("action-script")
            .is_some_and(|rest| Path::new(rest.trim()) == exe)
    });
    if !named {
        return Err(setup(format!(
            "{RUNC_CONF} must name this executable as CRIU's action script: add the line \
             `action-script {}`",
            exe.display()
        )));
    }
    // Podman starts runc (and so CRIU and the hook) with an environment of its own: the hook
    // learns the driver from its settings file.
    let fakecuda = exe.with_file_name("libcuda.so");
    let settings =
        crate::hook::settings::read(Path::new(crate::hook::settings::SETTINGS_FILE), false)
            .unwrap_or_default();
    let driver_named = settings.iter().any(|(name, value)| {
        name == crate::native::DRIVER_VARIABLE && Path::new(value) == fakecuda
    });
    if !driver_named {
        return Err(setup(format!(
            "{} must name the embedded driver for the hook: add the line `{}={}`",
            crate::hook::settings::SETTINGS_FILE,
            crate::native::DRIVER_VARIABLE,
            fakecuda.display()
        )));
    }
    Ok(())
}

/// Starts the workers in a container; returns it and the worker sockets.
pub(super) fn start(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
    driver_path: &Path,
    n: usize,
    keep: bool,
    carriage: crate::plan::Carriage,
) -> Result<(Container, Vec<PathBuf>), DemoError> {
    check_setup()?;
    let rootfs = work.join("rootfs");
    for dir in ["usr", "tmp", "proc", "dev", "sys", "etc"] {
        std::fs::create_dir_all(rootfs.join(dir))
            .map_err(|e| setup(format!("creating the container's root: {e}")))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        std::os::unix::fs::symlink(target, rootfs.join(link))
            .map_err(|e| setup(format!("creating the container's root: {e}")))?;
    }
    let (sockets, script) = tree_script(work, driver, n);
    let binaries = worker_binary(artifacts)
        .parent()
        .ok_or_else(|| setup("the worker binary has no directory"))?
        .to_path_buf();
    let name = format!("cuinterpose-demo-{}", std::process::id());
    let mount = |dir: &Path, mode: &str| format!("{0}:{0}{mode}", dir.display());
    // Podman's own environment (runc, and so CRIU and the hook, start with one of their own:
    // the hook finds its settings in its settings file and the workload's processes).
    let env: Vec<(OsString, OsString)> = super::hook::hook_environment(work, driver_path, carriage);
    let container = Container { name, env, keep };
    let mut args: Vec<String> = [
        "--runtime",
        "runc",
        "run",
        "--detach",
        "--name",
        &container.name,
        // The host's network namespace: the workers' sockets are reached from the host, and
        // CRIU finds a unix socket's peer only within one network namespace.
        "--network",
        "host",
        "--volume",
        "/usr:/usr:ro",
        "--volume",
        &mount(work, ""),
        "--volume",
        &mount(&binaries, ":ro"),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    // The carrier the hook uses, as the workload's processes declare it.
    for (key, value) in super::hook::carrier_environment(carriage) {
        args.push("--env".into());
        args.push(format!("{key}={value}"));
    }
    for (key, value) in worker_env(artifacts, work, driver) {
        args.push("--env".into());
        args.push(format!(
            "{}={}",
            key.to_string_lossy(),
            value.to_string_lossy()
        ));
    }
    args.extend([
        "--rootfs".into(),
        rootfs.display().to_string(),
        "/bin/sh".into(),
        "-c".into(),
        script,
        worker_binary(artifacts).display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    container.run(&args, "starting the container")?;
    Ok((container, sockets))
}

/// Checkpoints and restores the container [`CYCLES`] times, verifying every byte after each
/// restore but the last (the demo verifies that one, sharing included).
pub(super) fn cycles(
    demo: &mut Demo,
    container: &Container,
    sockets: &[PathBuf],
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, DemoError> {
    let n = sockets.len();
    let mut report = Report::new("demo --podman");
    let mut step = |report: &mut Report, name: String, args: &[&str]| {
        let during = name.clone();
        phase(name, n, report, progress, || container.run(args, &during))
    };
    let images = container.checkpoint_dir()?;
    for cycle in 1..=CYCLES {
        // This cycle's outcomes only (--keep leaves the directory between cycles).
        let _ = std::fs::remove_file(crate::checkpoint_dir::hook_status(&images));
        // Nothing outside the container may stay connected to it during the dump.
        demo.workers.clear();
        step(
            &mut report,
            format!("podman_checkpoint_{cycle}"),
            &["container", "checkpoint", "--keep", &container.name],
        )?;
        step(
            &mut report,
            format!("podman_restore_{cycle}"),
            &["container", "restore", "--keep", &container.name],
        )?;
        super::hook::take_counts(&mut report, &images);
        for action in ["pre-dump", "post-resume"] {
            let said = super::hook::hook_said(&images, action)?;
            demo.topology
                .push(format!("podman cycle {cycle}: the hook's {action}: {said}"));
        }
        demo.topology.push(format!(
            "podman cycle {cycle}: {}",
            super::hook::carried(&images)
        ));
        demo.workers = connect_all(sockets)?;
        if cycle < CYCLES {
            let (regions, bytes) = demo.verify_all()?;
            demo.topology.push(format!(
                "podman cycle {cycle}: {regions} regions ({bytes} bytes) verified"
            ));
        }
    }
    Ok(report)
}
