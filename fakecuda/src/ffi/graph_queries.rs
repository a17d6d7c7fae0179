//! A graph's shape through the C ABI: its nodes, roots, edges, a node's dependencies and
//! dependents (each with CUDA 12.3's edge-data `_v2`; every edge here has the default data),
//! removing a node, a DOT print, the instantiation with parameters and upload, and the
//! memory nodes' getters.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graphs::h;
use super::{gated, get, handle_ptr, put, with};
use crate::abi::RawMemAllocNodeParams;
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
use crate::state::extras::graph::Work;
use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::driver::sys::{CUgraph, CUgraphExec, CUgraphExec_st, CUgraphNode, CUgraphNode_st};
use std::ffi::CStr;
use std::ffi::{c_char, c_uint};

/// `CUgraphEdgeData`: 8 bytes, all zero for a default edge.
pub(super) type EdgeData = [u8; 8];

/// Only default edges are modelled: `n` edge data (or none, when `data` is null) that are
/// all zero, else `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `data` is null or valid for `n` reads (cuda.h).
pub(super) unsafe fn default_edges(data: *const EdgeData, n: usize) -> CuResult<()> {
    if data.is_null() || n == 0 {
        return Ok(());
    }
    // SAFETY: `n` edge data, per the caller.
    let data = unsafe { std::slice::from_raw_parts(data, n) };
    if data.iter().any(|e| *e != [0; 8]) {
        return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// Writes a list the CUDA way: with every array null, its length into `*count`; else up to
/// `*count` entries (the rest of each array nulled, edge data zeroed) and how many there were.
///
/// # Safety
/// `count` is null or valid for one `size_t`; each non-null array holds `*count` entries.
unsafe fn put_list<const N: usize>(
    columns: [*mut CUgraphNode; N],
    edges: *mut EdgeData,
    count: *mut usize,
    rows: &[[u64; N]],
) -> CuResult<()> {
    // SAFETY: size_t in-out parameter (cuda.h), per the caller.
    let room = unsafe { get(count.cast_const()) }?;
    let all_null = columns.iter().all(|c| c.is_null()) && edges.is_null();
    if all_null {
        // SAFETY: as above.
        return unsafe { put(count, rows.len()) };
    }
    for (i, column) in columns.iter().enumerate() {
        if column.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's array of `room` handles (cuda.h).
        let out = unsafe { std::slice::from_raw_parts_mut(*column, room) };
        for (j, slot) in out.iter_mut().enumerate() {
            *slot = rows
                .get(j)
                .map_or(std::ptr::null_mut(), |r| handle_ptr::<CUgraphNode_st>(r[i]));
        }
    }
    if !edges.is_null() {
        // SAFETY: the caller's array of `room` CUgraphEdgeData (cuda.h).
        unsafe { std::slice::from_raw_parts_mut(edges, room) }.fill([0; 8]);
    }
    // SAFETY: as above.
    unsafe { put(count, rows.len().min(room)) }
}

fn rows(nodes: Vec<u64>) -> Vec<[u64; 1]> {
    nodes.into_iter().map(|n| [n]).collect()
}

/// A list of `graph`'s nodes (see [`put_list`]).
///
/// # Safety
/// cuda.h's contract for the list.
unsafe fn graph_nodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
    which: fn(&crate::state::extras::graph::Graphs, u64) -> CuResult<Vec<u64>>,
) -> RawResult {
    gated(|| {
        let all = driver::with(|d| which(&d.graphs, h(graph)))?;
        // SAFETY: per the caller.
        unsafe { put_list([nodes], std::ptr::null_mut(), count, &rows(all)) }
    })
}

export! {
    /// A graph's nodes in the order they were added.
    fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) {
        // SAFETY: the caller's list (cuda.h).
        unsafe { graph_nodes(graph, nodes, count, crate::state::extras::graph::Graphs::nodes_of) }
    }

    fn cuGraphGetRootNodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) {
        // SAFETY: the caller's list (cuda.h).
        unsafe { graph_nodes(graph, nodes, count, crate::state::extras::graph::Graphs::roots) }
    }
}

/// # Safety
/// cuda.h's contract for the lists.
unsafe fn edges(
    graph: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> RawResult {
    gated(|| {
        let all = driver::with(|d| d.graphs.edges(h(graph)))?;
        let rows: Vec<[u64; 2]> = all.into_iter().map(|(f, t)| [f, t]).collect();
        // SAFETY: per the caller.
        unsafe { put_list([from, to], data, count, &rows) }
    })
}

export! {
    fn cuGraphGetEdges(
        graph: CUgraph,
        from: *mut CUgraphNode,
        to: *mut CUgraphNode,
        count: *mut usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { edges(graph, from, to, std::ptr::null_mut(), count) }
    }

    fn cuGraphGetEdges_v2(
        graph: CUgraph,
        from: *mut CUgraphNode,
        to: *mut CUgraphNode,
        data: *mut EdgeData,
        count: *mut usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { edges(graph, from, to, data, count) }
    }
}

/// A node's neighbours: its dependencies (`up`) or its dependents.
///
/// # Safety
/// cuda.h's contract for the list.
unsafe fn neighbours(
    node: CUgraphNode,
    up: bool,
    out: *mut CUgraphNode,
    data: *mut EdgeData,
    count: *mut usize,
) -> RawResult {
    gated(|| {
        let all = driver::with(|d| {
            if up {
                d.graphs.dependencies(h(node))
            } else {
                d.graphs.dependents(h(node))
            }
        })?;
        // SAFETY: per the caller.
        unsafe { put_list([out], data, count, &rows(all)) }
    })
}

export! {
    fn cuGraphNodeGetDependencies(node: CUgraphNode, out: *mut CUgraphNode, count: *mut usize) {
        // SAFETY: the caller's list (cuda.h).
        unsafe { neighbours(node, true, out, std::ptr::null_mut(), count) }
    }

    fn cuGraphNodeGetDependentNodes(node: CUgraphNode, out: *mut CUgraphNode, count: *mut usize) {
        // SAFETY: the caller's list (cuda.h).
        unsafe { neighbours(node, false, out, std::ptr::null_mut(), count) }
    }

    for (node: CUgraphNode, out: *mut CUgraphNode, data: *mut EdgeData, count: *mut usize) {
        fn cuGraphNodeGetDependencies_v2 {
            // SAFETY: the caller's list (cuda.h).
            unsafe { neighbours(node, true, out, data, count) }
        }

        fn cuGraphNodeGetDependentNodes_v2 {
            // SAFETY: the caller's list (cuda.h).
            unsafe { neighbours(node, false, out, data, count) }
        }
    }

    safe fn cuGraphDestroyNode(node: CUgraphNode) {
        with(|d| d.graphs.destroy_node(h(node)))
    }

    /// `cuGraphDebugDotPrint`: the graph as DOT, a node per line (its type and local id) and an
    /// edge per line; `flags` (what detail to print) change nothing here.
    fn cuGraphDebugDotPrint(graph: CUgraph, path: *const c_char, _flags: c_uint) {
        gated(|| {
            if path.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: a NUL-terminated path (cuda.h), non-null.
            let path = unsafe { CStr::from_ptr(path) }
                .to_string_lossy()
                .into_owned();
            let dot = driver::with(|d| {
                let g = h(graph);
                let mut dot = format!("digraph fakecuda_graph_{} {{\n", d.graphs.graph_id(g)?);
                for n in d.graphs.nodes_of(g)? {
                    let (local, _, _) = d.graphs.node(n)?;
                    let kind = super::graph_params::type_name(&d.graphs.work(n)?);
                    dot.push_str(&format!("  n{n:x} [label=\"{kind} {local}\"];\n"));
                }
                for (from, to) in d.graphs.edges(g)? {
                    dot.push_str(&format!("  n{from:x} -> n{to:x};\n"));
                }
                dot.push_str("}\n");
                Ok(dot)
            })?;
            std::fs::write(&path, dot).map_err(|_| CuError::CUDA_ERROR_OPERATING_SYSTEM)
        })
    }
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    error_node: CUgraphNode,
    result: c_uint,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`: free graph allocations on relaunch, upload, device launch,
/// node priorities.
const AUTO_FREE_ON_LAUNCH: u64 = 1;
const UPLOAD: u64 = 2;
const DEVICE_LAUNCH: u64 = 4;
const USE_NODE_PRIORITY: u64 = 8;

/// Instantiates `graph` with `flags`: auto-free and node priorities change nothing here (graph
/// memory is the executable graph's either way, and work runs in dependency order); upload
/// needs `upload` (a stream to check); device launch needs device code.
pub(super) fn instantiate(
    out: *mut CUgraphExec,
    graph: CUgraph,
    flags: u64,
    upload: Option<CUstream>,
) -> CuResult<()> {
    if out.is_null()
        || flags & !(AUTO_FREE_ON_LAUNCH | UPLOAD | DEVICE_LAUNCH | USE_NODE_PRIORITY) != 0
    {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    if flags & DEVICE_LAUNCH != 0 {
        return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
    }
    if flags & UPLOAD != 0 {
        let stream = upload.ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        memcpy::target(Some(stream as usize as u64))?;
    }
    driver::with(|d| {
        let e = d.next_handle();
        d.graphs.instantiate(e, h(graph))?;
        d.user_objects.exec_retain(h(graph), e);
        // SAFETY: CUgraphExec out-parameter (cuda.h), non-null.
        unsafe { put(out, handle_ptr::<CUgraphExec_st>(e)) }
    })
}

/// `CUgraphInstantiateResult`: success, a general error, an invalid structure, a node kind
/// that cannot be instantiated, several contexts.
const RESULT_SUCCESS: c_uint = 0;
const RESULT_ERROR: c_uint = 1;
const RESULT_INVALID_STRUCTURE: c_uint = 2;
const RESULT_NODE_OPERATION_NOT_SUPPORTED: c_uint = 3;

export! {
    fn cuGraphInstantiateWithParams(
        out: *mut CUgraphExec,
        graph: CUgraph,
        params: *mut InstantiateParams,
    ) {
        gated(|| {
            if params.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: the caller's CUDA_GRAPH_INSTANTIATE_PARAMS (cuda.h), non-null.
            let (flags, upload) = unsafe { ((*params).flags, (*params).upload_stream) };
            let done = instantiate(out, graph, flags, Some(upload));
            let result = match done {
                Ok(()) => RESULT_SUCCESS,
                Err(CuError::CUDA_ERROR_NOT_SUPPORTED) => RESULT_NODE_OPERATION_NOT_SUPPORTED,
                // Dependencies out of order, or a second executable graph of a graph with memory.
                Err(CuError::CUDA_ERROR_INVALID_VALUE) => RESULT_INVALID_STRUCTURE,
                Err(_) => RESULT_ERROR,
            };
            // SAFETY: as above: the driver's outputs (no node is blamed here).
            unsafe {
                (*params).error_node = std::ptr::null_mut();
                (*params).result = result;
            }
            done
        })
    }

    /// `cuGraphUpload`: nothing to move ahead of a launch here; the executable graph and the
    /// stream are checked.
    safe fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) {
        gated(|| {
            driver::with(|d| d.graphs.exec_id(h(exec)).map(drop))?;
            memcpy::target(Some(stream as usize as u64)).map(drop)
        })
    }

    fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, out: *mut RawMemAllocNodeParams) {
        with(|d| {
            let Work::MemAlloc {
                base,
                requested,
                device,
                ..
            } = d.graphs.work(h(node))?
            else {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            };
            let (descs, n) = d.graphs.grants(h(node))?;
            if out.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: a CUDA_MEM_ALLOC_NODE_PARAMS out-parameter (cuda.h), non-null; all zero is
            // a valid value of it before the fields are set.
            unsafe {
                out.write_bytes(0, 1);
                let p = &mut *out;
                p.pool_props.alloc_type = crate::abi::consts::ALLOCATION_TYPE_PINNED;
                p.pool_props.location.type_ = crate::abi::consts::LOCATION_TYPE_DEVICE;
                p.pool_props.location.id = device as i32;
                p.access_descs = descs;
                p.access_desc_count = n;
                p.bytesize = requested as usize;
                p.dptr = base;
            }
            Ok(())
        })
    }

    fn cuGraphMemFreeNodeGetParams(node: CUgraphNode, out: *mut CUdeviceptr) {
        with(|d| match d.graphs.work(h(node))? {
            // SAFETY: CUdeviceptr out-parameter (cuda.h).
            Work::MemFree { base } => unsafe { put(out, base) },
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        })
    }
}

/// Adds (`add`) or removes `n` edges `from[i] → to[i]`; only default edge data is modelled.
///
/// # Safety
/// `from` and `to` hold `n` handles, `data` is null or holds `n` edge data (cuda.h).
unsafe fn dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    data: *const EdgeData,
    n: usize,
    add: bool,
) -> RawResult {
    gated(|| {
        if n == 0 {
            return Ok(());
        }
        if from.is_null() || to.is_null() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `n` edge data or null (cuda.h), per the caller.
        unsafe { default_edges(data, n) }?;
        // SAFETY: `n` handles each (cuda.h), per the caller.
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(from, n),
                std::slice::from_raw_parts(to, n),
            )
        };
        let edges: Vec<(u64, u64)> = from.iter().zip(to).map(|(f, t)| (h(*f), h(*t))).collect();
        driver::with(|d| d.graphs.change_dependencies(h(graph), &edges, add))
    })
}

export! {
    fn cuGraphAddDependencies(
        graph: CUgraph,
        from: *const CUgraphNode,
        to: *const CUgraphNode,
        n: usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { dependencies(graph, from, to, std::ptr::null(), n, true) }
    }

    fn cuGraphAddDependencies_v2(
        graph: CUgraph,
        from: *const CUgraphNode,
        to: *const CUgraphNode,
        data: *const EdgeData,
        n: usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { dependencies(graph, from, to, data, n, true) }
    }

    fn cuGraphRemoveDependencies(
        graph: CUgraph,
        from: *const CUgraphNode,
        to: *const CUgraphNode,
        n: usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { dependencies(graph, from, to, std::ptr::null(), n, false) }
    }

    fn cuGraphRemoveDependencies_v2(
        graph: CUgraph,
        from: *const CUgraphNode,
        to: *const CUgraphNode,
        data: *const EdgeData,
        n: usize,
    ) {
        // SAFETY: the caller's lists (cuda.h).
        unsafe { dependencies(graph, from, to, data, n, false) }
    }
}
