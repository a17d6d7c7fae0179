//! What a case looks like from outside: each worker's descriptors and device memory, the
//! participants' records through the coordinator, `cuinterpose toggle` itself, the logs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cuinterpose_coordinator::session::{self, Session};
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{NamespacePid, Phase, Record};
use serde_json::Value;

use crate::case::{Case, CaseResult, Context, Env, ensure};

/// What a worker holds: open descriptors by target (socket and pipe inode numbers left out),
/// and how many distinct fakecuda memfds (device memory, multicast teams) its descriptors and
/// mappings keep alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resources {
    pub(crate) descriptors: BTreeMap<String, usize>,
    pub(crate) backing: usize,
}

/// `socket:[123]` → `socket:[]`.
pub(crate) fn normalize_target(target: &str) -> String {
    match target.split_once(":[") {
        Some((kind, _)) => format!("{kind}:[]"),
        None => target.to_string(),
    }
}

impl Case<'_> {
    /// [`Case::resources`] once two looks 25 ms apart agree (connections the shims just
    /// served close asynchronously).
    pub(crate) fn settled_resources(&mut self) -> CaseResult<Vec<Resources>> {
        let mut last = self.resources()?;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(25));
            let now = self.resources()?;
            if now == last {
                return Ok(now);
            }
            last = now;
        }
        Err(format!("open descriptors never settled: {last:?}"))
    }

    pub(crate) fn resources(&mut self) -> CaseResult<Vec<Resources>> {
        use std::os::unix::fs::MetadataExt;
        (0..self.workers.len())
            .map(|p| {
                let name = self.name(p);
                let fds = self.workers[p]
                    .fd_targets()
                    .ctx(|| format!("{name}: open descriptors"))?;
                let mut descriptors: BTreeMap<String, usize> = BTreeMap::new();
                for fd in &fds {
                    *descriptors.entry(normalize_target(&fd.target)).or_default() += 1;
                }
                let pid = self.workers[p].worker_pid();
                let mut inodes = BTreeSet::new();
                for fd in fds
                    .iter()
                    .filter(|fd| fd.target.starts_with("/memfd:fakecuda-"))
                {
                    let path = format!("/proc/{pid}/fd/{}", fd.fd);
                    // The control socket's own descriptors come and go; memfds stay.
                    if let Ok(metadata) = std::fs::metadata(&path) {
                        inodes.insert(metadata.ino());
                    }
                }
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .map_err(|e| format!("{name}: read its maps: {e}"))?;
                for line in maps
                    .lines()
                    .filter(|line| line.contains("/memfd:fakecuda-"))
                {
                    if let Some(inode) = line.split_whitespace().nth(4) {
                        inodes.insert(inode.parse().unwrap_or(0));
                    }
                }
                Ok(Resources {
                    descriptors,
                    backing: inodes.len(),
                })
            })
            .collect()
    }

    pub(crate) fn pids(&self) -> BTreeSet<NamespacePid> {
        self.workers
            .iter()
            .map(|w| NamespacePid::new(w.worker_pid() as u32).expect("pid"))
            .collect()
    }

    pub(crate) fn inspect(&self) -> CaseResult<BTreeMap<NamespacePid, Vec<Record>>> {
        let control = self.dir.path().join("ctl");
        let session = Session::open(&control, &[], Timeouts::default())
            .map_err(|e| format!("open a session: {e}"))?;
        let inspection = session::inspect(&session);
        let mut records = BTreeMap::new();
        for (pid, reply) in inspection.replies {
            let reply = reply.map_err(|e| format!("inspect {pid}: {e}"))?;
            ensure!(
                reply.phase == Phase::Active && reply.raw_imports == 0,
                "inspect {pid}: phase {:?}, {} raw imports",
                reply.phase,
                reply.raw_imports
            );
            records.insert(pid, reply.records.to_vec());
        }
        let found: BTreeSet<NamespacePid> = records.keys().copied().collect();
        ensure!(
            found == self.pids(),
            "participants {found:?}, expected the workers {:?}",
            self.pids()
        );
        match inspection.validation {
            Some(Ok(_)) => Ok(records),
            Some(Err(errors)) => Err(format!(
                "the topology is invalid: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            None => Err("inspection incomplete".into()),
        }
    }

    pub(crate) fn toggle(&self, env: &Env, checkpoint: &Path) -> CaseResult<Value> {
        let output = Command::new(env!("CARGO_BIN_EXE_cuinterpose"))
            .args(["toggle", "--pid", &std::process::id().to_string(), "--dir"])
            .arg(checkpoint)
            .arg("--json")
            .env("CUINTERPOSE_DRIVER", env.fakecuda.join("libcuda.so.1"))
            .env("CUINTERPOSE_CONTROL_DIR", self.dir.path().join("ctl"))
            .env("FAKECUDA_CONTROL_DIR", self.dir.path().join("fakecuda"))
            .env("FAKECUDA_DEVICES", self.plan.device_count.to_string())
            .env_remove("LD_PRELOAD")
            .output()
            .map_err(|e| format!("run cuinterpose: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success(),
            "cuinterpose toggle: {}\nstdout:\n{stdout}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).map_err(|e| format!("toggle JSON: {e}: {stdout}"))
    }

    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        for p in 0..self.plan.processes {
            let text = std::fs::read_to_string(self.dir.path().join(format!("worker-{p}.log")))
                .unwrap_or_default();
            if !text.trim().is_empty() {
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                out.push_str(&format!("--- p{p} stderr (last lines) ---\n"));
                for line in tail.iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}
