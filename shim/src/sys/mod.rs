//! The bottom floor: what every other floor uses and nothing here depends on: the C structs
//! and constants of the driver ABI, `CUresult` errors, logging, conversions between the C
//! structs and the schema's types, and the generated names of the shim's entry points, and
//! the settings read once from the environment.

pub mod abi;
pub mod convert;
// Written by `cuinterpose-codegen entry-points`, checked for staleness: rustfmt must leave it
// as generated.
#[rustfmt::skip]
pub mod entries;
pub mod error;
pub mod log;
pub mod settings;
