//! The command line's grammar: every command, flag and help text as clap parses them.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
participants were changed (fail-stop: do not resume the workload); 3 aborted: a participant \
refused or did not answer in time (one silent in prepare_unicast, or in a restore step, is \
waited for up to the quiet window, three control timeouts; the restore then goes on), publishing the state, a native checkpoint step or the CRIU \
dump failed, and the workload was put back in place and resumed (nothing was checkpointed); \
64 usage error.

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
        #[command(flatten)]
        carrier: CarrierArgs,
        /// Print JSON on stdout: one line per phase event as it happens (phase_started,
        /// progress, phase_done), then the report as the last line.
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
    /// process first (a locked one, left by a coordinator killed after the native lock, is
    /// only unlocked; a running one is refused), then the same phases.
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
        /// Print JSON on stdout: one line per phase event as it happens (phase_started,
        /// progress, phase_done), then the report as the last line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        criu: CriuArgs,
        /// The staging window of a checkpoint saved with the storage carrier, in MiB (whole
        /// 64 MiB chunks; default 256). The carrier itself is the state's.
        #[arg(long, value_name = "MIB")]
        staging_mib: Option<u64>,
        /// Restore onto other GPUs: `OLD=NEW,…` pairs every GPU the checkpointed processes saw
        /// with a GPU of this machine, each side an ordinal (the old one as the checkpointing
        /// coordinator's driver numbered the GPUs, the new one as this one's does; leave
        /// CUDA_VISIBLE_DEVICES unset for the coordinator) or a GPU UUID (`GPU-…`, as
        /// `nvidia-smi -L` prints it). `auto`: a GPU still here keeps itself, the others pair
        /// with GPUs of the same model and memory size, in order. Refused before anything
        /// changes when the map is incomplete, not one-to-one, pairs different models, or a GPU
        /// lacks the free memory for the shared memory mapped to it. Each process keeps its
        /// own ordinals, with the new GPUs behind them.
        #[arg(long, value_name = "MAP")]
        device_map: Option<crate::remap::DeviceMapSpec>,
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
        #[command(flatten)]
        carrier: CarrierArgs,
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
        #[command(flatten)]
        carrier: CarrierArgs,
        /// Restore onto other GPUs (for testing a remap in place): `OLD=NEW,…` pairs every GPU the checkpointed processes saw
        /// with a GPU of this machine, each side an ordinal (the old one as the checkpointing
        /// coordinator's driver numbered the GPUs, the new one as this one's does; leave
        /// CUDA_VISIBLE_DEVICES unset for the coordinator) or a GPU UUID (`GPU-…`, as
        /// `nvidia-smi -L` prints it). `auto`: a GPU still here keeps itself, the others pair
        /// with GPUs of the same model and memory size, in order. Refused (the workload
        /// resumes on its own GPUs, exit 3) when the map is incomplete, not one-to-one, pairs different models, or a GPU
        /// lacks the free memory for the shared memory mapped to it. Each process keeps its
        /// own ordinals, with the new GPUs behind them.
        #[arg(long, value_name = "MAP")]
        device_map: Option<crate::remap::DeviceMapSpec>,
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
        /// Also N small shared allocations per process (one granule each: 2 MiB, or
        /// FAKECUDA_GRANULARITY_KIB on the embedded driver), each imported and mapped by the
        /// next process, filled and verified: the control plane at scale (each adds 4 records
        /// to a process, so at most 4000).
        #[arg(long, default_value_t = 0, value_name = "N")]
        mesh: usize,
        /// The driver library for the workers and native checkpoint (default: the embedded
        /// fakecuda; `libcuda.so.1` for the system's NVIDIA driver).
        #[arg(long, value_name = "PATH")]
        driver: Option<PathBuf>,
        /// Keep the work directory (sockets, state, CRIU images, logs).
        #[arg(long)]
        keep: bool,
        /// Print JSON on stdout: one line per phase event as it happens (phase_started,
        /// progress, phase_done), then the report as the last line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        criu: CriuArgs,
        /// With --criu: run plain `criu dump` and `criu restore` twice, configured with one
        /// line naming this executable as CRIU's action script (see `criu-hook`), instead of
        /// driving the steps from here.
        #[arg(long, requires = "criu")]
        criu_hook: bool,
        /// With --criu-hook: CRIU's plugin directory (`libdir` in the configuration), so that
        /// CRIU's own CUDA plugin takes part; on the embedded driver its `cuda-checkpoint` is
        /// fakecuda-checkpoint, and the plugin is forced on (CRIU_FAULT=138).
        #[arg(long, value_name = "DIR", requires = "criu_hook")]
        criu_plugins: Option<PathBuf>,
        /// Run the workers in a Podman container (runc) and checkpoint and restore it twice
        /// with `podman container checkpoint` and `podman container restore`. Needs podman,
        /// CRIU on PATH, and `action-script <this executable>` in /etc/criu/runc.conf.
        #[arg(long, conflicts_with = "criu")]
        podman: bool,
        #[command(flatten)]
        carrier: CarrierArgs,
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
    /// Run as CRIU's action script: a plain `criu dump` / `criu restore` then checkpoints the
    /// sharing too.
    ///
    /// Configure CRIU with one line, `action-script /path/to/cuinterpose` (in the file given
    /// to `--config`, in /etc/criu/default.conf, or in /etc/criu/runc.conf for runc-based
    /// engines such as Podman). CRIU runs the script with no arguments; `cuinterpose` run with
    /// no arguments and CRTOOLS_SCRIPT_ACTION set is this command. At pre-dump: prepare into
    /// the image directory, then native lock and checkpoint of every CUDA process of the tree
    /// (a watcher puts the workload back if CRIU then ends without a dump, or leaves the tree
    /// running); at pre-restore: the state must be intact, and CUINTERPOSE_DEVICE_MAP (the
    /// `--device-map` of a restore onto other GPUs) one this machine can honour; at
    /// post-resume: native restore and unlock where needed, the restore phases and the
    /// comparison. Other actions do nothing. Each outcome is appended to
    /// cuinterpose-hook.status in the image directory. Settings come from the environment
    /// CRIU passes on (CUINTERPOSE_CONTROL_DIR, CUINTERPOSE_DRIVER, CUINTERPOSE_DEVICE_MAP, the
    /// timeouts) or /etc/cuinterpose/criu-hook.conf; a workload in a container is reached
    /// through /proc/ROOT/root.
    CriuHook {
        /// Control directory as the workload sees it (default: $CUINTERPOSE_CONTROL_DIR, else
        /// /tmp/cuinterpose).
        #[arg(long, value_name = "DIR")]
        control_dir: Option<PathBuf>,
        /// Timeout of each native lock in milliseconds (0: wait as long as it takes).
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        lock_timeout_ms: u32,
        /// Internal: watch this CRIU process (started by pre-dump).
        #[arg(long, value_name = "PID", hide = true, requires_all = ["root", "dir"])]
        watch_criu: Option<u32>,
        #[arg(long, value_name = "PID", hide = true)]
        root: Option<u32>,
        #[arg(long, value_name = "DIR", hide = true)]
        dir: Option<PathBuf>,
    },
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

/// Where a checkpoint keeps the shared bytes between the save and the load.
#[derive(Debug, Args)]
pub struct CarrierArgs {
    /// host: each creator keeps its shared bytes in its own memory (1.0x the shared bytes
    /// held for the whole checkpoint; a CRIU dump then writes them into its page images).
    /// storage: each creator writes them to files in the checkpoint directory's carrier/
    /// folder through a staging window (host memory held: the window), synced before the
    /// state is published, read back and verified by the restore. auto: storage where the
    /// checkpoint goes to a directory that is kept (prepare, checkpoint, toggle with --dir
    /// or --criu, demo --criu or --podman; the CRIU hook's image directory, where
    /// CUINTERPOSE_CARRIER sets it), host for a toggle in a temporary directory (nothing need
    /// reach a disk).
    #[arg(long, value_enum, default_value_t = CarrierChoice::Auto)]
    pub carrier: CarrierChoice,
    /// The storage carrier's staging window in MiB: whole 64 MiB chunks, at least one (the
    /// default keeps the copy and three writers busy at once).
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_STAGING_MIB)]
    pub staging_mib: u64,
}

/// `--staging-mib`'s default: the plan's, four chunks.
pub const DEFAULT_STAGING_MIB: u64 = crate::plan::DEFAULT_STAGING_BYTES >> 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CarrierChoice {
    Auto,
    Host,
    Storage,
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
    pub(super) fn get(&self) -> Option<crate::criu::Criu> {
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
    /// Print JSON on stdout: one line per phase event as it happens (phase_started,
    /// progress, phase_done), then the report as the last line.
    #[arg(long)]
    pub json: bool,
}

impl Cli {
    pub(super) fn wants_json(&self) -> bool {
        match &self.command {
            Command::Inspect { json, .. }
            | Command::Prepare { json, .. }
            | Command::Restore { json, .. }
            | Command::Demo { json, .. } => *json,
            Command::Checkpoint { tree, .. } | Command::Toggle { tree, .. } => tree.json,
            Command::Launch { .. } | Command::State(_) | Command::CriuHook { .. } => false,
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match &self.command {
            Command::Inspect { .. } => "inspect",
            Command::Prepare { .. } => "prepare",
            Command::Restore { .. } => "restore",
            Command::Checkpoint { .. } => "checkpoint",
            Command::Toggle { .. } => "toggle",
            Command::Demo { .. } => "demo",
            Command::Launch { .. } => "launch",
            Command::CriuHook { .. } => "criu-hook",
            Command::State(_) => "state",
        }
    }
}
