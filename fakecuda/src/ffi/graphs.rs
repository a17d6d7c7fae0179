//! CUDA graphs (see [`crate::state::extras::graph`]).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, get, handle_ptr, put, with, with_out};
pub(super) use crate::abi::RawMemcpy3d;
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use crate::memcpy;
pub(super) use crate::state::extras::graph::MemsetNodeParams;
use crate::state::extras::graph::{Side, Work};
use cudarc::driver::sys::{CUcontext, CUstream};
use cudarc::driver::sys::{CUgraph, CUgraph_st, CUgraphExec, CUgraphNode, CUgraphNode_st};
use std::ffi::{c_uint, c_ulonglong, c_void};

pub(super) fn h<T>(p: *mut T) -> u64 {
    p as usize as u64
}

/// The dependency list of a node being added.
///
/// # Safety
/// `deps` is null or points at `n` node handles (cuda.h).
pub(super) unsafe fn deps(deps: *const CUgraphNode, n: usize) -> CuResult<Vec<u64>> {
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

pub(super) fn add(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: Vec<u64>,
    work: Work,
) -> CuResult<()> {
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

export! {
    fn cuGraphCreate(out: *mut CUgraph, flags: c_uint) {
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

    safe fn cuGraphDestroy(graph: CUgraph) {
        super::user_objects::releasing(|d| d.graph_destroy(h(graph)))
    }

    fn cuGraphAddEmptyNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
    ) {
        // SAFETY: cuda.h's contract for the dependency list.
        gated(|| add(out, graph, unsafe { deps(dependencies, n) }?, Work::Empty))
    }
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostNodeParams {
    pub(super) function: usize,
    pub(super) user: usize,
}

/// A host node's work: the application's function (non-null) and its argument.
pub(super) fn host_node(function: usize, user: usize) -> CuResult<Work> {
    if function == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Work::Host { function, user })
}

/// A memset node's work: elements of 1, 2 or 4 bytes, a non-empty area.
pub(super) fn memset_node(p: &MemsetNodeParams) -> CuResult<Work> {
    if !matches!(p.element_size, 1 | 2 | 4) || p.width == 0 || p.height == 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Work::Memset(*p))
}

/// `CUmemorytype`.
const MEMORY_HOST: c_uint = 1;
const MEMORY_DEVICE: c_uint = 2;
const MEMORY_UNIFIED: c_uint = 4;

/// One side of a copy: where its first byte is, whether that is device memory (unified
/// addresses are device memory when they lie in a mapping), and its row and slice strides.
fn side(
    d: &driver::DriverState,
    kind: c_uint,
    (host, device): (usize, u64),
    (x, y, z): (usize, usize, usize),
    (pitch, height): (usize, usize),
    rows: usize,
    width: usize,
) -> CuResult<Side> {
    let (base, is_device) = match kind {
        MEMORY_HOST => (host as u64, false),
        MEMORY_DEVICE => (device, true),
        MEMORY_UNIFIED => (device, d.vmm.mapping_at(device).is_some()),
        // CUDA arrays are not copied (no texture memory is modelled).
        _ => return Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
    };
    if base == 0 || (rows > 1 && pitch < x + width) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = pitch as u64;
    let slice = pitch * height as u64;
    Ok(Side {
        address: base + x as u64 + y as u64 * pitch + z as u64 * slice,
        pitch,
        slice,
        device: is_device,
    })
}

/// A memcpy node's work: host, device or unified sides, 1D to 3D, no arrays.
pub(super) fn memcpy_node(p: &RawMemcpy3d) -> CuResult<Work> {
    if p.width_in_bytes == 0 || p.height == 0 || p.depth == 0 || p.src_lod != 0 || p.dst_lod != 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let rows = p.height * p.depth;
    // Each end's fields, the source's then the destination's.
    let kinds = [p.src_memory_type, p.dst_memory_type];
    let addresses = [(p.src_host, p.src_device), (p.dst_host, p.dst_device)];
    let offsets = [
        (p.src_x_in_bytes, p.src_y, p.src_z),
        (p.dst_x_in_bytes, p.dst_y, p.dst_z),
    ];
    let strides = [(p.src_pitch, p.src_height), (p.dst_pitch, p.dst_height)];
    let [src, dst] = driver::with(|d| {
        let end = |i: usize| {
            let (pitch, height) = strides[i];
            let stride = (pitch, height.max(p.height));
            side(
                d,
                kinds[i],
                addresses[i],
                offsets[i],
                stride,
                rows,
                p.width_in_bytes,
            )
        };
        Ok([end(0)?, end(1)?])
    })?;
    Ok(Work::Memcpy {
        dst,
        src,
        width: p.width_in_bytes as u64,
        height: p.height as u64,
        depth: p.depth as u64,
        given: Box::new(*p),
    })
}

/// The work one parameter struct gives, which `work` decodes.
///
/// # Safety
/// `params` is null or points at a readable `P`.
pub(super) unsafe fn work_from<P: Copy>(
    params: *const P,
    work: impl FnOnce(&P) -> CuResult<Work>,
) -> CuResult<Work> {
    // SAFETY: per the caller.
    let p = unsafe { get(params) }?;
    work(&p)
}

/// `cuGraphAdd*Node` entry points of one ABI: the new node's handle out, the graph, its
/// dependencies, their count, the node's parameter struct (and, for some, a context that
/// changes nothing here).
macro_rules! add_nodes {
    ($($name:ident($params:ty $(, $ctx:ident: $ctx_type:ty)?) => $work:expr;)*) => {
        export! {$(
            fn $name(
                out: *mut CUgraphNode,
                graph: CUgraph,
                dependencies: *const CUgraphNode,
                n: usize,
                params: *const $params,
                $($ctx: $ctx_type,)?
            ) {
                gated(|| {
                    // SAFETY: cuda.h's contract for the parameters.
                    let work = unsafe { work_from(params, $work) }?;
                    // SAFETY: cuda.h's contract for the dependency list.
                    add(out, graph, unsafe { deps(dependencies, n) }?, work)
                })
            }
        )*}
    };
}

add_nodes! {
    cuGraphAddHostNode(HostNodeParams) => |p| host_node(p.function, p.user);
    cuGraphAddMemsetNode(MemsetNodeParams, _ctx: CUcontext) => memset_node;
    cuGraphAddMemcpyNode(RawMemcpy3d, _ctx: CUcontext) => memcpy_node;
}

/// A child-graph node's work: a copy of `child`'s nodes (another graph), taken now.
pub(super) fn child_node(graph: CUgraph, child: CUgraph) -> CuResult<Work> {
    if h(child) == h(graph) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = driver::with(|d| d.graphs.ordered_work(h(child)))?;
    // A child graph may not hold memory nodes (cuda.h).
    if nodes
        .iter()
        .any(|w| matches!(w, Work::MemAlloc { .. } | Work::MemFree { .. }))
    {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Work::Child(nodes))
}

export! {
    /// A child-graph node: a copy of `child`'s nodes, taken now (later changes to `child` are not
    /// seen, as with CUDA's clone).
    fn cuGraphAddChildGraphNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        child: CUgraph,
    ) {
        gated(|| {
            let work = child_node(graph, child)?;
            // SAFETY: cuda.h's contract for the dependency list.
            add(out, graph, unsafe { deps(dependencies, n) }?, work)
        })
    }

    fn cuGraphInstantiateWithFlags(out: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) {
        // Upload needs a stream, which only cuGraphInstantiateWithParams names.
        gated(|| super::graph_queries::instantiate(out, graph, flags, None))
    }

    safe fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) {
        gated(|| {
            let order = driver::with(|d| {
                let order = d.graphs.exec_order(h(exec))?;
                // Graph allocations get their memory at the first launch.
                d.graph_mem_launch(h(exec), &order)?;
                Ok(order)
            })?;
            if loops_forever(&order) {
                // No device code runs here to clear the condition: the loop would never end.
                return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
            }
            let stream = Some(stream as usize as u64);
            // Its copies and fills are the work of the stream's context.
            let issuer = memcpy::issuer(&memcpy::target(stream)?);
            memcpy::host_work(stream, move || {
                run_works(issuer, &order);
            })
        })
    }
}

/// Whether `order` holds a while node whose condition is set: nothing here could clear it.
fn loops_forever(order: &[Work]) -> bool {
    order.iter().any(|work| match work {
        Work::Branch {
            kind,
            value,
            bodies,
        } => {
            (*kind == crate::state::extras::graph::COND_WHILE && *value != 0)
                || bodies.iter().any(|b| loops_forever(b))
        }
        Work::Child(nodes) => loops_forever(nodes),
        _ => false,
    })
}

/// Runs a graph's work in order, child graphs included; a node that fails ends the launch
/// (said on stderr: a GPU would fault). Returns whether every node ran.
fn run_works(issuer: u64, order: &[Work]) -> bool {
    for work in order {
        match work {
            // Graph memory is the executable graph's from its launch on.
            Work::Empty | Work::MemAlloc { .. } | Work::MemFree { .. } => {}
            Work::EventRecord(e) => {
                let n = e.event.record();
                e.event.reach(n);
            }
            Work::EventWait(e) => e.event.wait_for(e.event.latest()),
            Work::Child(nodes) => {
                if !run_works(issuer, nodes) {
                    return false;
                }
            }
            Work::Branch {
                kind,
                value,
                bodies,
            } => {
                // An if runs its body when set, its else (a second body) when not; a switch
                // the body its value names; a while (clear: `loops_forever` refused a set
                // one at launch) none.
                let chosen = match *kind {
                    crate::state::extras::graph::COND_IF if *value != 0 => bodies.first(),
                    crate::state::extras::graph::COND_IF => bodies.get(1),
                    crate::state::extras::graph::COND_SWITCH => bodies.get(*value as usize),
                    _ => None,
                };
                if let Some(body) = chosen
                    && !run_works(issuer, body)
                {
                    return false;
                }
            }
            // Resolved into a branch when the graph was instantiated.
            Work::Conditional { .. } => return false,
            Work::Host { function, user } => {
                // SAFETY: the application's CUhostFn with its own argument (cuda.h).
                let f: unsafe extern "C" fn(*mut c_void) =
                    unsafe { std::mem::transmute(*function) };
                // SAFETY: as above.
                unsafe { f(*user as *mut c_void) };
            }
            Work::Memcpy {
                dst,
                src,
                width,
                height,
                depth,
                ..
            } => {
                for (slice, row) in (0..*depth).flat_map(|z| (0..*height).map(move |y| (z, y))) {
                    let (to, from) = (dst.row(slice, row), src.row(slice, row));
                    // SAFETY: host sides are the application's buffers, which must stay valid
                    // while its graph runs (cuda.h); device sides are validated by the copy.
                    let copied = unsafe {
                        memcpy::copy_now(issuer, to, dst.device, from, src.device, *width)
                    };
                    if let Err(e) = copied {
                        eprintln!("fakecuda: graph memcpy node to {to:#x} failed when it ran: {e}");
                        return false;
                    }
                }
            }
            Work::Memset(m) => {
                let width = m.element_size as usize;
                for row in 0..m.height as u64 {
                    let at = m.dst + row * m.pitch as u64;
                    if let Err(e) = memcpy::fill_now(issuer, at, m.value, width, m.width) {
                        let dst = m.dst;
                        eprintln!(
                            "fakecuda: graph memset node at {dst:#x} failed when it ran: {e}"
                        );
                        return false;
                    }
                }
            }
        }
    }
    true
}

export! {
    safe fn cuGraphExecDestroy(exec: CUgraphExec) {
        super::user_objects::releasing(|d| d.graph_exec_destroy(h(exec)))
    }

    fn cuGraphGetId(graph: CUgraph, id: *mut c_uint) -> id |d| {
        d.graphs.graph_id(h(graph))
    }

    fn cuGraphExecGetId(exec: CUgraphExec, id: *mut c_uint) -> id |d| {
        d.graphs.exec_id(h(exec))
    }

    fn cuGraphNodeGetLocalId(node: CUgraphNode, id: *mut c_uint) -> id |d| {
        let (local, _, _) = d.graphs.node(h(node))?;
        Ok(local)
    }

    fn cuGraphNodeGetToolsId(node: CUgraphNode, id: *mut c_ulonglong) -> id |d| {
        let (_, tools, _) = d.graphs.node(h(node))?;
        Ok(tools)
    }

    fn cuGraphNodeGetContainingGraph(node: CUgraphNode, out: *mut CUgraph) -> out |d| {
        let (_, _, graph) = d.graphs.node(h(node))?;
        Ok(handle_ptr::<CUgraph_st>(graph))
    }
}
