//! The CUDA driver ABI, once for every crate of the workspace (the shim, fakecuda, the worker,
//! the client suite): C-layout mirrors of the structs whose cudarc definitions hold Rust enums,
//! the constants the crates use, and the `CUresult` table.
//!
//! Every field of a mirror is a plain integer: a struct read from an application's memory may
//! hold any value, and reading it into cudarc's type (a Rust enum field) would be undefined
//! behaviour; decoding happens explicitly. Compile-time assertions tie each mirror's layout to
//! cudarc's, every constant is taken from cudarc, and [`results`] is generated from cudarc's
//! bindings, so nothing here can drift from the CUDA headers.

#![forbid(unsafe_code)]

// Floors, top to bottom: each module imports only from those below it (the tidy test).
// 1. The struct mirrors, the results table, UUIDs.
// `results` is written by `cuinterpose-codegen entry-points`, checked for staleness: rustfmt
// must leave it as generated.
#[rustfmt::skip]
pub mod results;
pub mod structs;
pub mod uuid;
// 2. The constants.
pub mod consts;

pub use structs::{
    RawAccessDesc, RawAllocProp, RawIpcMemHandle, RawLocation, RawMemAllocNodeParams, RawMemcpy3d,
    RawMulticastProp, RawPoolProps,
};
