//! The tables of the models beside the VMM and IPC core: graphs and their executable
//! instances, graph memory, green contexts, managed memory's advice, user objects. The core's
//! tables (one folder up) never name them.

pub mod graph;
pub mod graph_memory;
pub mod green;
pub mod managed;
pub mod user_object;
