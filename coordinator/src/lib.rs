//! The cuinterpose coordinator: inspects, validates, checkpoints and restores the processes of
//! a multi-process CUDA workload through their shims' control sockets.
//!
//! Layout: a sans-I/O core ([`validate`], [`plan`], [`remap`], [`state::compare`],
//! [`report`], [`events`], [`render`]) fed with replies and time, and the edges that do I/O:
//! [`session`] (sockets, one thread per participant), [`state`] (the durable state file),
//! [`checkpoint_dir`] (what lives where in a checkpoint directory), [`native`] (the driver's
//! checkpoint entry points), [`process`] (`/proc`). [`commands`] and [`compose`] put them
//! together as the CLI's commands ([`cli`]).

// Floors, top to bottom: each imports only from those below it (the workspace's tidy test,
// `tidy/`, fails otherwise; its table is `tidy/src/workspace.rs`).
// 1. The command line.
pub mod cli;
// 2. The demo.
pub mod demo;
// 3. The CRIU action-script hook.
pub mod hook;
// 4. CRIU dump and restore of a whole tree.
pub mod criu;
// 5. The whole-workload checkpoint and restore, and its way back.
pub mod compose;
// 6. prepare, restore, inspect: the coordinator's commands over a session.
pub mod commands;
// 7. The session: one socket exchange per participant.
pub mod session;
// 8. The plan: the order of operations and abort-and-resume, sans-I/O.
pub mod plan;
// 9. The state file, and the topology's rules.
pub mod state;
pub mod validate;
// 10. Rendering records for messages.
pub mod render;
// 11. Device remapping.
pub mod remap;
// 12. Leaves: events, stale sockets, `/proc`, the checkpoint directory's layout, the
//     driver's checkpoint calls, reports.
pub mod checkpoint_dir;
pub mod events;
pub mod native;
pub mod process;
pub mod report;
pub mod stale;
