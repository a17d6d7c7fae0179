//! What the benches share: cuda.h's allocation properties and the setup of a driver context.

use std::ffi::{c_int, c_uint, c_void};

/// `CUmemAllocationProp` (cuda.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Prop {
    pub type_: u32,
    pub handle_types: u32,
    pub location: [i32; 2],
    pub win32: *mut c_void,
    pub flags: [u8; 8],
}

/// Pinned memory on device 0, exportable as a POSIX FD.
pub const POSIX: Prop = Prop {
    type_: 1,
    handle_types: 1,
    location: [1, 0],
    win32: std::ptr::null_mut(),
    flags: [0; 8],
};

/// `cuInit` through `library` (the shim or the driver itself), then device 0's primary
/// context made current through the driver (the shim does not wrap the context calls).
pub fn init(library: &libloading::Library, driver: &libloading::Library) {
    type Init = unsafe extern "C" fn(c_uint) -> u32;
    type Retain = unsafe extern "C" fn(*mut usize, c_int) -> u32;
    type SetCurrent = unsafe extern "C" fn(usize) -> u32;
    // SAFETY: each name is looked up with its cuda.h prototype and called with valid
    // pointers to locals.
    unsafe {
        let init: Init = *library.get(b"cuInit\0").unwrap();
        assert_eq!(init(0), 0);
        let retain: Retain = *driver.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
        let set: SetCurrent = *driver.get(b"cuCtxSetCurrent\0").unwrap();
        let mut ctx = 0;
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set(ctx), 0);
    }
}
