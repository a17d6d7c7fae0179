//! A participant that stops answering a step and comes back: the coordinator waits for it
//! (settle) instead of declaring a fail-stop. In `prepare_unicast` it then puts the workload
//! back from the state in memory (exit 3); in a restore's step the restore goes on.

use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::events::Event;
use cuinterpose_coordinator::state::{self, StateError};
use cuinterpose_protocol::Phase;

use crate::faults::workload::{A, B, NAMES, Workload, prepare};
use crate::support::sandbox::Sandbox;

/// Stops `victim` as `phase` starts and resumes it `after` later; counts how often settling
/// was announced (once, however many rounds it takes).
struct Stopper {
    phase: &'static str,
    host_pid: String,
    after: Duration,
    resumer: Option<std::thread::JoinHandle<()>>,
    settle_started: usize,
}

impl Stopper {
    fn new(workload: &Workload, victim: usize, phase: &'static str, after: Duration) -> Self {
        Self {
            phase,
            host_pid: workload.host_pid(victim).to_string(),
            after,
            resumer: None,
            settle_started: 0,
        }
    }

    fn see(&mut self, event: &Event, workload: &Workload, victim: usize) {
        match event {
            Event::Started { phase, .. } if *phase == self.phase && self.resumer.is_none() => {
                workload.signal(victim, libc::SIGSTOP);
                let (host_pid, after) = (self.host_pid.clone(), self.after);
                self.resumer = Some(std::thread::spawn(move || {
                    std::thread::sleep(after);
                    let sent = std::process::Command::new("kill")
                        .args(["-CONT", &host_pid])
                        .status();
                    assert!(sent.is_ok_and(|s| s.success()), "SIGCONT to {host_pid}");
                }));
            }
            Event::Started {
                phase: "settle", ..
            } => self.settle_started += 1,
            _ => {}
        }
    }

    /// Waits for the resume (sent even when the run failed) and returns how often settling
    /// was announced.
    fn join(self) -> usize {
        if let Some(resumer) = self.resumer {
            resumer.join().expect("the resumer");
        }
        self.settle_started
    }
}

/// `victim` is stopped as `prepare_unicast` starts and resumed `after` later; the coordinator
/// waits at most its quiet window (3 s at a 1 s control timeout).
fn check(sandbox: &Sandbox, victim: usize, after: Duration) {
    let mut workload = Workload::start(sandbox, "settle");
    let session = workload.session(Duration::from_secs(1));
    let dir = sandbox.fresh("checkpoint");
    let victim_pid = workload.pid(victim);
    let started = Instant::now();
    let mut stopper = Stopper::new(&workload, victim, "prepare_unicast", after);
    let result = commands::prepare(&session, &dir, &mut |event| {
        stopper.see(event, &workload, victim)
    });
    let settle_started = stopper.join();
    let took = started.elapsed();
    let what = format!("{} silent in prepare_unicast for {after:?}", NAMES[victim]);
    let error = result.expect_err(&what);
    let CommandError::Aborted {
        during, resumed, ..
    } = &error
    else {
        panic!("{what}: not aborted: {error}");
    };
    assert_eq!(error.exit_code(), 3, "{what}: {error}");
    assert_eq!(
        during, "prepare_unicast (a participant did not answer in time)",
        "{what}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "prepare failed in phase prepare_unicast: participant {victim_pid}: no reply: "
        )) && text.contains("timed out after 1s")
            && text.contains("the workload was put back in place")
            && !text.contains("FAIL-STOP"),
        "{what}: {text}"
    );
    let resumed_phases: Vec<&str> = resumed.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        resumed_phases.last(),
        Some(&"verify"),
        "{what}: {resumed_phases:?}"
    );
    assert_eq!(settle_started, 1, "{what}: settling announced once");
    println!("  {what}: put back after {took:.1?}");
    assert_eq!(workload.phases(), [Phase::Active; 3], "{what}");
    assert!(
        matches!(state::load(&dir), Err(StateError::Missing { .. })),
        "{what}: the aborted checkpoint's state is discarded"
    );
    workload.check_shared(7);
    // The workload checkpoints again.
    let again = sandbox.fresh("checkpoint");
    commands::prepare(&session, &again, &mut |_| {}).expect("a second prepare");
    commands::restore(&session, &again, &mut |_| {}).expect("and its restore");
    workload.check_writes_cross(8);
}

/// The creator (A) and an importer (B), each silent for about two control timeouts.
pub(crate) fn silent_in_prepare_unicast(sandbox: &Sandbox) {
    for victim in [A, B] {
        check(sandbox, victim, Duration::from_millis(1500));
    }
}

/// `victim` is stopped as a restore's `phase` starts and resumed `after` later: the restore
/// waits for it and goes on, and completes.
fn check_restore(sandbox: &Sandbox, victim: usize, phase: &'static str, after: Duration) {
    let mut workload = Workload::start(sandbox, "settle-restore");
    let dir = prepare(sandbox, &workload);
    let session = workload.session(Duration::from_secs(1));
    let started = Instant::now();
    let mut stopper = Stopper::new(&workload, victim, phase, after);
    let result = commands::restore(&session, &dir, &mut |event| {
        stopper.see(event, &workload, victim)
    });
    let settle_started = stopper.join();
    let took = started.elapsed();
    let what = format!("{} silent in {phase} for {after:?}", NAMES[victim]);
    let report = result.unwrap_or_else(|e| panic!("{what}: {e}"));
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    let at = names.iter().position(|n| *n == phase).expect(phase);
    assert_eq!(names.get(at + 1), Some(&"settle"), "{what}: {names:?}");
    assert_eq!(names.last(), Some(&"verify"), "{what}: {names:?}");
    assert_eq!(settle_started, 1, "{what}: settling announced once");
    println!("  {what}: restored after {took:.1?}");
    assert_eq!(workload.phases(), [Phase::Active; 3], "{what}");
    workload.check_shared(7);
    workload.check_writes_cross(8);
}

/// The creator (A) silent in `load_allocations`, an importer (B) in `restore_unicast`, each
/// for about two control timeouts.
pub(crate) fn silent_in_a_restore_step(sandbox: &Sandbox) {
    check_restore(sandbox, A, "load_allocations", Duration::from_millis(1500));
    check_restore(sandbox, B, "restore_unicast", Duration::from_millis(1500));
}
