//! The workspace's tidy test (in the style of rust-analyzer's): each crate's modules are
//! floors and the code keeps to them, no folder's modules import each other in a circle, no
//! source file passes 600 lines and no function 150 (an allowlist that may only shrink),
//! `unsafe` lives only where a crate's table allows it and crates that need none forbid it.
//!
//! The rules run on the real tree (`tests/tidy.rs`) and on small made-up trees that break each
//! one, so the test cannot pass by finding nothing. The sources are parsed with `syn`: paths
//! in `use` trees, expressions, types and macro names count as imports; comments and strings
//! do not.
//!
//! The modules are floors, listed top to bottom; each imports only from those below it.

#![forbid(unsafe_code)]

// 1. This workspace's tables, and reading its files.
pub mod workspace;
// 2. The rules over a tree of files.
pub mod rules;
// 3. What one source file says: its imports, functions, unsafe code, environment reads.
pub mod source;
