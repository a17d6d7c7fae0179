//! The graph_memory tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::extras::graph_memory`.

use cudarc::driver::sys::CUgraphMem_attribute as A;
use std::collections::{BTreeMap, HashMap};

/// `CUgraphMem_attribute`, as the values the entry points receive.
pub(crate) const USED_MEM_CURRENT: u32 = A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT as u32;

pub(crate) const USED_MEM_HIGH: u32 = A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH as u32;

pub(crate) const RESERVED_MEM_CURRENT: u32 = A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT as u32;

pub(crate) const RESERVED_MEM_HIGH: u32 = A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH as u32;

#[derive(Debug)]
pub(crate) struct Reserved {
    pub(crate) size: u64,
    pub(crate) device: u32,
    pub(crate) graph: u64,
    /// The graph was destroyed: the address goes once no executable graph holds it.
    pub(crate) orphaned: bool,
}

#[derive(Debug, Default)]
pub struct GraphMemory {
    /// Addresses allocation nodes reserved, by base.
    pub(crate) reserved: BTreeMap<u64, Reserved>,
    /// What each executable graph holds: (base, physical allocation).
    pub(crate) held: HashMap<u64, Vec<(u64, u64)>>,
    /// Per device, the high-water mark of what executable graphs held.
    pub(crate) high: HashMap<u32, u64>,
}
