//! The cuinterpose coordinator: inspects, validates, checkpoints and restores the processes of
//! a multi-process CUDA workload through their shims' control sockets.
//!
//! Layout: a sans-I/O core ([`validate`], [`plan`], [`state::compare`], [`report`]) fed with
//! replies and time, and the edges that do I/O ([`session`] for sockets and threads, [`state`]
//! for the durable state file, [`native`] for the driver's checkpoint entry points,
//! [`process`] for `/proc`).

pub mod fixtures;
pub mod plan;
pub mod render;
pub mod report;
pub mod state;
pub mod validate;
