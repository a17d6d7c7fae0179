//! Starting the demo's workers: the files it needs next to the executable, each worker's
//! configuration, and (for CRIU) the workload started as its own PID namespace.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuinterpose_workload::{EntryPath, Output, Worker, WorkerConfig};

use super::types::{DemoError, DriverChoice, setup, worker_error};

/// Files the demo needs next to the `cuinterpose` executable.
pub(super) struct Artifacts {
    worker: PathBuf,
    shim: PathBuf,
    pub(super) fakecuda: PathBuf,
}

pub(super) fn artifacts() -> Result<Artifacts, DemoError> {
    let exe =
        std::env::current_exe().map_err(|e| setup(format!("cannot find this executable: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| setup("this executable has no directory"))?;
    let found = Artifacts {
        worker: dir.join("cuinterpose-worker"),
        shim: dir.join("libcuinterpose.so"),
        fakecuda: dir.join("libcuda.so"),
    };
    for path in [&found.worker, &found.shim] {
        if !path.exists() {
            return Err(setup(format!(
                "{} not found next to cuinterpose: build the workspace first (`cargo build --workspace`)",
                path.display()
            )));
        }
    }
    Ok(found)
}

pub(super) fn config(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
    entry: EntryPath,
) -> WorkerConfig {
    let config = WorkerConfig::new(&artifacts.worker)
        .entry(entry)
        .env("LD_PRELOAD", &artifacts.shim)
        .env("CUINTERPOSE_CONTROL_DIR", work.join("control"))
        .env(
            super::types::FAKECUDA_CONTROL_DIR,
            super::types::fakecuda_dir(work),
        )
        .stdout(Output::Null)
        .stderr(Output::File(work.join("workers.log")));
    match driver {
        DriverChoice::Embedded => config.env("LD_LIBRARY_PATH", work.join("lib")),
        DriverChoice::Path(p) => config.driver(p),
    }
}

pub(super) fn entry_for(i: usize) -> EntryPath {
    // Different processes reach the driver differently, as real programs do.
    match i % 3 {
        0 => EntryPath::Dlsym,
        1 => EntryPath::ProcAddress(12030),
        _ => EntryPath::Default,
    }
}

/// Ends the PID namespace whose init is `root`: killing the init ends every process in it.
pub(super) fn kill_namespace(root: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(root as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// The workers' socket paths and the `sh -c` script that starts them (each listening on its
/// socket, `$0` the worker binary) and waits, its output going to the work directory's log.
pub(super) fn tree_script(work: &Path, driver: &DriverChoice, n: usize) -> (Vec<PathBuf>, String) {
    let sockets = crate::criu::worker_sockets(work, n);
    let driver_flag = match driver {
        DriverChoice::Path(p) => format!(" --driver '{}'", p.display()),
        DriverChoice::Embedded => String::new(),
    };
    // The tree writes its own log (`unshare` itself writes to another).
    let script = crate::criu::listening_script(
        &work.join("workload.log"),
        sockets.iter().enumerate().map(|(i, socket)| {
            (
                socket.clone(),
                format!(" --entry {}{driver_flag}", entry_for(i)),
            )
        }),
    );
    (sockets, script)
}

/// The environment every worker gets (shim, driver, control directories).
pub(super) fn worker_env(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    config(artifacts, work, driver, EntryPath::Dlsym).env
}

/// The worker binary.
pub(super) fn worker_binary(artifacts: &Artifacts) -> &Path {
    &artifacts.worker
}

/// Starts the workers as one PID namespace (`unshare -fp setsid sh`), each listening on a
/// socket in the work directory, so that CRIU can dump the tree. Returns the spawned
/// `unshare` and the socket paths.
pub(super) fn start_namespace(
    artifacts: &Artifacts,
    work: &Path,
    driver: &DriverChoice,
    n: usize,
) -> Result<(std::process::Child, Vec<PathBuf>), DemoError> {
    let (sockets, script) = tree_script(work, driver, n);
    let template = config(artifacts, work, driver, EntryPath::Dlsym);
    let mut command = std::process::Command::new("unshare");
    command
        .args(["-fp", "setsid", "sh", "-c", &script])
        .arg(&artifacts.worker)
        // Its own working directory: CRIU mounts the tree's /proc at `./proc.crtools` there,
        // so two demos dumped at once do not collide.
        .current_dir(work)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::File::create(work.join("unshare.log"))
                .map_err(|e| setup(format!("creating unshare.log: {e}")))?,
        );
    for (key, value) in &template.env {
        command.env(key, value);
    }
    let child = command
        .spawn()
        .map_err(|e| setup(format!("starting `unshare -fp setsid sh`: {e}")))?;
    Ok((child, sockets))
}

/// The namespace init (`sh`) the spawned `unshare` forked.
pub(super) fn namespace_root(unshare: u32) -> Result<u32, DemoError> {
    crate::criu::first_child(unshare, Duration::from_secs(10))
        .ok_or_else(|| setup("the workload's namespace init did not start"))
}

pub(super) fn connect_all(sockets: &[PathBuf]) -> Result<Vec<Worker>, DemoError> {
    sockets
        .iter()
        .map(|s| {
            Worker::connect(s, Duration::from_secs(30))
                .map_err(worker_error(format!("connecting to {}", s.display())))
        })
        .collect()
}
