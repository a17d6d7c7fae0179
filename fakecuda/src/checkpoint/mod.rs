//! Native checkpoint emulation: the gate every entry point passes (so a lock really stops
//! the application's driver calls), the process state machine, and what checkpoint and
//! restore do to the device state.
//!
//! `native` changes the device state; `server` serves the steps to other processes over the
//! control socket and `client` asks them, in the `wire` format both share.

pub mod client;
pub mod native;
pub mod server;
pub mod wire;
