//! The process-wide driver state, its initialisation (`cuInit`) and the access helpers every
//! entry point uses.

use crate::device::Config;
use crate::error::{CuError, CuResult};
use crate::state::context::Contexts;
use crate::state::ipc::Ipc;
use crate::state::multicast::Multicast;
use crate::state::vmm::Vmm;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

pub struct DriverState {
    pub config: Config,
    pub contexts: Contexts,
    pub vmm: Vmm,
    pub ipc: Ipc,
    pub mc: Multicast,
    pub legacy: crate::state::legacy::Legacy,
    /// CUDA graphs and their executable instances.
    pub graphs: crate::state::extras::graph::Graphs,
    /// Stream-ordered memory pools and their allocations.
    pub pools: crate::state::pool::Pools,
    /// Events by handle.
    pub events: std::collections::HashMap<u64, std::sync::Arc<crate::state::stream::Event>>,
    /// What graph allocation nodes reserved and executable graphs hold.
    pub graph_memory: crate::state::extras::graph_memory::GraphMemory,
    /// User objects and the references graphs hold to them.
    pub user_objects: crate::state::extras::user_object::UserObjects,
    /// Green contexts and their resource descriptors.
    pub greens: crate::state::extras::green::Greens,
    /// Interprocess events this process exported.
    pub ipc_events: crate::state::ipc_event::IpcEvents,
    /// Managed memory's advice and prefetch locations.
    pub advice: crate::state::extras::managed::Advice,
    /// Allocations (by buffer id) with `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS` set.
    pub sync_memops: std::collections::BTreeSet<u64>,
    /// Source of every handle value (allocations, multicast objects, contexts, streams):
    /// values are never reused within a process.
    next_handle: u64,
}

impl DriverState {
    pub fn next_handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    /// What the process holds, for `fakecuda_objects`.
    pub fn objects(&self) -> crate::abi::FakecudaObjects {
        crate::abi::FakecudaObjects {
            allocations: self.vmm.allocs.len() as u64,
            mappings: self.vmm.mappings.len() as u64,
            reservations: self.vmm.reservations.len() as u64,
            multicast_objects: self.mc.objects.len() as u64,
            ipc_opened: self.ipc.open_count(),
        }
    }
}

static DRIVER: Mutex<Option<DriverState>> = Mutex::new(None);

/// The pid that ran `cuInit`; a forked child sees another pid and, as with the real driver,
/// cannot use the parent's driver state.
static INIT_PID: AtomicU32 = AtomicU32::new(0);

fn lock() -> MutexGuard<'static, Option<DriverState>> {
    // A panic while holding the lock was already reported as an error by the ABI edge; the
    // tables are updated in an order that leaves them consistent, so keep going.
    DRIVER.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn forked_child() -> bool {
    let pid = INIT_PID.load(Ordering::Acquire);
    pid != 0 && pid != std::process::id()
}

/// Runs `f` on the initialised driver state.
pub fn with<T>(f: impl FnOnce(&mut DriverState) -> CuResult<T>) -> CuResult<T> {
    if forked_child() {
        return Err(CuError::CUDA_ERROR_NOT_INITIALIZED);
    }
    let mut g = lock();
    let d = g.as_mut().ok_or(CuError::CUDA_ERROR_NOT_INITIALIZED)?;
    f(d)
}

/// `cuInit`: reads the configuration, creates the device tables and, once, runs `start` (the
/// entry point starts the control socket that serves native checkpoint and IPC requests from
/// other processes) before the state exists.
pub fn init(flags: u32, start: impl FnOnce() -> CuResult<()>) -> CuResult<()> {
    if flags != 0 {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    if forked_child() {
        return Err(CuError::CUDA_ERROR_NOT_INITIALIZED);
    }
    let mut g = lock();
    if g.is_some() {
        return Ok(());
    }
    let config = Config::from_env()?;
    if config.count() == 0 {
        return Err(CuError::CUDA_ERROR_NO_DEVICE);
    }
    start()?;
    INIT_PID.store(std::process::id(), Ordering::Release);
    let contexts = Contexts::new(config.count());
    *g = Some(DriverState {
        config,
        contexts,
        vmm: Vmm::default(),
        ipc: Ipc::default(),
        mc: Multicast::default(),
        legacy: crate::state::legacy::Legacy::default(),
        events: std::collections::HashMap::new(),
        pools: crate::state::pool::Pools::default(),
        graphs: crate::state::extras::graph::Graphs::default(),
        advice: crate::state::extras::managed::Advice::default(),
        ipc_events: crate::state::ipc_event::IpcEvents::default(),
        greens: crate::state::extras::green::Greens::default(),
        user_objects: crate::state::extras::user_object::UserObjects::default(),
        graph_memory: crate::state::extras::graph_memory::GraphMemory::default(),
        sync_memops: std::collections::BTreeSet::new(),
        next_handle: 0x1000,
    });
    Ok(())
}
