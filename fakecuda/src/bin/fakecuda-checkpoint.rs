//! fakecuda-checkpoint: drives native checkpoint of another process, like NVIDIA's
//! `cuda-checkpoint`. It loads the driver (`libcuda.so.1`, found through the usual library
//! search path, or `--driver PATH` / `FAKECUDA_LIBCUDA`) and calls its
//! `cuCheckpointProcess*` entry points, so it works against fakecuda or the real driver.

use clap::{Parser, ValueEnum};
use std::ffi::{CStr, c_char, c_int, c_uint};
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Action {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Checkpoint and restore the CUDA state of a running process"
)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["toggle", "action", "get_state", "get_restore_tid"])))]
struct Args {
    /// Suspend a running process (lock + checkpoint) or resume a checkpointed one
    /// (restore + unlock).
    #[arg(long)]
    toggle: bool,
    /// Perform a single step.
    #[arg(long, value_enum)]
    action: Option<Action>,
    /// Print the process state: running, locked, checkpointed or failed.
    #[arg(long)]
    get_state: bool,
    /// Print the id of the thread that serves checkpoint requests in the process (a tool
    /// that stops the process, such as CRIU's CUDA plugin, lets it run during each step).
    #[arg(long)]
    get_restore_tid: bool,
    /// The target process id.
    #[arg(long, short = 'p')]
    pid: c_int,
    /// Lock timeout in milliseconds (0: wait indefinitely).
    #[arg(long, default_value_t = 0)]
    timeout: c_uint,
    /// Restore onto other GPUs: `OLD=NEW` UUID pairs (`GPU-…` as `nvidia-smi -L` prints
    /// them), comma-separated, one for every GPU the process was checkpointed on.
    #[arg(long, value_parser = parse_device_map)]
    device_map: Option<DeviceMap>,
    /// Driver library to load instead of `libcuda.so.1` (also: FAKECUDA_LIBCUDA).
    #[arg(long)]
    driver: Option<std::path::PathBuf>,
}

/// CUcheckpointGpuPair: the old and the new CUuuid.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct GpuPair {
    old: [u8; 16],
    new: [u8; 16],
}

/// CUcheckpointRestoreArgs of CUDA 13: gpuPairs, gpuPairsCount, then zeroed reserved bytes.
#[repr(C)]
struct RestoreArgs {
    pairs: *mut GpuPair,
    count: c_uint,
    reserved: [u8; 52],
}

/// The pairs of one `--device-map` (a newtype: clap reads a bare `Vec` as repeated values).
#[derive(Debug, Clone)]
struct DeviceMap(Vec<GpuPair>);

fn parse_device_map(text: &str) -> Result<DeviceMap, String> {
    text.split(',')
        .map(|pair| {
            let (old, new) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not OLD=NEW"))?;
            Ok(GpuPair {
                old: cuinterpose_abi::uuid::parse_gpu_uuid(old.trim())?,
                new: cuinterpose_abi::uuid::parse_gpu_uuid(new.trim())?,
            })
        })
        .collect::<Result<_, String>>()
        .map(DeviceMap)
}

/// `cuCheckpointProcessGetState` (a CUprocessState) and `…GetRestoreThreadId` (an int).
type QueryFn<T> = unsafe extern "C" fn(c_int, *mut T) -> c_uint;
/// Every step takes an optional args struct: a null pointer, or for lock, the timeout.
type StepFn = unsafe extern "C" fn(c_int, *mut [u64; 8]) -> c_uint;
type RestoreFn = unsafe extern "C" fn(c_int, *mut RestoreArgs) -> c_uint;
type NameFn = unsafe extern "C" fn(c_uint, *mut *const c_char) -> c_uint;

struct DriverState {
    lib: libloading::Library,
}

impl DriverState {
    fn load(path: Option<std::path::PathBuf>) -> Result<DriverState, String> {
        let path = path
            .or_else(|| std::env::var_os("FAKECUDA_LIBCUDA").map(Into::into))
            .unwrap_or_else(|| "libcuda.so.1".into());
        // SAFETY: loading the CUDA driver library runs its initialisers, which is what this
        // tool exists to do.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("cannot load the CUDA driver {}: {e}", path.display()))?;
        Ok(DriverState { lib })
    }

    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        // SAFETY: each symbol is looked up with the C signature cuda.h declares for it.
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("the driver lacks {name}: {e}"))
    }

    fn error_name(&self, code: c_uint) -> String {
        let Ok(f) = self.sym::<NameFn>("cuGetErrorName") else {
            return format!("CUDA error {code}");
        };
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string or null.
        let r = unsafe { f(code, &mut p) };
        if r != 0 || p.is_null() {
            return format!("CUDA error {code}");
        }
        // SAFETY: non-null result of cuGetErrorName: a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{s} ({code})")
    }

    /// The value a query entry point writes for `pid` (`what` names it in an error).
    fn query<T: Copy + Default>(&self, name: &str, what: &str, pid: c_int) -> Result<T, String> {
        let f = self.sym::<QueryFn<T>>(name)?;
        let mut value = T::default();
        // SAFETY: `value` is a valid out-parameter of the type the entry point writes.
        let r = unsafe { f(pid, &mut value) };
        if r != 0 {
            return Err(format!("pid {pid}: {what} failed: {}", self.error_name(r)));
        }
        Ok(value)
    }

    fn state(&self, pid: c_int) -> Result<&'static str, String> {
        let s: c_uint = self.query("cuCheckpointProcessGetState", "get-state", pid)?;
        Ok(match s {
            0 => "running",
            1 => "locked",
            2 => "checkpointed",
            3 => "failed",
            _ => "unknown",
        })
    }

    fn restore_tid(&self, pid: c_int) -> Result<c_int, String> {
        self.query(
            "cuCheckpointProcessGetRestoreThreadId",
            "get-restore-tid",
            pid,
        )
    }

    fn restore(&self, pid: c_int, pairs: &[GpuPair]) -> Result<(), String> {
        if pairs.is_empty() {
            return self.step(pid, Action::Restore, 0);
        }
        let f = self.sym::<RestoreFn>("cuCheckpointProcessRestore")?;
        let mut pairs = pairs.to_vec();
        let mut args = RestoreArgs {
            pairs: pairs.as_mut_ptr(),
            count: pairs.len() as c_uint,
            reserved: [0; 52],
        };
        // SAFETY: `args` is a CUcheckpointRestoreArgs of the CUDA 13 layout naming `count`
        // pairs that outlive the call.
        let r = unsafe { f(pid, &mut args) };
        if r != 0 {
            return Err(format!("pid {pid}: restore failed: {}", self.error_name(r)));
        }
        Ok(())
    }

    fn step(&self, pid: c_int, action: Action, timeout: c_uint) -> Result<(), String> {
        let (name, label) = match action {
            Action::Lock => ("cuCheckpointProcessLock", "lock"),
            Action::Checkpoint => ("cuCheckpointProcessCheckpoint", "checkpoint"),
            Action::Restore => ("cuCheckpointProcessRestore", "restore"),
            Action::Unlock => ("cuCheckpointProcessUnlock", "unlock"),
        };
        let f = self.sym::<StepFn>(name)?;
        // CUcheckpointLockArgs: timeoutMs (u32), reserved0 (u32), reserved1[7]; the other
        // args structs are 64 reserved bytes: all zero.
        let mut args = [0u64; 8];
        if action == Action::Lock {
            args[0] = u64::from(timeout);
        }
        let p: *mut [u64; 8] = if action == Action::Lock {
            &mut args
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: `p` is null or a zeroed 64-byte args struct of the layout cuda.h declares.
        let r = unsafe { f(pid, p) };
        if r != 0 {
            return Err(format!("pid {pid}: {label} failed: {}", self.error_name(r)));
        }
        Ok(())
    }
}

fn run(args: Args) -> Result<(), String> {
    let driver = DriverState::load(args.driver)?;
    let pid = args.pid;
    if args.get_state {
        println!("{}", driver.state(pid)?);
        return Ok(());
    }
    if args.get_restore_tid {
        println!("{}", driver.restore_tid(pid)?);
        return Ok(());
    }
    let pairs = args.device_map.map(|m| m.0).unwrap_or_default();
    if !pairs.is_empty() && !matches!(args.action, None | Some(Action::Restore)) {
        return Err("--device-map goes with a restore (--action restore or --toggle)".into());
    }
    if let Some(action) = args.action {
        if action == Action::Restore {
            return driver.restore(pid, &pairs);
        }
        return driver.step(pid, action, args.timeout);
    }
    match driver.state(pid)? {
        "running" => {
            driver.step(pid, Action::Lock, args.timeout)?;
            // A refused checkpoint must not leave the process locked (every later driver call
            // of it would hang): unlock it again, then report the refusal.
            driver
                .step(pid, Action::Checkpoint, args.timeout)
                .map_err(
                    |refused| match driver.step(pid, Action::Unlock, args.timeout) {
                        Ok(()) => format!("{refused}; the process was unlocked again"),
                        Err(unlock) => {
                            format!("{refused}; unlocking it again failed too: {unlock}")
                        }
                    },
                )
        }
        "checkpointed" => {
            driver.restore(pid, &pairs)?;
            driver.step(pid, Action::Unlock, args.timeout)
        }
        other => Err(format!(
            "pid {pid}: cannot toggle a process in state {other} (use --action to finish the step)"
        )),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fakecuda-checkpoint: {e}");
            ExitCode::FAILURE
        }
    }
}
