//! Event record and wait nodes: added, read, and changed in a graph or an executable graph.
//! A record node records its event when it runs; a wait node waits, when it runs, for the
//! event's latest record.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graphs::{add, deps, h};
use super::{gated, handle_ptr, put};
use crate::driver::{self, DriverState};
use crate::error::{CuError, CuResult, RawResult};
use crate::state::extras::graph::{EventRef, Work};
use cudarc::driver::sys::{CUevent, CUevent_st, CUgraph, CUgraphExec, CUgraphNode};

/// The event `e` names, for a node.
pub(super) fn event_ref(e: CUevent) -> CuResult<EventRef> {
    driver::with(|d| event_in(d, e))
}

/// [`event_ref`] with the driver already locked.
pub(super) fn event_in(d: &DriverState, e: CUevent) -> CuResult<EventRef> {
    Ok(EventRef {
        handle: e as usize as u64,
        event: super::streams::event(d, e)?,
    })
}

/// # Safety
/// cuda.h's contract for the dependency list.
unsafe fn add_event_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    n: usize,
    work: impl FnOnce(EventRef) -> Work,
    e: CUevent,
) -> RawResult {
    gated(|| {
        let work = work(event_ref(e)?);
        // SAFETY: per the caller.
        add(out, graph, unsafe { deps(dependencies, n) }?, work)
    })
}

export! {
    fn cuGraphAddEventRecordNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        e: CUevent,
    ) {
        // SAFETY: the caller's dependency list (cuda.h).
        unsafe { add_event_node(out, graph, dependencies, n, Work::EventRecord, e) }
    }

    fn cuGraphAddEventWaitNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        e: CUevent,
    ) {
        // SAFETY: the caller's dependency list (cuda.h).
        unsafe { add_event_node(out, graph, dependencies, n, Work::EventWait, e) }
    }
}

/// The event of a record (`record`) or wait node.
fn node_event(node: CUgraphNode, record: bool, out: *mut CUevent) -> RawResult {
    gated(|| {
        let e = match (driver::with(|d| d.graphs.work(h(node)))?, record) {
            (Work::EventRecord(e), true) | (Work::EventWait(e), false) => e,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: CUevent out-parameter (cuda.h).
        unsafe { put(out, handle_ptr::<CUevent_st>(e.handle)) }
    })
}

export! {
    fn cuGraphEventRecordNodeGetEvent(node: CUgraphNode, out: *mut CUevent) {
        node_event(node, true, out)
    }

    fn cuGraphEventWaitNodeGetEvent(node: CUgraphNode, out: *mut CUevent) {
        node_event(node, false, out)
    }
}

/// A record or wait node's new event, in a graph or (`exec`) in what it became there.
fn set_event(exec: Option<CUgraphExec>, node: CUgraphNode, record: bool, e: CUevent) -> RawResult {
    gated(|| {
        let e = event_ref(e)?;
        let work = if record {
            Work::EventRecord(e)
        } else {
            Work::EventWait(e)
        };
        driver::with(|d| match exec {
            None => d.graphs.set_work(h(node), work),
            Some(x) => d.graphs.exec_set_work(h(x), h(node), work),
        })
    })
}

export! {
    safe fn cuGraphEventRecordNodeSetEvent(node: CUgraphNode, e: CUevent) {
        set_event(None, node, true, e)
    }

    safe fn cuGraphEventWaitNodeSetEvent(node: CUgraphNode, e: CUevent) {
        set_event(None, node, false, e)
    }

    safe fn cuGraphExecEventRecordNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, e: CUevent) {
        set_event(Some(exec), node, true, e)
    }

    safe fn cuGraphExecEventWaitNodeSetEvent(exec: CUgraphExec, node: CUgraphNode, e: CUevent) {
        set_event(Some(exec), node, false, e)
    }
}
