//! The driver's state, concern by concern: each module's tables and their own methods. None
//! names the `DriverState` or takes its lock; the driver (`crate::driver`) holds them under its
//! lock, and the operations above it (`impl DriverState` in each concern's own module) change them.

pub mod context;
pub mod extras;
pub mod gate;
pub mod ipc;
pub mod ipc_event;
pub mod legacy;
pub mod multicast;
pub mod pool;
pub mod stream;
pub mod vmm;
