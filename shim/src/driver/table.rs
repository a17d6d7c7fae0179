//! The real driver's table: loaded once, resolved through glibc's `dlsym`, and the `call!`
//! macro the floor's safe methods (and the FFI edge) use.

use super::os;
use crate::sys::abi::{RawAccessDesc, RawAllocProp, RawLocation, RawMulticastProp, RawPoolProps};
use crate::sys::error::{CuError, CuResult};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::sys::settings;
pub use crate::sys::settings::DRIVER_VARIABLE;

macro_rules! table {
    ($($name:ident: fn($($arg:ty),*);)*) => {
        /// Entry points of the real driver; `None` where the driver lacks one.
        #[allow(non_snake_case)]
        #[derive(Debug, Clone, Copy)]
        pub struct Driver {
            /// The driver library (kept open for the life of the process).
            pub library: os::Library,
            $(pub $name: Option<unsafe extern "C" fn($($arg),*) -> u32>,)*
        }

        impl Driver {
            fn resolve(library: os::Library) -> Self {
                Driver {
                    library,
                    $($name: {
                        let p = library.symbol(
                            // The literal ends in its NUL, so the conversion cannot fail.
                            std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes())
                                .expect("NUL-terminated"),
                        );
                        // SAFETY: a non-null result is the driver's function of that name,
                        // whose C prototype (cuda.h) is the declared one.
                        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> u32>(p) })
                    },)*
                }
            }
        }
    };
}

table! {
    cuInit: fn(c_uint);
    cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64);
    cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint);
    cuDeviceGetAttribute: fn(*mut c_int, c_int, c_int);
    cuDeviceGetCount: fn(*mut c_int);
    cuDeviceGetName: fn(*mut c_char, c_int, c_int);
    cuDeviceGetUuid_v2: fn(*mut [u8; 16], c_int);
    cuDeviceTotalMem_v2: fn(*mut usize, c_int);
    cuDevicePrimaryCtxRetain: fn(*mut usize, c_int);
    cuDevicePrimaryCtxRelease_v2: fn(c_int);
    cuDevicePrimaryCtxReset_v2: fn(c_int);
    cuCtxDestroy_v2: fn(usize);
    cuCtxGetCurrent: fn(*mut usize);
    cuCtxSetCurrent: fn(usize);
    cuCtxGetDevice: fn(*mut c_int);
    cuCtxSynchronize: fn();
    cuCtxEnablePeerAccess: fn(usize, c_uint);
    cuCtxDisablePeerAccess: fn(usize);
    cuStreamCreate: fn(*mut usize, c_uint);
    cuStreamSynchronize: fn(usize);
    cuStreamDestroy_v2: fn(usize);
    cuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64);
    cuMemAddressFree: fn(u64, usize);
    cuMemCreate: fn(*mut u64, usize, *const RawAllocProp, u64);
    cuMemRelease: fn(u64);
    cuMemRetainAllocationHandle: fn(*mut u64, *mut c_void);
    cuMemMap: fn(u64, usize, usize, u64, u64);
    cuMemUnmap: fn(u64, usize);
    cuMemSetAccess: fn(u64, usize, *const RawAccessDesc, usize);
    cuMemGetAllocationGranularity: fn(*mut usize, *const RawAllocProp, c_uint);
    cuMemGetAllocationPropertiesFromHandle: fn(*mut RawAllocProp, u64);
    cuMemExportToShareableHandle: fn(*mut c_void, u64, c_uint, u64);
    cuMemImportFromShareableHandle: fn(*mut u64, *mut c_void, c_uint);
    cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister: fn(*mut c_void);
    cuMemcpyDtoHAsync_v2: fn(*mut c_void, u64, usize, usize);
    cuMemcpyHtoDAsync_v2: fn(u64, *const c_void, usize, usize);
    cuMemAlloc_v2: fn(*mut u64, usize);
    cuMemFree_v2: fn(u64);
    cuMemGetAddressRange_v2: fn(*mut u64, *mut usize, u64);
    cuMulticastCreate: fn(*mut u64, *const RawMulticastProp);
    cuMulticastAddDevice: fn(u64, c_int);
    cuMulticastBindMem: fn(u64, usize, u64, usize, usize, u64);
    cuMulticastBindMem_v2: fn(u64, c_int, usize, u64, usize, usize, u64);
    cuMulticastBindAddr: fn(u64, usize, u64, usize, u64);
    cuMulticastBindAddr_v2: fn(u64, c_int, usize, u64, usize, u64);
    cuMulticastUnbind: fn(u64, c_int, usize, usize);
    cuMulticastGetGranularity: fn(*mut usize, *const RawMulticastProp, c_uint);
    cuMemPoolExportToShareableHandle: fn(*mut c_void, usize, c_uint, u64);
    cuMemPoolImportFromShareableHandle: fn(*mut usize, *mut c_void, c_uint, u64);
    cuMemPoolDestroy: fn(usize);
    cuMemPoolCreate: fn(*mut usize, *const RawPoolProps);
    cuMemPoolSetAttribute: fn(usize, c_uint, *mut c_void);
    cuMemPoolGetAttribute: fn(usize, c_uint, *mut c_void);
    cuMemPoolSetAccess: fn(usize, *const RawAccessDesc, usize);
    cuMemPoolGetAccess: fn(*mut c_uint, usize, *mut RawLocation);
    cuMemPoolTrimTo: fn(usize, usize);
    cuMemPoolExportPointer: fn(*mut c_void, u64);
    cuMemPoolImportPointer: fn(*mut u64, usize, *mut c_void);
    cuMemAllocFromPoolAsync: fn(*mut u64, usize, usize, usize);
    cuMemAllocFromPoolAsync_ptsz: fn(*mut u64, usize, usize, usize);
    cuMemAllocAsync: fn(*mut u64, usize, usize);
    cuMemAllocAsync_ptsz: fn(*mut u64, usize, usize);
    cuMemFreeAsync: fn(u64, usize);
    cuMemFreeAsync_ptsz: fn(u64, usize);
    cuDeviceSetMemPool: fn(c_int, usize);
    cuDeviceGetMemPool: fn(*mut usize, c_int);
    cuMemSetMemPool: fn(*mut RawLocation, c_uint, usize);
    cuMemGetMemPool: fn(*mut usize, *mut RawLocation, c_uint);
    cuPointerGetAttribute: fn(*mut c_void, c_uint, u64);
    cuPointerGetAttributes: fn(c_uint, *mut c_uint, *mut *mut c_void, u64);
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver table, loading it on first use. A driver that cannot be loaded gives
/// `CUDA_ERROR_NOT_INITIALIZED` (logged once).
#[inline]
pub fn driver() -> CuResult<&'static Driver> {
    match DRIVER.get_or_init(load) {
        Ok(driver) => Ok(driver),
        Err(_) => Err(CuError::NOT_INITIALIZED),
    }
}

fn load() -> Result<Driver, String> {
    let path = settings::driver_library().to_vec();
    let shown = String::from_utf8_lossy(&path).into_owned();
    let opened = os::c_path(path)
        .map_err(|why| format!("{DRIVER_VARIABLE}={shown:?} {why}"))
        .and_then(|path| {
            os::Library::open(&path).map_err(|reason| format!("dlopen({shown}) failed: {reason}"))
        });
    match opened {
        Ok(library) => Ok(Driver::resolve(library)),
        Err(message) => {
            crate::log!("cannot load the CUDA driver: {message}");
            Err(message)
        }
    }
}

/// Calls a driver entry point: `NOT_INITIALIZED` when the driver lacks it, else its result.
/// Used by this floor's safe methods and by the FFI edge, which forwards the application's own
/// pointers; a tidy test keeps it out of every other floor.
///
/// The arguments are evaluated inside the `unsafe` block; every call site passes plain values
/// or pointers to locals (or pointers the application handed in), never an unsafe expression.
macro_rules! call {
    ($driver:expr, $name:ident($($arg:expr),* $(,)?)) => {{
        match $driver.$name {
            // SAFETY: the pointer is the driver's own function with this prototype (see
            // `Driver::resolve`); every argument is what cuda.h asks for, and pointer
            // arguments point at live locals or application memory the caller vouched for.
            Some(f) => $crate::sys::error::CuError::check(unsafe { f($($arg),*) }),
            None => Err($crate::sys::error::CuError::NOT_INITIALIZED),
        }
    }};
}
pub(crate) use call;
