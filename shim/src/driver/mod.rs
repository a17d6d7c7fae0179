//! The driver floor: every foreign call the shim makes for itself, and the only place below
//! the FFI edge where `unsafe` appears.
//!
//! The real driver is `dlopen("libcuda.so.1")` (or `CUINTERPOSE_DRIVER`), resolved once through
//! glibc's own `dlsym` into a table of typed function pointers, and loaded on the first call
//! that needs it, so a process that never calls CUDA pays nothing but the library load. The
//! floors above call the safe typed methods of [`api`], [`Stream`] and [`HostMemory`]: a copy
//! takes a slice whose length bounds it, and a stream holds the buffers it copies until it has
//! synchronized.

pub mod api;
pub mod context;
pub mod host;
pub mod os;
pub mod stream;
pub mod table;
pub mod vmm;

pub use host::HostMemory;
pub use stream::Stream;
pub(crate) use table::call;
pub use table::{DRIVER_VARIABLE, Driver, driver};
