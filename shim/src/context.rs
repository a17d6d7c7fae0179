//! Running driver work in a recorded context, from whichever thread does it (the control
//! worker has no context of its own).

use crate::driver::Driver;
use crate::driver::call;
use crate::error::CuResult;

pub fn current(d: &Driver) -> usize {
    let mut ctx = 0usize;
    match call!(d, cuCtxGetCurrent(&mut ctx)) {
        Ok(()) => ctx,
        Err(_) => 0,
    }
}

pub fn current_device(d: &Driver) -> CuResult<i32> {
    let mut device = 0;
    call!(d, cuCtxGetDevice(&mut device))?;
    Ok(device)
}

/// Runs `body` with `ctx` current (or, when `ctx` is 0, the primary context of `device`),
/// then restores the previous context. `body`'s error wins over a cleanup error.
///
/// A primary context retained here stays retained: releasing the last reference would
/// destroy it, and with it streams and state the restored memory may still need.
pub fn run<T>(
    d: &Driver,
    ctx: usize,
    device: i32,
    body: impl FnOnce() -> CuResult<T>,
) -> CuResult<T> {
    let previous = current(d);
    let target = if ctx != 0 {
        ctx
    } else {
        let mut primary = 0usize;
        call!(d, cuDevicePrimaryCtxRetain(&mut primary, device))?;
        primary
    };
    if target != previous {
        call!(d, cuCtxSetCurrent(target))?;
    }
    let result = body();
    let restored = if target != previous {
        call!(d, cuCtxSetCurrent(previous))
    } else {
        Ok(())
    };
    let value = result?;
    restored?;
    Ok(value)
}
