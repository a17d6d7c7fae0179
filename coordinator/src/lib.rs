//! The cuinterpose coordinator.
