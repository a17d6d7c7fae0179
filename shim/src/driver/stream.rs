//! A stream for the shim's own asynchronous copies that holds every host buffer it copies
//! until the copies have finished.
//!
//! [`Stream::scope`] works like `std::thread::scope`: the body gets the stream by reference,
//! buffers handed to it are borrowed for `'env` (which outlives the scope), and the scope
//! synchronizes before it returns, also when the body fails or panics. So no buffer can be
//! touched, freed or reused while a copy into or out of it may still run, and no caller can
//! leak the stream past the synchronization.

use super::os;
use super::table::{Driver, call};
use crate::sys::abi::consts;
use crate::sys::error::CuResult;
use std::marker::PhantomData;

/// A non-blocking stream in the current context.
#[derive(Debug)]
pub struct Stream<'env> {
    d: &'env Driver,
    raw: usize,
    /// Invariant in `'env`: the body cannot shorten the buffers' borrow to its own lifetime.
    buffers: PhantomData<&'env mut &'env ()>,
}

impl<'env> Stream<'env> {
    /// Creates a stream, runs `body` with it, waits for every copy it queued and destroys it.
    /// `body`'s error wins over the destruction's.
    pub fn scope<R>(
        d: &'env Driver,
        body: impl FnOnce(&Stream<'env>) -> CuResult<R>,
    ) -> CuResult<R> {
        let mut raw = 0usize;
        call!(d, cuStreamCreate(&mut raw, consts::STREAM_NON_BLOCKING))?;
        let stream = Stream {
            d,
            raw,
            buffers: PhantomData,
        };
        let result = body(&stream);
        // Synchronizes, then destroys (the Drop below): also on unwinding.
        drop(stream);
        result
    }

    /// Waits for every copy queued so far. The buffers stay borrowed until the scope ends, so
    /// this only tells the caller how far the copies got.
    pub fn synchronize(&self) -> CuResult<()> {
        let d = self.d;
        call!(d, cuStreamSynchronize(self.raw))
    }

    /// Queues a copy of `host.len()` bytes from device address `device` into `host`. The
    /// driver checks the device range (an unmapped one is its error, not a fault here).
    pub fn copy_to_host(&self, host: &'env mut [u8], device: u64) -> CuResult<()> {
        let d = self.d;
        call!(
            d,
            cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), device, host.len(), self.raw)
        )
    }

    /// Queues a copy of `host.len()` bytes from `host` to device address `device`.
    pub fn copy_to_device(&self, device: u64, host: &'env [u8]) -> CuResult<()> {
        let d = self.d;
        call!(
            d,
            cuMemcpyHtoDAsync_v2(device, host.as_ptr().cast(), host.len(), self.raw)
        )
    }
}

impl Drop for Stream<'_> {
    /// Waits for the queued copies. When the driver cannot say they finished, a DMA may still
    /// write into the borrowed buffers after they are freed or reused: the process ends at
    /// once, running no destructors.
    fn drop(&mut self) {
        let d = self.d;
        if let Err(e) = call!(d, cuStreamSynchronize(self.raw)) {
            crate::log!("CUDA copy completion unknown ({e}); terminating without cleanup");
            os::exit_now(127);
        }
        let _ = call!(d, cuStreamDestroy_v2(self.raw));
    }
}
