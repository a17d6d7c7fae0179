//! fakecuda: a stand-in for NVIDIA's `libcuda.so.1` on machines without a GPU.
//!
//! Device memory is host memory with the driver's semantics: physical allocations are memfds
//! (so two processes mapping one allocation really share bytes), address reservations are
//! `PROT_NONE` mappings, `cuMemMap` maps the memfd in place, and `cuMemSetAccess` is
//! `mprotect` (touching memory without a grant faults, as on a GPU). Native checkpoint is
//! served to other processes over a per-process control socket. See README.md.

// Floors, top to bottom: each imports only from those below it (the workspace's tidy test,
// `tidy/`, its table in `tidy/src/workspace.rs`).
// 1. The exported C functions, and `cuGetProcAddress`'s table of them.
mod ffi;
// 2. The operations of the models beside the core: graph memory, green contexts, managed
//    memory.
mod extras;
// 3. The core's operations: the driver's methods on each concern's state, and native
//    checkpoint.
mod checkpoint;
mod ipc;
mod ipc_event;
mod legacy;
mod memcpy;
mod multicast;
mod pointer;
mod pool;
mod vmm;
// 4. The driver: its state under one lock, and `cuInit`.
mod driver;
// 5. The state, concern by concern.
mod state;
// 6. The devices this process sees.
mod device;
// 7. The ABI, errors, system calls.
mod abi;
mod error;
mod sys;
