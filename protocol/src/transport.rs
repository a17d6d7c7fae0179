//! Unix-socket transport.
