//! Scriptable CUDA worker processes for tests and the demo.
//!
//! `cuinterpose-worker` is an ordinary CUDA driver-API program: it `dlopen`s `libcuda.so.1`
//! (or `$CUINTERPOSE_WORKER_DRIVER`), resolves entry points through one selectable
//! [`EntryPath`], and touches device memory only through driver calls. It runs
//! [`Command`]s sent over an inherited Unix socket and answers each with a [`Response`].
//! [`Worker`] spawns and drives one.
//!
//! ```no_run
//! use cuinterpose_workload::{Worker, WorkerConfig};
//! // The worker binary next to this program (tests use `cuinterpose_testkit::build_worker`).
//! let program = std::env::current_exe()?.with_file_name("cuinterpose-worker");
//! let mut a = Worker::spawn(&WorkerConfig::new(&program))?;
//! a.init(0)?;
//! let h = a.create(2 << 20, 0, 1)?;
//! let p = a.map_rw(h, 2 << 20, 0)?;
//! a.fill(p, 2 << 20, 42)?;
//! let fd = a.export(h)?;
//! let mut b = Worker::spawn(&WorkerConfig::new(&program))?;
//! b.init(0)?;
//! let hb = b.import(std::os::fd::AsFd::as_fd(&fd))?;
//! let q = b.map_rw(hb, 2 << 20, 0)?;
//! b.verify(q, 2 << 20, 42)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Floors, top to bottom: each module imports only from those below it (the tidy test).
// 1. The two ends: the test's client and the worker process.
pub mod client;
pub mod worker;
// 2. Errors and framing.
pub mod error;
pub mod wire;
// 3. The commands and replies.
pub mod proto;
// 4. The driver's types, the entry paths, the byte patterns.
pub mod cuda;
pub mod entry;
pub mod pattern;

pub use client::{
    DEFAULT_TIMEOUT, Exported, InitInfo, Output, Resolved, Worker, WorkerConfig, WorkerIdentity,
};
pub use entry::EntryPath;
pub use error::WorkloadError;
pub use pattern::{checksum, pattern, pattern_byte, pattern_checksum, pattern_word};
pub use proto::{
    AllocationProperties, Command, DriverObjects, ErrorKind, ErrorReply, Grant, Reply, Response,
};
