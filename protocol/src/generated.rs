//! Types generated from `schema/protocol.ron` by `build.rs` (the codegen crate), into the
//! build's output folder: nothing here is written by hand.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/protocol.rs"));
