//! Native checkpoint: `cuCheckpointProcess*` act on another process's driver.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use super::{run, write_out};
use crate::checkpoint::{self, wire::Op};
use crate::error::{CUDA_SUCCESS, CuError, CuResult, RawResult};
use cudarc::driver::sys::{
    CUcheckpointCheckpointArgs, CUcheckpointLockArgs, CUcheckpointRestoreArgs,
    CUcheckpointUnlockArgs, CUuuid,
};
use std::ffi::{c_int, c_uint};

/// Reads an optional args struct and checks its reserved bytes are zero.
///
/// # Safety
/// `args` is null or points at a readable `T`.
unsafe fn reserved_zero<T: Copy>(args: *const T, skip: usize) -> CuResult<Option<T>> {
    if args.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null, readable per the caller; viewed as bytes of a plain C struct.
    let bytes = unsafe { std::slice::from_raw_parts(args.cast::<u8>(), size_of::<T>()) };
    if bytes[skip..].iter().any(|b| *b != 0) {
        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: as above; the struct holds only integers and pointers.
    Ok(Some(unsafe { args.read() }))
}

export! {
    fn cuCheckpointProcessGetState(pid: c_int, state: *mut c_uint) {
        // SAFETY: CUprocessState out-parameter (a C enum: u32).
        run(|| unsafe { write_out(state, || checkpoint::client::get_state(pid)) })
    }

    /// The thread of `pid` that serves checkpoint requests (fakecuda's control thread): CRIU's
    /// CUDA plugin lets it run while it holds the rest of the process stopped.
    fn cuCheckpointProcessGetRestoreThreadId(pid: c_int, tid: *mut c_int) {
        // SAFETY: an int out-parameter.
        run(|| unsafe { write_out(tid, || checkpoint::client::restore_thread(pid)) })
    }

    fn cuCheckpointProcessLock(pid: c_int, args: *mut CUcheckpointLockArgs) {
        run(|| {
            // SAFETY: optional CUcheckpointLockArgs (cuda.h); only timeoutMs may be non-zero.
            let a = unsafe { reserved_zero(args, 4) }?;
            let timeout = a.map_or(0, |a| a.timeoutMs);
            checkpoint::client::simple(pid, Op::Lock, u64::from(timeout))
        })
    }

    fn cuCheckpointProcessCheckpoint(pid: c_int, args: *mut CUcheckpointCheckpointArgs) {
        run(|| {
            // SAFETY: optional CUcheckpointCheckpointArgs (cuda.h): reserved, must be zero.
            unsafe { reserved_zero(args, 0) }?;
            checkpoint::client::simple(pid, Op::Checkpoint, 0)
        })
    }

    fn cuCheckpointProcessRestore(pid: c_int, args: *mut CUcheckpointRestoreArgs) {
        run(|| {
            let mut pairs = Vec::new();
            if !args.is_null() {
                // SAFETY: optional CUcheckpointRestoreArgs (cuda.h, CUDA 13 layout).
                let a = unsafe { args.read() };
                let count = a.gpuPairsCount as usize;
                if count > 0 {
                    if a.gpuPairs.is_null() || count > crate::device::MAX_DEVICES as usize {
                        return Err(CuError::CUDA_ERROR_INVALID_VALUE);
                    }
                    // SAFETY: the caller passes `gpuPairsCount` pairs at `gpuPairs` (cuda.h).
                    let given = unsafe { std::slice::from_raw_parts(a.gpuPairs, count) };
                    let bytes = |u: &CUuuid| u.bytes.map(|b| b as u8);
                    pairs = given
                        .iter()
                        .map(|p| (bytes(&p.oldUuid), bytes(&p.newUuid)))
                        .collect();
                }
            }
            checkpoint::client::restore(pid, pairs)
        })
    }

    fn cuCheckpointProcessUnlock(pid: c_int, args: *mut CUcheckpointUnlockArgs) {
        run(|| {
            // SAFETY: optional CUcheckpointUnlockArgs (cuda.h): reserved, must be zero.
            unsafe { reserved_zero(args, 0) }?;
            checkpoint::client::simple(pid, Op::Unlock, 0)
        })
    }
}

const _: () = assert!(CUDA_SUCCESS == 0);
