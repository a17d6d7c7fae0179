//! User objects (`cuUserObjectCreate`): an application pointer and its destructor, reference
//! counted by the application, by graphs that retain them and by executable graphs made from
//! those graphs. When the last reference goes, the destructor is queued; the entry points run
//! it once the driver lock is released (CUDA runs it on a thread of its own; it may call no
//! CUDA function either way).

use crate::error::{CuError, CuResult};
use std::collections::HashMap;

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the one flag and a required one.
pub(crate) const NO_DESTRUCTOR_SYNC: u32 = 1;

/// `CU_GRAPH_USER_OBJECT_MOVE`: the caller's references move to the graph.
pub(crate) const MOVE: u32 = 1;

#[derive(Debug)]
pub(crate) struct UserObject {
    pub(crate) destroy: usize,
    pub(crate) ptr: usize,
    pub(crate) refs: u64,
}

/// A destructor due to run: the application's function and its pointer.
pub type Destructor = (usize, usize);

#[derive(Debug, Default)]
pub struct UserObjects {
    pub(crate) objects: HashMap<u64, UserObject>,
    /// References each graph or executable graph holds: (owner, object) → count.
    pub(crate) held: HashMap<(u64, u64), u64>,
    /// Destructors of objects whose last reference went, to run outside the driver lock.
    pub(crate) pending: Vec<Destructor>,
}

impl UserObjects {
    /// `cuUserObjectCreate`.
    pub fn create(
        &mut self,
        handle: u64,
        ptr: usize,
        destroy: usize,
        refs: u32,
        flags: u32,
    ) -> CuResult<()> {
        if destroy == 0 || refs == 0 || flags != NO_DESTRUCTOR_SYNC {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.objects.insert(
            handle,
            UserObject {
                destroy,
                ptr,
                refs: u64::from(refs),
            },
        );
        Ok(())
    }

    pub(crate) fn object(&mut self, h: u64) -> CuResult<&mut UserObject> {
        self.objects
            .get_mut(&h)
            .ok_or(CuError::CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuUserObjectRetain`.
    pub fn retain(&mut self, h: u64, count: u32) -> CuResult<()> {
        if count == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        self.object(h)?.refs += u64::from(count);
        Ok(())
    }

    /// `cuUserObjectRelease`: more than it holds is `CUDA_ERROR_INVALID_VALUE`.
    pub fn release(&mut self, h: u64, count: u64) -> CuResult<()> {
        let o = self.object(h)?;
        if count == 0 || count > o.refs {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        o.refs -= count;
        if o.refs == 0 {
            let o = self.objects.remove(&h).expect("looked up above");
            self.pending.push((o.destroy, o.ptr));
        }
        Ok(())
    }

    /// `cuGraphRetainUserObject`: `count` references for `graph`, new ones or (`MOVE`) the
    /// caller's.
    pub fn graph_retain(&mut self, graph: u64, h: u64, count: u32, flags: u32) -> CuResult<()> {
        if count == 0 || flags > MOVE {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let o = self.object(h)?;
        if flags & MOVE == 0 {
            o.refs += u64::from(count);
        } else if o.refs < u64::from(count) {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        *self.held.entry((graph, h)).or_default() += u64::from(count);
        Ok(())
    }

    /// `cuGraphReleaseUserObject`: at most what the graph holds.
    pub fn graph_release(&mut self, graph: u64, h: u64, count: u32) -> CuResult<()> {
        let count = u64::from(count);
        match self.held.get_mut(&(graph, h)) {
            Some(n) if count > 0 && *n >= count => *n -= count,
            _ => return Err(CuError::CUDA_ERROR_INVALID_VALUE),
        }
        self.held.retain(|_, n| *n > 0);
        self.release(h, count)
    }

    /// An executable graph made from `graph` holds what the graph holds, until it is destroyed.
    pub fn exec_retain(&mut self, graph: u64, exec: u64) {
        for (h, n) in self.held_by(graph) {
            if let Some(o) = self.objects.get_mut(&h) {
                o.refs += n;
                *self.held.entry((exec, h)).or_default() += n;
            }
        }
    }

    /// A graph or executable graph went: every reference it held goes.
    pub fn owner_gone(&mut self, owner: u64) {
        let held = self.held_by(owner);
        self.held.retain(|(o, _), _| *o != owner);
        for (h, n) in held {
            let _ = self.release(h, n);
        }
    }

    /// What `owner` holds: (object, references).
    pub(crate) fn held_by(&self, owner: u64) -> Vec<(u64, u64)> {
        self.held
            .iter()
            .filter(|((o, _), _)| *o == owner)
            .map(|((_, h), n)| (*h, *n))
            .collect()
    }

    /// The destructors now due.
    pub fn take_pending(&mut self) -> Vec<Destructor> {
        std::mem::take(&mut self.pending)
    }
}
