//! VMM steps the shim performs for itself (a `cuMemAlloc` region, a carrier's temporary
//! alias): a whole allocation mapped read-write for one device in a fresh reservation.

use crate::abi::{RawAccessDesc, RawLocation, consts};
use crate::driver::{Driver, call};
use crate::error::{CuError, CuResult};

/// Reserves `size` bytes, maps `raw` there and grants `device` read-write; undoes what it did
/// on failure. Returns the address.
pub fn map_read_write(d: &Driver, raw: u64, size: u64, device: i32) -> CuResult<u64> {
    let size = usize::try_from(size).map_err(|_| CuError::OUT_OF_MEMORY)?;
    let mut address = 0;
    call!(d, cuMemAddressReserve(&mut address, size, 0, 0, 0))?;
    let grant = RawAccessDesc {
        location: RawLocation {
            type_: consts::LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: consts::ACCESS_READWRITE,
    };
    let mapped = call!(d, cuMemMap(address, size, 0, raw, 0));
    let granted = mapped.and_then(|()| call!(d, cuMemSetAccess(address, size, &grant, 1)));
    if let Err(e) = granted {
        if mapped.is_ok() {
            let _ = call!(d, cuMemUnmap(address, size));
        }
        let _ = call!(d, cuMemAddressFree(address, size));
        return Err(e);
    }
    Ok(address)
}

/// Undoes [`map_read_write`]: unmaps and frees the reservation (both attempted; the first
/// error wins).
pub fn unmap_and_free(d: &Driver, address: u64, size: usize) -> CuResult<()> {
    let unmapped = call!(d, cuMemUnmap(address, size));
    let freed = call!(d, cuMemAddressFree(address, size));
    unmapped.and(freed)
}
