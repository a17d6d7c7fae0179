//! CRIU for the tests that run it: the binary `tests/setup/criu` caches (or
//! `$CUINTERPOSE_CRIU`), and the namespace init of a tree started as `unshare -fp setsid CMD`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cuinterpose_coordinator::criu;

/// CRIU ≥ 4.1: `$CUINTERPOSE_CRIU`, else the one `tests/setup/criu` caches; an error says why
/// it cannot be used here.
pub fn binary() -> Result<PathBuf, String> {
    let binary = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/criu/criu"));
    let out = Command::new(&binary)
        .arg("check")
        .output()
        .map_err(|e| format!("{}: {e} (tests/setup/criu builds it)", binary.display()))?;
    if out.status.success() {
        Ok(binary)
    } else {
        Err(format!(
            "`{} check` failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// [`binary`] for test `test`, or `None` after saying why it cannot run (which fails the test
/// under `CI=true`: [`super::tmpfs::unavailable`]).
pub fn usable(test: &str) -> Option<PathBuf> {
    binary()
        .map_err(|why| super::tmpfs::unavailable(test, &format!("CRIU is not usable here: {why}")))
        .ok()
}

/// [`binary`] and the directory of CRIU's CUDA plugin next to it (`tests/setup/criu` builds
/// `plugins/cuda_plugin.so`); an error says what is missing.
pub fn with_cuda_plugin() -> Result<(PathBuf, PathBuf), String> {
    let binary = binary().map_err(|why| format!("CRIU is not usable here: {why}"))?;
    let plugins = binary.with_file_name("plugins");
    if !plugins.join("cuda_plugin.so").exists() {
        return Err(format!(
            "no cuda_plugin.so in {} (run tests/setup/criu)",
            plugins.display()
        ));
    }
    Ok((binary, plugins))
}

/// A coordinator command line through CRIU: `HEAD… --criu --criu-binary CRIU --dir DIR TAIL…`.
pub fn args<'a>(head: &[&'a str], criu: &'a str, dir: &'a str, tail: &[&'a str]) -> Vec<&'a str> {
    [head, &["--criu", "--criu-binary", criu, "--dir", dir], tail].concat()
}

/// [`with_cuda_plugin`] for test `test`, or `None` after saying why it cannot run (which fails
/// the test under `CI=true`: [`super::tmpfs::unavailable`]).
pub fn usable_with_cuda_plugin(test: &str) -> Option<(PathBuf, PathBuf)> {
    with_cuda_plugin()
        .map_err(|why| super::tmpfs::unavailable(test, &why))
        .ok()
}

/// The namespace init (the first child) of the spawned `unshare` with host PID `unshare`.
pub fn namespace_root(unshare: u32) -> u32 {
    let wait = cuinterpose_testkit::slack(Duration::from_secs(10));
    criu::first_child(unshare, wait)
        .unwrap_or_else(|| panic!("the namespace init of {unshare} did not start"))
}

/// A workload CRIU can dump: `n` `cuinterpose-worker --listen` processes started as one PID
/// namespace (`unshare -fp setsid sh`) on fakecuda, under the shim when `shim`, with their
/// control directories in `dir` (`control/`, `fakecuda/`). The tree writes its own log
/// (`workload.log`: a file written from outside would change size under CRIU). Returns the
/// spawned `unshare`, the namespace's init and the workers' socket paths.
pub fn listening_tree(dir: &Path, n: usize, shim: bool) -> (Child, u32, Vec<PathBuf>) {
    let sockets = criu::worker_sockets(dir, n);
    let script = criu::listening_script(
        &dir.join("workload.log"),
        sockets.iter().map(|socket| (socket.clone(), String::new())),
    );
    let mut command = Command::new("unshare");
    command
        .args(["-fp", "setsid", "sh", "-c", &script])
        .arg(cuinterpose_testkit::build_worker())
        // CRIU's parasite mounts the tree's /proc at `./proc.crtools` (relative to the task's
        // working directory) when /proc is not the tree's own: two trees dumped at once from
        // one directory collide there (EEXIST, "Can't create a directory (-17)").
        .current_dir(dir)
        .env("LD_LIBRARY_PATH", cuinterpose_testkit::fakecuda_lib_dir())
        .env("CUINTERPOSE_CONTROL_DIR", dir.join("control"))
        .env("FAKECUDA_CONTROL_DIR", dir.join("fakecuda"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if shim {
        command.env("LD_PRELOAD", cuinterpose_testkit::build_shim());
    } else {
        command.env_remove("LD_PRELOAD");
    }
    let unshare = command.spawn().expect("start unshare");
    let root = namespace_root(unshare.id());
    (unshare, root, sockets)
}

/// Processes killed (SIGKILL) when the test ends, passing or not: a tree must not outlive it.
#[derive(Default)]
pub struct Reaper(pub Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The last lines of a CRIU log, for a failure message: CRIU prints nothing on stderr when `-o`
/// sends its log to a file, so a failed dump says why only there.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("({}: {e})", log.display()));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}
