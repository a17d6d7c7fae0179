//! The green tables: what the driver holds for them, with their own methods. The
//! driver's operations on them are `crate::extras::green`.

use std::collections::HashMap;

/// The SMs a device has (what `cuDeviceGetDevResource` reports).
pub const DEVICE_SMS: u32 = 132;

#[derive(Debug, Default)]
pub struct Greens {
    /// Resource descriptors: handle → SM count.
    pub(crate) descs: HashMap<u64, u32>,
    /// Green contexts: handle → (their context, SM count).
    pub(crate) contexts: HashMap<u64, (u64, u32)>,
}
