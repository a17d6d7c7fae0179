//! User objects (see [`crate::state::extras::user_object`]). Every entry point that may drop a last
//! reference runs the destructors due once the driver lock is released.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::graphs::h;
use super::{gated, handle_ptr, with, with_out};
use crate::driver::{self, DriverState};
use crate::error::{CuResult, RawResult};
use cudarc::driver::sys::{CUgraph, CUuserObject, CUuserObject_st};
use std::ffi::{c_uint, c_void};

/// Runs `f` under the driver lock, then the destructors it made due, on this thread.
pub(super) fn releasing(f: impl FnOnce(&mut DriverState) -> CuResult<()>) -> RawResult {
    gated(|| {
        let done = driver::with(f);
        let due = driver::with(|d| Ok(d.user_objects.take_pending()))?;
        for (destroy, ptr) in due {
            // SAFETY: the application's CUhostFn and its pointer, given to cuUserObjectCreate
            // to be called once when the object's last reference goes (cuda.h).
            let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(destroy) };
            // SAFETY: as above.
            unsafe { f(ptr as *mut c_void) };
        }
        done
    })
}

/// `CUhostFn`.
type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

export! {
    fn cuUserObjectCreate(
        out: *mut CUuserObject,
        ptr: *mut c_void,
        destroy: HostFn,
        initial: c_uint,
        flags: c_uint,
    ) -> out |d| {
        let handle = d.next_handle();
        let destroy = destroy.map_or(0, |f| f as usize);
        d.user_objects
            .create(handle, ptr as usize, destroy, initial, flags)?;
        Ok(handle_ptr::<CUuserObject_st>(handle))
    }

    safe fn cuUserObjectRetain(object: CUuserObject, count: c_uint) {
        with(|d| d.user_objects.retain(h(object), count))
    }

    safe fn cuUserObjectRelease(object: CUuserObject, count: c_uint) {
        releasing(|d| d.user_objects.release(h(object), u64::from(count)))
    }

    safe fn cuGraphRetainUserObject(
        graph: CUgraph,
        object: CUuserObject,
        count: c_uint,
        flags: c_uint,
    ) {
        with(|d| {
            d.graphs.graph_id(h(graph))?;
            d.user_objects
                .graph_retain(h(graph), h(object), count, flags)
        })
    }

    safe fn cuGraphReleaseUserObject(graph: CUgraph, object: CUuserObject, count: c_uint) {
        releasing(|d| {
            d.graphs.graph_id(h(graph))?;
            d.user_objects.graph_release(h(graph), h(object), count)
        })
    }
}
