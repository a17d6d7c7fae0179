//! Graph nodes from generic parameters (`cuGraphAddNode`, `CUgraphNodeParams`) and
//! conditional nodes (`cuGraphConditionalHandleCreate`): empty, host, memset, memcpy and
//! child-graph nodes as their own calls make them, and if, while and switch nodes whose body
//! graphs the driver creates for the application to fill.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graph_queries::{EdgeData, default_edges};
use super::graphs;
use super::graphs::{RawMemcpy3d, add, child_node, deps, h, host_node, memcpy_node, memset_node};
use super::{gated, get, handle_ptr, put, with_out};
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use crate::state::extras::graph::Work;
use cudarc::driver::sys::CUcontext;
use cudarc::driver::sys::{
    CUgraph, CUgraphConditionalHandle, CUgraphNode, CUgraphNodeParams, CUgraphNodeType as T,
};
use std::ffi::c_uint;

export! {
    fn cuGraphConditionalHandleCreate(
        out: *mut CUgraphConditionalHandle,
        graph: CUgraph,
        ctx: CUcontext,
        default: c_uint,
        flags: c_uint,
    ) -> out |d| {
        d.contexts.check_live(ctx as usize as u64)?;
        let condition = d.next_handle();
        d.graphs
            .condition_create(condition, h(graph), default, flags)?;
        Ok(condition)
    }

    /// A node from generic parameters. A conditional node's bodies are written back into
    /// `params` (`phGraph_out` then points at an array that lives as long as the node).
    fn cuGraphAddNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        params: *mut CUgraphNodeParams,
    ) {
        gated(|| {
            // SAFETY: CUgraphNodeParams input (cuda.h), a plain C struct read by value.
            let p = unsafe { get(params.cast_const()) }?;
            // SAFETY: cuda.h's contract for the dependency list.
            let deps = unsafe { deps(dependencies, n) }?;
            if p.type_ == T::CU_GRAPH_NODE_TYPE_CONDITIONAL {
                // SAFETY: `type_` says the application filled the `conditional` member.
                let c = unsafe { p.__bindgen_anon_1.conditional };
                let bodies = add_conditional(out, graph, deps, c.handle, c.type_ as u32, c.size)?;
                // SAFETY: `params` is the application's CUgraphNodeParams (read above); the
                // driver owns and fills `phGraph_out` (cuda.h).
                unsafe { (*params).__bindgen_anon_1.conditional.phGraph_out = bodies.cast() };
                return Ok(());
            }
            if p.type_ == T::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
                let at = std::mem::offset_of!(CUgraphNodeParams, __bindgen_anon_1);
                // SAFETY: `type_` says the application filled the `alloc` member, a
                // CUDA_MEM_ALLOC_NODE_PARAMS at the union's offset (8-aligned) whose `dptr` the
                // driver writes back (cuda.h).
                let alloc = unsafe { params.cast::<u8>().add(at) }.cast();
                // SAFETY: as above.
                return unsafe { super::graph_memory::add_alloc(out, graph, deps, alloc) };
            }
            add(out, graph, deps, generic_work(graph, &p)?)
        })
    }
}

/// The work of a node from generic parameters, every kind but conditional nodes (which make
/// graphs of their own); `graph` is the node's graph (a child may not be it).
pub(super) fn generic_work(graph: CUgraph, p: &CUgraphNodeParams) -> CuResult<Work> {
    Ok(match p.type_ {
        T::CU_GRAPH_NODE_TYPE_EMPTY => Work::Empty,
        T::CU_GRAPH_NODE_TYPE_HOST => {
            // SAFETY: `type_` says the application filled the `host` member.
            let host = unsafe { p.__bindgen_anon_1.host };
            host_node(host.fn_.map_or(0, |f| f as usize), host.userData as usize)?
        }
        T::CU_GRAPH_NODE_TYPE_MEMSET => {
            // SAFETY: `type_` says the application filled the `memset` member.
            let m = unsafe { p.__bindgen_anon_1.memset };
            memset_node(&graphs::MemsetNodeParams {
                dst: m.dst,
                pitch: m.pitch,
                value: m.value,
                element_size: m.elementSize,
                width: m.width,
                height: m.height,
            })?
        }
        T::CU_GRAPH_NODE_TYPE_MEMCPY => {
            // SAFETY: `type_` says the application filled the `memcpy` member.
            let m = unsafe { p.__bindgen_anon_1.memcpy };
            if m.flags != 0 {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: `RawMemcpy3d` mirrors CUDA_MEMCPY3D field for field (its size is
            // asserted equal); both are plain integers and pointers.
            let raw: RawMemcpy3d = unsafe { std::mem::transmute(m.copyParams) };
            memcpy_node(&raw)?
        }
        T::CU_GRAPH_NODE_TYPE_GRAPH => {
            // SAFETY: `type_` says the application filled the `graph` member.
            let child = unsafe { p.__bindgen_anon_1.graph }.graph;
            child_node(graph, child)?
        }
        T::CU_GRAPH_NODE_TYPE_EVENT_RECORD => {
            // SAFETY: `type_` says the application filled the `eventRecord` member.
            let e = unsafe { p.__bindgen_anon_1.eventRecord }.event;
            Work::EventRecord(super::graph_events::event_ref(e)?)
        }
        T::CU_GRAPH_NODE_TYPE_WAIT_EVENT => {
            // SAFETY: `type_` says the application filled the `eventWait` member.
            let e = unsafe { p.__bindgen_anon_1.eventWait }.event;
            Work::EventWait(super::graph_events::event_ref(e)?)
        }
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => {
            // SAFETY: `type_` says the application filled the `free` member.
            let dptr = unsafe { p.__bindgen_anon_1.free }.dptr;
            driver::with(|d| d.graph_mem_free_node(h(graph), dptr))?
        }
        // Kernels need device code; semaphores and batch-op nodes are not modelled.
        _ => return Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
    })
}

/// Adds a conditional node with `size` fresh body graphs; returns where their handles lie.
fn add_conditional(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: Vec<u64>,
    condition: u64,
    kind: u32,
    size: u32,
) -> CuResult<*mut usize> {
    if out.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    driver::with(|d| {
        d.graphs
            .check_conditional(h(graph), condition, kind, size)?;
        let bodies: Vec<u64> = (0..size)
            .map(|_| {
                let body = d.next_handle();
                d.graphs.create(body);
                body
            })
            .collect();
        let node = d.next_handle();
        let work = Work::Conditional {
            condition,
            kind,
            bodies: bodies.clone(),
        };
        if let Err(e) = d.graphs.add(node, h(graph), &deps, work) {
            for body in bodies {
                let _ = d.graphs.destroy(body);
            }
            return Err(e);
        }
        let array = d.graphs.keep_bodies(node, &bodies);
        // SAFETY: CUgraphNode out-parameter (cuda.h), non-null.
        unsafe { put(out, handle_ptr::<cudarc::driver::sys::CUgraphNode_st>(node)) }?;
        Ok(array)
    })
}

/// Where CUDA 13's `CUDA_HOST_NODE_PARAMS_v2` keeps `syncMode` (after the function and its
/// argument), which the bindings' older layout lacks.
const HOST_SYNC_MODE_AT: usize = 16;

export! {
    for (
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        edges: *const EdgeData,
        n: usize,
        params: *mut CUgraphNodeParams,
    ) {
        /// `cuGraphAddNode` with edge data: only default edges (null, or all zero) are
        /// modelled.
        fn cuGraphAddNode_v2 {
            // SAFETY: `n` CUgraphEdgeData or null (cuda.h).
            if let Err(e) = unsafe { default_edges(edges, n) } {
                return e.raw();
            }
            // SAFETY: the same contract as cuGraphAddNode.
            unsafe { cuGraphAddNode(out, graph, dependencies, n, params) }
        }

        /// The newest `cuGraphAddNode` ABI (`cuda.bindings` asks for it at 13041): a host
        /// node's `syncMode` is read (blocking or spin-wait, both run by the stream's worker
        /// here; anything else is `CUDA_ERROR_INVALID_VALUE`).
        fn cuGraphAddNode_v3 {
            // SAFETY: the caller's CUgraphNodeParams (cuda.h).
            if let Err(e) = unsafe { host_sync_mode(params) } {
                return e.raw();
            }
            // SAFETY: the same contract as cuGraphAddNode_v2.
            unsafe { cuGraphAddNode_v2(out, graph, dependencies, edges, n, params) }
        }
    }
}

/// The check CUDA 13's node-parameter ABIs add: a host node's `syncMode` is blocking (0) or
/// spin-wait (1).
///
/// # Safety
/// `params` is null or a readable `CUgraphNodeParams`.
pub(super) unsafe fn host_sync_mode(params: *const CUgraphNodeParams) -> CuResult<()> {
    if params.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a CUgraphNodeParams input (cuda.h), non-null; its `type_` is its first field.
    if unsafe { (*params).type_ } != T::CU_GRAPH_NODE_TYPE_HOST {
        return Ok(());
    }
    let at = std::mem::offset_of!(CUgraphNodeParams, __bindgen_anon_1);
    // SAFETY: `type_` says the application filled the `host` member, which begins the union
    // at `at`; the union is 232 bytes, past this field's end at 20.
    let sync_mode = unsafe {
        params
            .cast::<u8>()
            .add(at + HOST_SYNC_MODE_AT)
            .cast::<c_uint>()
            .read_unaligned()
    };
    if sync_mode > super::streams::HOST_TASK_SPINWAIT {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}
