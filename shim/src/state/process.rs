//! Process-wide state: the registry behind one mutex, the sticky failure flag, and the
//! process's identity. Lock order: registry → export cache → gate slots.

use crate::state::registry::Registry;
use crate::sys::error::{CuError, CuResult};
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

/// Set by the first raw import, so that releasing native handles (a pass-through call) takes
/// the registry lock only in processes that ever held a raw import.
static RAW_IMPORTS_SEEN: AtomicBool = AtomicBool::new(false);

/// Counts a live raw import of driver handle `raw`. Never fails: the handle exists whether or
/// not the shim is healthy, and a checkpoint must see it.
pub fn note_raw_import(raw: u64) {
    RAW_IMPORTS_SEEN.store(true, Ordering::SeqCst);
    let mut guard = lock();
    let r = guard.as_mut().expect("created by lock()");
    *r.raw_imports.entry(raw).or_insert(0) += 1;
}

/// Forgets one raw import of `raw`, if it was one (after the driver released it).
pub fn note_native_release(raw: u64) {
    if !RAW_IMPORTS_SEEN.load(Ordering::SeqCst) {
        return;
    }
    let mut guard = lock();
    let r = guard.as_mut().expect("created by lock()");
    if let Some(count) = r.raw_imports.get_mut(&raw) {
        *count -= 1;
        if *count == 0 {
            r.raw_imports.remove(&raw);
        }
    }
}

/// Records a pool export (`imported`: false) or import. Never fails: the sharing exists whether
/// or not the shim is healthy, and a checkpoint must see it.
pub fn note_pool_share(pool: usize, imported: bool) {
    let mut guard = lock();
    let r = guard.as_mut().expect("created by lock()");
    let share = r.pool_shares.entry(pool).or_default();
    if imported {
        share.imported = true;
    } else {
        share.exports += 1;
    }
}

/// Forgets a destroyed pool's sharing.
pub fn forget_pool(pool: usize) {
    let mut guard = lock();
    if let Some(r) = guard.as_mut() {
        r.pool_shares.remove(&pool);
    }
}

/// For the fork handlers: the raw mutex.
pub(crate) fn registry_mutex() -> &'static Mutex<Option<Registry>> {
    &REGISTRY
}

pub(crate) fn clear_failure() {
    FAILED.store(false, Ordering::SeqCst);
}
