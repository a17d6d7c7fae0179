//! A graph's shape: its root nodes, a node's dependencies and dependents, its edges, and
//! removing a node (`cuGraphDestroyNode`) with the edges that touch it.

use super::{Graph, Graphs, Work};
use crate::error::{CuError, CuResult};

impl Graphs {
    fn graph_of_node(&self, node: u64) -> CuResult<&Graph> {
        self.graph(self.node_ref(node)?.graph)
    }

    /// The nodes `node` depends on, in the order they were given.
    pub fn dependencies(&self, node: u64) -> CuResult<Vec<u64>> {
        self.node_ref(node).map(|n| n.deps.clone())
    }

    /// The nodes that depend on `node`, in the order they were added.
    pub fn dependents(&self, node: u64) -> CuResult<Vec<u64>> {
        let g = self.graph_of_node(node)?;
        Ok(g.nodes
            .iter()
            .filter(|n| self.nodes[*n].deps.contains(&node))
            .copied()
            .collect())
    }

    /// The nodes of `graph` that depend on none.
    pub fn roots(&self, graph: u64) -> CuResult<Vec<u64>> {
        Ok(self
            .nodes_of(graph)?
            .into_iter()
            .filter(|n| self.nodes[n].deps.is_empty())
            .collect())
    }

    /// Every edge of `graph` as (from, to), by the dependent's order, then its dependencies'.
    pub fn edges(&self, graph: u64) -> CuResult<Vec<(u64, u64)>> {
        Ok(self
            .nodes_of(graph)?
            .into_iter()
            .flat_map(|to| self.nodes[&to].deps.iter().map(move |from| (*from, to)))
            .collect())
    }

    /// `cuGraphAddDependencies` (`add`) and `cuGraphRemoveDependencies`: edges `from → to`
    /// between nodes of `graph`; adding one that exists or removing one that does not is
    /// `CUDA_ERROR_INVALID_VALUE`. A cycle is refused when the graph is instantiated.
    pub fn change_dependencies(
        &mut self,
        graph: u64,
        edges: &[(u64, u64)],
        add: bool,
    ) -> CuResult<()> {
        for (from, to) in edges {
            let known = |n: &u64| self.nodes.get(n).is_some_and(|n| n.graph == graph);
            if !known(from) || !known(to) || from == to {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            if self.nodes[to].deps.contains(from) == add {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
        }
        for (from, to) in edges {
            let deps = &mut self.nodes.get_mut(to).expect("checked above").deps;
            if add {
                deps.push(*from);
            } else {
                deps.retain(|d| d != from);
            }
        }
        Ok(())
    }

    /// `cuGraphDestroyNode`: the node and every edge to or from it go. A graph allocation with
    /// a free node naming it, or a conditional node (whose bodies are the driver's), stays:
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn destroy_node(&mut self, node: u64) -> CuResult<()> {
        let n = self
            .nodes
            .get(&node)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
        let owner = n.graph;
        let pinned = match &n.work {
            Work::Conditional { .. } => true,
            Work::MemAlloc { base, .. } => {
                let freed = Work::MemFree { base: *base };
                self.nodes
                    .values()
                    .any(|m| m.graph == owner && m.work == freed)
            }
            _ => false,
        };
        if pinned {
            return Err(CuError::CUDA_ERROR_NOT_SUPPORTED);
        }
        self.nodes.remove(&node);
        self.grants.remove(&node);
        if let Some(g) = self.graphs.get_mut(&owner) {
            g.nodes.retain(|n| *n != node);
            for other in &g.nodes {
                if let Some(o) = self.nodes.get_mut(other) {
                    o.deps.retain(|d| *d != node);
                }
            }
        }
        Ok(())
    }
}
