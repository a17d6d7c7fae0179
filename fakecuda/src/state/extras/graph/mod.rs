//! CUDA graphs, for the node kinds that run without device code: empty, host, memset, memcpy,
//! child-graph and conditional nodes, with their dependencies, instantiated into executable
//! graphs that a launch runs on a stream in dependency order (one unit of the stream's work).
//! Nodes' parameters can change, in a graph or in an executable graph. Kernel nodes are not
//! modelled (`CUDA_ERROR_NOT_SUPPORTED`).

use crate::abi::{RawAccessDesc, RawLocation, RawMemcpy3d};
use crate::error::{CuError, CuResult};
use std::collections::HashMap;

/// `CUDA_MEMSET_NODE_PARAMS`: `width` elements of `element_size` bytes of `value` in each of
/// `height` rows `pitch` apart.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemsetNodeParams {
    pub dst: u64,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}

/// What a node does when its graph runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    Empty,
    /// A host function and its argument (the application's).
    Host {
        function: usize,
        user: usize,
    },
    /// A memset as its parameters give it (elements of 1, 2 or 4 bytes, a non-empty area).
    Memset(MemsetNodeParams),
    /// `depth` slices of `height` rows of `width` bytes; on each side rows are `pitch` apart
    /// and slices `slice` apart, from the first byte copied; `*_dev` says which sides are
    /// device memory (the others are the application's host buffers). `given` is the
    /// `CUDA_MEMCPY3D` as the application gave it, for the node's getters.
    Memcpy {
        dst: Side,
        src: Side,
        width: u64,
        height: u64,
        depth: u64,
        given: Box<RawMemcpy3d>,
    },
    /// A child graph: a copy of its nodes' work, in dependency order, taken when the node was
    /// added (CUDA clones the child graph).
    Child(Vec<Work>),
    /// A conditional node as added: its condition, kind ([`COND_IF`], [`COND_WHILE`],
    /// [`COND_SWITCH`]) and body graphs, which the application fills after adding the node,
    /// so they are read when the graph is instantiated.
    Conditional {
        condition: u64,
        kind: u32,
        bodies: Vec<u64>,
    },
    /// A graph allocation: `size` bytes of `device` at `base`, an address reserved when the
    /// node was added, with the devices granted access (`(device, CUmemAccess_flags)`).
    /// Physical memory comes when an executable graph holding it is launched.
    MemAlloc {
        base: u64,
        size: u64,
        requested: u64,
        device: u32,
        access: Vec<(u32, u32)>,
    },
    /// The end of a graph allocation's lifetime in the graph (its base).
    MemFree {
        base: u64,
    },
    /// Records an event when the node runs.
    EventRecord(EventRef),
    /// Waits, when the node runs, for the event's latest record.
    EventWait(EventRef),
    /// A conditional node as instantiated: the value its condition has at every launch (no
    /// device code runs here to set it, so it is the handle's default) and each body's work.
    Branch {
        kind: u32,
        value: u32,
        bodies: Vec<Vec<Work>>,
    },
}

/// An event a node records or waits for: its handle (for the getters) and the event.
#[derive(Debug, Clone)]
pub struct EventRef {
    pub handle: u64,
    pub event: std::sync::Arc<crate::state::stream::Event>,
}

impl PartialEq for EventRef {
    fn eq(&self, other: &Self) -> bool {
        self.handle == other.handle
    }
}

impl Eq for EventRef {}

/// `CUgraphConditionalNodeType`.
pub const COND_IF: u32 = 0;
pub const COND_WHILE: u32 = 1;
pub const COND_SWITCH: u32 = 2;
/// Most bodies a switch node may have here.
pub const MAX_SWITCH: u32 = 64;

/// `cuGraphConditionalHandleCreate`: the graph it belongs to and its default launch value.
#[derive(Debug)]
struct Condition {
    graph: u64,
    default: u32,
}

/// One side of a memcpy node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Side {
    pub address: u64,
    pub pitch: u64,
    pub slice: u64,
    pub device: bool,
}

impl Side {
    /// The first byte of row `row` of slice `slice`.
    pub fn row(&self, slice: u64, row: u64) -> u64 {
        self.address + slice * self.slice + row * self.pitch
    }
}

#[derive(Debug)]
struct Node {
    graph: u64,
    work: Work,
    deps: Vec<u64>,
    local_id: u32,
    tools_id: u64,
}

#[derive(Debug)]
struct Graph {
    id: u32,
    nodes: Vec<u64>,
    next_local: u32,
}

#[derive(Debug)]
struct Exec {
    id: u32,
    /// The nodes' work in an order that respects every dependency.
    order: Vec<Work>,
    /// The graph's node each entry of `order` was instantiated from.
    nodes: Vec<u64>,
    /// The graph it was made from.
    graph: u64,
}

#[derive(Debug, Default)]
pub struct Graphs {
    graphs: HashMap<u64, Graph>,
    nodes: HashMap<u64, Node>,
    execs: HashMap<u64, Exec>,
    conditions: HashMap<u64, Condition>,
    /// Each conditional node's body graphs, as the array `phGraph_out` points at (it lives as
    /// long as the node).
    bodies: HashMap<u64, Box<[usize]>>,
    /// Each allocation node's access grants as `cuGraphMemAllocNodeGetParams` hands them out
    /// (the array lives as long as the node).
    grants: HashMap<u64, Box<[RawAccessDesc]>>,
    next_id: u32,
}

impl Graphs {
    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    pub fn create(&mut self, handle: u64) -> u32 {
        let id = self.id();
        self.graphs.insert(
            handle,
            Graph {
                id,
                nodes: Vec::new(),
                next_local: 0,
            },
        );
        id
    }

    /// Destroys a graph and its nodes (a conditional node's bodies with it); executable
    /// graphs made from it stay.
    pub fn destroy(&mut self, graph: u64) -> CuResult<()> {
        let g = self
            .graphs
            .remove(&graph)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        for n in g.nodes {
            self.nodes.remove(&n);
            self.grants.remove(&n);
            for body in self.bodies.remove(&n).unwrap_or_default() {
                let _ = self.destroy(body as u64);
            }
        }
        self.conditions.retain(|_, c| c.graph != graph);
        Ok(())
    }

    /// `cuGraphConditionalHandleCreate`: a condition of `graph` whose value is `default` at
    /// every launch (`flags` 1, `CU_GRAPH_COND_ASSIGN_DEFAULT`) or from the start (0).
    pub fn condition_create(
        &mut self,
        handle: u64,
        graph: u64,
        default: u32,
        flags: u32,
    ) -> CuResult<()> {
        if !self.graphs.contains_key(&graph) || flags > 1 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.conditions.insert(handle, Condition { graph, default });
        Ok(())
    }

    /// Checks a conditional node's arguments: a condition of `graph`, a known kind, and as
    /// many bodies as the kind takes (if: 1 or 2, with an else; while: 1; switch: 1 to
    /// [`MAX_SWITCH`]).
    pub fn check_conditional(
        &self,
        graph: u64,
        condition: u64,
        kind: u32,
        size: u32,
    ) -> CuResult<()> {
        let fits = match kind {
            COND_IF => matches!(size, 1 | 2),
            COND_WHILE => size == 1,
            COND_SWITCH => (1..=MAX_SWITCH).contains(&size),
            _ => false,
        };
        match self.conditions.get(&condition) {
            Some(c) if c.graph == graph && fits => Ok(()),
            _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Keeps node `node`'s body array and returns where it lives (for `phGraph_out`).
    pub fn keep_bodies(&mut self, node: u64, bodies: &[u64]) -> *mut usize {
        let array: Box<[usize]> = bodies.iter().map(|b| *b as usize).collect();
        let at = self.bodies.entry(node).or_insert(array);
        at.as_mut_ptr()
    }

    /// Adds a node depending on `deps` (nodes of the same graph).
    pub fn add(&mut self, handle: u64, graph: u64, deps: &[u64], work: Work) -> CuResult<()> {
        if !self.graphs.contains_key(&graph) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        for d in deps {
            match self.nodes.get(d) {
                Some(n) if n.graph == graph => {}
                _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
            }
        }
        let mut unique = deps.to_vec();
        unique.sort_unstable();
        unique.dedup();
        if unique.len() != deps.len() {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let g = self.graphs.get_mut(&graph).expect("checked above");
        let local_id = g.next_local;
        g.next_local += 1;
        g.nodes.push(handle);
        self.nodes.insert(
            handle,
            Node {
                graph,
                work,
                deps: deps.to_vec(),
                local_id,
                tools_id: (u64::from(g.id) << 32) | u64::from(local_id),
            },
        );
        Ok(())
    }

    /// Graph `graph`; an unknown handle is `CUDA_ERROR_INVALID_VALUE`.
    fn graph(&self, graph: u64) -> CuResult<&Graph> {
        self.graphs
            .get(&graph)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// Node `node`; an unknown handle is `CUDA_ERROR_INVALID_VALUE`.
    fn node_ref(&self, node: u64) -> CuResult<&Node> {
        self.nodes
            .get(&node)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    pub fn graph_id(&self, graph: u64) -> CuResult<u32> {
        self.graph(graph).map(|g| g.id)
    }

    pub fn exec_id(&self, exec: u64) -> CuResult<u32> {
        self.execs
            .get(&exec)
            .map(|e| e.id)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// A node's (local id, tools id, graph).
    pub fn node(&self, node: u64) -> CuResult<(u32, u64, u64)> {
        self.node_ref(node)
            .map(|n| (n.local_id, n.tools_id, n.graph))
    }

    /// Instantiates `graph`: its nodes' work in dependency order.
    pub fn instantiate(&mut self, handle: u64, graph: u64) -> CuResult<()> {
        let order = self.ordered_work(graph)?;
        // A graph with memory nodes has one executable graph at a time (cuda.h).
        let has_memory = order.iter().any(|w| matches!(w, Work::MemAlloc { .. }));
        if has_memory && self.execs.values().any(|e| e.graph == graph) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        // The same order as ordered_work's.
        let nodes = self.order(graph)?;
        let id = self.id();
        self.execs.insert(
            handle,
            Exec {
                id,
                order,
                nodes,
                graph,
            },
        );
        Ok(())
    }

    /// `graph`'s nodes' work in an order that respects every dependency.
    pub fn ordered_work(&self, graph: u64) -> CuResult<Vec<Work>> {
        self.order(graph)?
            .iter()
            .map(|n| self.resolved(&self.nodes[n].work))
            .collect()
    }

    /// `graph`'s nodes in an order that respects every dependency: each as early as its
    /// dependencies allow, ties in the order nodes were added (dependencies added later with
    /// `cuGraphAddDependencies` may reorder them). A cycle is `CUDA_ERROR_INVALID_VALUE`.
    pub fn order(&self, graph: u64) -> CuResult<Vec<u64>> {
        let g = self.graph(graph)?;
        let position: HashMap<u64, usize> =
            g.nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        // Kahn's algorithm; the ready node added first goes first.
        let mut waiting: Vec<usize> = g.nodes.iter().map(|n| self.nodes[n].deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
        for (i, n) in g.nodes.iter().enumerate() {
            for d in &self.nodes[n].deps {
                let at = *position.get(d).ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
                dependents[at].push(i);
            }
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = waiting
            .iter()
            .enumerate()
            .filter(|(_, w)| **w == 0)
            .map(|(i, _)| std::cmp::Reverse(i))
            .collect();
        let mut order = Vec::with_capacity(g.nodes.len());
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(g.nodes[i]);
            for &j in &dependents[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.push(std::cmp::Reverse(j));
                }
            }
        }
        if order.len() != g.nodes.len() {
            // A cycle: some nodes never became ready.
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(order)
    }

    /// `work` with its conditional node resolved (bodies read now, the condition's value).
    fn resolved(&self, work: &Work) -> CuResult<Work> {
        let Work::Conditional {
            condition,
            kind,
            bodies,
        } = work
        else {
            return Ok(work.clone());
        };
        let value = self
            .conditions
            .get(condition)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?
            .default;
        let bodies = bodies
            .iter()
            .map(|b| self.ordered_work(*b))
            .collect::<CuResult<_>>()?;
        Ok(Work::Branch {
            kind: *kind,
            value,
            bodies,
        })
    }

    pub fn exec_order(&self, exec: u64) -> CuResult<Vec<Work>> {
        self.execs
            .get(&exec)
            .map(|e| e.order.clone())
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    pub fn exec_destroy(&mut self, exec: u64) -> CuResult<()> {
        self.execs
            .remove(&exec)
            .map(drop)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// The graph allocations of `graph`'s nodes: (base, whether a free node ends it).
    pub fn allocations_of(&self, graph: u64) -> CuResult<Vec<(u64, bool)>> {
        let g = self.graph(graph)?;
        let works = || g.nodes.iter().map(|n| &self.nodes[n].work);
        Ok(works()
            .filter_map(|w| match w {
                Work::MemAlloc { base, .. } => Some(*base),
                _ => None,
            })
            .map(|base| {
                let freed = works().any(|w| *w == Work::MemFree { base });
                (base, freed)
            })
            .collect())
    }

    /// An allocation node's grants to other devices (`CUmemAccessDesc`s), in an array that
    /// lives as long as the node.
    pub fn grants(&mut self, node: u64) -> CuResult<(*const RawAccessDesc, usize)> {
        let Work::MemAlloc { device, access, .. } = &self.work(node)? else {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        };
        let descs: Box<[RawAccessDesc]> = access
            .iter()
            .filter(|(d, _)| d != device)
            .map(|&(d, flags)| RawAccessDesc {
                location: RawLocation {
                    type_: crate::abi::consts::LOCATION_TYPE_DEVICE,
                    id: d as i32,
                },
                flags,
            })
            .collect();
        let kept = self.grants.entry(node).or_insert(descs);
        Ok((kept.as_ptr(), kept.len()))
    }

    /// A node's work as it stands (after any `cuGraph*SetParams`).
    pub fn work(&self, node: u64) -> CuResult<Work> {
        self.node_ref(node).map(|n| n.work.clone())
    }

    /// A graph's nodes, in the order they were added.
    pub fn nodes_of(&self, graph: u64) -> CuResult<Vec<u64>> {
        self.graph(graph).map(|g| g.nodes.clone())
    }

    /// `cuGraphNodeSetParams` and the typed setters: new parameters of the same kind for a node
    /// of a graph; executable graphs already made from it keep what they were given.
    pub fn set_work(&mut self, node: u64, work: Work) -> CuResult<()> {
        let n = self
            .nodes
            .get_mut(&node)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        settable(&n.work, &work)?;
        n.work = work;
        Ok(())
    }

    /// `cuGraphExecNodeSetParams` and the typed exec setters: new parameters for what node
    /// `node` became in `exec`, under the driver's rules (the same kind; a memset or memcpy
    /// stays one-dimensional and each copy side stays device or host memory).
    pub fn exec_set_work(&mut self, exec: u64, node: u64, work: Work) -> CuResult<()> {
        let e = self
            .execs
            .get_mut(&exec)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let at = e
            .nodes
            .iter()
            .position(|n| *n == node)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let old = &e.order[at];
        settable(old, &work)?;
        let same_operands = match (old, &work) {
            (Work::Memset(a), Work::Memset(b)) => a.height == 1 && b.height == 1,
            (
                Work::Memcpy {
                    src: s0,
                    dst: d0,
                    height: h0,
                    depth: z0,
                    ..
                },
                Work::Memcpy {
                    src: s1,
                    dst: d1,
                    height: h1,
                    depth: z1,
                    ..
                },
            ) => {
                (*h0, *z0, *h1, *z1) == (1, 1, 1, 1)
                    && s0.device == s1.device
                    && d0.device == d1.device
            }
            _ => true,
        };
        if !same_operands {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        e.order[at] = work;
        Ok(())
    }
}

/// Whether `new` may replace `old`: the same kind of node, one whose parameters can change
/// here (child graphs and conditional nodes cannot: `CUDA_ERROR_NOT_SUPPORTED`).
fn settable(old: &Work, new: &Work) -> CuResult<()> {
    match (old, new) {
        (Work::Empty, Work::Empty)
        | (Work::EventRecord(_), Work::EventRecord(_))
        | (Work::EventWait(_), Work::EventWait(_))
        | (Work::Host { .. }, Work::Host { .. })
        | (Work::Memset(_), Work::Memset(_))
        | (Work::Memcpy { .. }, Work::Memcpy { .. }) => Ok(()),
        (
            Work::Child(_)
            | Work::Conditional { .. }
            | Work::Branch { .. }
            | Work::MemAlloc { .. }
            | Work::MemFree { .. },
            _,
        ) => Err(CuError::CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CuError::CUDA_ERROR_INVALID_VALUE),
    }
}

mod topology;
