//! The state floor: what the process holds between calls: the registry behind its lock and
//! the sticky failure ([`process`]), the records themselves ([`registry`], the pool adapter's in [`pools`]), the export cache
//! the peer thread serves from ([`cache`]), the host carrier's arena ([`arena`]) or the storage carrier's files ([`stored`]) and how far
//! its copy has got ([`progress`]), and the gate every application driver call passes
//! ([`gate`]). Lock order: registry → export cache →
//! gate slots.

pub mod arena;
pub mod cache;
pub mod gate;
pub mod pools;
pub mod process;
pub mod progress;
pub mod registry;
pub mod stored;
