//! The machine's GPUs as this process's driver lists them: what a checkpoint records and a
//! restore onto other GPUs pairs against. Ordinals are the coordinator's own, so its
//! `CUDA_VISIBLE_DEVICES` should be unset (then they are the machine's indices).

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::{NativeDriver, NativeError};

/// One GPU of the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineDevice {
    pub ordinal: i32,
    pub uuid: [u8; 16],
    /// `cuDeviceGetName`: the model.
    pub name: String,
    /// `cuDeviceTotalMem`.
    pub memory: u64,
    /// `cuMemGetInfo`'s free bytes, in the device's primary context (when asked for; else
    /// the total).
    pub free: u64,
}

type InitFn = unsafe extern "C" fn(c_uint) -> c_uint;
type CountFn = unsafe extern "C" fn(*mut c_int) -> c_uint;
type UuidFn = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_uint;
type NameFn = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_uint;
type TotalFn = unsafe extern "C" fn(*mut usize, c_int) -> c_uint;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_uint;
type ReleaseFn = unsafe extern "C" fn(c_int) -> c_uint;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> c_uint;
type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> c_uint;

impl NativeDriver {
    fn device_entry<T: Copy>(&self, name: &'static str) -> Result<T, NativeError> {
        // SAFETY: each caller names a driver function with the C signature `T` that cuda.h
        // declares for it.
        unsafe { self.library.get::<T>(name.as_bytes()) }
            .map(|entry| *entry)
            .map_err(|error| NativeError::MissingSymbol {
                path: self.path.clone(),
                symbol: name,
                message: error.to_string(),
            })
    }

    fn device_call(&self, call: &'static str, code: c_uint) -> Result<(), NativeError> {
        if code == 0 {
            return Ok(());
        }
        Err(NativeError::Devices {
            call,
            name: self.error_name(code),
        })
    }

    /// Every GPU this process's driver sees; with `measure`, also its free memory (which takes
    /// a primary context on each, released again).
    pub fn devices(&self, measure: bool) -> Result<Vec<MachineDevice>, NativeError> {
        let init: InitFn = self.device_entry("cuInit")?;
        let count_of: CountFn = self.device_entry("cuDeviceGetCount")?;
        let uuid_of: UuidFn = self.device_entry("cuDeviceGetUuid_v2")?;
        let name_of: NameFn = self.device_entry("cuDeviceGetName")?;
        let total_of: TotalFn = self.device_entry("cuDeviceTotalMem_v2")?;
        let retain: RetainFn = self.device_entry("cuDevicePrimaryCtxRetain")?;
        let release: ReleaseFn = self.device_entry("cuDevicePrimaryCtxRelease_v2")?;
        let set_current: SetCurrentFn = self.device_entry("cuCtxSetCurrent")?;
        let info: InfoFn = self.device_entry("cuMemGetInfo_v2")?;
        // SAFETY: each call below is the driver's function of that prototype, and every pointer
        // argument points at a live local of the type cuda.h asks for.
        let code = unsafe { init(0) };
        self.device_call("cuInit", code)?;
        let mut count: c_int = 0;
        // SAFETY: as above.
        let code = unsafe { count_of(&mut count) };
        self.device_call("cuDeviceGetCount", code)?;
        let mut devices = Vec::new();
        for ordinal in 0..count {
            let mut uuid = [0u8; 16];
            // SAFETY: as above.
            let code = unsafe { uuid_of(&mut uuid, ordinal) };
            self.device_call("cuDeviceGetUuid_v2", code)?;
            let mut name = [0 as c_char; 256];
            // SAFETY: as above; the driver writes at most `len` bytes, NUL included.
            let code = unsafe { name_of(name.as_mut_ptr(), name.len() as c_int, ordinal) };
            self.device_call("cuDeviceGetName", code)?;
            let mut total = 0usize;
            // SAFETY: as above.
            let code = unsafe { total_of(&mut total, ordinal) };
            self.device_call("cuDeviceTotalMem_v2", code)?;
            let total = total as u64;
            let mut free = total as usize;
            if measure {
                let mut context: *mut c_void = std::ptr::null_mut();
                // SAFETY: as above.
                let code = unsafe { retain(&mut context, ordinal) };
                self.device_call("cuDevicePrimaryCtxRetain", code)?;
                let mut all = 0usize;
                // SAFETY: as above.
                let code = unsafe { set_current(context) };
                let measured = self.device_call("cuCtxSetCurrent", code).and_then(|()| {
                    // SAFETY: as above.
                    let code = unsafe { info(&mut free, &mut all) };
                    self.device_call("cuMemGetInfo_v2", code)
                });
                // Leave no context behind, whatever the measurement did.
                // SAFETY: as above (a null context unbinds the thread's).
                let _ = unsafe { set_current(std::ptr::null_mut()) };
                // SAFETY: as above.
                let _ = unsafe { release(ordinal) };
                measured?;
            }
            let bytes: Vec<u8> = name
                .iter()
                .take_while(|c| **c != 0)
                .map(|c| *c as u8)
                .collect();
            devices.push(MachineDevice {
                ordinal,
                uuid,
                name: String::from_utf8_lossy(&bytes).into_owned(),
                memory: total,
                free: free as u64,
            });
        }
        Ok(devices)
    }
}
