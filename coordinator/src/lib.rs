//! The cuinterpose coordinator: inspects, validates, checkpoints and restores the processes of
//! a multi-process CUDA workload through their shims' control sockets.
//!
//! Layout: a sans-I/O core ([`validate`], [`plan`], [`remap`], [`state::compare`], [`report`],
//! [`events`], [`render`]) fed with replies and time, and the edges that do I/O: [`session`] (sockets,
//! one thread per participant), [`state`] (the durable state file), [`checkpoint_dir`] (what lives where in a
//! checkpoint directory), [`native`] (the driver's
//! checkpoint entry points), [`process`] (`/proc`). [`commands`] and [`compose`] put them
//! together as the CLI's commands ([`cli`]).

pub mod checkpoint_dir;
pub mod cli;
pub mod commands;
pub mod compose;
pub mod criu;
pub mod demo;
pub mod events;
pub mod hook;
pub mod native;
pub mod plan;
pub mod process;
pub mod remap;
pub mod render;
pub mod report;
pub mod session;
pub mod stale;
pub mod state;
pub mod validate;
