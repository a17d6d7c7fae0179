//! cuinterpose as a CRIU action script: a plain `criu dump` / `criu restore`, configured with
//! one line (`action-script /path/to/cuinterpose`), takes the sharing apart before the dump
//! and rebuilds it after the restore. This is how container engines (Podman, CRI-O and
//! containerd under Kubernetes) checkpoint: they configure CRIU, they do not run our CLI.
//!
//! CRIU runs every action script with no arguments and tells it what happens through its
//! environment ([`ACTION_VARIABLE`], [`IMAGE_DIR_VARIABLE`], [`INIT_PID_VARIABLE`]):
//!
//! - `pre-dump` (the tree still runs): prepare (validate, save the shared bytes to the
//!   carriers, by default files in the image directory's `carrier/` folder, release the
//!   sharing, publish the state into the image directory), then native
//!   lock and checkpoint of every CUDA process of the tree, so that CRIU's CUDA plugin finds
//!   them done. A watcher ([`watch`]) then waits for CRIU: if CRIU exits and the tree still
//!   runs (the dump failed, or `--leave-running`), it puts the workload back.
//! - `pre-restore`: the state must be there and intact, or the restore stops before any
//!   process is resumed.
//! - `pre-resume`: notes where the image directory is (CRIU closes it before post-resume).
//! - `post-resume` (the tree runs again): native restore and unlock where nobody did it (the
//!   CUDA plugin may have), then the restore phases and the record-by-record comparison.
//! - every other action: nothing.
//!
//! Every action may be delivered twice (Podman does): each is idempotent. CRIU only logs a
//! failing `post-resume`, so each outcome is also appended to [`crate::checkpoint_dir::HOOK_STATUS_FILE_NAME`] in the
//! image directory (one JSON line per action) and said on stderr, with a nonzero exit.

pub mod settings;
pub mod watch;

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::checkpoint_dir;
use crate::commands::CommandError;
use crate::compose::{self, NativeRestore, Workload};
use crate::events::Event;
use crate::native::{NativeDriver, ProcessState};
use crate::report::Report;
use crate::session::SessionError;
use crate::state;

/// Which CRIU action this is (`pre-dump`, `post-resume`, ...).
pub const ACTION_VARIABLE: &str = "CRTOOLS_SCRIPT_ACTION";
/// The image directory, as `/proc/<criu pid>/fd/<n>` (CRIU holds it open).
pub const IMAGE_DIR_VARIABLE: &str = "CRTOOLS_IMAGE_DIR";
/// The host PID of the tree's root (at restore: of the restored root).
pub const INIT_PID_VARIABLE: &str = "CRTOOLS_INIT_PID";
/// Where the restored processes' GPUs go, as `--device-map` takes it (`auto`, or
/// `OLD=NEW,…`): checked at pre-restore, honoured at post-resume. From the environment or the
/// settings file.
pub const DEVICE_MAP_VARIABLE: &str = "CUINTERPOSE_DEVICE_MAP";
/// How a pre-dump carries the shared bytes, as `--carrier` takes it (`auto`, the default,
/// `host` or `storage`): the image directory is kept, so `auto` is the storage carrier, whose
/// files go to the image directory's `carrier/` folder (and with it into Podman's exported
/// archive) instead of into CRIU's page images. From the environment or the settings file.
pub const CARRIER_VARIABLE: &str = "CUINTERPOSE_CARRIER";
/// The storage carrier's staging window in MiB, as `--staging-mib` takes it (default 256).
pub const STAGING_VARIABLE: &str = "CUINTERPOSE_STAGING_MIB";

/// The actions the hook acts on; every other one is passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    PreDump,
    PostDump,
    PreRestore,
    PreResume,
    PostResume,
    Other(String),
}

impl Action {
    pub fn parse(name: &str) -> Self {
        match name {
            "pre-dump" => Self::PreDump,
            "post-dump" => Self::PostDump,
            "pre-restore" => Self::PreRestore,
            "pre-resume" => Self::PreResume,
            "post-resume" => Self::PostResume,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Self::PreDump => "pre-dump",
            Self::PostDump => "post-dump",
            Self::PreRestore => "pre-restore",
            Self::PreResume => "pre-resume",
            Self::PostResume => "post-resume",
            Self::Other(name) => name,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "{ACTION_VARIABLE} is not set: `cuinterpose criu-hook` is run by CRIU as an action \
         script (`action-script PATH` in a CRIU configuration file)"
    )]
    NotFromCriu,
    #[error("{variable} is {value:?}: {reason}")]
    Environment {
        variable: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("hook settings: {0}")]
    Settings(#[from] settings::SettingsError),
    #[error(transparent)]
    Command(#[from] CommandError),
}

impl HookError {
    /// 64 for a hook not run by CRIU, else the command's exit status.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotFromCriu | Self::Environment { .. } | Self::Settings(_) => {
                crate::plan::EXIT_USAGE
            }
            Self::Command(error) => error.exit_code(),
        }
    }
}

/// What CRIU told the hook.
#[derive(Debug, Clone)]
pub struct Context {
    pub action: Action,
    /// The image directory as a real path (resolved from CRIU's `/proc/<pid>/fd/<n>`).
    pub image_dir: Option<PathBuf>,
    /// The tree's root, as a host PID.
    pub init_pid: Option<u32>,
    /// The CRIU process, when the image directory names it.
    pub criu_pid: Option<u32>,
}

impl Context {
    /// Reads the CRIU variables through `lookup` (the process environment in production).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, HookError> {
        let action = Action::parse(&lookup(ACTION_VARIABLE).ok_or(HookError::NotFromCriu)?);
        let init_pid = match lookup(INIT_PID_VARIABLE) {
            None => None,
            Some(value) => Some(value.trim().parse::<u32>().ok().filter(|p| *p > 0).ok_or(
                HookError::Environment {
                    variable: INIT_PID_VARIABLE,
                    value,
                    reason: "not a process ID",
                },
            )?),
        };
        let (image_dir, criu_pid) = match lookup(IMAGE_DIR_VARIABLE) {
            None => (None, None),
            Some(value) => {
                let given = PathBuf::from(&value);
                let criu_pid = criu_pid_of(&given);
                let unreachable = |reason| HookError::Environment {
                    variable: IMAGE_DIR_VARIABLE,
                    value: value.clone(),
                    reason,
                };
                let real = if action == Action::PostResume {
                    // CRIU closed the directory before post-resume (and the descriptor number
                    // may be reused): pre-resume noted where it was.
                    let note = criu_pid
                        .and_then(note_path)
                        .ok_or_else(|| unreachable("not a /proc/<criu pid>/fd/<n> path"))?;
                    let text = std::fs::read_to_string(&note).map_err(|_| {
                        unreachable("closed by CRIU, and pre-resume left no note of it")
                    })?;
                    let _ = std::fs::remove_file(&note);
                    PathBuf::from(text.trim_end_matches('\n'))
                } else {
                    std::fs::canonicalize(&given)
                        .map_err(|_| unreachable("not a directory this process can reach"))?
                };
                (Some(real), criu_pid)
            }
        };
        Ok(Self {
            action,
            image_dir,
            init_pid,
            criu_pid,
        })
    }

    fn need_dir(&self) -> Result<&Path, HookError> {
        self.image_dir.as_deref().ok_or(HookError::Environment {
            variable: IMAGE_DIR_VARIABLE,
            value: String::new(),
            reason: "not set (CRIU sets it for every action)",
        })
    }

    fn need_root(&self) -> Result<u32, HookError> {
        self.init_pid.ok_or(HookError::Environment {
            variable: INIT_PID_VARIABLE,
            value: String::new(),
            reason: "not set (CRIU sets it once it knows the tree's root)",
        })
    }
}

/// Where pre-resume notes the image directory for post-resume: in the temp directory, named
/// by the CRIU process (PID and start time), removed by post-resume (or, if CRIU died in
/// between, by a later hook that finds its process gone).
fn note_path(criu: u32) -> Option<PathBuf> {
    let identity = watch::Identity::of(criu)?;
    Some(std::env::temp_dir().join(format!(
        "cuinterpose-criu-{}-{}.imagedir",
        identity.pid,
        identity.start()
    )))
}

/// Notes the image directory for this CRIU process's post-resume.
fn write_note(context: &Context, dir: &Path) -> Result<(), HookError> {
    remove_stale_notes();
    let Some(note) = context.criu_pid.and_then(note_path) else {
        return Ok(());
    };
    let text = format!("{}\n", dir.display());
    std::fs::write(&note, text).map_err(|source| {
        HookError::Command(CommandError::Io {
            path: note,
            during: "noting the image directory for post-resume",
            source,
        })
    })
}

/// Notes whose CRIU process is gone.
fn remove_stale_notes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cuinterpose-criu-"))
            .and_then(|n| n.strip_suffix(".imagedir"))
        else {
            continue;
        };
        let Some((pid, start)) = rest.split_once('-') else {
            continue;
        };
        let current = pid
            .parse()
            .ok()
            .and_then(watch::Identity::of)
            .map(|identity| identity.start().to_string());
        if current.as_deref() != Some(start) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// `/proc/<pid>/fd/<n>` → pid.
fn criu_pid_of(path: &Path) -> Option<u32> {
    let mut parts = path.components().skip(1);
    let proc = parts.next()?.as_os_str();
    let pid = parts.next()?.as_os_str().to_str()?.parse().ok()?;
    (proc == "proc").then_some(pid)
}

/// The control directory as this process reaches it: the workload's own path, seen through
/// `/proc/<root>/root` when the root lives in another mount namespace (a container; the hook
/// runs in the host's).
pub fn control_dir_for(control_dir: &Path, root: u32) -> PathBuf {
    let theirs = PathBuf::from(format!("/proc/{root}/root"));
    let same = match (std::fs::metadata(&theirs), std::fs::metadata("/")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => true,
    };
    if same {
        control_dir.to_path_buf()
    } else {
        theirs.join(control_dir.strip_prefix("/").unwrap_or(control_dir))
    }
}

/// What an action did, for the status file and stderr.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// `ok` (work was done) or `skipped` (nothing to do, and why).
    pub status: &'static str,
    pub message: String,
    pub report: Option<Report>,
}

impl Done {
    fn skipped(message: impl Into<String>) -> Self {
        Self {
            status: "skipped",
            message: message.into(),
            report: None,
        }
    }

    fn ok(message: impl Into<String>, report: Option<Report>) -> Self {
        Self {
            status: "ok",
            message: message.into(),
            report,
        }
    }
}

/// Runs the action of `context` for the workload whose control directory (as the workload
/// sees it) is `workload.control_dir`.
pub fn run(
    context: &Context,
    workload: &Workload,
    progress: &mut dyn FnMut(&Event),
) -> Result<Done, HookError> {
    match &context.action {
        Action::PreDump => pre_dump(context, &Tree::of(context, workload)?, progress),
        Action::PostDump => Ok(Done::ok("the dump completed", None)),
        Action::PreRestore => pre_restore(context.need_dir()?, workload),
        Action::PreResume => {
            let dir = context.need_dir()?;
            // Noted even without a state, so that post-resume finds the directory and sees
            // there is nothing to do (rather than failing to find it).
            write_note(context, dir)?;
            if !checkpoint_dir::state(dir).exists() {
                return Ok(Done::skipped("no cuinterpose state in these images"));
            }
            Ok(Done::ok("noted the image directory for post-resume", None))
        }
        Action::PostResume => post_resume(&Tree::of(context, workload)?, progress),
        Action::Other(name) => Ok(Done::skipped(format!("nothing to do at {name}"))),
    }
}

/// The workload as the hook reaches it (the control directory through the root's mounts).
fn reach(workload: &Workload, root: u32) -> Workload {
    Workload {
        control_dir: control_dir_for(&workload.control_dir, root),
        ..workload.clone()
    }
}

/// What pre-dump and post-resume act on: the image directory, the tree's root, and the
/// workload as the hook reaches it.
struct Tree<'a> {
    dir: &'a Path,
    root: u32,
    workload: Workload,
}

impl<'a> Tree<'a> {
    fn of(context: &'a Context, workload: &Workload) -> Result<Self, HookError> {
        let (dir, root) = (context.need_dir()?, context.need_root()?);
        Ok(Self {
            dir,
            root,
            workload: reach(workload, root),
        })
    }
}

fn no_participants(error: &CommandError) -> bool {
    matches!(
        error,
        CommandError::Session(SessionError::NoParticipants { .. })
    )
}

fn pre_dump(
    context: &Context,
    tree: &Tree,
    progress: &mut dyn FnMut(&Event),
) -> Result<Done, HookError> {
    let (dir, root, workload) = (tree.dir, tree.root, &tree.workload);
    let skipped = || {
        Done::skipped(format!(
            "no cuinterpose participant in the tree of {root} (control directory {})",
            workload.control_dir.display()
        ))
    };
    if !compose::has_participants(workload, root)? {
        return Ok(skipped());
    }
    let driver = NativeDriver::load_from(&workload.driver).map_err(CommandError::from)?;
    let members = match compose::find_members(workload, &driver, root) {
        Ok(members) => members,
        Err(error) if no_participants(&error) => return Ok(skipped()),
        Err(error) => return Err(error.into()),
    };
    if checkpoint_dir::state(dir).exists() {
        // The same action delivered again: done already if every CUDA process is checkpointed.
        let all_checkpointed = members
            .iter()
            .filter(|member| member.cuda)
            .all(|member| driver.state(member.host_pid).ok() == Some(ProcessState::Checkpointed));
        if all_checkpointed {
            return Ok(Done::skipped("already prepared for this dump"));
        }
        // A state from an earlier dump into this directory (`podman container checkpoint
        // --keep`, a reused image directory): CRIU is about to replace those images, so the
        // state describing them goes too.
        crate::checkpoint_dir::discard(dir);
    }
    let report = compose::checkpoint(workload, root, dir, progress)?;
    watch::spawn(context, root, dir, workload)?;
    Ok(Done::ok(
        "the sharing was taken apart and every CUDA process checkpointed natively",
        Some(report),
    ))
}

fn pre_restore(dir: &Path, workload: &Workload) -> Result<Done, HookError> {
    let has_state = checkpoint_dir::state(dir).exists();
    let has_processes = checkpoint_dir::processes(dir).exists();
    if !has_state && !has_processes {
        return Ok(Done::skipped("no cuinterpose state in these images"));
    }
    // Missing (with a process list) or corrupt: named, and CRIU stops before resuming anyone.
    let saved = state::load(dir).map_err(CommandError::from)?;
    // So is a device map this machine cannot honour (post-resume resolves it again, against
    // the GPUs' free memory once the tree is back).
    if let Some(spec) = &workload.device_map {
        let driver = NativeDriver::load_from(&workload.driver).map_err(CommandError::from)?;
        crate::commands::resolve_device_map(&driver, spec, &saved)?;
        return Ok(Done::ok(
            format!("the state is present and intact; {DEVICE_MAP_VARIABLE} can be honoured"),
            None,
        ));
    }
    Ok(Done::ok("the state is present and intact", None))
}

fn post_resume(tree: &Tree, progress: &mut dyn FnMut(&Event)) -> Result<Done, HookError> {
    let (dir, root, workload) = (tree.dir, tree.root, &tree.workload);
    if !checkpoint_dir::state(dir).exists() {
        return Ok(Done::skipped("no cuinterpose state in these images"));
    }
    if compose::is_restored(workload, root)? {
        return Ok(Done::skipped("already restored"));
    }
    let report = compose::restore_with(
        workload,
        Some(root),
        dir,
        progress,
        NativeRestore::WhereNeeded,
    )?;
    Ok(Done::ok(
        "the sharing was rebuilt and verified",
        Some(report),
    ))
}

/// Appends the outcome of `action` to the status file in `dir` (best effort: a full disk must
/// not hide the outcome, which also goes to stderr and the exit status).
pub fn record(dir: Option<&Path>, action: &str, outcome: &Result<Done, HookError>) -> Value {
    let line = match outcome {
        Ok(done) => json!({
            "action": action,
            "status": done.status,
            "message": done.message,
            "report": done.report.as_ref().map(Report::json),
        }),
        Err(error) => json!({
            "action": action,
            "status": "failed",
            "exit_code": error.exit_code(),
            "message": error.to_string(),
        }),
    };
    if let Some(dir) = dir {
        let path = checkpoint_dir::hook_status(dir);
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(&path) {
            let _ = writeln!(file, "{line}");
        }
    }
    line
}

/// The status file's lines (for callers that check what the hook did).
pub fn read_status(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(checkpoint_dir::hook_status(dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[cfg(test)]
mod tests;
