//! VMM steps the shim performs for itself (a `cuMemAlloc` region, a carrier's temporary
//! alias): a whole allocation mapped read-write for one device in a fresh reservation.

use super::table::Driver;
use crate::sys::abi::{RawAccessDesc, RawLocation, consts};
use crate::sys::error::{CuError, CuResult};

/// Reserves `size` bytes, maps `raw` there and grants `device` read-write; undoes what it did
/// on failure. Returns the address.
pub fn map_read_write(d: &Driver, raw: u64, size: u64, device: i32) -> CuResult<u64> {
    let size = usize::try_from(size).map_err(|_| CuError::OUT_OF_MEMORY)?;
    let address = d.address_reserve(size)?;
    let grant = RawAccessDesc {
        location: RawLocation {
            type_: consts::LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: consts::ACCESS_READWRITE,
    };
    let mapped = d.mem_map(address, size, 0, raw, 0);
    let granted = mapped.and_then(|()| d.mem_set_access(address, size, &[grant]));
    if let Err(e) = granted {
        if mapped.is_ok() {
            let _ = d.mem_unmap(address, size);
        }
        let _ = d.address_free(address, size);
        return Err(e);
    }
    Ok(address)
}

/// Undoes [`map_read_write`]: unmaps and frees the reservation (both attempted; the first
/// error wins).
pub fn unmap_and_free(d: &Driver, address: u64, size: usize) -> CuResult<()> {
    let unmapped = d.mem_unmap(address, size);
    let freed = d.address_free(address, size);
    unmapped.and(freed)
}
