//! `begin_checkpoint`: close the gate, drain, synchronize, inspect, freeze, and start watching
//! for a coordinator that goes quiet ([`super::rollback`]).

use super::carrier;
use super::inspect::inspection;
use super::step::{OpResult, at, loaded_driver};
use crate::driver::context;
use crate::log;
use crate::state::cache::refused;
use crate::state::gate;
use crate::state::process;
use crate::state::registry::Registry;
use crate::sys::entries;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{Phase, RefusalCode, Reply};

/// Refuses unless the process can start a checkpoint now.
fn may_begin(r: &Registry) -> Option<Reply> {
    if let Some(failure) = &r.failure {
        return Some(refused(
            RefusalCode::FailStopped,
            format!("fail-stopped earlier: {failure}"),
        ));
    }
    if r.phase != Phase::Active {
        return Some(refused(
            RefusalCode::OutOfOrder,
            format!(
                "begin_checkpoint needs phase active; this process is in phase {}",
                r.phase
            ),
        ));
    }
    None
}

/// `begin_checkpoint`: close the gate, wait until no application thread is inside a driver
/// call, synchronize every context that holds tracked memory, inspect, freeze. Any refusal
/// reopens the gate and changes nothing.
pub fn begin(timeouts: &Timeouts) -> Reply {
    {
        let guard = process::lock();
        if let Some(refusal) = may_begin(guard.as_ref().expect("created by lock()")) {
            return refusal;
        }
    }
    gate::close();
    let drain = timeouts.drain();
    if let Err(busy) = gate::drain(drain) {
        gate::open();
        let threads: Vec<String> = busy.iter().map(describe_busy).collect();
        let message = format!(
            "{} application thread(s) did not leave their driver call within {} s: {}; the gate \
             is open again and nothing was changed",
            busy.len(),
            drain.as_secs_f64(),
            threads.join(", ")
        );
        log!("begin_checkpoint refused: {message}");
        return refused(RefusalCode::Busy, message);
    }
    let mut guard = process::lock();
    let r = guard.as_mut().expect("created by lock()");
    if let Some(refusal) = may_begin(r) {
        gate::open();
        return refusal;
    }
    if let Err(failure) = synchronize(r) {
        gate::open();
        return refused(
            RefusalCode::Busy,
            format!(
                "begin_checkpoint could not synchronize: {failure}; the gate is open again and \
                 nothing was changed"
            ),
        );
    }
    match inspection(r) {
        Reply::Inspection(mut i) => {
            r.set_phase(Phase::Frozen);
            i.phase = Phase::Frozen;
            super::rollback::watch(*timeouts);
            Reply::Inspection(i)
        }
        other => {
            gate::open();
            other
        }
    }
}

fn describe_busy(b: &gate::Busy) -> String {
    let function = b
        .function
        .map(|i| entries::name(i).to_owned())
        .unwrap_or_else(|| "a driver call".to_owned());
    if b.thread_name.is_empty() {
        format!("thread {} is inside {function}", b.thread)
    } else {
        format!(
            "thread {} ({}) is inside {function}",
            b.thread, b.thread_name
        )
    }
}

/// Waits for the queued work of every context that holds tracked memory, so the bytes the
/// carrier saves include every copy and kernel the application issued before the gate closed.
fn synchronize(r: &Registry) -> OpResult<()> {
    let d = loaded_driver()?;
    let mut contexts: Vec<(usize, i32)> = r
        .allocations
        .values()
        .map(|a| (a.context, carrier::device_of(a)))
        .chain(
            r.multicasts
                .values()
                .map(|m| (m.context, m.devices.first().copied().unwrap_or(0))),
        )
        .collect();
    contexts.sort_unstable();
    contexts.dedup();
    for (ctx, device) in contexts {
        context::run(d, ctx, device, || d.ctx_synchronize())
            .map_err(at(|| format!("context {ctx:#x} (device {device})")))?;
    }
    Ok(())
}
