//! The watcher `pre-dump` leaves behind. CRIU calls no action script when a dump fails after
//! `pre-dump` (a full image disk, CRIU killed, a later CRIU error), and with
//! `--leave-running` it resumes the tree after a good dump without telling anyone. Either way
//! the tree would run on natively checkpointed, its sharing released: every CUDA call would
//! hang. So `pre-dump` starts a detached watcher that waits for the CRIU process to end and
//! then looks at the tree:
//!
//! - gone: the dump completed and CRIU ended the tree, as it does by default. Nothing to do.
//! - still running, and `post-dump` recorded a completed dump (`--leave-running`): restored in
//!   place from the state (native restore and unlock, the restore phases); the images stay.
//! - still running, no completed dump: abort and resume, as `cuinterpose checkpoint --criu`
//!   does (the workload is put back from its carriers; the checkpoint is discarded).
//!
//! The outcome is appended to the status file. Processes are recognised by PID and start time,
//! so a reused PID is never mistaken for them.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Context, Done, HookError, read_status, record};
use crate::commands::CommandError;
use crate::compose::{self, Workload};

/// How often the watcher looks whether CRIU is still there.
pub const POLL: Duration = Duration::from_millis(100);
/// What the watcher prints once it watches (the hook waits for it before it returns to CRIU).
const READY: &str = "watching";

/// A process as PID and start time (field 22 of `/proc/<pid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub pid: u32,
    start: u64,
}

impl Identity {
    pub fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses: fields follow the last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let start = rest.split_whitespace().nth(19)?.parse().ok()?;
        Some(Self { pid, start })
    }

    /// Clock ticks after boot at which it started.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Still the same process (a zombie counts as gone).
    pub fn alive(&self) -> bool {
        let zombie = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                let rest = stat[stat.rfind(')')? + 1..].to_owned();
                rest.split_whitespace().next().map(|state| state == "Z")
            })
            .unwrap_or(true);
        !zombie && Self::of(self.pid) == Some(*self)
    }
}

/// Starts the watcher for the dump of the tree rooted at `root` into `dir`, detached from
/// CRIU, and returns once it watches.
pub fn spawn(
    context: &Context,
    root: u32,
    dir: &Path,
    workload: &Workload,
) -> Result<(), HookError> {
    let criu = context
        .criu_pid
        .unwrap_or_else(std::os::unix::process::parent_id);
    let io = |during: &'static str| CommandError::io(dir, during);
    let exe = std::env::current_exe().map_err(io("locating this executable for the watcher"))?;
    let mut child = Command::new(exe)
        .arg("criu-hook")
        .arg("--watch-criu")
        .arg(criu.to_string())
        .arg("--root")
        .arg(root.to_string())
        .arg("--dir")
        .arg(dir)
        .arg("--control-dir")
        .arg(&workload.control_dir)
        .env_remove(super::ACTION_VARIABLE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a signal to CRIU's group (a Ctrl-C) does not end it.
        .process_group(0)
        .spawn()
        .map_err(io("starting the watcher"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(io("waiting for the watcher"))?;
    if line.trim() != READY {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io("starting the watcher")(std::io::Error::other(
            "it ended before it watched",
        ))
        .into());
    }
    Ok(())
}

/// The watcher itself (`cuinterpose criu-hook --watch-criu PID ...`): returns what it did.
pub fn watch(criu: u32, root: u32, dir: &Path, workload: &Workload) -> Result<Done, HookError> {
    let (criu_id, root_id) = (Identity::of(criu), Identity::of(root));
    println!("{READY}");
    // Nobody reads further: stop holding the hook's pipe, so CRIU is not kept waiting.
    if let Ok(null) = std::fs::File::options().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stdout(&null);
    }
    let Some(root_id) = root_id else {
        return Ok(Done::skipped("the tree was gone before CRIU ended"));
    };
    if let Some(criu_id) = criu_id {
        while criu_id.alive() {
            std::thread::sleep(POLL);
        }
    }
    if !root_id.alive() {
        return Ok(Done::skipped("the dump completed and CRIU ended the tree"));
    }
    let dumped = read_status(dir)
        .iter()
        .any(|line| line["action"] == "post-dump" && line["status"] == "ok");
    let mut quiet = |_: &crate::events::Event| {};
    if dumped {
        let report = compose::restore(workload, Some(root), dir, &mut quiet)?;
        return Ok(Done::ok(
            "the dump completed and CRIU left the tree running: restored in place",
            Some(report),
        ));
    }
    let cause = CommandError::Io {
        path: dir.to_path_buf(),
        during: "criu dump",
        source: std::io::Error::other("CRIU ended without completing the dump"),
    };
    match compose::resume_in_place(
        workload,
        root,
        dir,
        &mut quiet,
        compose::Task::CriuDump,
        cause,
    ) {
        CommandError::Aborted { resumed, .. } => Ok(Done::ok(
            "CRIU ended without completing the dump: the workload was put back in place and \
             resumed",
            Some(*resumed),
        )),
        failed => Err(failed.into()),
    }
}

/// Runs [`watch`] and records its outcome in the status file.
pub fn watch_and_record(criu: u32, root: u32, dir: &Path, workload: &Workload) -> u8 {
    let outcome = watch(criu, root, dir, workload);
    record(Some(dir), "watch", &outcome);
    match outcome {
        Ok(_) => 0,
        Err(error) => error.exit_code(),
    }
}
