//! Test support: workers over fakecuda, each test with its own fakecuda control directory.
#![allow(dead_code)]

use cuinterpose_testkit::fakecuda_lib_dir;
use cuinterpose_workload::{EntryPath, Worker, WorkerConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const GRAN: u64 = 2 << 20;
pub const POSIX_FD: u32 = 1;
pub const FABRIC: u32 = 8;

/// The worker binary cargo built for this package's integration tests.
pub fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cuinterpose-worker"))
}

/// fakecuda's `libcuda.so` (the real file the `libcuda.so.1` symlink names).
pub fn fakecuda_library() -> PathBuf {
    std::fs::canonicalize(fakecuda_lib_dir().join("libcuda.so.1")).expect("fakecuda library")
}

/// One test's environment: fakecuda on `LD_LIBRARY_PATH`, a private control directory.
pub struct Env {
    pub control: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env {
            control: tempfile::Builder::new()
                .prefix("workload-test")
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn config(&self, entry: EntryPath) -> WorkerConfig {
        WorkerConfig::new(program())
            .entry(entry)
            .env("LD_LIBRARY_PATH", fakecuda_lib_dir())
            .env("FAKECUDA_CONTROL_DIR", self.control.path())
            .env_remove("LD_PRELOAD")
            .timeout(Duration::from_secs(20))
    }

    /// A worker with the `dlsym` entry path, initialised on device 0.
    pub fn worker(&self) -> Worker {
        self.worker_with(EntryPath::Dlsym)
    }

    pub fn worker_with(&self, entry: EntryPath) -> Worker {
        let mut w = Worker::spawn(&self.config(entry)).expect("spawn worker");
        let info = w.init(0).expect("init");
        assert_eq!(info.device_count, 2, "fakecuda's default device count");
        w
    }

    pub fn control_dir(&self) -> &Path {
        self.control.path()
    }
}
