//! Copies and fills, in stream order. The device side of every copy is validated against the
//! mapping table (mapped, and with the access the copy needs) when the copy is issued, so bad
//! arguments fail at the call; the copy itself runs without the driver lock (so transfers of
//! several threads proceed in parallel) and holds a guard that keeps the validated ranges
//! mapped until it is done ([`sys::copy_guard`]). Work on a created stream runs later on the
//! stream's worker, which validates the ranges again: a range unmapped in between becomes the
//! stream's `CUDA_ERROR_ILLEGAL_ADDRESS`, as a GPU fault does.

use crate::driver;
use crate::error::{CuError, CuResult};
use crate::state::context::Target;
use crate::state::gate;
use crate::sys::{self, CopyGuard};

/// The device side of a copy: its address and, for `cuMemcpyPeer`, the context whose device
/// touches it (`None`: the context the copy is issued in).
#[derive(Debug, Clone, Copy)]
struct Side {
    at: u64,
    by: Option<u64>,
}

fn side(at: Option<u64>) -> Option<Side> {
    at.map(|at| Side { at, by: None })
}

/// The device ranges of a copy issued in context `issuer`, validated for the device that
/// touches each (its context's, resolved under the same lock); the guard keeps them so until
/// it is dropped.
fn ranges(issuer: u64, src: Option<Side>, dst: Option<Side>, n: u64) -> CuResult<CopyGuard> {
    driver::with(|d| {
        let actor = |side: &Side| d.contexts.actor(side.by.unwrap_or(issuer));
        if let Some(s) = src {
            d.check_range(actor(&s)?, s.at, n, false)?;
        }
        if let Some(t) = dst {
            d.check_range(actor(&t)?, t.at, n, true)?;
        }
        // Taken under the driver lock, so no change can slip in between check and copy.
        Ok(sys::copy_guard())
    })
}

/// Where `stream`'s work runs for the calling thread, after the implicit synchronization of the
/// legacy default stream with the blocking streams.
pub fn target(stream: Option<u64>) -> CuResult<Target> {
    let target = driver::with(|d| d.contexts.target(stream))?;
    if let Target::Now { drain, .. } = &target {
        for s in drain {
            s.drain();
        }
    }
    Ok(target)
}

/// The context work on `target` is issued in.
pub fn issuer(target: &Target) -> u64 {
    match target {
        Target::Now { ctx, .. } => *ctx,
        Target::Queue(s) => s.ctx,
    }
}

/// Runs `op` on `stream` in order (now for a default stream), the device ranges validated
/// before and, for queued work, again when it runs.
fn transfer(
    stream: Option<u64>,
    src: Option<Side>,
    dst: Option<Side>,
    n: u64,
    op: impl FnOnce() + Send + 'static,
) -> CuResult<()> {
    let target = target(stream)?;
    let issuer = issuer(&target);
    let guard = ranges(issuer, src, dst, n)?;
    match target {
        Target::Now { .. } => {
            op();
            drop(guard);
        }
        Target::Queue(s) => {
            drop(guard);
            let job = move || {
                let _mapped =
                    ranges(issuer, src, dst, n).map_err(|_| CuError::CUDA_ERROR_ILLEGAL_ADDRESS)?;
                op();
                Ok(())
            };
            s.submit(Box::new(job), gate::extend());
        }
    }
    Ok(())
}

/// One 1D copy that runs now, where a graph node runs: device sides validated and kept mapped
/// for the copy; a side that is no device memory (`None` in `*_dev`) is the caller's host
/// buffer.
///
/// # Safety
/// A host side must be the application's buffer of `n` bytes (readable for `src`, writable
/// for `dst`), valid while its graph runs (the CUDA contract for memcpy nodes).
pub unsafe fn copy_now(
    issuer: u64,
    dst: u64,
    dst_dev: bool,
    src: u64,
    src_dev: bool,
    n: u64,
) -> CuResult<()> {
    let _mapped = ranges(
        issuer,
        side(src_dev.then_some(src)),
        side(dst_dev.then_some(dst)),
        n,
    )?;
    // SAFETY: device sides are mapped with the needed access (validated, kept by the guard);
    // host sides per this function's contract; `copy` tolerates overlap within one allocation.
    unsafe {
        std::ptr::copy(
            src as usize as *const u8,
            dst as usize as *mut u8,
            n as usize,
        )
    };
    Ok(())
}

/// A host or device address a queued copy carries to its worker thread. The caller keeps the
/// host buffer valid until the stream has run the copy (the CUDA contract).
#[derive(Debug, Clone, Copy)]
struct Raw(usize);

impl Raw {
    fn read(self) -> *const u8 {
        self.0 as *const u8
    }

    fn write(self) -> *mut u8 {
        self.0 as *mut u8
    }
}

/// Copies from this size on are split over [`sys::copy_threads`] threads.
const PARALLEL_COPY: usize = 8 << 20;

/// Copies `n` bytes between ranges that do not overlap, a large copy in parts on several
/// threads at once: most of a copy into fresh fake device memory is the kernel faulting its
/// pages in, and that scales with cores as a GPU's copy engines do not need to.
///
/// # Safety
/// `from` readable and `to` writable for `n` bytes, not overlapping, for the whole call.
unsafe fn move_bytes(from: Raw, to: Raw, n: usize) {
    let threads = sys::copy_threads();
    if n < PARALLEL_COPY || threads < 2 {
        // SAFETY: per this function's contract.
        unsafe { std::ptr::copy_nonoverlapping(from.read(), to.write(), n) };
        return;
    }
    let part = n.div_ceil(threads).next_multiple_of(1 << 12);
    std::thread::scope(|scope| {
        for offset in (0..n).step_by(part) {
            let len = part.min(n - offset);
            let (from, to) = (Raw(from.0 + offset), Raw(to.0 + offset));
            // SAFETY: each part lies within the ranges of this function's contract, and the
            // parts are disjoint; the scope joins every thread before the call returns.
            scope.spawn(move || unsafe {
                std::ptr::copy_nonoverlapping(from.read(), to.write(), len)
            });
        }
    });
}

/// # Safety
/// `src` must be readable for `n` bytes until the copy has run (the caller's host buffer).
pub unsafe fn htod(dst: u64, src: *const u8, n: usize, stream: Option<u64>) -> CuResult<()> {
    let (from, to) = (Raw(src as usize), Raw(dst as usize));
    transfer(stream, None, side(Some(dst)), n as u64, move || {
        // SAFETY: `dst..dst+n` is mapped writable device memory (validated, and kept so by
        // the guard); `src` is the caller's readable buffer per this function's contract.
        // Device ranges live in fakecuda reservations, so they cannot overlap it.
        unsafe { move_bytes(from, to, n) }
    })
}

/// # Safety
/// `dst` must be writable for `n` bytes until the copy has run (the caller's host buffer).
pub unsafe fn dtoh(dst: *mut u8, src: u64, n: usize, stream: Option<u64>) -> CuResult<()> {
    let (from, to) = (Raw(src as usize), Raw(dst as usize));
    transfer(stream, side(Some(src)), None, n as u64, move || {
        // SAFETY: `src..src+n` is mapped readable device memory (validated, kept by the
        // guard); `dst` is the caller's writable buffer per this function's contract (device
        // ranges live in fakecuda reservations, so they cannot overlap it).
        unsafe { move_bytes(from, to, n) }
    })
}

pub fn dtod(dst: u64, src: u64, n: usize, stream: Option<u64>) -> CuResult<()> {
    let (from, to) = (Raw(src as usize), Raw(dst as usize));
    transfer(
        stream,
        side(Some(src)),
        side(Some(dst)),
        n as u64,
        move || {
            // SAFETY: both ranges are mapped device memory with the needed access (validated,
            // kept by the guard); `copy` tolerates overlap, as cuMemcpy does within one allocation.
            unsafe { std::ptr::copy(from.read(), to.write(), n) }
        },
    )
}

/// `cuMemcpyPeer`/`cuMemcpyPeerAsync`: each side touched by its own context's device, so the
/// copy needs no peer access (the driver stages it when there is none).
pub fn peer(
    dst: u64,
    dst_ctx: u64,
    src: u64,
    src_ctx: u64,
    n: usize,
    stream: Option<u64>,
) -> CuResult<()> {
    let (from, to) = (Raw(src as usize), Raw(dst as usize));
    let src = Some(Side {
        at: src,
        by: Some(src_ctx),
    });
    let dst = Some(Side {
        at: dst,
        by: Some(dst_ctx),
    });
    transfer(stream, src, dst, n as u64, move || {
        // SAFETY: both ranges are mapped device memory with the needed access for their
        // devices (validated, kept by the guard); `copy` tolerates overlap.
        unsafe { std::ptr::copy(from.read(), to.write(), n) }
    })
}

/// `cuMemcpy`/`cuMemcpyAsync` under unified addressing: each side is device memory when it
/// lies in a mapping, host memory of the caller otherwise.
///
/// # Safety
/// A side that is not device memory must be the caller's host buffer of `n` bytes (readable
/// for `src`, writable for `dst`), valid until the copy has run.
pub unsafe fn unified(dst: u64, src: u64, n: usize, stream: Option<u64>) -> CuResult<()> {
    let (dst_dev, src_dev) = driver::with(|d| {
        Ok((
            d.vmm.mapping_at(dst).is_some(),
            d.vmm.mapping_at(src).is_some(),
        ))
    })?;
    if (!dst_dev && dst == 0) || (!src_dev && src == 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let (from, to) = (Raw(src as usize), Raw(dst as usize));
    transfer(
        stream,
        side(src_dev.then_some(src)),
        side(dst_dev.then_some(dst)),
        n as u64,
        move || {
            // SAFETY: device sides are validated mapped ranges (kept by the guard); host sides
            // are the caller's buffers per this function's contract. `copy` tolerates overlap.
            unsafe { std::ptr::copy(from.read(), to.write(), n) }
        },
    )
}

/// `cuMemsetD8/D16/D32`: `count` elements of `value`'s width at `dst` (aligned to it).
pub fn memset(
    dst: u64,
    value: u32,
    width: usize,
    count: usize,
    stream: Option<u64>,
) -> CuResult<()> {
    if !dst.is_multiple_of(width as u64) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = count
        .checked_mul(width)
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
    let to = Raw(dst as usize);
    transfer(stream, None, side(Some(dst)), bytes as u64, move || {
        let p = to.write();
        // SAFETY: `dst..dst+bytes` is mapped writable device memory (validated, kept by the
        // guard), aligned to `width` (checked above).
        unsafe {
            match width {
                1 => std::ptr::write_bytes(p, value as u8, count),
                2 => std::slice::from_raw_parts_mut(p.cast::<u16>(), count).fill(value as u16),
                _ => std::slice::from_raw_parts_mut(p.cast::<u32>(), count).fill(value),
            }
        }
    })
}

/// Fills device memory now, from whichever thread (a graph launch running on a stream's
/// worker): the range validated and kept mapped while it is written.
pub fn fill_now(issuer: u64, dst: u64, value: u32, width: usize, count: usize) -> CuResult<()> {
    if !dst.is_multiple_of(width as u64) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = count
        .checked_mul(width)
        .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)?;
    let _mapped = ranges(issuer, None, side(Some(dst)), bytes as u64)?;
    let p = dst as usize as *mut u8;
    // SAFETY: `dst..dst+bytes` is mapped writable device memory (validated, kept by the
    // guard), aligned to `width` (checked above).
    unsafe {
        match width {
            1 => std::ptr::write_bytes(p, value as u8, count),
            2 => std::slice::from_raw_parts_mut(p.cast::<u16>(), count).fill(value as u16),
            _ => std::slice::from_raw_parts_mut(p.cast::<u32>(), count).fill(value),
        }
    }
    Ok(())
}

/// Runs a host function in stream order (`cuLaunchHostFunc`, `cuStreamAddCallback`).
pub fn host_work(stream: Option<u64>, work: impl FnOnce() + Send + 'static) -> CuResult<()> {
    match target(stream)? {
        Target::Now { .. } => work(),
        Target::Queue(s) => s.submit(
            Box::new(move || {
                work();
                Ok(())
            }),
            gate::extend(),
        ),
    }
    Ok(())
}
