//! Fork: a child must not act on its parent's records, sockets or cached export FDs.
//!
//! `prepare` takes the registry, export-cache and gate-slot locks (in the usual order) so that no other
//! thread is halfway through changing them when the address space is copied; the parent then
//! simply releases them. The child empties both through the guards it inherited, closes the
//! descriptors they held and the inherited listening socket, and forgets the runtime: its first
//! CUDA call starts afresh, under its own pid.

use crate::process;
use crate::registry::Registry;
use crate::runtime::cache::{self, Cache};
use std::cell::RefCell;
use std::sync::{MutexGuard, Once};

type Guards = (
    MutexGuard<'static, Option<Registry>>,
    MutexGuard<'static, Option<Cache>>,
    MutexGuard<'static, Vec<&'static crate::gate::Slot>>,
);

thread_local! {
    // Only the forking thread touches this, between prepare and parent/child.
    static HELD: RefCell<Option<Guards>> = const { RefCell::new(None) };
}

extern "C" fn prepare() {
    let registry = process::registry_mutex()
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let cache = cache::mutex().lock().unwrap_or_else(|p| p.into_inner());
    let slots = crate::gate::slots_mutex()
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    HELD.with(|held| *held.borrow_mut() = Some((registry, cache, slots)));
}

extern "C" fn parent() {
    HELD.with(|held| drop(held.borrow_mut().take()));
}

extern "C" fn child() {
    HELD.with(|held| {
        if let Some((mut registry, mut cache, mut slots)) = held.borrow_mut().take() {
            // Dropping the records closes nothing of the driver's (the child cannot use the
            // parent's driver state anyway); dropping the cache closes the export FDs, and
            // dropping the arena unmaps the inherited host copy.
            *registry = None;
            *cache = None;
            crate::gate::reset_after_fork(&mut slots);
        }
    });
    super::forget_in_child();
    process::clear_failure();
}

/// Installs the handlers once per process image.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the three handlers are `extern "C" fn()` that live for the whole process.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            crate::log!("pthread_atfork failed ({rc}); a forked child would inherit shim state");
        }
    });
}
