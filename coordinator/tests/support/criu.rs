//! CRIU for the tests that run it: the binary `.ci/install-criu` caches (or
//! `$CUINTERPOSE_CRIU`), and the namespace init of a tree started as `unshare -fp setsid CMD`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// CRIU ≥ 4.1: `$CUINTERPOSE_CRIU`, else the one `.ci/install-criu` caches; an error says why
/// it cannot be used here.
pub fn binary() -> Result<PathBuf, String> {
    let binary = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/criu/criu"));
    let out = Command::new(&binary)
        .arg("check")
        .output()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
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

/// [`binary`] and the directory of CRIU's CUDA plugin next to it (`.ci/install-criu` builds
/// `plugins/cuda_plugin.so`); an error says what is missing.
pub fn with_cuda_plugin() -> Result<(PathBuf, PathBuf), String> {
    let binary = binary().map_err(|why| format!("CRIU is not usable here: {why}"))?;
    let plugins = binary.with_file_name("plugins");
    if !plugins.join("cuda_plugin.so").exists() {
        return Err(format!(
            "no cuda_plugin.so in {} (run .ci/install-criu)",
            plugins.display()
        ));
    }
    Ok((binary, plugins))
}

/// The namespace init (the first child) of the spawned `unshare` with host PID `unshare`.
pub fn namespace_root(unshare: u32) -> u32 {
    let deadline = Instant::now() + cuinterpose_testkit::slack(Duration::from_secs(10));
    loop {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "the namespace init of {unshare} did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
