//! Graph memory nodes and the device's graph-memory attributes (see [`crate::extras::graph_memory`]).

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graphs::{add, deps, h};
use super::{gated, get, put, with};
use crate::abi::RawMemAllocNodeParams;
use crate::driver::{self};
use crate::error::{CuError, CuResult, RawResult};
use cudarc::driver::sys::{CUdevice, CUdeviceptr};
use cudarc::driver::sys::{CUgraph, CUgraphNode};
use std::ffi::{c_uint, c_void};

/// Adds an allocation node from `params` and writes its address back into them.
///
/// # Safety
/// `params` is null or a readable and writable `CUDA_MEM_ALLOC_NODE_PARAMS` whose access
/// descriptors are `accessDescCount` readable entries (cuda.h).
pub(super) unsafe fn add_alloc(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: Vec<u64>,
    params: *mut RawMemAllocNodeParams,
) -> CuResult<()> {
    // SAFETY: per the caller.
    let p = unsafe { get(params.cast_const()) }?;
    let grants = if p.access_desc_count == 0 {
        Vec::new()
    } else if p.access_descs.is_null() {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    } else {
        // SAFETY: `accessDescCount` descriptors (cuda.h), per the caller.
        unsafe { std::slice::from_raw_parts(p.access_descs, p.access_desc_count) }.to_vec()
    };
    let (base, work) =
        driver::with(|d| d.graph_mem_reserve(h(graph), &p.pool_props, &grants, p.bytesize as u64))?;
    if let Err(e) = add(out, graph, deps, work) {
        // Not added (a bad dependency, no output): the address goes back.
        driver::with(|d| {
            d.graph_mem_unreserve(base);
            Ok(())
        })?;
        return Err(e);
    }
    // SAFETY: the caller's parameters, writable (cuda.h: the driver returns the address).
    unsafe { (*params).dptr = base };
    Ok(())
}

export! {
    fn cuGraphAddMemAllocNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        params: *mut RawMemAllocNodeParams,
    ) {
        gated(|| {
            // SAFETY: cuda.h's contract for the dependency list and the parameters.
            unsafe { add_alloc(out, graph, deps(dependencies, n)?, params) }
        })
    }

    fn cuGraphAddMemFreeNode(
        out: *mut CUgraphNode,
        graph: CUgraph,
        dependencies: *const CUgraphNode,
        n: usize,
        dptr: CUdeviceptr,
    ) {
        gated(|| {
            let work = driver::with(|d| d.graph_mem_free_node(h(graph), dptr))?;
            // SAFETY: cuda.h's contract for the dependency list.
            add(out, graph, unsafe { deps(dependencies, n) }?, work)
        })
    }

    fn cuDeviceGetGraphMemAttribute(device: CUdevice, attribute: c_uint, value: *mut c_void) {
        with(|d| {
            let v = d.graph_mem_attribute(device, attribute)?;
            // SAFETY: a cuuint64_t out-parameter (cuda.h) for every attribute.
            unsafe { put(value.cast::<u64>(), v) }
        })
    }

    fn cuDeviceSetGraphMemAttribute(device: CUdevice, attribute: c_uint, value: *mut c_void) {
        with(|d| {
            // SAFETY: a cuuint64_t input (cuda.h) for every attribute.
            let v = unsafe { get(value.cast_const().cast::<u64>()) }?;
            d.graph_mem_set_attribute(device, attribute, v)
        })
    }

    safe fn cuDeviceGraphMemTrim(device: CUdevice) {
        with(|d| d.graph_mem_trim(device))
    }
}
