//! Running driver work in a recorded context, from whichever thread does it (the control
//! worker has no context of its own).

use super::table::Driver;
use crate::sys::error::CuResult;

/// The calling thread's current context, 0 when there is none or the driver cannot say.
pub fn current(d: &Driver) -> usize {
    d.ctx_current().unwrap_or(0)
}

pub fn current_device(d: &Driver) -> CuResult<i32> {
    d.ctx_device()
}

/// Runs `body` as work of `device`: with `ctx` current when it is a context of `device`,
/// otherwise (0, or a context of another device) with the primary context of `device`; then
/// restores the previous context. `body`'s error wins over a cleanup error.
///
/// A copy is the work of the current context's device, which needs access to the memory: an
/// allocation made on one device while another device's context was current is copied in
/// its own device's context.
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
        d.primary_ctx_retain(device)?
    };
    let mut switched = target != previous;
    if switched {
        d.ctx_set_current(target)?;
    }
    let result = (|| {
        if ctx != 0 && d.ctx_device()? != device {
            d.ctx_set_current(d.primary_ctx_retain(device)?)?;
            switched = true;
        }
        body()
    })();
    let restored = if switched {
        d.ctx_set_current(previous)
    } else {
        Ok(())
    };
    let value = result?;
    restored?;
    Ok(value)
}
