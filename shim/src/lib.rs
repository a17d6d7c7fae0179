//! libcuinterpose.so: loaded with `LD_PRELOAD` into every process of a CUDA workload.
//!
//! It forwards driver calls to the real driver, tracks every POSIX-FD-shareable allocation and
//! multicast object with its sharing and mappings, hands out logical handles and ticket FDs,
//! serves peers and the coordinator on its own socket, and takes sharing apart and rebuilds
//! it around native checkpoint.
//!
//! The modules are floors, listed top to bottom: each imports only from the floors below it
//! (the workspace's tidy test, `tidy/`, fails otherwise). Raw pointers and foreign calls live in
//! two of them only: the FFI edge, which reads and writes the application's pointers, and the
//! driver floor, which holds every foreign call the shim makes for itself behind safe typed
//! methods. See `docs/architecture.md`.

// 1. The exported C functions: the driver's entry points, `dlsym`, `cuGetProcAddress`.
pub mod ffi;
// 2. The runtime: the control socket, the peer and control threads, fork.
pub mod runtime;
// 3. The lifecycle: the checkpoint phases and the host carriers.
pub mod lifecycle;
// 4. Per-call logic: VMM, sharing through tickets, memory IPC, multicast.
pub mod calls;
// 5. State: the registry, the process's lock and failure, the export cache, the arena, the gate.
pub mod state;
// 6. The driver: the real driver's table and safe methods, and the libc calls.
pub mod driver;
// 7. System helpers: C structs and constants, errors, logging, conversions, entry names.
pub mod sys;
