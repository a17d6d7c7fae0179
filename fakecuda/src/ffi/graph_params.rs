//! Reading and changing graph nodes: the typed getters and setters (`cuGraphMemcpyNodeGetParams`
//! and the rest), the generic ones (`cuGraphNodeGetParams`, `cuGraphNodeSetParams`,
//! `cuGraphExecNodeSetParams`) and node types. Empty, host, memset and
//! memcpy nodes can change; child-graph, conditional and memory nodes are
//! `CUDA_ERROR_NOT_SUPPORTED`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graph_nodes::{generic_work, host_sync_mode};
use super::graphs::{
    HostNodeParams, MemsetNodeParams, RawMemcpy3d, h, host_node, memcpy_node, memset_node,
    work_from,
};
use super::{gated, get, handle_ptr, put};
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use crate::state::extras::graph::Work;
use cudarc::driver::sys::CUcontext;
use cudarc::driver::sys::{CUgraphExec, CUgraphNode, CUgraphNodeParams, CUgraphNodeType as T};
use std::ffi::{c_int, c_uint};

/// `CUDA_MEMCPY_NODE_PARAMS`: the generic parameters' memcpy member.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemcpyNodeParams {
    flags: c_int,
    reserved: c_int,
    ctx: usize,
    copy: RawMemcpy3d,
}

/// The node type cuda.h gives `work`.
fn node_type(work: &Work) -> T {
    match work {
        Work::Empty => T::CU_GRAPH_NODE_TYPE_EMPTY,
        Work::Host { .. } => T::CU_GRAPH_NODE_TYPE_HOST,
        Work::Memset { .. } => T::CU_GRAPH_NODE_TYPE_MEMSET,
        Work::Memcpy { .. } => T::CU_GRAPH_NODE_TYPE_MEMCPY,
        Work::Child(_) => T::CU_GRAPH_NODE_TYPE_GRAPH,
        Work::MemAlloc { .. } => T::CU_GRAPH_NODE_TYPE_MEM_ALLOC,
        Work::MemFree { .. } => T::CU_GRAPH_NODE_TYPE_MEM_FREE,
        Work::EventRecord(_) => T::CU_GRAPH_NODE_TYPE_EVENT_RECORD,
        Work::EventWait(_) => T::CU_GRAPH_NODE_TYPE_WAIT_EVENT,
        Work::Conditional { .. } | Work::Branch { .. } => T::CU_GRAPH_NODE_TYPE_CONDITIONAL,
    }
}

/// The node type's name without its `CU_GRAPH_NODE_TYPE_` prefix, for DOT prints.
pub(super) fn type_name(work: &Work) -> &'static str {
    match node_type(work) {
        T::CU_GRAPH_NODE_TYPE_EMPTY => "EMPTY",
        T::CU_GRAPH_NODE_TYPE_HOST => "HOST",
        T::CU_GRAPH_NODE_TYPE_MEMSET => "MEMSET",
        T::CU_GRAPH_NODE_TYPE_MEMCPY => "MEMCPY",
        T::CU_GRAPH_NODE_TYPE_GRAPH => "GRAPH",
        T::CU_GRAPH_NODE_TYPE_MEM_ALLOC => "MEM_ALLOC",
        T::CU_GRAPH_NODE_TYPE_MEM_FREE => "MEM_FREE",
        T::CU_GRAPH_NODE_TYPE_EVENT_RECORD => "EVENT_RECORD",
        T::CU_GRAPH_NODE_TYPE_WAIT_EVENT => "WAIT_EVENT",
        _ => "CONDITIONAL",
    }
}

/// A memset node's parameters as `CUDA_MEMSET_NODE_PARAMS`.
fn memset_params(work: &Work) -> CuResult<MemsetNodeParams> {
    match work {
        Work::Memset(p) => Ok(*p),
        _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
    }
}

fn node_work(node: CUgraphNode) -> CuResult<Work> {
    driver::with(|d| d.graphs.work(h(node)))
}

export! {
    fn cuGraphNodeGetType(node: CUgraphNode, out: *mut c_uint) {
        gated(|| {
            let kind = node_type(&node_work(node)?) as c_uint;
            // SAFETY: CUgraphNodeType out-parameter (cuda.h), an enum the size of an int.
            unsafe { put(out, kind) }
        })
    }

    fn cuGraphMemcpyNodeGetParams(node: CUgraphNode, out: *mut RawMemcpy3d) {
        gated(|| match node_work(node)? {
            // SAFETY: CUDA_MEMCPY3D out-parameter (cuda.h).
            Work::Memcpy { given, .. } => unsafe { put(out, *given) },
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        })
    }

    fn cuGraphMemsetNodeGetParams(node: CUgraphNode, out: *mut MemsetNodeParams) {
        gated(|| {
            let p = memset_params(&node_work(node)?)?;
            // SAFETY: CUDA_MEMSET_NODE_PARAMS out-parameter (cuda.h).
            unsafe { put(out, p) }
        })
    }

    fn cuGraphHostNodeGetParams(node: CUgraphNode, out: *mut HostNodeParams) {
        gated(|| match node_work(node)? {
            // SAFETY: CUDA_HOST_NODE_PARAMS out-parameter (cuda.h).
            Work::Host { function, user } => unsafe { put(out, HostNodeParams { function, user }) },
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        })
    }
}

/// Where new parameters go: a graph's node, or what a node became in an executable graph.
#[derive(Clone, Copy)]
enum Target {
    Node(CUgraphNode),
    Exec(CUgraphExec, CUgraphNode),
}

fn set(target: Target, work: Work) -> CuResult<()> {
    driver::with(|d| match target {
        Target::Node(node) => d.graphs.set_work(h(node), work),
        Target::Exec(exec, node) => d.graphs.exec_set_work(h(exec), h(node), work),
    })
}

/// Decodes generic parameters for `target` (child-graph and conditional ones cannot change).
///
/// # Safety
/// `params` is null or a readable `CUgraphNodeParams`.
unsafe fn set_generic(target: Target, params: *const CUgraphNodeParams) -> CuResult<()> {
    // SAFETY: per the caller.
    let p = unsafe { get(params) }?;
    if matches!(
        p.type_,
        T::CU_GRAPH_NODE_TYPE_GRAPH | T::CU_GRAPH_NODE_TYPE_CONDITIONAL
    ) {
        return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
    }
    let node = match target {
        Target::Node(n) | Target::Exec(_, n) => n,
    };
    let (_, _, graph) = driver::with(|d| d.graphs.node(h(node)))?;
    set(target, generic_work(handle_ptr(graph), &p)?)
}

/// The two `cu[Exec]*NodeSetParams` entry points of one parameter struct: for a graph's node,
/// and for what it became in an executable graph (some with a context that changes nothing).
macro_rules! set_params {
    ($($node:ident, $exec:ident($params:ty $(, $ctx:ident: $ctx_type:ty)?) => $work:expr;)*) => {
        export! {$(
            fn $node(node: CUgraphNode, params: *const $params) {
                // SAFETY: cuda.h's contract for the parameters.
                gated(|| set(Target::Node(node), unsafe { work_from(params, $work) }?))
            }

            fn $exec(
                exec: CUgraphExec,
                node: CUgraphNode,
                params: *const $params,
                $($ctx: $ctx_type,)?
            ) {
                // SAFETY: cuda.h's contract for the parameters.
                gated(|| set(Target::Exec(exec, node), unsafe { work_from(params, $work) }?))
            }
        )*}
    };
}

set_params! {
    cuGraphMemcpyNodeSetParams, cuGraphExecMemcpyNodeSetParams(RawMemcpy3d, _ctx: CUcontext)
        => memcpy_node;
    cuGraphMemsetNodeSetParams, cuGraphExecMemsetNodeSetParams(MemsetNodeParams, _ctx: CUcontext)
        => memset_node;
    cuGraphHostNodeSetParams, cuGraphExecHostNodeSetParams(HostNodeParams)
        => |p| host_node(p.function, p.user);
}

export! {
    fn cuGraphNodeSetParams(node: CUgraphNode, params: *mut CUgraphNodeParams) {
        // SAFETY: CUgraphNodeParams input (cuda.h).
        gated(|| unsafe { set_generic(Target::Node(node), params) })
    }

    /// The newest `cuGraphNodeSetParams` ABI (`cuda.bindings` asks for it at 13041): a host
    /// node's sync mode is checked, as `cuGraphAddNode_v3` does.
    fn cuGraphNodeSetParams_v2(node: CUgraphNode, params: *mut CUgraphNodeParams) {
        gated(|| {
            // SAFETY: CUgraphNodeParams input (cuda.h).
            unsafe { host_sync_mode(params) }?;
            // SAFETY: as above.
            unsafe { set_generic(Target::Node(node), params) }
        })
    }

    fn cuGraphExecNodeSetParams(
        exec: CUgraphExec,
        node: CUgraphNode,
        params: *mut CUgraphNodeParams,
    ) {
        // SAFETY: CUgraphNodeParams input (cuda.h).
        gated(|| unsafe { set_generic(Target::Exec(exec, node), params) })
    }

    /// A node's parameters in the generic form: its type and its member of the union, the rest
    /// zero (no context is kept for a copy or a memset; a host function's sync mode is blocking).
    fn cuGraphNodeGetParams(node: CUgraphNode, params: *mut CUgraphNodeParams) {
        gated(|| {
            let work = node_work(node)?;
            if params.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let kind = node_type(&work);
            if matches!(
                kind,
                T::CU_GRAPH_NODE_TYPE_GRAPH
                    | T::CU_GRAPH_NODE_TYPE_CONDITIONAL
                    | T::CU_GRAPH_NODE_TYPE_MEM_ALLOC
                    | T::CU_GRAPH_NODE_TYPE_MEM_FREE
            ) {
                return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
            }
            let at = std::mem::offset_of!(CUgraphNodeParams, __bindgen_anon_1);
            let base = params.cast::<u8>();
            // SAFETY: the application's CUgraphNodeParams (cuda.h), non-null: all zero bytes are
            // a valid value of it (a node type, integers, null pointers and functions), then the
            // type in its first field and the member at the union's offset, within its 232 bytes.
            unsafe {
                params.write_bytes(0, 1);
                base.cast::<c_uint>().write(kind as c_uint);
                let member = base.add(at);
                match &work {
                    Work::Host { function, user } => {
                        let p = HostNodeParams {
                            function: *function,
                            user: *user,
                        };
                        member.cast::<HostNodeParams>().write_unaligned(p);
                    }
                    Work::Memset { .. } => {
                        let p = memset_params(&work)?;
                        member.cast::<MemsetNodeParams>().write_unaligned(p);
                    }
                    Work::Memcpy { given, .. } => {
                        let p = MemcpyNodeParams {
                            flags: 0,
                            reserved: 0,
                            ctx: 0,
                            copy: **given,
                        };
                        member.cast::<MemcpyNodeParams>().write_unaligned(p);
                    }
                    // CUDA_EVENT_RECORD_NODE_PARAMS / CUDA_EVENT_WAIT_NODE_PARAMS: the event.
                    Work::EventRecord(e) | Work::EventWait(e) => {
                        member.cast::<u64>().write_unaligned(e.handle);
                    }
                    _ => {}
                }
            }
            Ok(())
        })
    }
}
