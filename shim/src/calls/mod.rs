//! The per-call floor: the logic behind each tracked driver entry point. Inputs arrive as
//! plain values (the FFI edge read the application's pointers); what must reach the driver
//! with the application's own pointers comes back to the edge as a closure or a decision.
//!
//! [`track`] records objects and mappings; [`vmm`] is the VMM calls; [`multicast`] the
//! multicast calls; [`sharing`] POSIX-FD export and import through tickets; [`ipc`] the
//! memory IPC adapter (`cuMemAlloc` as VMM, `cuIpc*`); [`peer`] peer access for its regions;
//! [`pool`] the pool adapter (IPC memory pools as VMM regions).

pub mod ipc;
pub mod multicast;
pub mod peer;
pub mod pool;
pub mod sharing;
pub mod track;
pub mod vmm;
