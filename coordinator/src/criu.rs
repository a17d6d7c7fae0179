//! Process checkpoint with CRIU around the CUDA checkpoint: `criu dump` of the workload's
//! process tree after the native checkpoint (the GPU state then lives in host memory the
//! dump saves), `criu restore` before the native restore.
//!
//! The workload must run as its own PID namespace (`unshare -fp setsid CMD`): restore needs
//! the original PIDs free, and only namespace PIDs come back the same (host PIDs change,
//! which is why participants are named by namespace PID). Everything the tree holds must be
//! dumpable: no connection to a process outside the tree (files and listening sockets are
//! fine).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::checkpoint_dir;
use crate::commands::CommandError;
use crate::compose::{self, Workload};
use crate::events::Event;
use crate::report::{PhaseReport, Report};

/// Names the CRIU binary when `--criu-binary` is not given (else `criu` on `PATH`).
pub const CRIU_VARIABLE: &str = "CUINTERPOSE_CRIU";

/// A CRIU binary.
#[derive(Debug, Clone)]
pub struct Criu {
    pub binary: PathBuf,
    /// Appended to every dump and restore (e.g. `--config FILE` naming the action script).
    pub extra_args: Vec<std::ffi::OsString>,
    /// Set for CRIU (and so for its action scripts).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Criu {
    /// `explicit`, else `$CUINTERPOSE_CRIU`, else `criu`.
    pub fn locate(explicit: Option<PathBuf>) -> Criu {
        let binary = explicit
            .or_else(|| {
                std::env::var_os(CRIU_VARIABLE)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from("criu"));
        Criu {
            binary,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }

    fn run(
        &self,
        args: &[&std::ffi::OsStr],
        during: &'static str,
        log: &Path,
    ) -> Result<(), CommandError> {
        let output = Command::new(&self.binary)
            .args(args)
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(CommandError::io(&self.binary, during))?;
        if output.status.success() {
            return Ok(());
        }
        let tail = std::fs::read_to_string(log)
            .map(|text| {
                let mut tail = text
                    .lines()
                    .filter(|l| l.contains("Error") || l.contains("error"))
                    .take(8)
                    .collect::<Vec<_>>()
                    .join("\n");
                if let Some(hint) = hint(&text) {
                    tail.push_str("\nhint: ");
                    tail.push_str(hint);
                }
                tail
            })
            .unwrap_or_default();
        Err(CommandError::Io {
            path: self.binary.clone(),
            during,
            source: std::io::Error::other(format!(
                "{} ({}); log {}:\n{tail}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                log.display()
            )),
        })
    }

    /// `criu dump -t ROOT`: saves the tree and kills it.
    pub fn dump(&self, root: u32, images: &Path) -> Result<(), CommandError> {
        std::fs::create_dir_all(images).map_err(CommandError::io(
            images,
            "creating the CRIU image directory",
        ))?;
        let log = checkpoint_dir::dump_log(images);
        let root = root.to_string();
        self.run(
            &[
                "dump".as_ref(),
                "-t".as_ref(),
                root.as_ref(),
                "-D".as_ref(),
                images.as_os_str(),
                "-o".as_ref(),
                log.as_os_str(),
                "-v4".as_ref(),
            ],
            "criu dump",
            &log,
        )
    }

    /// `criu restore -d`: brings the tree back, detached; returns the root's new host PID.
    pub fn restore(&self, images: &Path) -> Result<u32, CommandError> {
        let log = checkpoint_dir::restore_log(images);
        let pidfile = checkpoint_dir::restore_pid(images);
        let _ = std::fs::remove_file(&pidfile);
        self.run(
            &[
                "restore".as_ref(),
                "-D".as_ref(),
                images.as_os_str(),
                "-d".as_ref(),
                "-o".as_ref(),
                log.as_os_str(),
                "-v4".as_ref(),
                "--pidfile".as_ref(),
                pidfile.as_os_str(),
            ],
            "criu restore",
            &log,
        )?;
        let text = std::fs::read_to_string(&pidfile).map_err(CommandError::io(
            &pidfile,
            "reading the restored root's PID",
        ))?;
        text.trim().parse().map_err(|_| CommandError::Io {
            path: pidfile,
            during: "parsing the restored root's PID",
            source: std::io::Error::other(format!("{text:?} is not a PID")),
        })
    }
}

/// How many participants the coordinator phases of `report` reached.
fn participant_count(report: &Report) -> usize {
    report
        .phases
        .iter()
        .map(|phase| phase.participants)
        .max()
        .unwrap_or(0)
}

fn timed(name: &str, started: Instant) -> PhaseReport {
    PhaseReport {
        name: name.to_owned(),
        duration: started.elapsed(),
        bytes: 0,
        participants: 0,
    }
}

/// `compose::checkpoint`, then `criu dump` of the tree into `<dir>/criu`: the dump is the
/// last step of the checkpoint's plan, so a failed dump takes the plan's way back (CRIU leaves
/// the tasks running when a dump fails).
pub fn checkpoint(
    workload: &Workload,
    criu: &Criu,
    root: u32,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    let mut dump = |report: &mut Report, progress: &mut dyn FnMut(&Event)| {
        let started = Instant::now();
        progress(&Event::Started {
            phase: "criu_dump",
            participants: participant_count(report),
        });
        criu.dump(root, &checkpoint_dir::images(dir))?;
        let mut phase = timed("criu_dump", started);
        // CRIU dumped every participant of the tree (and its other processes).
        phase.participants = participant_count(report);
        progress(&Event::Done(&phase));
        report.phases.push(phase);
        Ok(())
    };
    compose::checkpoint_with(workload, root, dir, progress, Some(&mut dump))
}

/// `criu restore` of `<dir>/criu`, then `compose::restore` of the restored tree.
pub fn restore(
    workload: &Workload,
    criu: &Criu,
    dir: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    // A device map this machine cannot honour is refused before CRIU brings anything back
    // (`compose::restore` resolves it again once the tree is back, against the GPUs' free
    // memory then).
    if let Some(spec) = &workload.device_map {
        let saved = crate::state::load(dir)?;
        let driver = crate::native::NativeDriver::load_from(&workload.driver)?;
        crate::commands::resolve_device_map(&driver, spec, &saved)?;
    }
    let started = Instant::now();
    progress(&Event::Started {
        phase: "criu_restore",
        participants: 0,
    });
    let root = criu.restore(&checkpoint_dir::images(dir))?;
    let phase = timed("criu_restore", started);
    progress(&Event::Done(&phase));
    let mut report = Report::new("restore");
    report.phases.push(phase);
    report.absorb(compose::restore(workload, Some(root), dir, progress)?);
    // Known once the restored participants answered.
    let restored = participant_count(&report);
    if let Some(criu_phase) = report.phases.first_mut() {
        criu_phase.participants = restored;
    }
    // The host PIDs the restored tree got (namespace PIDs are kept, host PIDs are new).
    if let Ok(tree) = crate::process::tree(Path::new("/proc"), root) {
        report.host_pids = tree
            .into_iter()
            .filter(|p| report.participants.contains(&p.namespace_pid))
            .map(|p| (p.namespace_pid, p.host_pid))
            .collect();
    }
    Ok(report)
}

/// Whether `criu check` passes on this machine.
pub fn check(criu: &Criu) -> Result<(), String> {
    match Command::new(&criu.binary).arg("check").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{} check: {}{}",
            criu.binary.display(),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("{}: {e}", criu.binary.display())),
    }
}

/// What a user can do about a failure CRIU's log names only by its symptom.
fn hint(log: &str) -> Option<&'static str> {
    // CRIU's parasite mounts a /proc of the tree's own at `proc.crtools` in the dumped task's
    // working directory when the tree's /proc is not its own (`unshare -fp` without
    // `--mount-proc`); a second dump of a tree started in the same directory finds it there.
    (log.contains("parasite.c") && log.contains("Can't create a directory (-17)")).then_some(
        "another CRIU dump of a tree with the same working directory was running (CRIU mounts \
         the tree's /proc at ./proc.crtools there); start each tree in a directory of its own, \
         or with a /proc of its own (unshare --mount-proc), or dump one at a time",
    )
}

/// The sockets of `n` workers listening in `dir`: `worker-<i>.sock`.
pub fn worker_sockets(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| dir.join(format!("worker-{i}.sock")))
        .collect()
}

/// The `sh -c` script that starts, in the background, one `"$0" --listen SOCKET FLAGS` per
/// worker (`$0` the worker binary) and waits. The tree's output goes to `log`, a file only the
/// tree writes: one another process also writes would change size between dump and restore,
/// which CRIU refuses.
pub fn listening_script(
    log: &Path,
    workers: impl IntoIterator<Item = (PathBuf, String)>,
) -> String {
    let mut script = format!("exec </dev/null >/dev/null 2>>'{}'; ", log.display());
    for (socket, flags) in workers {
        script.push_str(&format!("\"$0\" --listen '{}'{flags} & ", socket.display()));
    }
    script.push_str("wait");
    script
}

/// The first child of process `parent` (the namespace init a spawned `unshare -fp` forks),
/// waiting up to `wait` for it to start.
pub fn first_child(parent: u32, wait: Duration) -> Option<u32> {
    let deadline = Instant::now() + wait;
    loop {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return Some(pid);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::hint;

    #[test]
    fn a_colliding_proc_mount_is_explained() {
        let log = "pie: 1: Error (criu/pie/parasite.c:634): Can't create a directory (-17)\n\
                   pie: 1: Error (criu/pie/parasite.c:828): can't get /proc fd\n";
        assert!(hint(log).expect("a hint").contains("proc.crtools"));
        assert_eq!(hint("Error (criu/cr-dump.c:2111): Dumping FAILED."), None);
    }
}
