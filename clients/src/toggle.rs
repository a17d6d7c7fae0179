//! A whole checkpoint/restore cycle in place, as `cuinterpose toggle` runs it: the
//! coordinator's `prepare` (inspect, topology validation, begin_checkpoint, prepare_multicast,
//! save_allocations, prepare_unicast, `cuinterpose.state` published), fakecuda's native lock and
//! checkpoint of every process, native restore and unlock, and the coordinator's `restore`
//! (load_allocations … restore_multicast_bindings, then the records compared with the saved
//! state). The processes are named explicitly (`cuinterpose toggle` finds them as the process
//! tree under a root PID, which in a test harness would include other tests' workers).

use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::session::Session;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{NamespacePid, Phase};
use std::path::Path;
use std::process::Command;

/// One native checkpoint step (`lock`, `checkpoint`, `restore`, `unlock`) on host pid `pid`,
/// through `fakecuda-checkpoint` with the sandbox's fakecuda control directory.
pub fn native(fakecuda_dir: &Path, pid: i32, action: &str) {
    cuinterpose_testkit::succeed(
        Command::new(crate::build::checkpoint_tool())
            .args(["--action", action, "--pid", &pid.to_string()])
            .env("LD_LIBRARY_PATH", cuinterpose_testkit::fakecuda_lib_dir())
            .env("FAKECUDA_CONTROL_DIR", fakecuda_dir)
            .env_remove("LD_PRELOAD"),
        &format!("native {action} of pid {pid}"),
    );
}

/// Checkpoints and restores the processes `pids` (host PID = namespace PID here) in place.
/// `Err` with the coordinator's message when `prepare` refuses (nothing was changed then);
/// panics on any failure after that.
pub fn toggle(
    control_dir: &Path,
    fakecuda_dir: &Path,
    state_dir: &Path,
    pids: &[i32],
) -> Result<(), String> {
    let participants: Vec<NamespacePid> = pids
        .iter()
        .map(|&p| NamespacePid::new(p as u32).expect("a live pid"))
        .collect();
    let session = Session::open(control_dir, &participants, Timeouts::default())
        .expect("open a coordinator session");
    let mut quiet = |_: &cuinterpose_coordinator::events::Event| {};
    commands::prepare(&session, state_dir, &mut quiet)
        .map_err(|e| format!("coordinator prepare of {pids:?} refused: {e}"))?;
    // Each step of every process before the next step of any.
    for action in ["lock", "checkpoint", "restore", "unlock"] {
        for &pid in pids {
            native(fakecuda_dir, pid, action);
        }
    }
    if let Err(e) = commands::restore(&session, state_dir, &mut quiet) {
        panic!("coordinator restore of {pids:?} failed: {e}");
    }
    for (pid, inspection) in session.inspect() {
        let inspection = inspection.unwrap_or_else(|e| panic!("inspect of {pid}: {e}"));
        assert_eq!(inspection.phase, Phase::Active, "{pid} after restore");
    }
    Ok(())
}
