//! Sealed memfd tickets.
