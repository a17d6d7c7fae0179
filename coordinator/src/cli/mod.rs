//! The `cuinterpose` command line.
//!
//! Exit codes: 0 success; 1 refused or invalid, nothing was changed; 2 failed after
//! participants were changed (fail-stop: the workload must not resume); 3 aborted after
//! participants were changed, the workload put back in place and resumed; 64 usage (bad
//! arguments or settings); `launch` passes on its command's status (127/126 when it cannot run).

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use cuinterpose_protocol::NamespacePid;
use cuinterpose_protocol::transport::{CONTROL_DIR_VARIABLE, Timeouts, control_dir_from};
use serde_json::{Value, json};

use crate::commands::{self, CommandError};
use crate::compose::{self, Workload};
use crate::report::{PhaseReport, Report};
use crate::session::{self, Session};
use crate::{render, state};

/// Exit status: refused or invalid, nothing changed.
pub const EXIT_REFUSED: u8 = 1;
/// Exit status: failed after mutation (fail-stop).
pub const EXIT_FAIL_STOP: u8 = 2;
/// Exit status: aborted after mutation; the workload was put back in place and resumed.
pub const EXIT_ABORTED: u8 = 3;
/// Exit status: usage error (`EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;
/// Names the shim library `launch` preloads when `--shim` is not given.
pub const SHIM_VARIABLE: &str = "CUINTERPOSE_SHIM";
/// The shim's file name, looked for next to the `cuinterpose` executable.
pub const SHIM_FILE_NAME: &str = "libcuinterpose.so";

const ABOUT: &str = "Checkpoint and restore multi-process CUDA workloads that share GPU memory";

const LONG_ABOUT: &str = "\
Checkpoint and restore multi-process CUDA workloads that share GPU memory.

Every process of the workload runs with the cuinterpose shim preloaded (see `launch`), which \
records how memory is shared and listens on <control dir>/cuinterpose-<namespace pid>.sock. \
This tool talks to those sockets.

A checkpoint, in order:
  1. inspect    (optional) read-only preflight: every participant's records, validated.
  2. prepare    inspect and validate again, then begin_checkpoint (freezes tracked CUDA calls),
                prepare_multicast, save_allocations (creators copy shared bytes to host
                memory), prepare_unicast (sharing released); publishes cuinterpose.state.
  3. native checkpoint of every CUDA process (lock, then checkpoint), e.g. cuda-checkpoint.
  4. (optional) a process checkpoint such as CRIU.
A restore, in order:
  1. (optional) the process restore.
  2. native restore and unlock of every CUDA process.
  3. restore    load_allocations, restore_unicast, the four multicast phases, then a final
                inspect compared record by record with cuinterpose.state.
`checkpoint` does steps 2-3 of a checkpoint, `restore --dir` steps 2-3 of a restore, and
`toggle` both in place.

Exit status: 0 success; 1 refused or invalid (nothing was changed); 2 failed after the \
participants were changed (fail-stop: do not resume the workload); 3 publishing the state, a \
native checkpoint step or the CRIU dump failed and the workload was put back in place and \
resumed (nothing was checkpointed); 64 usage error.

Environment: CUINTERPOSE_CONTROL_DIR (control directory, default /tmp/cuinterpose),
CUINTERPOSE_CONTROL_TIMEOUT_SECONDS (default 10), CUINTERPOSE_COPY_TIMEOUT_SECONDS (for
save_allocations and load_allocations, default 3600), CUINTERPOSE_DRIVER (driver library for
native checkpoint, default libcuda.so.1), CUINTERPOSE_SHIM (the library `launch` preloads).";

#[derive(Debug, Parser)]
#[command(name = "cuinterpose", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show every participant's records and whether a checkpoint would be accepted; read-only.
    ///
    /// Exits 1 when a participant does not answer or the topology is invalid.
    Inspect {
        #[command(flatten)]
        target: Target,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Take the participants apart for a native checkpoint and write cuinterpose.state.
    ///
    /// inspect → validate → begin_checkpoint → prepare_multicast → save_allocations →
    /// prepare_unicast → publish the state. Refuses a directory that already holds a state
    /// before contacting anyone. Afterwards every participant is `released`: checkpoint each
    /// CUDA process natively, then `restore` rebuilds the sharing.
    Prepare {
        /// Directory for cuinterpose.state (created if missing; must not hold a state).
        #[arg(long, value_name = "DIR")]
        checkpoint_dir: PathBuf,
        #[command(flatten)]
        target: Target,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the participants' sharing after a native restore (or natively restore first).
    ///
    /// With --checkpoint-dir: the coordinator phases only, for processes already natively
    /// restored and unlocked: load cuinterpose.state → check the live participants against it
    /// → load_allocations → restore_unicast → the four restore_multicast_* phases → a final
    /// inspect compared with the saved records.
    ///
    /// With --dir (after `cuinterpose checkpoint`): natively restore and unlock every CUDA
    /// process first, then the same phases.
    #[command(group(clap::ArgGroup::new("where").required(true).args(["checkpoint_dir", "dir"])))]
    Restore {
        /// Checkpoint directory written by `prepare`; run the coordinator phases only.
        #[arg(long, value_name = "DIR")]
        checkpoint_dir: Option<PathBuf>,
        /// Checkpoint directory written by `checkpoint`; natively restore the processes first.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Control directory (default: $CUINTERPOSE_CONTROL_DIR, else /tmp/cuinterpose).
        #[arg(long, value_name = "DIR")]
        control_dir: Option<PathBuf>,
        /// With --checkpoint-dir: a participant's namespace PID (repeatable; default: every
        /// socket in the control directory). With --dir: the host PID of the workload's root
        /// process (default: the processes `checkpoint` recorded).
        #[arg(long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        criu: CriuArgs,
    },
    /// prepare, then native lock and checkpoint of every CUDA process of a process tree.
    ///
    /// The workload is ROOT and its descendants; its CUDA processes are those the driver
    /// knows, its participants those with a socket in the control directory.
    Checkpoint {
        #[command(flatten)]
        tree: Tree,
        /// Checkpoint directory (created if missing; must not hold a state).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        #[command(flatten)]
        criu: CriuArgs,
    },
    /// checkpoint, then restore, in place: the workload continues with its sharing rebuilt.
    ///
    /// Like `cuda-checkpoint --toggle`, for a whole process tree: inspect and validate →
    /// begin_checkpoint (application driver calls wait at the shim's gate; calls in flight
    /// drain) → prepare_multicast → save_allocations → prepare_unicast → publish
    /// cuinterpose.state → native lock and checkpoint of every CUDA process → native restore
    /// and unlock → load_allocations → restore_unicast → the four restore_multicast_* phases →
    /// a final inspect compared record by record with the state; then the gate reopens.
    ///
    /// A failure after the sharing was released (the state cannot be published, a native
    /// step refused, the CRIU dump failed) puts the workload back and exits 3. Without --dir
    /// the state goes to a temporary directory, removed afterwards unless a fail-stop needs it.
    /// --criu dumps the tree with CRIU between the native checkpoint and restore (which ends and
    /// recreates the processes) and needs --dir for the images.
    Toggle {
        #[command(flatten)]
        tree: Tree,
        /// Checkpoint directory to keep (default: a temporary one, removed on success).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        #[command(flatten)]
        criu: CriuArgs,
    },
    /// Show the whole product working, on the embedded fakecuda driver (no GPU needed).
    ///
    /// Starts worker processes under the shim (cuinterpose-worker, libcuinterpose.so and
    /// fakecuda's libcuda.so, all found next to this executable: nothing is built at run time),
    /// builds a sharing topology (an allocation every process imports, a partial import,
    /// private and untracked memory, a cuMemAlloc buffer shared through cuIpcGetMemHandle),
    /// fills every byte with a known pattern, checkpoints and restores in place (with --criu:
    /// dumps the process tree with CRIU, kills it and restores it from the images), then
    /// verifies every byte at its original address and that writes are still shared.
    Demo {
        /// Worker processes (at least 2).
        #[arg(long, default_value_t = 3)]
        processes: usize,
        /// MiB of the allocation every process imports (its bytes are what the host carrier
        /// saves and loads; raise it to measure copy throughput).
        #[arg(long, default_value_t = 8, value_name = "MIB")]
        shared_mib: u64,
        /// The driver library for the workers and native checkpoint (default: the embedded
        /// fakecuda; `libcuda.so.1` for the system's NVIDIA driver).
        #[arg(long, value_name = "PATH")]
        driver: Option<PathBuf>,
        /// Keep the work directory (sockets, state, CRIU images, logs).
        #[arg(long)]
        keep: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        criu: CriuArgs,
    },
    /// Run a command with the shim preloaded (LD_PRELOAD), replacing this process.
    Launch {
        /// The shim library (default: $CUINTERPOSE_SHIM, else libcuinterpose.so next to this
        /// executable).
        #[arg(long, value_name = "PATH")]
        shim: Option<PathBuf>,
        /// Control directory the shim listens in (sets CUINTERPOSE_CONTROL_DIR).
        #[arg(long, value_name = "DIR")]
        control_dir: Option<PathBuf>,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
    /// Read a checkpoint's state file.
    #[command(subcommand)]
    State(StateCommand),
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Print cuinterpose.state decoded: hex ids, enum names.
    Show {
        /// A checkpoint directory, or the state file itself.
        path: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

/// Which participants: a control directory and optional namespace PIDs.
#[derive(Debug, Args)]
pub struct Target {
    /// Control directory (default: $CUINTERPOSE_CONTROL_DIR, else /tmp/cuinterpose).
    #[arg(long, value_name = "DIR")]
    pub control_dir: Option<PathBuf>,
    /// A participant's namespace PID (repeatable; default: every socket in the control
    /// directory).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
}

/// Process checkpoint with CRIU.
#[derive(Debug, Args)]
pub struct CriuArgs {
    /// Also checkpoint (dump, which ends the processes) or restore the process tree with CRIU.
    /// The workload must run as its own PID namespace (`unshare -fp setsid CMD`) and hold no
    /// connection to a process outside its tree.
    #[arg(long)]
    pub criu: bool,
    /// The CRIU binary (default: $CUINTERPOSE_CRIU, else `criu` on PATH).
    #[arg(long, value_name = "PATH")]
    pub criu_binary: Option<PathBuf>,
}

impl CriuArgs {
    fn get(&self) -> Option<crate::criu::Criu> {
        self.criu
            .then(|| crate::criu::Criu::locate(self.criu_binary.clone()))
    }
}

/// A workload as a process tree.
#[derive(Debug, Args)]
pub struct Tree {
    /// Host PID of the workload's root process.
    #[arg(long = "pid", value_name = "ROOT")]
    pub root: u32,
    /// Control directory (default: $CUINTERPOSE_CONTROL_DIR, else /tmp/cuinterpose).
    #[arg(long, value_name = "DIR")]
    pub control_dir: Option<PathBuf>,
    /// Timeout of each native lock in milliseconds (0: wait as long as it takes).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub lock_timeout_ms: u32,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A usage problem found after parsing (settings from the environment, PID values).
#[derive(Debug)]
struct Usage(String);

enum Failure {
    Usage(Usage),
    Command(CommandError),
}

impl From<CommandError> for Failure {
    fn from(error: CommandError) -> Self {
        Self::Command(error)
    }
}

impl From<Usage> for Failure {
    fn from(error: Usage) -> Self {
        Self::Usage(error)
    }
}

/// Parses `args` and runs the command.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let json = cli.wants_json();
    let command = cli.name();
    match execute(cli.command) {
        Ok(code) => code,
        Err(Failure::Usage(Usage(message))) => {
            eprintln!("cuinterpose: {message}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Command(error)) => {
            let code = error.exit_code();
            for line in error.to_string().lines() {
                eprintln!("cuinterpose: {line}");
            }
            if json {
                print_json(&failure_json(command, &error));
            }
            ExitCode::from(code)
        }
    }
}

impl Cli {
    fn wants_json(&self) -> bool {
        match &self.command {
            Command::Inspect { json, .. }
            | Command::Prepare { json, .. }
            | Command::Restore { json, .. }
            | Command::Demo { json, .. } => *json,
            Command::Checkpoint { tree, .. } | Command::Toggle { tree, .. } => tree.json,
            Command::Launch { .. } | Command::State(_) => false,
        }
    }

    fn name(&self) -> &'static str {
        match &self.command {
            Command::Inspect { .. } => "inspect",
            Command::Prepare { .. } => "prepare",
            Command::Restore { .. } => "restore",
            Command::Checkpoint { .. } => "checkpoint",
            Command::Toggle { .. } => "toggle",
            Command::Demo { .. } => "demo",
            Command::Launch { .. } => "launch",
            Command::State(_) => "state",
        }
    }
}

fn control_dir(flag: Option<PathBuf>) -> Result<PathBuf, Usage> {
    let value = flag
        .map(OsString::from)
        .or_else(|| std::env::var_os(CONTROL_DIR_VARIABLE));
    control_dir_from(value).map_err(|error| Usage(format!("control directory: {error}")))
}

fn timeouts() -> Result<Timeouts, Usage> {
    Timeouts::from_env().map_err(|error| Usage(error.to_string()))
}

fn namespace_pids(values: &[u32]) -> Result<Vec<NamespacePid>, Usage> {
    values
        .iter()
        .map(|&value| {
            NamespacePid::new(value).ok_or_else(|| Usage("--pid 0 names no process".to_string()))
        })
        .collect()
}

fn session(target: &Target) -> Result<Session, Failure> {
    let dir = control_dir(target.control_dir.clone())?;
    let pids = namespace_pids(&target.pids)?;
    Ok(Session::open(&dir, &pids, timeouts()?).map_err(CommandError::from)?)
}

fn workload(tree: &Tree) -> Result<Workload, Usage> {
    Ok(Workload {
        control_dir: control_dir(tree.control_dir.clone())?,
        timeouts: timeouts()?,
        lock_timeout_ms: tree.lock_timeout_ms,
        proc_dir: PathBuf::from("/proc"),
    })
}

/// Progress on stderr as phases complete (the report goes to stdout at the end).
fn progress(json: bool) -> impl FnMut(&PhaseReport) {
    move |phase: &PhaseReport| {
        if !json {
            eprintln!(
                "cuinterpose: {} done in {:.1} ms",
                phase.name,
                phase.duration.as_secs_f64() * 1e3
            );
        }
    }
}

fn print_json(value: &Value) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{value}");
}

fn print_report(report: &Report, json: bool) {
    if json {
        print_json(&report.json());
    } else {
        print!("{}", report.text());
    }
}

fn failure_json(command: &str, error: &CommandError) -> Value {
    let mut value = json!({
        "command": command,
        "status": "failed",
        "exit_code": error.exit_code(),
        "message": error.to_string(),
    });
    if let CommandError::Aborted { resumed, .. } = error {
        value["status"] = json!("aborted");
        value["resumed"] = resumed.json();
    }
    let run = match error {
        CommandError::Run(run) => Some(run),
        CommandError::AfterMutation { source, .. } | CommandError::Aborted { source, .. } => {
            match source.as_ref() {
                CommandError::Run(run) => Some(run),
                _ => None,
            }
        }
        _ => None,
    };
    if let Some(run) = run {
        value["phase"] = json!(run.stage.name());
        value["mutated"] = json!(run.mutated);
        value["fail_stopped"] = json!(
            run.fail_stopped
                .iter()
                .map(|pid| pid.get())
                .collect::<Vec<_>>()
        );
        value["failures"] = Value::Array(
            run.failures
                .iter()
                .map(|failure| {
                    json!({
                        "participant": failure.participant.map(NamespacePid::get),
                        "message": failure.to_string(),
                    })
                })
                .collect(),
        );
    }
    value
}

fn execute(command: Command) -> Result<ExitCode, Failure> {
    match command {
        Command::Inspect { target, json } => inspect(&target, json),
        Command::Prepare {
            checkpoint_dir,
            target,
            json,
        } => {
            let session = session(&target)?;
            let report = commands::prepare(&session, &checkpoint_dir, &mut progress(json))?;
            print_report(&report, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore {
            checkpoint_dir,
            dir,
            control_dir: control,
            pids,
            json,
            criu,
        } => {
            if criu.criu && dir.is_none() {
                return Err(Usage(
                    "--criu restores a checkpoint taken with `checkpoint --criu`: use --dir".into(),
                )
                .into());
            }
            let report = match (checkpoint_dir, dir) {
                (Some(checkpoint_dir), None) => {
                    // The state first: a missing or corrupt one is named as such, not as
                    // "no participants" when nothing runs.
                    state::load(&checkpoint_dir).map_err(CommandError::from)?;
                    let session = session(&Target {
                        control_dir: control,
                        pids,
                    })?;
                    commands::restore(&session, &checkpoint_dir, &mut progress(json))?
                }
                (None, Some(dir)) => {
                    if pids.len() > 1 {
                        return Err(Usage(
                            "with --dir, --pid names the workload's root process once".into(),
                        )
                        .into());
                    }
                    let workload = Workload {
                        control_dir: control_dir(control)?,
                        timeouts: timeouts()?,
                        lock_timeout_ms: 0,
                        proc_dir: PathBuf::from("/proc"),
                    };
                    match criu.get() {
                        Some(criu) => {
                            crate::criu::restore(&workload, &criu, &dir, &mut progress(json))?
                        }
                        None => compose::restore(
                            &workload,
                            pids.first().copied(),
                            &dir,
                            &mut progress(json),
                        )?,
                    }
                }
                _ => unreachable!("clap requires exactly one of --checkpoint-dir and --dir"),
            };
            print_report(&report, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Checkpoint { tree, dir, criu } => {
            let workload = workload(&tree)?;
            let report = match criu.get() {
                Some(criu) => crate::criu::checkpoint(
                    &workload,
                    &criu,
                    tree.root,
                    &dir,
                    &mut progress(tree.json),
                )?,
                None => compose::checkpoint(&workload, tree.root, &dir, &mut progress(tree.json))?,
            };
            print_report(&report, tree.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Toggle { tree, dir, criu } => {
            let workload = workload(&tree)?;
            let report = match criu.get() {
                Some(criu) => {
                    let dir = dir
                        .ok_or_else(|| Usage("toggle --criu needs --dir for the images".into()))?;
                    let mut report = Report::new("toggle");
                    report.absorb(crate::criu::checkpoint(
                        &workload,
                        &criu,
                        tree.root,
                        &dir,
                        &mut progress(tree.json),
                    )?);
                    report.absorb(crate::criu::restore(
                        &workload,
                        &criu,
                        &dir,
                        &mut progress(tree.json),
                    )?);
                    report
                }
                None => compose::toggle(
                    &workload,
                    tree.root,
                    dir.as_deref(),
                    &mut progress(tree.json),
                )?,
            };
            print_report(&report, tree.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            processes,
            shared_mib,
            driver,
            keep,
            json,
            criu,
        } => {
            let options = crate::demo::Options {
                processes,
                shared_mib,
                criu: criu.get(),
                driver: driver.map_or(
                    crate::demo::DriverChoice::Embedded,
                    crate::demo::DriverChoice::Path,
                ),
                keep,
            };
            match crate::demo::run(&options, &mut progress(json)) {
                Ok(outcome) => {
                    if json {
                        print_json(&outcome.json());
                    } else {
                        print!("{}", outcome.text());
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("cuinterpose demo: FAILED: {error}");
                    Ok(ExitCode::from(error.exit_code()))
                }
            }
        }
        Command::Launch {
            shim,
            control_dir: control,
            command,
        } => launch(shim, control, command),
        Command::State(StateCommand::Show { path, format }) => {
            let state = if path.is_dir() {
                state::load(&path)
            } else {
                state::load_file(&path)
            }
            .map_err(CommandError::from)?;
            let value = render::state_json(&state);
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&value).expect("JSON values serialize")
                ),
                Format::Yaml => print!("{}", render::yaml(&value)),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn inspect(target: &Target, json: bool) -> Result<ExitCode, Failure> {
    let session = session(target)?;
    let inspection = session::inspect(&session);
    if json {
        let participants: serde_json::Map<String, Value> = inspection
            .replies
            .iter()
            .map(|(pid, reply)| {
                let value = match reply {
                    Ok(reply) => json!({
                        "phase": reply.phase.wire_name(),
                        "raw_imports": reply.raw_imports,
                        "records": reply.records.iter().map(render::record_json).collect::<Vec<_>>(),
                    }),
                    Err(error) => json!({ "error": error }),
                };
                (pid.to_string(), value)
            })
            .collect();
        let mut value = json!({
            "participants": participants,
            "valid": inspection.is_valid(),
        });
        match &inspection.validation {
            Some(Ok(topology)) => {
                value["summary"] = json!({
                    "participants": topology.participants.len(),
                    "records": topology.records,
                    "shared_allocations": topology.shared_allocations.len(),
                    "importer_records": topology.importer_records,
                    "bytes_to_save": topology.bytes_to_save,
                    "multicast_groups": topology.multicast_groups.len(),
                });
            }
            Some(Err(errors)) => {
                value["errors"] = json!(errors.iter().map(ToString::to_string).collect::<Vec<_>>());
            }
            None => {
                value["errors"] = json!(["not every participant answered"]);
            }
        }
        print_json(&value);
    } else {
        for (pid, reply) in &inspection.replies {
            match reply {
                Ok(reply) => print!("{}", render::inspection_text(*pid, reply)),
                Err(error) => println!("participant {pid}: no inspection: {error}"),
            }
        }
        match &inspection.validation {
            Some(Ok(topology)) => println!(
                "topology: valid: {} participants, {} records, {} shared allocations ({} bytes to save), {} importer records, {} multicast groups",
                topology.participants.len(),
                topology.records,
                topology.shared_allocations.len(),
                topology.bytes_to_save,
                topology.importer_records,
                topology.multicast_groups.len()
            ),
            Some(Err(errors)) => {
                println!(
                    "topology: invalid ({} problem{}):",
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                );
                for error in errors {
                    println!("  {error}");
                }
            }
            None => println!("topology: not validated: not every participant answered"),
        }
    }
    Ok(ExitCode::from(if inspection.is_valid() {
        0
    } else {
        EXIT_REFUSED
    }))
}

/// The shim `launch` preloads: `--shim`, else $CUINTERPOSE_SHIM, else next to `exe`.
pub fn shim_path(flag: Option<PathBuf>, variable: Option<OsString>, exe: &Path) -> PathBuf {
    flag.or_else(|| {
        variable
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| {
        exe.parent()
            .unwrap_or_else(|| Path::new("."))
            .join(SHIM_FILE_NAME)
    })
}

/// `LD_PRELOAD` with `shim` first, keeping what was there.
pub fn preload_value(shim: &Path, existing: Option<OsString>) -> OsString {
    let mut value = OsString::from(shim);
    if let Some(existing) = existing.filter(|existing| !existing.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

fn launch(
    shim: Option<PathBuf>,
    control: Option<PathBuf>,
    command: Vec<OsString>,
) -> Result<ExitCode, Failure> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("cuinterpose"));
    let shim = shim_path(shim, std::env::var_os(SHIM_VARIABLE), &exe);
    let shim = std::fs::canonicalize(&shim).map_err(|error| {
        Usage(format!(
            "shim {}: {error} (build it with `cargo build -p cuinterpose-shim`, or pass --shim)",
            shim.display()
        ))
    })?;
    let (program, args) = command.split_first().expect("clap requires a command");
    let mut child = std::process::Command::new(program);
    child.args(args).env(
        "LD_PRELOAD",
        preload_value(&shim, std::env::var_os("LD_PRELOAD")),
    );
    if let Some(control) = control {
        let dir = control_dir(Some(control))?;
        child.env(CONTROL_DIR_VARIABLE, dir);
    }
    let error = child.exec();
    eprintln!(
        "cuinterpose: cannot run {}: {error}",
        Path::new(program).display()
    );
    Ok(ExitCode::from(
        if error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_exit_64() {
        assert_eq!(
            run(["cuinterpose", "frobnicate"]),
            ExitCode::from(EXIT_USAGE)
        );
        assert_eq!(run(["cuinterpose", "prepare"]), ExitCode::from(EXIT_USAGE));
        assert_eq!(
            run([
                "cuinterpose",
                "restore",
                "--dir",
                "/a",
                "--checkpoint-dir",
                "/b"
            ]),
            ExitCode::from(EXIT_USAGE)
        );
        assert_eq!(
            run(["cuinterpose", "inspect", "--control-dir", "relative/dir"]),
            ExitCode::from(EXIT_USAGE)
        );
        assert_eq!(
            run([
                "cuinterpose",
                "inspect",
                "--control-dir",
                "/tmp",
                "--pid",
                "0"
            ]),
            ExitCode::from(EXIT_USAGE)
        );
    }

    #[test]
    fn shim_is_found_next_to_the_executable() {
        let exe = Path::new("/opt/cuinterpose/bin/cuinterpose");
        assert_eq!(
            shim_path(None, None, exe),
            Path::new("/opt/cuinterpose/bin/libcuinterpose.so")
        );
        assert_eq!(
            shim_path(None, Some("/x/shim.so".into()), exe),
            Path::new("/x/shim.so")
        );
        assert_eq!(
            shim_path(Some("/y/shim.so".into()), Some("/x/shim.so".into()), exe),
            Path::new("/y/shim.so")
        );
        assert_eq!(
            preload_value(Path::new("/s.so"), Some("/other.so".into())),
            OsString::from("/s.so:/other.so")
        );
        assert_eq!(
            preload_value(Path::new("/s.so"), Some("".into())),
            OsString::from("/s.so")
        );
    }
}
