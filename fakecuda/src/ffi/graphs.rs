//! CUDA graphs (see [`crate::graph`]).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::*;
use crate::graph::Work;
use cudarc::driver::sys::{
    CUgraph, CUgraph_st, CUgraphExec, CUgraphExec_st, CUgraphNode, CUgraphNode_st,
};

fn h<T>(p: *mut T) -> u64 {
    p as usize as u64
}

/// The dependency list of a node being added.
///
/// # Safety
/// `deps` is null or points at `n` node handles (cuda.h).
unsafe fn deps(deps: *const CUgraphNode, n: usize) -> CuResult<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if deps.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `n` handles (cuda.h).
    Ok(unsafe { std::slice::from_raw_parts(deps, n) }
        .iter()
        .map(|d| h(*d))
        .collect())
}

fn add(out: *mut CUgraphNode, graph: CUgraph, deps: Vec<u64>, work: Work) -> CuResult<()> {
    if out.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    driver::with(|d| {
        let node = d.next_handle();
        d.graphs.add(node, h(graph), &deps, work)?;
        // SAFETY: CUgraphNode out-parameter (cuda.h), non-null.
        unsafe { put(out, handle_ptr::<CUgraphNode_st>(node)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(out: *mut CUgraph, flags: c_uint) -> RawResult {
    with(|d| {
        if out.is_null() || flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let g = d.next_handle();
        d.graphs.create(g);
        // SAFETY: CUgraph out-parameter (cuda.h), non-null.
        unsafe { put(out, handle_ptr::<CUgraph_st>(g)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> RawResult {
    with(|d| d.graphs.destroy(h(graph)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    n: usize,
) -> RawResult {
    // SAFETY: cuda.h's contract for the dependency list.
    gated(|| add(out, graph, unsafe { deps(dependencies, n) }?, Work::Empty))
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostNodeParams {
    function: usize,
    user: usize,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddHostNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    n: usize,
    params: *const HostNodeParams,
) -> RawResult {
    gated(|| {
        // SAFETY: CUDA_HOST_NODE_PARAMS input (cuda.h).
        let p = unsafe { get(params) }?;
        if p.function == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let work = Work::Host {
            function: p.function,
            user: p.user,
        };
        // SAFETY: cuda.h's contract for the dependency list.
        add(out, graph, unsafe { deps(dependencies, n) }?, work)
    })
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemsetNodeParams {
    dst: u64,
    pitch: usize,
    value: c_uint,
    element_size: c_uint,
    width: usize,
    height: usize,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    out: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    n: usize,
    params: *const MemsetNodeParams,
    _ctx: CUcontext,
) -> RawResult {
    gated(|| {
        // SAFETY: CUDA_MEMSET_NODE_PARAMS input (cuda.h).
        let p = unsafe { get(params) }?;
        if !matches!(p.element_size, 1 | 2 | 4) || p.width == 0 || p.height == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let work = Work::Memset {
            dst: p.dst,
            pitch: p.pitch as u64,
            value: p.value,
            width: p.element_size as usize,
            count: p.width,
            height: p.height,
        };
        // SAFETY: cuda.h's contract for the dependency list.
        add(out, graph, unsafe { deps(dependencies, n) }?, work)
    })
}

/// Generic node parameters (`CUgraphNodeParams`): no kind is modelled through them yet.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphAddNode(
    _out: *mut CUgraphNode,
    _graph: CUgraph,
    _deps: *const CUgraphNode,
    _n: usize,
    _params: *mut c_void,
) -> RawResult {
    CuError::CUDA_ERROR_NOT_SUPPORTED.raw()
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphAddNode_v2(
    _out: *mut CUgraphNode,
    _graph: CUgraph,
    _deps: *const CUgraphNode,
    _edges: *const c_void,
    _n: usize,
    _params: *mut c_void,
) -> RawResult {
    CuError::CUDA_ERROR_NOT_SUPPORTED.raw()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> RawResult {
    with(|d| {
        if out.is_null() || flags != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let e = d.next_handle();
        d.graphs.instantiate(e, h(graph))?;
        // SAFETY: CUgraphExec out-parameter (cuda.h), non-null.
        unsafe { put(out, handle_ptr::<CUgraphExec_st>(e)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> RawResult {
    gated(|| {
        let order = driver::with(|d| d.graphs.exec_order(h(exec)))?;
        memcpy::host_work(Some(stream as usize as u64), move || {
            for work in order {
                match work {
                    Work::Empty => {}
                    Work::Host { function, user } => {
                        // SAFETY: the application's CUhostFn with its own argument (cuda.h).
                        let f: unsafe extern "C" fn(*mut c_void) =
                            unsafe { std::mem::transmute(function) };
                        // SAFETY: as above.
                        unsafe { f(user as *mut c_void) };
                    }
                    Work::Memset {
                        dst,
                        pitch,
                        value,
                        width,
                        count,
                        height,
                    } => {
                        for row in 0..height as u64 {
                            if let Err(e) = memcpy::fill_now(dst + row * pitch, value, width, count)
                            {
                                eprintln!(
                                    "fakecuda: graph memset node at {dst:#x} failed when it ran: {e}"
                                );
                                return;
                            }
                        }
                    }
                }
            }
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> RawResult {
    with(|d| d.graphs.exec_destroy(h(exec)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetId(graph: CUgraph, id: *mut c_uint) -> RawResult {
    with(|d| {
        let v = d.graphs.graph_id(h(graph))?;
        // SAFETY: unsigned out-parameter (cuda.h).
        unsafe { put(id, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecGetId(exec: CUgraphExec, id: *mut c_uint) -> RawResult {
    with(|d| {
        let v = d.graphs.exec_id(h(exec))?;
        // SAFETY: unsigned out-parameter (cuda.h).
        unsafe { put(id, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetLocalId(node: CUgraphNode, id: *mut c_uint) -> RawResult {
    with(|d| {
        let (local, _, _) = d.graphs.node(h(node))?;
        // SAFETY: unsigned out-parameter (cuda.h).
        unsafe { put(id, local) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetToolsId(
    node: CUgraphNode,
    id: *mut c_ulonglong,
) -> RawResult {
    with(|d| {
        let (_, tools, _) = d.graphs.node(h(node))?;
        // SAFETY: unsigned long long out-parameter (cuda.h).
        unsafe { put(id, tools) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetContainingGraph(
    node: CUgraphNode,
    out: *mut CUgraph,
) -> RawResult {
    with(|d| {
        let (_, _, graph) = d.graphs.node(h(node))?;
        // SAFETY: CUgraph out-parameter (cuda.h).
        unsafe { put(out, handle_ptr::<CUgraph_st>(graph)) }
    })
}
