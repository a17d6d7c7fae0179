//! The models beside the VMM and IPC core, which the shim only passes through: CUDA graphs'
//! memory nodes, green contexts and managed memory. Their operations sit on a floor of their
//! own above the core's (nothing in the core uses them), their tables in `state/extras/`.

pub mod graph_memory;
pub mod green;
pub mod managed;
