//! Scriptable CUDA worker processes for tests and the demo.
