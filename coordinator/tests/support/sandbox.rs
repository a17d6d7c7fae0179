//! Real workloads: `cuinterpose-worker` processes over fakecuda under the shim.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use cuinterpose_testkit::fixtures::TempDir;
use cuinterpose_testkit::{build_shim, build_worker, fakecuda_lib_dir};
use cuinterpose_workload::{EntryPath, Output, Worker, WorkerConfig};

/// The shim, the worker, fakecuda (built for this test's profile), and a private directory.
pub struct Sandbox {
    pub shim: PathBuf,
    pub worker: PathBuf,
    pub fakecuda: PathBuf,
    pub dir: TempDir,
}

impl Sandbox {
    pub fn new(label: &str) -> Self {
        Self {
            shim: build_shim().to_path_buf(),
            worker: build_worker().to_path_buf(),
            fakecuda: fakecuda_lib_dir().to_path_buf(),
            dir: TempDir::new(label).expect("sandbox"),
        }
    }

    /// A fresh directory inside the sandbox.
    pub fn fresh(&self, label: &str) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = self
            .dir
            .path()
            .join(format!("{label}-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&path).expect("fresh directory");
        path
    }

    /// The shim's control directory of the workers of `root`.
    pub fn control_dir(root: &Path) -> PathBuf {
        root.join("ctl")
    }

    /// fakecuda's control directory of the workers of `root`.
    pub fn fakecuda_control_dir(root: &Path) -> PathBuf {
        root.join("fakecuda")
    }

    /// A worker of `root` under the shim (reaching the driver through `dlsym`), initialised on
    /// device 0; its stderr goes to `log` if given.
    pub fn worker(&self, root: &Path, log: Option<&Path>) -> Worker {
        self.worker_with(root, log, &[])
    }

    /// [`Sandbox::worker`] with extra environment variables.
    pub fn worker_with(&self, root: &Path, log: Option<&Path>, env: &[(&str, &str)]) -> Worker {
        let mut config = WorkerConfig::new(&self.worker)
            .entry(EntryPath::Dlsym)
            .env("LD_LIBRARY_PATH", &self.fakecuda)
            .env("LD_PRELOAD", &self.shim)
            .env("CUINTERPOSE_CONTROL_DIR", Self::control_dir(root))
            .env("FAKECUDA_CONTROL_DIR", Self::fakecuda_control_dir(root));
        for (key, value) in env {
            config = config.env(key, value);
        }
        if let Some(log) = log {
            config = config.stderr(Output::File(log.to_path_buf()));
        }
        let mut worker = Worker::spawn(&config).expect("spawn a worker");
        worker.init(0).expect("init");
        worker
    }
}

/// The sharing is live: each of `workers` in turn writes through its mapping of one allocation
/// (`size` bytes at its entry of `addresses`) the pattern of `first_seed` + its index, and every
/// worker reads that through its own mapping.
pub fn check_writes_cross(workers: &mut [Worker], addresses: &[u64], size: u64, first_seed: u64) {
    for writer in 0..workers.len() {
        let pattern = first_seed + writer as u64;
        workers[writer]
            .fill(addresses[writer], size, pattern)
            .expect("write");
        for reader in 0..workers.len() {
            workers[reader]
                .verify(addresses[reader], size, pattern)
                .unwrap_or_else(|error| panic!("{reader} reads {writer}'s write: {error}"));
        }
    }
}

/// One allocation of `size` bytes on device 0, created by the first of `workers` and imported
/// by the others, mapped read-write in each: its address in each worker, in order.
pub fn shared_by_all(workers: &mut [Worker], size: u64) -> Vec<u64> {
    let handle = workers[0].create(size, 0, 1).expect("create");
    let ticket = workers[0].export(handle).expect("export");
    let mut shared = vec![workers[0].map_rw(handle, size, 0).expect("map")];
    for w in workers.iter_mut().skip(1) {
        let imported = w.import(std::os::fd::AsFd::as_fd(&ticket)).expect("import");
        shared.push(w.map_rw(imported, size, 0).expect("map import"));
    }
    shared
}

/// `size` bytes `creator` creates on its device 0, maps there and fills from `seed`: the
/// address and the ticket that exports them.
pub fn create_filled(creator: &mut Worker, size: u64, seed: u64) -> (u64, std::os::fd::OwnedFd) {
    let shared = creator.create(size, 0, 1).expect("create");
    let va = creator.map_rw(shared, size, 0).expect("map");
    creator.fill(va, size, seed).expect("fill");
    (va, creator.export(shared).expect("export"))
}
