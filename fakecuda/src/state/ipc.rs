//! The ipc tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::ipc`.

use crate::error::{CuError, CuResult};
use crate::sys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

pub const HANDLE_BYTES: usize = 64;

pub(crate) const MAGIC: &[u8; 8] = b"FKCUIPC1";

pub(crate) static NATIVE_CALLS: AtomicU64 = AtomicU64::new(0);

pub fn count_call() {
    NATIVE_CALLS.fetch_add(1, Ordering::Relaxed);
}

pub fn calls() -> u64 {
    NATIVE_CALLS.load(Ordering::Relaxed)
}

#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) base: u64,
    pub(crate) refs: u32,
    /// The size the creator asked cuMemAlloc for (what cuMemGetAddressRange reports).
    pub(crate) requested: u64,
    /// The context that opened it: destroying or resetting that context closes it.
    pub(crate) context: u64,
}

#[derive(Debug, Default)]
pub struct Ipc {
    /// (creator pid, creator's allocation handle) → local mapping.
    pub(crate) opened: HashMap<(u32, u64), Opened>,
}

impl Ipc {
    pub fn live(&self) -> bool {
        !self.opened.is_empty()
    }

    /// Peer handles open here.
    pub fn open_count(&self) -> u64 {
        self.opened.len() as u64
    }

    /// (base, requested size) of the opened block containing `ptr`.
    pub fn opened_range(&self, ptr: u64) -> Option<(u64, u64)> {
        self.opened
            .values()
            .find(|o| o.base <= ptr && ptr < o.base + o.requested)
            .map(|o| (o.base, o.requested))
    }

    /// The context that opened the block mapped at `base`.
    pub fn context_at(&self, base: u64) -> Option<u64> {
        self.opened
            .values()
            .find(|o| o.base == base)
            .map(|o| o.context)
    }

    /// The open handle mapped at `base`, with its key.
    pub(crate) fn opened_at(&mut self, base: u64) -> CuResult<((u32, u64), &mut Opened)> {
        self.opened
            .iter_mut()
            .find(|(_, o)| o.base == base)
            .map(|(k, o)| (*k, o))
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// Forgets every handle context `ctx` opened: the bases to unmap.
    pub fn close_context(&mut self, ctx: u64) -> Vec<u64> {
        let mut bases = Vec::new();
        self.opened.retain(|_, o| {
            let keep = o.context != ctx;
            if !keep {
                bases.push(o.base);
            }
            keep
        });
        bases
    }
}

/// What a handle names: the creator's pid, its allocation handle, the allocation's size and
/// the size cuMemAlloc was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named {
    pub pid: u32,
    pub alloc: u64,
    pub size: u64,
    pub requested: u64,
}

pub(crate) fn encode(n: Named) -> [u8; HANDLE_BYTES] {
    let mut h = [0u8; HANDLE_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&n.pid.to_le_bytes());
    h[16..24].copy_from_slice(&n.alloc.to_le_bytes());
    h[24..32].copy_from_slice(&n.size.to_le_bytes());
    h[32..40].copy_from_slice(&n.requested.to_le_bytes());
    h
}

pub(crate) fn decode(h: &[u8; HANDLE_BYTES]) -> CuResult<Named> {
    if &h[..8] != MAGIC || h[12..16] != [0; 4] || h[40..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let pid = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    let (alloc, size, requested) = (sys::le_u64(h, 16), sys::le_u64(h, 24), sys::le_u64(h, 32));
    if requested == 0 || requested > size {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Named {
        pid,
        alloc,
        size,
        requested,
    })
}
