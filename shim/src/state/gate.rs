//! The gate every application driver call passes: open while the workload runs, closed from
//! `begin_checkpoint` until the restore completes (a call blocks, as under the driver's own
//! lock, and continues when the gate reopens), failed after a fail-stop (every gated call
//! returns `CUDA_ERROR_ILLEGAL_STATE`).
//!
//! The fast path touches only the calling thread's own slot (one cache line per thread) and
//! reads the shared state word: no shared counter, so threads do not contend. Closing is the
//! slow side of a Dekker handshake: the closer publishes `CLOSED`, then waits until every slot
//! is outside a driver call. Both sides order their store before their load with a full
//! fence; where the kernel offers `membarrier(PRIVATE_EXPEDITED)` the callers' fence is only a
//! compiler fence and the closer issues the barrier on their behalf (an asymmetric fence).
//!
//! The shim's own driver calls (control and peer threads, lifecycle work) go straight to the
//! driver table and never pass here.

use crate::sys::error::CuError;
use std::cell::Cell;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering, compiler_fence, fence,
};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const FAILED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(OPEN);
/// Waiters sleep here while the gate is closed; the mutex guards nothing but the wait.
static WAIT: Mutex<()> = Mutex::new(());
static REOPENED: Condvar = Condvar::new();

/// One thread's slot, alone on its cache line (and the next, for adjacent-line prefetch).
#[repr(align(128))]
#[derive(Debug)]
pub struct Slot {
    /// Nesting depth of driver calls this thread is inside (only the owner writes it).
    depth: AtomicU32,
    /// 1 + the entry-point index of the outermost call, for the drain's report.
    function: AtomicU32,
    /// The owning thread's kernel id; 0 when the slot is free for reuse.
    owner: AtomicU32,
    name: Mutex<String>,
}

/// Every slot ever made. Slots are leaked and reused by later threads, so the list is bounded
/// by the most threads that were ever alive at once.
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    static RELEASE: SlotRelease = const { SlotRelease(Cell::new(None)) };
}

/// Frees the thread's slot when the thread exits.
struct SlotRelease(Cell<Option<&'static Slot>>);

impl Drop for SlotRelease {
    fn drop(&mut self) {
        if let Some(slot) = self.0.get() {
            slot.depth.store(0, Ordering::Release);
            slot.owner.store(0, Ordering::Release);
        }
    }
}

/// Whether callers may use a compiler fence (the closer issues `membarrier` for them).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);
static ASYMMETRIC_CHECKED: AtomicBool = AtomicBool::new(false);

use crate::driver::os::{membarrier, thread_id, thread_name};

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// Registers for expedited membarrier once; before that callers use full fences, which is
/// always correct.
fn setup_asymmetric() {
    if !ASYMMETRIC_CHECKED.swap(true, Ordering::SeqCst)
        && !crate::sys::settings::current().is_ok_and(|s| s.symmetric_gate)
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
    {
        ASYMMETRIC.store(true, Ordering::SeqCst);
    }
}

#[cold]
fn new_slot() -> Option<&'static Slot> {
    setup_asymmetric();
    let tid = thread_id();
    let name = thread_name();
    let mut slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    let slot = match slots.iter().find(|s| {
        s.owner
            .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) {
        Some(slot) => *slot,
        None => {
            let slot: &'static Slot = Box::leak(Box::new(Slot {
                depth: AtomicU32::new(0),
                function: AtomicU32::new(0),
                owner: AtomicU32::new(tid),
                name: Mutex::new(String::new()),
            }));
            slots.push(slot);
            slot
        }
    };
    *slot.name.lock().unwrap_or_else(|p| p.into_inner()) = name;
    drop(slots);
    // A thread that is exiting (its TLS already destroyed) gets no slot; it uses the
    // shared fallback below.
    RELEASE.try_with(|r| r.0.set(Some(slot))).ok()?;
    MINE.try_with(|m| m.set(Some(slot))).ok()?;
    Some(slot)
}

/// Threads without a slot (exiting threads) count here, with full fences.
static SLOTLESS: AtomicU32 = AtomicU32::new(0);

/// A passed gate: dropping it leaves the driver call.
#[derive(Debug)]
#[must_use]
pub struct Pass(Option<&'static Slot>);

impl Drop for Pass {
    #[inline]
    fn drop(&mut self) {
        match self.0 {
            Some(slot) => {
                let depth = slot.depth.load(Ordering::Relaxed);
                slot.depth.store(depth - 1, Ordering::Release);
            }
            None => {
                SLOTLESS.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// The error a gated call returns once the process fail-stopped.
pub const FAILED_ERROR: CuError = CuError::ILLEGAL_STATE;

/// Enters a gated driver call of entry point `function`: returns at once while the gate is
/// open, blocks while it is closed, fails once the process fail-stopped. A call nested in one
/// this thread is already inside passes (blocking it would deadlock the drain).
#[inline]
pub fn enter(function: usize) -> Result<Pass, CuError> {
    let slot = match MINE.try_with(Cell::get) {
        Ok(Some(slot)) => Some(slot),
        Ok(None) => new_slot(),
        Err(_) => None,
    };
    let Some(slot) = slot else {
        return enter_slotless();
    };
    loop {
        let depth = slot.depth.load(Ordering::Relaxed);
        slot.depth.store(depth + 1, Ordering::Relaxed);
        if depth > 0 {
            return Ok(Pass(Some(slot)));
        }
        slot.function.store(function as u32 + 1, Ordering::Relaxed);
        if ASYMMETRIC.load(Ordering::Relaxed) {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        match STATE.load(Ordering::Relaxed) {
            OPEN => return Ok(Pass(Some(slot))),
            state => {
                slot.depth.store(depth, Ordering::Release);
                if state == FAILED {
                    return Err(FAILED_ERROR);
                }
                wait_reopened();
            }
        }
    }
}

#[cold]
fn enter_slotless() -> Result<Pass, CuError> {
    loop {
        SLOTLESS.fetch_add(1, Ordering::SeqCst);
        match STATE.load(Ordering::SeqCst) {
            OPEN => return Ok(Pass(None)),
            state => {
                SLOTLESS.fetch_sub(1, Ordering::SeqCst);
                if state == FAILED {
                    return Err(FAILED_ERROR);
                }
                wait_reopened();
            }
        }
    }
}

#[cold]
fn wait_reopened() {
    let mut guard = WAIT.lock().unwrap_or_else(|p| p.into_inner());
    while STATE.load(Ordering::SeqCst) == CLOSED {
        guard = REOPENED.wait(guard).unwrap_or_else(|p| p.into_inner());
    }
}

/// A thread still inside a driver call when the drain gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    pub thread: u32,
    pub thread_name: String,
    /// The entry point's index (`None`: a thread without a slot).
    pub function: Option<usize>,
}

/// The generation of the current hold (0: none). See [`hold`].
static HOLD: AtomicU64 = AtomicU64::new(0);
static HOLDS: AtomicU64 = AtomicU64::new(0);

/// After the last restore step the gate stays closed until the coordinator's verifying
/// inspection has read the records ([`release_hold`]), so no application call can change them
/// before they are compared. A coordinator that never inspects does not keep the workload
/// stopped: after `timeout` the gate reopens on its own (logged).
pub fn hold(timeout: Duration) {
    let generation = HOLDS.fetch_add(1, Ordering::SeqCst) + 1;
    HOLD.store(generation, Ordering::SeqCst);
    let spawned = std::thread::Builder::new()
        .name("cuinterpose-hold".into())
        .spawn(move || {
            std::thread::sleep(timeout);
            if HOLD
                .compare_exchange(generation, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                crate::log!(
                    "no verifying inspection within {} s of the restore; the gate is open again",
                    timeout.as_secs_f64()
                );
                open();
            }
        });
    if spawned.is_err() {
        // Without the timer a vanished coordinator would stop the workload for good.
        HOLD.store(0, Ordering::SeqCst);
        open();
    }
}

/// Ends a hold (the verifying inspection has read the records): the gate reopens. Whether
/// there was one.
pub fn release_hold() -> bool {
    if HOLD.swap(0, Ordering::SeqCst) != 0 {
        open();
        return true;
    }
    false
}

/// Closes the gate: from now on application calls block. Idempotent.
pub fn close() {
    HOLD.store(0, Ordering::SeqCst);
    let previous = STATE.swap(CLOSED, Ordering::SeqCst);
    if previous == FAILED {
        STATE.store(FAILED, Ordering::SeqCst);
    }
}

/// Waits until no application thread is inside a gated driver call, or `timeout` passed;
/// then names every thread still inside one. The gate must be closed.
pub fn drain(timeout: Duration) -> Result<(), Vec<Busy>> {
    if ASYMMETRIC.load(Ordering::SeqCst) {
        // Orders every caller's slot store before our reads of the slots.
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    }
    fence(Ordering::SeqCst);
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        let busy = busy();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(busy);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

fn busy() -> Vec<Busy> {
    let slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<Busy> = slots
        .iter()
        .filter(|s| s.depth.load(Ordering::Acquire) > 0)
        .map(|s| Busy {
            thread: s.owner.load(Ordering::Relaxed),
            thread_name: s.name.lock().map(|n| n.clone()).unwrap_or_default(),
            function: (s.function.load(Ordering::Relaxed) as usize).checked_sub(1),
        })
        .collect();
    for _ in 0..SLOTLESS.load(Ordering::SeqCst) {
        out.push(Busy {
            thread: 0,
            thread_name: "an exiting thread".into(),
            function: None,
        });
    }
    out
}

/// Reopens the gate; blocked calls continue. A failed gate stays failed.
pub fn open() {
    let _guard = WAIT.lock().unwrap_or_else(|p| p.into_inner());
    if STATE
        .compare_exchange(CLOSED, OPEN, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        REOPENED.notify_all();
    }
}

/// Fail-stop: every gated call from now on (and every blocked one) returns
/// [`FAILED_ERROR`].
pub fn fail() {
    let _guard = WAIT.lock().unwrap_or_else(|p| p.into_inner());
    STATE.store(FAILED, Ordering::SeqCst);
    REOPENED.notify_all();
}

/// Whether the gate is closed or failed.
pub fn is_closed() -> bool {
    STATE.load(Ordering::SeqCst) != OPEN
}

/// The slot list's lock, for the fork handlers: held across `fork` so the child never inherits
/// it locked by a thread that does not exist there.
pub fn slots_mutex() -> &'static Mutex<Vec<&'static Slot>> {
    &SLOTS
}

/// In the child after a fork, with the slot list's guard the fork handlers held: back to open
/// (the parent's checkpoint is not the child's), and the parent's other threads forgotten.
pub fn reset_after_fork(slots: &mut Vec<&'static Slot>) {
    STATE.store(OPEN, Ordering::SeqCst);
    HOLD.store(0, Ordering::SeqCst);
    let mine = MINE.try_with(Cell::get).ok().flatten();
    for slot in slots.iter() {
        if mine.is_some_and(|m| std::ptr::eq(m, *slot)) {
            slot.owner.store(thread_id(), Ordering::Relaxed);
        } else {
            slot.depth.store(0, Ordering::Relaxed);
            slot.owner.store(0, Ordering::Relaxed);
        }
    }
    SLOTLESS.store(0, Ordering::SeqCst);
}
