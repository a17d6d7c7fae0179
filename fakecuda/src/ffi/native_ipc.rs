//! Native memory IPC (`cuIpc*`), and fakecuda's own introspection entry points.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{gated, handle_ptr, put, run, with, with_out};
use crate::driver::{self};
use crate::error::{CuError, RawResult};
use crate::ipc;
use cudarc::driver::sys::{CUdeviceptr, CUipcMemHandle};
use std::ffi::{c_char, c_uint};

use crate::abi::FakecudaObjects;

export! {
    /// Fills `out` with what the driver holds for this process. Not a CUDA API: fakecuda's test
    /// hook (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`).
    fn fakecuda_objects(out: *mut FakecudaObjects) {
        run(|| {
            let objects = driver::with(|d| Ok(d.objects()))?;
            // SAFETY: out-parameter of the caller.
            unsafe { put(out, objects) }
        })
    }
}

/// How many times this process called cuIpcGetMemHandle, cuIpcOpenMemHandle_v2 or
/// cuIpcCloseMemHandle (successful or not). Not a CUDA API: fakecuda's test hook.
#[unsafe(no_mangle)]
pub extern "C" fn fakecuda_native_ipc_calls() -> u64 {
    crate::state::ipc::calls()
}

export! {
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        crate::state::ipc::count_call();
        // SAFETY: CUipcMemHandle out-parameter (cuda.h).
        unsafe {
            with_out(handle, |d| {
                let bytes = d.ipc_get(dptr)?;
                let reserved = bytes.map(|b| b as c_char);
                Ok(CUipcMemHandle { reserved })
            })
        }
    }

    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) {
        crate::state::ipc::count_call();
        gated(|| {
            if pdptr.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let bytes = handle.reserved.map(|b| b as u8);
            let p = ipc::open(&bytes, flags)?;
            // SAFETY: CUdeviceptr out-parameter (cuda.h), non-null.
            unsafe { put(pdptr, p) }
        })
    }

    safe fn cuIpcCloseMemHandle(dptr: CUdeviceptr) {
        crate::state::ipc::count_call();
        with(|d| d.ipc_close(dptr))
    }

    /// The pre-11.0 name, the same ABI (the CUDA runtime asks for it at 4.1).
    fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) {
        // SAFETY: same contract as the _v2 entry point.
        unsafe { cuIpcOpenMemHandle_v2(pdptr, handle, flags) }
    }
}

/// `CUipcEventHandle`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawIpcEventHandle {
    reserved: [u8; crate::state::ipc_event::HANDLE_BYTES],
}

export! {
    fn cuIpcGetEventHandle(
        out: *mut RawIpcEventHandle,
        e: cudarc::driver::sys::CUevent,
    ) -> out |d| {
        d.event_ipc_handle(e as usize as u64)
            .map(|reserved| RawIpcEventHandle { reserved })
    }

    /// `cuIpcOpenEventHandle`: another process's interprocess event, its page fetched from the
    /// creator's control socket and mapped here; a new event of this process each time.
    fn cuIpcOpenEventHandle(out: *mut cudarc::driver::sys::CUevent, handle: RawIpcEventHandle) {
        gated(|| {
            if out.is_null() {
                return Err(CuError::CUDA_ERROR_INVALID_VALUE);
            }
            let (pid, remote) = crate::state::ipc_event::decode(&handle.reserved)?;
            driver::with(|d| d.contexts.current().map(drop))?;
            if pid == std::process::id() {
                // Opening one's own handle fails, as for memory handles.
                return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
            }
            let fd = crate::checkpoint::client::fetch_ipc_fd(pid, remote)?;
            let shared = crate::state::ipc_event::SharedMarks::open(fd)?;
            let flags = crate::state::stream::EVENT_INTERPROCESS | crate::state::stream::EVENT_DISABLE_TIMING;
            driver::with(|d| {
                let h = d.next_handle();
                d.events
                    .insert(h, crate::state::stream::Event::with_marks(flags, Some(shared)));
                // SAFETY: CUevent out-parameter (cuda.h), non-null.
                unsafe { put(out, handle_ptr::<cudarc::driver::sys::CUevent_st>(h)) }
            })
        })
    }
}
