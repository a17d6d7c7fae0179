//! libcuinterpose.so.
