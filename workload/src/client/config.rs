//! How to start a worker: its program, entry path, driver, environment, wrapper and output.

use super::DEFAULT_TIMEOUT;
use crate::entry::EntryPath;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// Where a worker's stdout or stderr goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Output {
    /// The driving process's own stream.
    #[default]
    Inherit,
    /// `/dev/null`.
    Null,
    /// A file, created or appended to.
    File(PathBuf),
}

impl Output {
    pub(super) fn stdio(&self) -> std::io::Result<Stdio> {
        Ok(match self {
            Output::Inherit => Stdio::inherit(),
            Output::Null => Stdio::null(),
            Output::File(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
        })
    }
}

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The `cuinterpose-worker` binary (tests build it with `cuinterpose_testkit::build_worker`).
    pub program: PathBuf,
    /// `--entry`.
    pub entry: EntryPath,
    /// `--driver` (default: `$CUINTERPOSE_WORKER_DRIVER` in the worker, else `libcuda.so.1`).
    pub driver: Option<PathBuf>,
    /// Added to the inherited environment (e.g. `LD_PRELOAD`, `LD_LIBRARY_PATH`,
    /// `FAKECUDA_CONTROL_DIR`, `CUINTERPOSE_CONTROL_DIR`).
    pub env: Vec<(OsString, OsString)>,
    /// Removed from the inherited environment.
    pub env_remove: Vec<OsString>,
    /// Extra worker arguments, after the ones above (a later flag overrides).
    pub args: Vec<OsString>,
    /// A command prefix, e.g. `["unshare", "-fp", "setsid"]`; the control socket survives it.
    pub wrapper: Option<Vec<OsString>>,
    pub stdout: Output,
    pub stderr: Output,
    pub current_dir: Option<PathBuf>,
    /// Per-call timeout (also bounds the start-up handshake and [`Worker::wait`]).
    pub timeout: Duration,
}

impl WorkerConfig {
    /// `program` with the default entry path, no extra environment, inherited output.
    pub fn new(program: impl Into<PathBuf>) -> WorkerConfig {
        WorkerConfig {
            program: program.into(),
            entry: EntryPath::Dlsym,
            driver: None,
            env: Vec::new(),
            env_remove: Vec::new(),
            args: Vec::new(),
            wrapper: None,
            stdout: Output::Inherit,
            stderr: Output::Inherit,
            current_dir: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn entry(mut self, entry: EntryPath) -> WorkerConfig {
        self.entry = entry;
        self
    }

    pub fn driver(mut self, driver: impl Into<PathBuf>) -> WorkerConfig {
        self.driver = Some(driver.into());
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> WorkerConfig {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> WorkerConfig {
        self.env_remove.push(key.as_ref().to_owned());
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> WorkerConfig {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn wrapper<I, S>(mut self, prefix: I) -> WorkerConfig
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.wrapper = Some(prefix.into_iter().map(|s| s.as_ref().to_owned()).collect());
        self
    }

    pub fn stdout(mut self, o: Output) -> WorkerConfig {
        self.stdout = o;
        self
    }

    pub fn stderr(mut self, o: Output) -> WorkerConfig {
        self.stderr = o;
        self
    }

    pub fn timeout(mut self, t: Duration) -> WorkerConfig {
        self.timeout = t;
        self
    }
}
