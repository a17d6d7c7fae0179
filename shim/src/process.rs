//! Process-wide state: the registry behind one mutex, the sticky failure flag, and the
//! process's identity. Lock order: registry → export cache.

use crate::error::{CuError, CuResult};
use crate::registry::Registry;
use cuinterpose_protocol::NamespacePid;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// Set when a panic crossed an entry point: the records may be inconsistent, so tracked
/// calls are refused from then on.
static FAILED: AtomicBool = AtomicBool::new(false);

pub fn mark_failed(what: &str) {
    if !FAILED.swap(true, Ordering::SeqCst) {
        crate::log!(
            "internal failure in {what}; refusing further tracked CUDA calls (the records may be inconsistent)"
        );
    }
}

pub fn failed() -> bool {
    FAILED.load(Ordering::Relaxed)
}

/// The namespace pid this process sees itself as (what peers and the coordinator use).
pub fn own_pid() -> NamespacePid {
    NamespacePid::new(std::process::id()).expect("a running process has a non-zero pid")
}

pub type RegistryGuard = MutexGuard<'static, Option<Registry>>;

/// Locks the registry (creating it on first use). A poisoned lock means a panic, which has
/// already set the sticky failure.
pub fn lock() -> RegistryGuard {
    let mut guard = REGISTRY.lock().unwrap_or_else(|poison| poison.into_inner());
    if guard.is_none() {
        *guard = Some(Registry::new(own_pid()));
        crate::runtime::fork::install();
    }
    guard
}

/// Runs `f` on the registry under its lock; refuses everything after a sticky failure.
pub fn with<R>(f: impl FnOnce(&mut Registry) -> CuResult<R>) -> CuResult<R> {
    if failed() {
        return Err(CuError::UNKNOWN);
    }
    let mut guard = lock();
    f(guard.as_mut().expect("created by lock()"))
}

/// For the fork handlers: the raw mutex.
pub(crate) fn registry_mutex() -> &'static Mutex<Option<Registry>> {
    &REGISTRY
}

pub(crate) fn clear_failure() {
    FAILED.store(false, Ordering::SeqCst);
}
