//! The workload every fault scenario starts from (three workers sharing one allocation, A
//! creating it, B and C importing it), and driving a run over it through a session.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::plan::{Broadcast, Broadcasted, Participants, Run, RunError, Stage};
use cuinterpose_coordinator::report::Report;
use cuinterpose_coordinator::session::Session;
use cuinterpose_protocol::transport::{Endpoint, Timeouts, call};
use cuinterpose_protocol::{
    NamespacePid, Phase, RefusalCode, RefusedReply, Reply, Request, StateFile,
};
use cuinterpose_workload::Worker;

use crate::support::cli::{cuinterpose, path, text};
use crate::support::sandbox::{Sandbox, check_writes_cross};

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const SHARED: u64 = 4 * MIB;

/// Participant indexes.
pub(crate) const A: usize = 0;
pub(crate) const B: usize = 1;
pub(crate) const C: usize = 2;
pub(crate) const NAMES: [&str; 3] = ["A (creator)", "B (importer)", "C (importer)"];

pub(crate) struct Workload {
    pub(crate) workers: Vec<Worker>,
    pub(crate) logs: Vec<PathBuf>,
    pub(crate) addresses: Vec<u64>,
    pub(crate) control: PathBuf,
}

impl Workload {
    /// Three workers sharing one allocation, in a directory of their own in `sandbox`.
    pub(crate) fn start(sandbox: &Sandbox, label: &str) -> Self {
        let root = sandbox.fresh(label);
        let spawn = |name: &str| {
            let log = root.join(format!("{name}.log"));
            (sandbox.worker(&root, Some(&log)), log)
        };
        let (mut a, log_a) = spawn("a");
        let (mut b, log_b) = spawn("b");
        let (mut c, log_c) = spawn("c");
        let handle = a.create(SHARED, 0, 1).expect("create");
        let va = a.map_rw(handle, SHARED, 0).expect("map a");
        a.fill(va, SHARED, 7).expect("fill");
        let ticket = a
            .export(handle)
            .expect("export")
            .as_fd()
            .try_clone_to_owned()
            .unwrap();
        let hb = b.import(ticket.as_fd()).expect("import b");
        let vb = b.map_rw(hb, SHARED, 0).expect("map b");
        let hc = c.import(ticket.as_fd()).expect("import c");
        let vc = c.map_rw(hc, SHARED, 0).expect("map c");
        c.release(hc).expect("the mapping keeps it");
        Workload {
            workers: vec![a, b, c],
            logs: vec![log_a, log_b, log_c],
            addresses: vec![va, vb, vc],
            control: Sandbox::control_dir(&root),
        }
    }

    pub(crate) fn pid(&self, index: usize) -> NamespacePid {
        NamespacePid::new(self.workers[index].worker_pid() as u32).expect("pid")
    }

    pub(crate) fn pids(&self) -> Vec<NamespacePid> {
        (0..self.workers.len()).map(|i| self.pid(i)).collect()
    }

    pub(crate) fn session(&self, timeout: Duration) -> Session {
        Session::open(
            &self.control,
            &self.pids(),
            Timeouts::new(timeout, timeout).expect("timeouts"),
        )
        .expect("session")
    }

    /// The worker's host PID (for a signal sent from another thread).
    pub(crate) fn host_pid(&self, index: usize) -> u32 {
        self.workers[index].pid()
    }

    pub(crate) fn signal(&self, index: usize, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.workers[index].pid() as i32, signal) };
        assert_eq!(rc, 0, "kill {signal}: {}", std::io::Error::last_os_error());
    }

    /// `cuinterpose COMMAND --checkpoint-dir DIR` on this workload's control directory, with
    /// `env`, which exits 1: its stderr.
    pub(crate) fn refused_by_binary(
        &self,
        command: &str,
        dir: &Path,
        env: &[(&str, &str)],
    ) -> String {
        let output = cuinterpose(
            &[
                command,
                "--checkpoint-dir",
                path(dir),
                "--control-dir",
                path(&self.control),
            ],
            env,
        );
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        stderr
    }

    /// Asks participant `index` directly (not through the coordinator).
    pub(crate) fn ask(&self, index: usize, request: &Request) -> Result<Reply, String> {
        let endpoint = Endpoint::for_pid(&self.control, self.pid(index)).expect("endpoint");
        call(&endpoint, request, None, Duration::from_secs(5))
            .map(|(reply, _)| reply)
            .map_err(|e| e.to_string())
    }

    /// Participant `index`'s refusal of `request` (anything else fails the test).
    pub(crate) fn refusal(&self, index: usize, request: &Request) -> RefusedReply {
        match self.ask(index, request) {
            Ok(Reply::Refused(refusal)) => refusal,
            other => panic!("{}: {request:?}: {other:?}", NAMES[index]),
        }
    }

    /// [`Self::refusal`], whose code must be `code`.
    pub(crate) fn refused_as(
        &self,
        index: usize,
        request: &Request,
        code: RefusalCode,
    ) -> RefusedReply {
        let r = self.refusal(index, request);
        assert_eq!(r.code, code, "{request:?}: {r:?}");
        r
    }

    pub(crate) fn phase(&self, index: usize) -> Phase {
        match self.ask(index, &Request::Inspect) {
            Ok(Reply::Inspection(i)) => i.phase,
            other => panic!("inspect {}: {other:?}", NAMES[index]),
        }
    }

    /// Every participant's phase, in index order.
    pub(crate) fn phases(&self) -> Vec<Phase> {
        (0..self.workers.len()).map(|i| self.phase(i)).collect()
    }

    /// Polls until participant `index` is in `phase` (a request it read late takes effect).
    pub(crate) fn await_phase(&self, index: usize, phase: Phase) {
        self.await_phase_within(index, phase, Duration::from_secs(5));
    }

    /// [`Self::await_phase`], giving up after `limit` (scaled by the test time factor).
    pub(crate) fn await_phase_within(&self, index: usize, phase: Phase, limit: Duration) {
        let started = Instant::now();
        loop {
            let now = self.phase(index);
            if now == phase {
                return;
            }
            assert!(
                started.elapsed() < cuinterpose_testkit::slack(limit),
                "{} stays in phase {now}, expected {phase}",
                NAMES[index]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn log(&self, index: usize) -> String {
        std::fs::read_to_string(&self.logs[index]).unwrap_or_default()
    }

    /// Polls until participant `index` logged `text` (the handler thread that failed to send a
    /// reply logs it after the phase changed).
    pub(crate) fn await_log(&self, index: usize, text: &str) {
        let started = Instant::now();
        while !self.log(index).contains(text) {
            assert!(
                started.elapsed() < cuinterpose_testkit::slack(Duration::from_secs(2)),
                "{}: no {text:?} in its log:\n{}",
                NAMES[index],
                self.log(index)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Same bytes at the same addresses, and still shared: each writes, the others read.
    pub(crate) fn check_shared(&mut self, seed: u64) {
        for (worker, &address) in self.workers.iter_mut().zip(&self.addresses) {
            worker.verify(address, SHARED, seed).expect("bytes kept");
        }
        self.check_writes_cross(seed);
    }

    /// Still shared: each writes, the others read (the bytes before are not checked).
    pub(crate) fn check_writes_cross(&mut self, seed: u64) {
        check_writes_cross(&mut self.workers, &self.addresses, SHARED, 1000 + seed * 10);
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        // A stopped worker cannot notice its closed control socket.
        for worker in &self.workers {
            // SAFETY: kill(2) on our own child's pid (possibly already dead: ignored).
            unsafe { libc::kill(worker.pid() as i32, libc::SIGCONT) };
        }
        if !std::thread::panicking() {
            return;
        }
        for (name, log) in NAMES.iter().zip(&self.logs) {
            eprintln!(
                "--- {name} log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

/// The session's sockets with a hook ahead of each broadcast, timing each stage.
struct Hooked<'a> {
    session: &'a Session,
    publish: &'a mut dyn FnMut(&StateFile) -> Result<(), String>,
    before: &'a mut dyn FnMut(Stage),
    /// How long each stage's broadcast took, the first time it ran.
    took: std::collections::BTreeMap<&'static str, Duration>,
    last: Duration,
}

impl Participants for Hooked<'_> {
    fn broadcast(&mut self, _: &Run, call: Broadcast<'_>) -> Broadcasted {
        (self.before)(call.stage);
        let started = Instant::now();
        let outcomes = self.session.broadcast(call.request, call.participants);
        self.last = started.elapsed();
        self.took.entry(call.stage.name()).or_insert(self.last);
        (outcomes, self.last)
    }

    fn publish(&mut self, state: &StateFile) -> (Result<(), String>, Duration) {
        let started = Instant::now();
        let result = (self.publish)(state);
        self.last = started.elapsed();
        (result, self.last)
    }

    /// These tests stand for a coordinator that is gone once the run failed (killed, or its
    /// host lost): nobody is told, so each test sees what the shims do on their own and what a
    /// second run finds. The notice itself is tested through `commands` (`fail_stop.rs`, the
    /// end-to-end tests).
    fn declare_fail_stop(&mut self, _: &[NamespacePid], _: &str) -> Vec<NamespacePid> {
        Vec::new()
    }
}

/// Runs `run` through `session` with the product's loop, calling `before` ahead of each
/// broadcast and telling nobody of a fail-stop (see [`Hooked::declare_fail_stop`]); returns
/// the outcome and the time the failed stage (or the last step) took: a rollback after a
/// failure takes its own time.
pub(crate) fn drive(
    session: &Session,
    run: &mut Run,
    publish: &mut dyn FnMut(&StateFile) -> Result<(), String>,
    before: &mut dyn FnMut(Stage),
) -> (Result<Report, RunError>, Duration) {
    // As `Session::drive` does: a silent participant is waited for up to the quiet window.
    run.set_settle_limit(session.timeouts().quiet_window());
    let mut hooked = Hooked {
        session,
        publish,
        before,
        took: std::collections::BTreeMap::new(),
        last: Duration::ZERO,
    };
    let result = cuinterpose_coordinator::plan::drive(run, &mut hooked);
    let took = match &result {
        Err(error) => hooked
            .took
            .get(error.stage.name())
            .copied()
            .unwrap_or(hooked.last),
        Ok(_) => hooked.last,
    };
    (result, took)
}

pub(crate) fn no_publish(_: &StateFile) -> Result<(), String> {
    Ok(())
}

/// prepare through the library into a fresh directory; returns it.
pub(crate) fn prepare(sandbox: &Sandbox, workload: &Workload) -> PathBuf {
    let dir = sandbox.fresh("checkpoint");
    commands::prepare(&workload.session(Duration::from_secs(5)), &dir, &mut |_| {})
        .expect("prepare");
    assert_eq!(workload.phases(), [Phase::Released; 3]);
    dir
}
