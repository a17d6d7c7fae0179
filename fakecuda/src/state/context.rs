//! Contexts (primary and created), the per-thread context stack and streams.
//!
//! Handles given to the application are opaque numbers, never dereferenced.

use crate::error::{CuError, CuResult};
use crate::state::stream::{self, Stream};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Primary context handles are `PRIMARY_BASE + ordinal`, stable for the process lifetime as in
/// CUDA (a released and re-retained primary context has the same handle).
pub(crate) const PRIMARY_BASE: u64 = 0x100;

#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) device: u32,
    /// Primary contexts: retain count; created contexts: always 1 while alive.
    pub(crate) refs: u32,
    pub(crate) primary: bool,
}

#[derive(Debug)]
pub struct Contexts {
    pub(crate) table: HashMap<u64, Context>,
    pub(crate) streams: HashMap<u64, Arc<Stream>>,
    /// (accessing context, peer context) pairs of `cuCtxEnablePeerAccess`.
    pub(crate) peers: BTreeSet<(u64, u64)>,
}

/// Who touches device memory in a copy or fill: the context it was issued in (the stream's,
/// or the current one for the default streams) and that context's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actor {
    pub ctx: u64,
    pub device: u32,
}

/// Where a stream's work runs (see [`crate::state::stream`]).
#[derive(Debug)]
pub enum Target {
    /// A default stream: synchronously, in the caller, once `drain` has drained.
    Now { ctx: u64, drain: Vec<Arc<Stream>> },
    /// A created stream's worker.
    Queue(Arc<Stream>),
}

thread_local! {
    /// The calling thread's context stack; the last entry is current.
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

impl Contexts {
    pub fn new(devices: u32) -> Contexts {
        let table = (0..devices)
            .map(|d| {
                (
                    PRIMARY_BASE + u64::from(d),
                    Context {
                        device: d,
                        refs: 0,
                        primary: true,
                    },
                )
            })
            .collect();
        Contexts {
            table,
            streams: HashMap::new(),
            peers: BTreeSet::new(),
        }
    }

    /// The live context `ctx` as the actor of work issued in it.
    pub fn actor(&self, ctx: u64) -> CuResult<Actor> {
        let device = self.live(ctx)?.device;
        Ok(Actor { ctx, device })
    }

    /// `cuCtxEnablePeerAccess`: from now on the current context may access the memory
    /// `peer` allocates (past and future). `capable` is `cuDeviceCanAccessPeer` of the two
    /// devices. Errors as the driver documents them: no current context, a dead peer or the
    /// current context itself is an invalid context; devices that cannot reach each other
    /// are unsupported; a second enable is already enabled.
    pub fn enable_peer(&mut self, peer: u64, capable: impl Fn(u32, u32) -> bool) -> CuResult<()> {
        let (ctx, device) = self.current()?;
        let peer_device = self.live(peer)?.device;
        if peer == ctx {
            return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
        }
        if !capable(device, peer_device) {
            return Err(CuError::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        if !self.peers.insert((ctx, peer)) {
            return Err(CuError::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    }

    /// `cuCtxDisablePeerAccess`: the current context no longer reaches `peer`'s memory.
    pub fn disable_peer(&mut self, peer: u64) -> CuResult<()> {
        let (ctx, _) = self.current()?;
        self.live(peer)?;
        if !self.peers.remove(&(ctx, peer)) {
            return Err(CuError::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    }

    /// Whether `ctx` has peer access to the memory of `peer`.
    pub fn peer_enabled(&self, ctx: u64, peer: u64) -> bool {
        self.peers.contains(&(ctx, peer))
    }

    /// A context that goes away takes its peer access (both ways) with it.
    pub(crate) fn forget_peers(&mut self, ctx: u64) {
        self.peers.retain(|(from, to)| *from != ctx && *to != ctx);
    }

    /// The device of context `ctx`, if it is live.
    pub fn device_of(&self, ctx: u64) -> Option<u32> {
        self.live(ctx).ok().map(|c| c.device)
    }

    /// `CUDA_ERROR_INVALID_CONTEXT` unless `ctx` is a live context.
    pub fn check_live(&self, ctx: u64) -> CuResult<()> {
        self.live(ctx).map(drop)
    }

    pub(crate) fn live(&self, ctx: u64) -> CuResult<&Context> {
        self.table
            .get(&ctx)
            .filter(|c| c.refs > 0)
            .ok_or(CuError::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// `dev`'s primary context, with its handle.
    pub(crate) fn primary_mut(&mut self, dev: u32) -> CuResult<(u64, &mut Context)> {
        let h = self.primary_handle(dev);
        let c = self
            .table
            .get_mut(&h)
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)?;
        Ok((h, c))
    }

    pub fn primary_retain(&mut self, dev: u32) -> CuResult<u64> {
        let (h, c) = self.primary_mut(dev)?;
        c.refs += 1;
        Ok(h)
    }

    pub fn primary_release(&mut self, dev: u32) -> CuResult<()> {
        let (h, c) = self.primary_mut(dev)?;
        if c.refs == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_CONTEXT);
        }
        c.refs -= 1;
        if c.refs == 0 {
            self.close_streams(h);
            self.forget_peers(h);
        }
        Ok(())
    }

    /// The handle of `dev`'s primary context (stable for the process lifetime).
    pub fn primary_handle(&self, dev: u32) -> u64 {
        PRIMARY_BASE + u64::from(dev)
    }

    /// Destroys the primary context's streams and makes it inactive, whatever its count.
    pub fn primary_reset(&mut self, dev: u32) -> CuResult<()> {
        let (h, c) = self.primary_mut(dev)?;
        c.refs = 0;
        self.close_streams(h);
        self.forget_peers(h);
        Ok(())
    }

    pub fn primary_state(&self, dev: u32) -> CuResult<bool> {
        let c = self
            .table
            .get(&self.primary_handle(dev))
            .ok_or(CuError::CUDA_ERROR_INVALID_DEVICE)?;
        Ok(c.refs > 0)
    }

    /// `cuCtxCreate`: a new context, pushed on the calling thread's stack.
    pub fn create(&mut self, handle: u64, dev: u32) -> u64 {
        self.create_detached(handle, dev);
        STACK.with_borrow_mut(|s| s.push(handle));
        handle
    }

    /// A created context that no thread has current (a green context's).
    pub fn create_detached(&mut self, handle: u64, dev: u32) {
        self.table.insert(
            handle,
            Context {
                device: dev,
                refs: 1,
                primary: false,
            },
        );
    }

    pub fn destroy(&mut self, ctx: u64) -> CuResult<()> {
        match self.table.get(&ctx) {
            Some(c) if !c.primary && c.refs > 0 => {}
            Some(c) if c.primary => return Err(CuError::CUDA_ERROR_INVALID_CONTEXT),
            _ => return Err(CuError::CUDA_ERROR_INVALID_CONTEXT),
        }
        self.table.remove(&ctx);
        self.close_streams(ctx);
        self.forget_peers(ctx);
        // Only the calling thread's stack can be fixed up; other threads see an invalid
        // context on their next call, as with the real driver.
        STACK.with_borrow_mut(|s| s.retain(|c| *c != ctx));
        Ok(())
    }

    pub fn set_current(&self, ctx: u64) -> CuResult<()> {
        if ctx != 0 {
            self.live(ctx)?;
        }
        STACK.with_borrow_mut(|s| {
            s.pop();
            if ctx != 0 {
                s.push(ctx);
            }
        });
        Ok(())
    }

    pub fn push(&self, ctx: u64) -> CuResult<()> {
        self.live(ctx)?;
        STACK.with_borrow_mut(|s| s.push(ctx));
        Ok(())
    }

    pub fn pop(&self) -> CuResult<u64> {
        STACK
            .with_borrow_mut(|s| s.pop())
            .ok_or(CuError::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The calling thread's current context handle (0 if none), without validation.
    pub fn current_handle(&self) -> u64 {
        STACK.with_borrow(|s| s.last().copied().unwrap_or(0))
    }

    /// The current context and its device; `CUDA_ERROR_INVALID_CONTEXT` when there is none or
    /// it was destroyed.
    pub fn current(&self) -> CuResult<(u64, u32)> {
        let h = self.current_handle();
        let c = self.live(h)?;
        Ok((h, c.device))
    }

    /// Context `ctx` and its device, or the current one when `ctx` is null (CUDA 13's `_v2`
    /// context calls).
    pub fn given_or_current(&self, ctx: u64) -> CuResult<(u64, u32)> {
        if ctx == 0 {
            return self.current();
        }
        Ok((ctx, self.live(ctx)?.device))
    }

    pub fn create_stream(&mut self, handle: u64, flags: u32, priority: i32) -> CuResult<u64> {
        // CU_STREAM_DEFAULT (0) and CU_STREAM_NON_BLOCKING (1) are the only flags.
        if flags > stream::NON_BLOCKING {
            return Err(CuError::CUDA_ERROR_INVALID_VALUE);
        }
        let (ctx, _) = self.current()?;
        self.create_stream_in(ctx, handle, flags, priority)
    }

    /// A stream of context `ctx`, current or not (a green context's).
    pub fn create_stream_in(
        &mut self,
        ctx: u64,
        handle: u64,
        flags: u32,
        priority: i32,
    ) -> CuResult<u64> {
        self.check_live(ctx)?;
        self.streams
            .insert(handle, Stream::start(ctx, flags, priority)?);
        Ok(handle)
    }

    /// The created stream `stream`, owned by a live context.
    pub fn stream(&self, stream: u64) -> CuResult<&Arc<Stream>> {
        let s = self
            .streams
            .get(&stream)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        self.live(s.ctx)
            .map_err(|_| CuError::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(s)
    }

    /// Where work submitted to `stream` by the calling thread runs (`None`: a synchronous
    /// call, which runs on the legacy default stream). Needs a current context.
    pub fn target(&self, stream: Option<u64>) -> CuResult<Target> {
        let (ctx, _) = self.current()?;
        match stream.unwrap_or(0) {
            0 | stream::LEGACY => Ok(Target::Now {
                ctx,
                drain: self.streams_of(ctx, true),
            }),
            stream::PER_THREAD => Ok(Target::Now {
                ctx,
                drain: Vec::new(),
            }),
            s => self.stream(s).map(|s| Target::Queue(Arc::clone(s))),
        }
    }

    /// The created streams of `ctx` (only the blocking ones when `blocking`).
    pub fn streams_of(&self, ctx: u64, blocking: bool) -> Vec<Arc<Stream>> {
        self.streams
            .values()
            .filter(|s| s.ctx == ctx && (!blocking || s.blocking()))
            .cloned()
            .collect()
    }

    pub fn destroy_stream(&mut self, stream: u64) -> CuResult<()> {
        let s = self
            .streams
            .remove(&stream)
            .ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)?;
        s.close();
        Ok(())
    }

    /// The streams of a context that goes away: they finish their work, then their workers
    /// exit.
    pub(crate) fn close_streams(&mut self, ctx: u64) {
        self.streams.retain(|_, s| {
            if s.ctx == ctx {
                s.close();
            }
            s.ctx != ctx
        });
    }
}
