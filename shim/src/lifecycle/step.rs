//! What the lifecycle's operations share: their error type, and mapping a recorded object
//! back at its original addresses.

use crate::driver::Driver;
use crate::state::registry::{Kind, Registry};
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};

/// A failure inside an operation, naming the object.
pub type Step<T> = Result<T, String>;

pub fn at(what: impl FnOnce() -> String) -> impl FnOnce(CuError) -> String {
    move |e| format!("{}: {e}", what())
}

/// Maps every recorded mapping of `id` at its original address and restores its access.
pub fn remap(
    d: &Driver,
    r: &Registry,
    id: &cuinterpose_protocol::AllocationId,
    raw: u64,
    kind: Kind,
) -> CuResult<()> {
    for (&base, m) in r
        .mappings
        .iter()
        .filter(|(_, m)| m.id == *id && m.kind == kind)
    {
        d.mem_map(base, m.size as usize, m.offset as usize, raw, m.flags)?;
        if !m.access.is_empty() {
            let descriptors: Vec<_> = m.access.iter().map(convert::raw_access).collect();
            d.mem_set_access(base, m.size as usize, &descriptors)?;
        }
    }
    Ok(())
}
