//! libcuinterpose.so: loaded with `LD_PRELOAD` into every process of a CUDA workload.
//!
//! It forwards driver calls to the real driver, tracks every POSIX-FD-shareable allocation and
//! multicast object with its sharing and mappings, hands out logical handles and ticket FDs,
//! serves peers and the coordinator on its own socket, and takes sharing apart and rebuilds
//! it around native checkpoint. The FFI edge is `ffi`; everything behind it is safe Rust
//! except the few driver and libc calls, each of which says why it is sound.

pub mod abi;
pub mod carrier;
pub mod context;
pub mod convert;
pub mod driver;
pub mod error;
pub mod ffi;
pub mod gate;
pub mod inspect;
pub mod ipc;
pub mod lifecycle;
pub mod log;
pub mod multicast;
pub mod ops;
pub mod process;
pub mod registry;
pub mod runtime;
pub mod sharing;
pub mod vmm;
