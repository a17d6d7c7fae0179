//! Fork: a child must not act on its parent's records, sockets or cached export FDs.
//!
//! `prepare` takes the registry, export-cache and gate-slot locks (in the usual order) so that no other
//! thread is halfway through changing them when the address space is copied; the parent then
//! simply releases them. The child empties both through the guards it inherited, closes the
//! descriptors they held and the inherited listening socket, and forgets the runtime: its first
//! CUDA call starts afresh, under its own pid.

use crate::driver::os;
use crate::state::cache::{self, Cache};
use crate::state::gate::{self, Slot};
use crate::state::process;
use crate::state::registry::Registry;
use std::cell::RefCell;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// The pid the running runtime belongs to (0: none). A forked child sees its parent's value
/// until the fork handler clears it.
pub(super) static STARTED_FOR: Mutex<u32> = Mutex::new(0);

/// The listening socket's descriptor, for the fork handler to close in a child.
pub(super) static LISTENER_FD: AtomicI32 = AtomicI32::new(-1);

type Guards = (
    MutexGuard<'static, Option<Registry>>,
    MutexGuard<'static, Option<Cache>>,
    MutexGuard<'static, Vec<&'static Slot>>,
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
    let slots = gate::slots_mutex()
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
            gate::reset_after_fork(&mut slots);
        }
    });
    forget_runtime();
    process::clear_failure();
}

/// The parent's runtime threads do not exist in the child: its first `cuInit` starts afresh.
fn forget_runtime() {
    // The fork handler runs with no other thread alive; the lock cannot be held by anyone.
    if let Ok(mut started) = STARTED_FOR.try_lock() {
        *started = 0;
    }
    let fd = LISTENER_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // The inherited listening socket: its owner was the parent's peer thread.
        os::close_inherited(fd);
    }
}

/// Installs the handlers once per process image (at library load, from the FFI floor).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let rc = os::at_fork(prepare, parent, child);
        if rc != 0 {
            crate::log!("pthread_atfork failed ({rc}); a forked child would inherit shim state");
        }
    });
}
