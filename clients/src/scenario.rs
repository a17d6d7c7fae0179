//! Running a scenario: its sandbox, its workers, its notes, and the two ways it runs.

use crate::build::{entry_name, entry_paths};
use crate::steps::{settled, unmap_release};
use cuinterpose_protocol::{InspectionReply, Record};
use cuinterpose_testkit::{build_shim, build_worker, fakecuda_lib_dir};
use cuinterpose_workload::{DriverObjects, EntryPath, Output, Worker, WorkerConfig};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On the bare driver (fakecuda alone): the reference behaviour.
    Bare,
    /// Under the shim, no checkpoint: [`Ctx::checkpoint`] does nothing.
    Shim,
    /// Under the shim, with a whole checkpoint/restore cycle at every [`Ctx::checkpoint`].
    Toggle,
}

/// What a scenario needs of an entry path that resolves by CUDA version: a path asking for an
/// older version cannot resolve `probe` (the driver answers that, with or without the shim), so
/// the scenario is not run through it; [`plain`] checks that the bare driver and the shim give
/// the same answer for `probe` there.
#[derive(Debug, Clone, Copy)]
pub struct Needs {
    pub version: u32,
    pub probe: &'static str,
}

/// Any entry path will do.
pub const ANY: Needs = Needs {
    version: 0,
    probe: "cuMemCreate",
};
/// `cuMemRetainAllocationHandle`, `cuIpcOpenMemHandle_v2`, `cuDevicePrimaryCtxRelease_v2`
/// and `_Reset_v2` are CUDA 11.0 entry points.
pub const CUDA_11: Needs = Needs {
    version: 11000,
    probe: "cuMemRetainAllocationHandle",
};
/// Multicast is CUDA 12.1.
pub const CUDA_12_1: Needs = Needs {
    version: 12010,
    probe: "cuMulticastCreate",
};

fn eligible(entry: &EntryPath, needs: Needs) -> bool {
    entry.api_version().is_none_or(|v| v >= needs.version)
}

/// A scenario's world: a private directory for the control sockets of the shim and of
/// fakecuda, the workers it spawned, and what it noted.
#[derive(Debug)]
pub struct Ctx {
    mode: Mode,
    name: String,
    root: PathBuf,
    entries: Vec<EntryPath>,
    next_entry: usize,
    /// Every worker spawned: (pid, descriptors open right after `Init`).
    spawned: Vec<(i32, u64)>,
    notes: Vec<String>,
    toggles: usize,
    /// Libraries preloaded ahead of the shim (another interposer, as torch_memory_saver is).
    preload: Vec<PathBuf>,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The workers' stderr (the shim's and fakecuda's log lines) goes with the failure.
            for n in 0..self.spawned.len() {
                if let Ok(log) = std::fs::read_to_string(self.log_file(n))
                    && !log.is_empty()
                {
                    eprintln!(
                        "--- {} worker {n} ({:?}) stderr:\n{log}",
                        self.name, self.mode
                    );
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Ctx {
    fn new(name: &str, mode: Mode, entries: Vec<EntryPath>) -> Ctx {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        // Short: socket paths must fit in sun_path.
        let root = std::env::temp_dir().join(format!(
            "cuic-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create the scenario directory");
        Ctx {
            mode,
            name: name.to_owned(),
            root,
            entries,
            next_entry: 0,
            spawned: Vec::new(),
            notes: Vec::new(),
            toggles: 0,
            preload: Vec::new(),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the shim is preloaded in this run.
    pub fn shimmed(&self) -> bool {
        self.mode != Mode::Bare
    }

    fn control_dir(&self) -> PathBuf {
        self.root.join("ctl")
    }

    /// fakecuda's control directory of this scenario (removed with it).
    pub fn fakecuda_dir(&self) -> PathBuf {
        self.root.join("fc")
    }

    fn log_file(&self, n: usize) -> PathBuf {
        self.root.join(format!("worker{n}.log"))
    }

    /// A worker of this scenario's sockets and fakecuda, reaching the driver through `entry`,
    /// with `preload` (nothing else) in its `LD_PRELOAD`.
    fn config(&self, entry: EntryPath, preload: &[PathBuf]) -> WorkerConfig {
        let config = WorkerConfig::new(build_worker())
            .entry(entry)
            .env("LD_LIBRARY_PATH", fakecuda_lib_dir())
            .env("CUINTERPOSE_CONTROL_DIR", self.control_dir())
            .env("FAKECUDA_CONTROL_DIR", self.fakecuda_dir())
            .timeout(Duration::from_secs(30));
        if preload.is_empty() {
            config.env_remove("LD_PRELOAD")
        } else {
            config.env(
                "LD_PRELOAD",
                std::env::join_paths(preload).expect("preload list"),
            )
        }
    }

    /// A new worker, initialised on device 0, reaching the driver through the next of this
    /// run's entry paths.
    pub fn worker(&mut self) -> Worker {
        let entry = self.entries[self.next_entry % self.entries.len()].clone();
        self.next_entry += 1;
        let mut preload = self.preload.clone();
        if self.shimmed() {
            preload.push(build_shim().to_path_buf());
        }
        let config = self
            .config(entry.clone(), &preload)
            .stderr(Output::File(self.log_file(self.spawned.len())));
        let mut w = Worker::spawn(&config)
            .unwrap_or_else(|e| panic!("{}: spawn a worker ({entry}): {e}", self.name));
        let info = w
            .init(0)
            .unwrap_or_else(|e| panic!("{}: init through {}: {e}", self.name, entry_name(&entry)));
        assert_eq!(info.device_count, 2, "fakecuda's two devices");
        let fds = w.open_fd_count().expect("count descriptors");
        self.spawned.push((w.worker_pid(), fds));
        w
    }

    /// `N` new workers, spawned one after the other as [`Ctx::worker`] spawns them.
    pub fn workers<const N: usize>(&mut self) -> [Worker; N] {
        std::array::from_fn(|_| self.worker())
    }

    /// A worker on this scenario's fakecuda without the shim (nor any other preload), through
    /// `dlsym`, initialised on device 0: an application cuinterpose does not see, which is no
    /// participant of any checkpoint.
    pub fn unshimmed_worker(&self) -> Worker {
        let mut w = Worker::spawn(&self.config(EntryPath::Dlsym, &[]))
            .unwrap_or_else(|e| panic!("{}: spawn an unshimmed worker: {e}", self.name));
        w.init(0).expect("init");
        w
    }

    /// A new worker whose current context is `device`'s primary context.
    pub fn worker_on(&mut self, device: i32) -> Worker {
        let mut w = self.worker();
        if device != 0 {
            w.set_device(device).expect("set device");
        }
        w
    }

    /// Records an observation that must be the same on the bare driver and under the shim.
    pub fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// Notes the outcome of a call (`ok`, or the error it gave) under `label`, and returns it.
    pub fn expect<T>(
        &mut self,
        label: &str,
        result: Result<T, cuinterpose_workload::WorkloadError>,
    ) -> Result<T, cuinterpose_workload::WorkloadError> {
        self.note(format!("{label}: {}", crate::names::outcome(&result)));
        result
    }

    /// The shim's inspection of `w` (`None` on the bare driver).
    pub fn inspect(&self, w: &Worker) -> Option<InspectionReply> {
        if !self.shimmed() {
            return None;
        }
        let pid = cuinterpose_protocol::NamespacePid::new(w.worker_pid() as u32).expect("pid");
        let endpoint = cuinterpose_protocol::transport::Endpoint::for_pid(&self.control_dir(), pid)
            .expect("endpoint");
        let (reply, _) = cuinterpose_protocol::transport::call(
            &endpoint,
            &cuinterpose_protocol::Request::Inspect,
            None,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("inspect of {pid}: {e}"));
        match reply {
            cuinterpose_protocol::Reply::Inspection(i) => Some(i),
            other => panic!("inspect of {pid}: {other:?}"),
        }
    }

    /// The shim's records for `w` (`None` on the bare driver).
    pub fn records(&self, w: &Worker) -> Option<Vec<Record>> {
        self.inspect(w).map(|i| i.records.to_vec())
    }

    /// A checkpoint point: in [`Mode::Toggle`], checkpoints and restores every worker in
    /// place (they must be all the workers of the scenario still alive) and checks that each
    /// kept its records, descriptors and driver objects; otherwise nothing.
    pub fn checkpoint(&mut self, workers: &mut [&mut Worker]) {
        if self.mode != Mode::Toggle {
            return;
        }
        let pids = self.all_of(workers);
        let mut before: Vec<_> = workers
            .iter_mut()
            .map(|w| (self.snapshot(w), w.fd_targets()))
            .collect();
        // A peer's connection to a shim's socket (an import just answered) lingers a moment:
        // the baseline is the least count over a few rounds of readings.
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(40));
            for (w, ((_, fds, _), _)) in workers.iter_mut().zip(before.iter_mut()) {
                *fds = (*fds).min(w.open_fd_count().expect("count descriptors"));
            }
        }
        if let Err(refusal) = self.cycle("state", &pids) {
            panic!("{}: {refusal}", self.name);
        }
        for (w, (before, fds)) in workers.iter_mut().zip(before) {
            let after = self.snapshot_like(w, &before);
            if after != before {
                panic!(
                    "{}: worker {} after the toggle: (records, open descriptors, driver \
                     objects)\n  before: {before:?}\n   after: {after:?}\n  descriptors \
                     before: {fds:?}\n   after: {:?}",
                    self.name,
                    w.worker_pid(),
                    w.fd_targets()
                );
            }
        }
    }

    /// Under the shim, a checkpoint attempt now: `Err` with the coordinator's refusal (nothing
    /// changed then), `Ok` after a whole cycle. Nothing on the bare driver (`None`).
    pub fn try_toggle(&mut self, workers: &mut [&mut Worker]) -> Option<Result<(), String>> {
        if !self.shimmed() {
            return None;
        }
        let pids = self.all_of(workers);
        Some(self.cycle("attempt", &pids))
    }

    /// A whole checkpoint/restore cycle of `pids` ([`crate::toggle::toggle`]), its state in a
    /// directory of its own (`label` and the number of the cycle).
    fn cycle(&mut self, label: &str, pids: &[i32]) -> Result<(), String> {
        let state = self.root.join(format!("{label}{}", self.toggles));
        self.toggles += 1;
        crate::toggle::toggle(&self.control_dir(), &self.fakecuda_dir(), &state, pids)
    }

    /// The pids of `workers`, checked to be every live worker of the scenario.
    fn all_of(&self, workers: &[&mut Worker]) -> Vec<i32> {
        let pids: Vec<i32> = workers.iter().map(|w| w.worker_pid()).collect();
        let given: BTreeSet<i32> = pids.iter().copied().collect();
        let live: BTreeSet<i32> = self
            .spawned
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| {
                // A worker that was dropped has exited (its shim socket is gone).
                std::path::Path::new(&format!("/proc/{p}")).exists()
            })
            .collect();
        assert!(
            given == live,
            "{}: a checkpoint must take every live worker: given {given:?}, live {live:?}",
            self.name
        );
        pids
    }

    fn snapshot(&self, w: &mut Worker) -> (Option<Vec<Record>>, u64, DriverObjects) {
        // Descriptors first: the inspection's connection lingers a moment in the shim.
        let fds = w.open_fd_count().expect("count descriptors");
        let objects = w.driver_objects().expect("driver objects");
        (self.records(w), fds, objects)
    }

    /// Like [`Ctx::snapshot`], waiting a little for descriptors of connections that peers
    /// just closed to go.
    fn snapshot_like(
        &self,
        w: &mut Worker,
        expected: &(Option<Vec<Record>>, u64, DriverObjects),
    ) -> (Option<Vec<Record>>, u64, DriverObjects) {
        settled(expected, Duration::from_secs(3), || self.snapshot(w))
    }

    /// The end of `w`'s use of its last granule: [`unmap_release`] of `address` and `handle`,
    /// then [`Ctx::assert_clean`].
    pub fn release_last(&mut self, w: &mut Worker, address: u64, handle: u64) {
        unmap_release(w, address, handle);
        self.assert_clean(w);
    }

    /// The end of one granule shared by `creator` with `importer`, the importer first: it
    /// unmaps and releases `imported` (address, handle), the creator lets go of `created` last
    /// ([`Ctx::release_last`]), and then the importer must hold nothing either.
    pub fn release_shared(
        &mut self,
        importer: &mut Worker,
        imported: (u64, u64),
        creator: &mut Worker,
        created: (u64, u64),
    ) {
        unmap_release(importer, imported.0, imported.1);
        self.release_last(creator, created.0, created.1);
        self.assert_clean(importer);
    }

    /// Checks that `w` holds nothing any more: no shim record, no driver allocation, mapping,
    /// reservation, multicast object or open IPC handle, and the descriptors it had after
    /// `Init`.
    pub fn assert_clean(&mut self, w: &mut Worker) {
        let pid = w.worker_pid();
        let fds = self
            .spawned
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, fds)| *fds)
            .expect("a worker of this scenario");
        let expected = (self.shimmed().then(Vec::new), fds, DriverObjects::default());
        let now = self.snapshot_like(w, &expected);
        assert_eq!(
            now, expected,
            "{}: worker {pid} should hold nothing: (records, open descriptors, driver objects)",
            self.name
        );
    }
}

/// Runs `scenario` once in `mode` with `entries` (worker `i` gets entry `i mod len`): its
/// notes.
pub fn run(name: &str, mode: Mode, entries: Vec<EntryPath>, scenario: fn(&mut Ctx)) -> Vec<String> {
    run_preloaded(name, mode, entries, &[], scenario)
}

/// [`run`] with `preload` ahead of the shim in every worker's `LD_PRELOAD`.
pub fn run_preloaded(
    name: &str,
    mode: Mode,
    entries: Vec<EntryPath>,
    preload: &[PathBuf],
    scenario: fn(&mut Ctx),
) -> Vec<String> {
    let mut ctx = Ctx::new(name, mode, entries);
    ctx.preload = preload.to_vec();
    scenario(&mut ctx);
    if mode == Mode::Toggle {
        assert!(
            ctx.toggles > 0,
            "{name}: the scenario has no checkpoint point"
        );
    }
    std::mem::take(&mut ctx.notes)
}

/// The plain half: `scenario` on the bare driver, then under the shim through every entry path
/// (all its workers on that path); every run passes the scenario's own checks and notes
/// exactly what the bare run noted. Entry paths that ask for a CUDA version older than
/// `needs.version` cannot resolve the scenario's functions at all; for those, the bare
/// driver and the shim must give the same answer for `needs.probe`.
pub fn plain(name: &str, needs: Needs, scenario: fn(&mut Ctx)) {
    let reference = run(name, Mode::Bare, vec![EntryPath::Dlsym], scenario);
    for entry in entry_paths() {
        if !eligible(&entry, needs) {
            let answers: Vec<String> = [Mode::Bare, Mode::Shim]
                .into_iter()
                .map(|mode| {
                    let mut ctx = Ctx::new(name, mode, vec![entry.clone()]);
                    let mut w = ctx.worker();
                    crate::names::outcome(&w.resolve(needs.probe))
                })
                .collect();
            assert_eq!(
                answers[0],
                answers[1],
                "{name}: resolving {} through {}",
                needs.probe,
                entry_name(&entry)
            );
            assert_ne!(answers[0], "ok", "{name}: {} resolves", needs.probe);
            continue;
        }
        let notes = run(name, Mode::Shim, vec![entry.clone()], scenario);
        assert_eq!(
            notes,
            reference,
            "{name}: under the shim through {} the scenario noted something else than on the \
             bare driver",
            entry_name(&entry)
        );
    }
}

/// The toggle half: `scenario` under the shim with a whole checkpoint/restore cycle at each of
/// its checkpoint points. Its workers take turns over the entry paths that can run it,
/// starting at a point that depends on the scenario's name (so the suite as a whole crosses
/// toggles through every path).
pub fn across_toggle(name: &str, needs: Needs, scenario: fn(&mut Ctx)) {
    let mut entries: Vec<EntryPath> = entry_paths()
        .into_iter()
        .filter(|e| eligible(e, needs))
        .collect();
    let start = name.bytes().map(usize::from).sum::<usize>() % entries.len();
    entries.rotate_left(start);
    run(name, Mode::Toggle, entries, scenario);
}

/// Both halves with another interposer preloaded ahead of the shim (torch_memory_saver is an
/// `LD_PRELOAD` library linked against libcuda): the direct-symbol library itself, reached
/// through direct symbols and through `dlsym`; plain (bare driver with only that library
/// preloaded, then the shim behind it) and across a toggle.
/// Direct symbols resolve every function at any version, so any scenario can run this way.
pub fn co_preloaded(name: &str, scenario: fn(&mut Ctx)) {
    let preload = vec![crate::build::direct_library().to_path_buf()];
    let entries = vec![
        EntryPath::Runtime(crate::build::direct_library().to_path_buf()),
        EntryPath::Dlsym,
    ];
    let reference = run_preloaded(name, Mode::Bare, entries.clone(), &preload, scenario);
    let notes = run_preloaded(name, Mode::Shim, entries.clone(), &preload, scenario);
    assert_eq!(
        notes, reference,
        "{name}: with another interposer preloaded, the shim changed what the scenario noted"
    );
    run_preloaded(name, Mode::Toggle, entries, &preload, scenario);
}
