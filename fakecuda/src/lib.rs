//! fakecuda: a stand-in for NVIDIA's `libcuda.so.1` on machines without a GPU.
//!
//! Device memory is host memory with the driver's semantics: physical allocations are memfds
//! (so two processes mapping one allocation really share bytes), address reservations are
//! `PROT_NONE` mappings, `cuMemMap` maps the memfd in place, and `cuMemSetAccess` is
//! `mprotect` (touching memory without a grant faults, as on a GPU). Native checkpoint is
//! served to other processes over a per-process control socket. See README.md.

mod abi;
mod checkpoint;
mod context;
mod device;
mod driver;
mod error;
mod ffi;
mod graph;
mod graph_memory;
mod green;
mod ipc;
mod ipc_event;
mod legacy;
mod managed;
mod memcpy;
mod multicast;
mod pointer;
mod pool;
mod proc_address;
mod stream;
mod sys;
mod user_object;
mod vmm;
