//! Copies and fills. The device side of every copy is validated against the mapping table
//! (mapped, and with the access the copy needs); the copy itself runs without the driver lock
//! so large transfers from several threads proceed in parallel, holding a guard that keeps
//! the validated ranges mapped until it is done ([`sys::copy_guard`]). Streams execute work
//! synchronously, so the `Async` variants complete before they return.

use crate::driver;
use crate::error::CuResult;
use crate::sys::{self, CopyGuard};

/// Validates a copy's device ranges; the guard keeps them as validated until it is dropped.
fn check(
    stream: Option<u64>,
    src_dev: Option<u64>,
    dst_dev: Option<u64>,
    n: u64,
) -> CuResult<CopyGuard> {
    driver::with(|d| {
        match stream {
            Some(s) => d.contexts.check_stream(s)?,
            None => {
                d.contexts.current()?;
            }
        }
        if let Some(s) = src_dev {
            d.check_range(s, n, false)?;
        }
        if let Some(t) = dst_dev {
            d.check_range(t, n, true)?;
        }
        // Taken under the driver lock, so no change can slip in between check and copy.
        Ok(sys::copy_guard())
    })
}

/// # Safety
/// `src` must be readable for `n` bytes (the caller's host buffer).
pub unsafe fn htod(dst: u64, src: *const u8, n: usize, stream: Option<u64>) -> CuResult<()> {
    let _mapped = check(stream, None, Some(dst), n as u64)?;
    // SAFETY: `dst..dst+n` is mapped writable device memory (checked above, and kept so by the
    // guard); `src` is the
    // caller's readable buffer per this function's contract. Ranges cannot overlap: device
    // ranges live in fakecuda reservations.
    unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, n) };
    Ok(())
}

/// # Safety
/// `dst` must be writable for `n` bytes (the caller's host buffer).
pub unsafe fn dtoh(dst: *mut u8, src: u64, n: usize, stream: Option<u64>) -> CuResult<()> {
    let _mapped = check(stream, Some(src), None, n as u64)?;
    // SAFETY: `src..src+n` is mapped readable device memory (checked above); `dst` is the
    // caller's writable buffer per this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, n) };
    Ok(())
}

pub fn dtod(dst: u64, src: u64, n: usize, stream: Option<u64>) -> CuResult<()> {
    let _mapped = check(stream, Some(src), Some(dst), n as u64)?;
    // SAFETY: both ranges are mapped device memory with the needed access (checked above);
    // `copy` tolerates overlap, as cuMemcpy does within one allocation.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    Ok(())
}

pub fn memset_d8(dst: u64, value: u8, n: usize, stream: Option<u64>) -> CuResult<()> {
    let _mapped = check(stream, None, Some(dst), n as u64)?;
    // SAFETY: `dst..dst+n` is mapped writable device memory (checked above, kept by the guard).
    unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
    Ok(())
}
