//! A participant that stops answering in `prepare_unicast` and comes back: the coordinator
//! waits for it (settle), then puts the workload back from the state in memory (exit 3)
//! instead of declaring a fail-stop.

use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::events::Event;
use cuinterpose_coordinator::state::{self, StateError};
use cuinterpose_protocol::Phase;

use crate::faults::workload::{A, B, NAMES, Workload};
use crate::support::sandbox::Sandbox;

/// `victim` is stopped as `prepare_unicast` starts and resumed `after` later; the coordinator
/// waits at most its quiet window (3 s at a 1 s control timeout).
fn check(sandbox: &Sandbox, victim: usize, after: Duration) {
    let mut workload = Workload::start(sandbox, "settle");
    let session = workload.session(Duration::from_secs(1));
    let dir = sandbox.fresh("checkpoint");
    let victim_pid = workload.pid(victim);
    let started = Instant::now();
    let host_pid = workload.host_pid(victim).to_string();
    let mut resumer = None;
    let mut settle_rounds = 0;
    let mut progress = |event: &Event| match event {
        Event::Started {
            phase: "prepare_unicast",
            ..
        } if resumer.is_none() => {
            workload.signal(victim, libc::SIGSTOP);
            let host_pid = host_pid.clone();
            resumer = Some(std::thread::spawn(move || {
                std::thread::sleep(after);
                let sent = std::process::Command::new("kill")
                    .args(["-CONT", &host_pid])
                    .status();
                assert!(sent.is_ok_and(|s| s.success()), "SIGCONT to {host_pid}");
            }));
        }
        Event::Started {
            phase: "settle", ..
        } => settle_rounds += 1,
        _ => {}
    };
    let result = commands::prepare(&session, &dir, &mut progress);
    if let Some(resumer) = resumer {
        resumer.join().expect("the resumer");
    }
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
    assert!(
        settle_rounds >= 1,
        "{what}: settled in {settle_rounds} rounds"
    );
    println!("  {what}: put back after {took:.1?}, {settle_rounds} settle rounds");
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
