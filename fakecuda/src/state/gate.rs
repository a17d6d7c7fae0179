//! The checkpoint gate: every entry point passes it, so a native lock really stops the
//! application's driver calls, and the process's native state (running, locked,
//! checkpointed, failed) with the lock and unlock steps, under the gate's own lock (not the
//! driver's). What checkpoint and restore do to the device state is `crate::checkpoint::native`.

use crate::abi::consts as c;
use crate::error::{CuError, CuResult};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Gate {
    pub(crate) state: u32,
    /// A lock is waiting for in-flight calls to drain; new calls wait.
    pub(crate) draining: bool,
    pub(crate) in_flight: usize,
}

pub(crate) static GATE: Mutex<Gate> = Mutex::new(Gate {
    state: c::PROCESS_STATE_RUNNING,
    draining: false,
    in_flight: 0,
});

pub(crate) static GATE_CV: Condvar = Condvar::new();

pub(crate) fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Proof that the caller passed the gate; dropping it lets a pending lock proceed.
#[derive(Debug)]
pub struct Pass(());

impl Drop for Pass {
    fn drop(&mut self) {
        let mut g = gate();
        g.in_flight -= 1;
        if g.in_flight == 0 {
            GATE_CV.notify_all();
        }
    }
}

/// Another pass, for work that a call (which passed the gate and still holds its pass) queues
/// on a stream: the native lock then also waits for that work to run, as the driver's lock
/// waits for submitted work. Never waits: only called from inside a gated call.
pub fn extend() -> Pass {
    gate().in_flight += 1;
    Pass(())
}

/// Waits while the process is locked or checkpointed, as driver calls block on the real
/// driver between lock and unlock.
pub fn enter() -> Pass {
    let mut g = gate();
    while g.state != c::PROCESS_STATE_RUNNING || g.draining {
        g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.in_flight += 1;
    Pass(())
}

pub fn state() -> u32 {
    gate().state
}

/// Test hook: `FAKECUDA_REFUSE_CHECKPOINT=lock` (or `checkpoint`) in the target process makes
/// that native step refuse with `CUDA_ERROR_NOT_SUPPORTED`, leaving the state unchanged, as the
/// driver refuses a process it cannot checkpoint.
pub(crate) fn refused_by_hook(step: &str) -> CuResult<()> {
    match std::env::var("FAKECUDA_REFUSE_CHECKPOINT") {
        Ok(value) if value.split(',').any(|v| v == step) => Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
        _ => Ok(()),
    }
}

/// Lock: from RUNNING only; waits up to `timeout_ms` (0: no limit) for calls in flight.
pub fn lock(timeout_ms: u32) -> CuResult<()> {
    refused_by_hook("lock")?;
    let mut g = gate();
    if g.state != c::PROCESS_STATE_RUNNING || g.draining {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    g.draining = true;
    if timeout_ms == 0 {
        while g.in_flight > 0 {
            g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    } else {
        let (ng, res) = GATE_CV
            .wait_timeout_while(g, Duration::from_millis(u64::from(timeout_ms)), |g| {
                g.in_flight > 0
            })
            .unwrap_or_else(|e| e.into_inner());
        g = ng;
        if res.timed_out() && g.in_flight > 0 {
            g.draining = false;
            GATE_CV.notify_all();
            return Err(CuError::CUDA_ERROR_TIMEOUT);
        }
    }
    g.draining = false;
    g.state = c::PROCESS_STATE_LOCKED;
    Ok(())
}

pub fn unlock() -> CuResult<()> {
    let mut g = gate();
    if g.state != c::PROCESS_STATE_LOCKED {
        return Err(CuError::CUDA_ERROR_ILLEGAL_STATE);
    }
    g.state = c::PROCESS_STATE_RUNNING;
    GATE_CV.notify_all();
    Ok(())
}

/// A failure after destructive work leaves the process FAILED; a refusal before it leaves the
/// state unchanged.
pub(crate) enum Outcome {
    Refused(CuError),
    Broken(CuError),
}
