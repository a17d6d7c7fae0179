//! Native CUDA checkpoint of another process through the driver's `cuCheckpointProcess*`
//! entry points (what NVIDIA's `cuda-checkpoint` does), by host PID.
//!
//! The driver is `dlopen`ed at run time: `libcuda.so.1` through the usual search path, or the
//! file [`DRIVER_VARIABLE`] names (fakecuda on machines without a GPU). Results are read as raw
//! integers and decoded here, so an unknown value from a newer driver is an error message, not
//! undefined behaviour.

use std::ffi::{CStr, OsString, c_char, c_int, c_uint};
use std::fmt;
use std::path::{Path, PathBuf};

mod devices;
pub use devices::MachineDevice;

/// Names the driver library to load instead of `libcuda.so.1`.
pub const DRIVER_VARIABLE: &str = "CUINTERPOSE_DRIVER";
/// The driver's soname.
pub const DEFAULT_DRIVER: &str = "libcuda.so.1";

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// A value this build does not know.
    Unknown(u32),
}

impl ProcessState {
    pub fn from_raw(value: u32) -> Self {
        match value {
            0 => Self::Running,
            1 => Self::Locked,
            2 => Self::Checkpointed,
            3 => Self::Failed,
            other => Self::Unknown(other),
        }
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Running => f.write_str("running"),
            Self::Locked => f.write_str("locked"),
            Self::Checkpointed => f.write_str("checkpointed"),
            Self::Failed => f.write_str("failed"),
            Self::Unknown(value) => write!(f, "unknown state {value}"),
        }
    }
}

/// One driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeStep {
    GetState,
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl NativeStep {
    pub fn symbol(self) -> &'static str {
        match self {
            Self::GetState => "cuCheckpointProcessGetState",
            Self::Lock => "cuCheckpointProcessLock",
            Self::Checkpoint => "cuCheckpointProcessCheckpoint",
            Self::Restore => "cuCheckpointProcessRestore",
            Self::Unlock => "cuCheckpointProcessUnlock",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::GetState => "get state",
            Self::Lock => "lock",
            Self::Checkpoint => "checkpoint",
            Self::Restore => "restore",
            Self::Unlock => "unlock",
        }
    }
}

impl fmt::Display for NativeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error("cannot load the CUDA driver {}: {message}", path.display())]
    Load { path: PathBuf, message: String },
    #[error("the CUDA driver {} lacks {symbol}: {message}", path.display())]
    MissingSymbol {
        path: PathBuf,
        symbol: &'static str,
        message: String,
    },
    #[error("process {pid}: native {step} failed: {name} ({code})")]
    Call {
        pid: u32,
        step: NativeStep,
        code: u32,
        name: String,
    },
    #[error("listing the machine's GPUs: {call} failed: {name}")]
    Devices { call: &'static str, name: String },
    #[error("process {pid}: not a valid process id for the driver")]
    InvalidPid { pid: u32 },
    #[error("process {pid}: native {step} needs state {expected}, the process is {found}")]
    WrongState {
        pid: u32,
        step: NativeStep,
        expected: ProcessState,
        found: ProcessState,
    },
}

/// `CUcheckpointLockArgs`: `timeoutMs`, then reserved zeroes (64 bytes in all).
#[repr(C)]
#[derive(Debug, Default)]
struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs`, `CUcheckpointRestoreArgs`, `CUcheckpointUnlockArgs`: 64
/// bytes, all zero (for restore: no GPU pairs).
#[repr(C)]
#[derive(Debug, Default)]
struct ZeroArgs {
    reserved: [u64; 8],
}

/// `CUcheckpointGpuPair`: the checkpointed GPU's CUuuid, then the one to restore onto.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GpuPair {
    pub old: [u8; 16],
    pub new: [u8; 16],
}

/// `CUcheckpointRestoreArgs` of CUDA 13: `gpuPairs`, `gpuPairsCount`, zeroed reserved bytes.
#[repr(C)]
#[derive(Debug)]
struct RestoreArgs {
    pairs: *mut GpuPair,
    count: c_uint,
    reserved: [u8; 52],
}

const _: () = assert!(
    size_of::<LockArgs>() == 64 && size_of::<ZeroArgs>() == 64 && size_of::<RestoreArgs>() == 64
);

type GetStateFn = unsafe extern "C" fn(c_int, *mut c_uint) -> c_uint;
type LockFn = unsafe extern "C" fn(c_int, *mut LockArgs) -> c_uint;
type StepFn = unsafe extern "C" fn(c_int, *mut ZeroArgs) -> c_uint;
type ErrorNameFn = unsafe extern "C" fn(c_uint, *mut *const c_char) -> c_uint;

/// A loaded driver's checkpoint entry points.
#[derive(Debug)]
pub struct NativeDriver {
    path: PathBuf,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: StepFn,
    restore: StepFn,
    unlock: StepFn,
    error_name: Option<ErrorNameFn>,
    /// Keeps the entry points above loaded (dropped last); device queries look theirs up.
    library: libloading::Library,
}

impl NativeDriver {
    pub fn load_from(path: &Path) -> Result<Self, NativeError> {
        // SAFETY: loading the CUDA driver runs its initialisers; that is what this module is for,
        // and the library is one the user chose (or the system's driver).
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|error| NativeError::Load {
                path: path.to_path_buf(),
                message: error.to_string(),
            })?;
        macro_rules! entry {
            ($step:expr, $type:ty) => {{
                let name = $step.symbol();
                // SAFETY: the symbol is looked up with the C signature cuda.h declares for it
                // (`CUresult f(int pid, Args* args)`, CUresult and CUprocessState read as u32).
                unsafe { library.get::<$type>(name.as_bytes()) }
                    .map(|entry| *entry)
                    .map_err(|error| NativeError::MissingSymbol {
                        path: path.to_path_buf(),
                        symbol: name,
                        message: error.to_string(),
                    })?
            }};
        }
        let get_state = entry!(NativeStep::GetState, GetStateFn);
        let lock = entry!(NativeStep::Lock, LockFn);
        let checkpoint = entry!(NativeStep::Checkpoint, StepFn);
        let restore = entry!(NativeStep::Restore, StepFn);
        let unlock = entry!(NativeStep::Unlock, StepFn);
        // SAFETY: `CUresult cuGetErrorName(CUresult error, const char** pStr)`.
        let error_name = unsafe { library.get::<ErrorNameFn>(b"cuGetErrorName") }
            .ok()
            .map(|entry| *entry);
        Ok(Self {
            path: path.to_path_buf(),
            get_state,
            lock,
            checkpoint,
            restore,
            unlock,
            error_name,
            library,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `CUDA_ERROR_...` for a result code, or `CUDA error N` if the driver cannot name it.
    pub fn error_name(&self, code: u32) -> String {
        let fallback = || format!("CUDA error {code}");
        let Some(name) = self.error_name else {
            return fallback();
        };
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string (or leaves
        // it null) into the out-parameter, which is a valid `*const c_char` slot.
        let result = unsafe { name(code, &mut text) };
        if result != 0 || text.is_null() {
            return fallback();
        }
        // SAFETY: non-null result of cuGetErrorName: a static NUL-terminated string.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, pid: u32, step: NativeStep, code: u32) -> Result<(), NativeError> {
        if code == 0 {
            return Ok(());
        }
        Err(NativeError::Call {
            pid,
            step,
            code,
            name: self.error_name(code),
        })
    }

    fn raw_pid(pid: u32) -> Result<c_int, NativeError> {
        c_int::try_from(pid)
            .ok()
            .filter(|&raw| raw > 0)
            .ok_or(NativeError::InvalidPid { pid })
    }

    /// The process's checkpoint state. Fails for a process that never initialised CUDA.
    pub fn state(&self, pid: u32) -> Result<ProcessState, NativeError> {
        let raw = Self::raw_pid(pid)?;
        let mut state: c_uint = 0;
        // SAFETY: `state` is a valid CUprocessState out-parameter (a C enum, 32 bits).
        let code = unsafe { (self.get_state)(raw, &mut state) };
        self.check(pid, NativeStep::GetState, code)?;
        Ok(ProcessState::from_raw(state))
    }

    /// Locks the process's CUDA API, waiting at most `timeout_ms` for running calls to drain
    /// (0: no limit).
    pub fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), NativeError> {
        let raw = Self::raw_pid(pid)?;
        let mut args = LockArgs {
            timeout_ms,
            ..LockArgs::default()
        };
        // SAFETY: `args` is a CUcheckpointLockArgs laid out as cuda.h declares, reserved fields
        // zero, alive for the call.
        let code = unsafe { (self.lock)(raw, &mut args) };
        self.check(pid, NativeStep::Lock, code)
    }

    fn zero_args_step(&self, pid: u32, step: NativeStep) -> Result<(), NativeError> {
        let raw = Self::raw_pid(pid)?;
        let entry = match step {
            NativeStep::Checkpoint => self.checkpoint,
            NativeStep::Restore => self.restore,
            NativeStep::Unlock => self.unlock,
            NativeStep::GetState | NativeStep::Lock => unreachable!("not a zero-args step"),
        };
        let mut args = ZeroArgs::default();
        // SAFETY: `args` is the 64-byte args struct of this entry point with every field zero
        // (for restore: a null gpuPairs pointer and a zero count), alive for the call.
        let code = unsafe { entry(raw, &mut args) };
        self.check(pid, step, code)
    }

    /// Saves the locked process's device memory to host memory and releases its GPU resources.
    pub fn checkpoint(&self, pid: u32) -> Result<(), NativeError> {
        self.zero_args_step(pid, NativeStep::Checkpoint)
    }

    /// Re-acquires GPU resources and copies device memory back; the process stays locked.
    pub fn restore(&self, pid: u32) -> Result<(), NativeError> {
        self.zero_args_step(pid, NativeStep::Restore)
    }

    /// `restore` onto other GPUs: `pairs` names every GPU the process was checkpointed on and
    /// the one it gets (empty: the same GPUs).
    pub fn restore_onto(&self, pid: u32, pairs: &[GpuPair]) -> Result<(), NativeError> {
        if pairs.is_empty() {
            return self.restore(pid);
        }
        let raw = Self::raw_pid(pid)?;
        let mut pairs = pairs.to_vec();
        let mut args = RestoreArgs {
            pairs: pairs.as_mut_ptr(),
            count: pairs.len() as c_uint,
            reserved: [0; 52],
        };
        let entry = self.restore;
        // SAFETY: `args` is a CUcheckpointRestoreArgs of the CUDA 13 layout (64 bytes, reserved
        // zero) naming `count` pairs that outlive the call; the entry point reads only that.
        let code = unsafe { entry(raw, (&raw mut args).cast::<ZeroArgs>()) };
        self.check(pid, NativeStep::Restore, code)
    }

    /// Lets the process's CUDA calls run again.
    pub fn unlock(&self, pid: u32) -> Result<(), NativeError> {
        self.zero_args_step(pid, NativeStep::Unlock)
    }

    /// Requires `expected` before `step`.
    pub fn expect_state(
        &self,
        pid: u32,
        step: NativeStep,
        expected: ProcessState,
    ) -> Result<(), NativeError> {
        let found = self.state(pid)?;
        if found != expected {
            return Err(NativeError::WrongState {
                pid,
                step,
                expected,
                found,
            });
        }
        Ok(())
    }

    /// running → lock → checkpoint.
    pub fn suspend(&self, pid: u32, lock_timeout_ms: u32) -> Result<(), NativeError> {
        self.expect_state(pid, NativeStep::Lock, ProcessState::Running)?;
        self.lock(pid, lock_timeout_ms)?;
        self.checkpoint(pid)
    }

    /// checkpointed → restore → unlock.
    pub fn resume(&self, pid: u32) -> Result<(), NativeError> {
        self.expect_state(pid, NativeStep::Restore, ProcessState::Checkpointed)?;
        self.restore(pid)?;
        self.unlock(pid)
    }
}

/// The driver path for a value of [`DRIVER_VARIABLE`].
pub fn driver_path(value: Option<OsString>) -> PathBuf {
    value
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DRIVER), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_decode_explicitly() {
        assert_eq!(ProcessState::from_raw(0), ProcessState::Running);
        assert_eq!(ProcessState::from_raw(2), ProcessState::Checkpointed);
        assert_eq!(ProcessState::from_raw(3), ProcessState::Failed);
        assert_eq!(ProcessState::from_raw(9).to_string(), "unknown state 9");
    }

    #[test]
    fn driver_path_defaults_to_the_soname() {
        assert_eq!(driver_path(None), PathBuf::from("libcuda.so.1"));
        assert_eq!(driver_path(Some("".into())), PathBuf::from("libcuda.so.1"));
        assert_eq!(
            driver_path(Some("/opt/fake/libcuda.so.1".into())),
            PathBuf::from("/opt/fake/libcuda.so.1")
        );
    }

    #[test]
    fn a_missing_driver_is_a_load_error() {
        let error =
            NativeDriver::load_from(Path::new("/nonexistent/libcuda.so.1")).expect_err("load");
        assert!(matches!(error, NativeError::Load { .. }), "{error}");
        assert!(
            error
                .to_string()
                .starts_with("cannot load the CUDA driver /nonexistent/libcuda.so.1")
        );
    }

    #[test]
    fn a_library_without_the_entry_points_is_refused() {
        // libc is loaded in every process and has no cuCheckpoint* symbols.
        let error = NativeDriver::load_from(Path::new("libc.so.6")).expect_err("load");
        assert!(
            matches!(
                error,
                NativeError::MissingSymbol {
                    symbol: "cuCheckpointProcessGetState",
                    ..
                }
            ),
            "{error}"
        );
    }
}
