//! Streams and events with CUDA's ordering, on the host.
//!
//! Each created stream has a worker thread that runs the stream's work in submission order,
//! asynchronously to the caller: an async copy returns at once and its bytes move later, so
//! a client that forgets to synchronize sees what it would on a GPU. Work queued on a stream
//! counts as in flight for the native lock (it holds a gate pass until it has run), as the
//! driver's lock waits for submitted work.
//!
//! The legacy default stream (`0`, `CU_STREAM_LEGACY`) and the per-thread default stream run
//! their work synchronously in the caller; before legacy-stream work, every blocking stream
//! (created without `CU_STREAM_NON_BLOCKING`) of the context drains, which is the implicit
//! synchronization the legacy stream has with them.
//!
//! An error raised by queued work (a range unmapped between submission and execution) is kept
//! by the stream and returned by its next synchronization or query, as a GPU fault surfaces
//! asynchronously.

use crate::error::{CuError, CuResult};
use crate::state::gate::Pass;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// `CU_STREAM_LEGACY`.
pub const LEGACY: u64 = 1;

/// `CU_STREAM_PER_THREAD`.
pub const PER_THREAD: u64 = 2;

/// `CU_STREAM_NON_BLOCKING`.
pub const NON_BLOCKING: u32 = 1;

/// What `cuCtxGetStreamPriorityRange` reports: least (0) to greatest (-5) priority, as on
/// current data-center GPUs. Lower numbers are higher priorities.
pub const PRIORITY_LEAST: i32 = 0;

pub const PRIORITY_GREATEST: i32 = -5;

/// One unit of queued work.
pub type Job = Box<dyn FnOnce() -> CuResult<()> + Send + 'static>;

#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) jobs: VecDeque<(Job, Pass)>,
    /// Jobs submitted and jobs finished: the stream is idle when they are equal.
    pub(crate) submitted: u64,
    pub(crate) completed: u64,
    /// The first error queued work raised, reported by the next synchronization.
    pub(crate) error: Option<CuError>,
    pub(crate) closed: bool,
}

/// A created stream.
pub struct Stream {
    pub ctx: u64,
    pub flags: u32,
    pub priority: i32,
    pub(crate) queue: Mutex<Queue>,
    pub(crate) changed: Condvar,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ctx", &self.ctx)
            .field("flags", &self.flags)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Creates a stream of context `ctx` and starts its worker thread.
    pub fn start(ctx: u64, flags: u32, priority: i32) -> CuResult<Arc<Stream>> {
        let stream = Arc::new(Stream {
            ctx,
            flags,
            priority: priority.clamp(PRIORITY_GREATEST, PRIORITY_LEAST),
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let worker = Arc::clone(&stream);
        std::thread::Builder::new()
            .name("fakecuda-stream".into())
            .spawn(move || worker.work())
            .map_err(|_| CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(stream)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn blocking(&self) -> bool {
        self.flags & NON_BLOCKING == 0
    }

    /// Queues `job`; `pass` keeps the native lock waiting until it has run.
    pub fn submit(&self, job: Job, pass: Pass) {
        let mut q = self.lock();
        q.jobs.push_back((job, pass));
        q.submitted += 1;
        self.changed.notify_all();
    }

    /// Waits until everything submitted so far has run; then reports (and clears) the first
    /// error queued work raised.
    pub fn synchronize(&self) -> CuResult<()> {
        let mut q = self.lock();
        let target = q.submitted;
        while q.completed < target {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q.error.take().map_or(Ok(()), Err)
    }

    /// Waits until everything submitted so far has run, leaving any error for the stream's own
    /// synchronization (the legacy default stream's implicit wait on blocking streams).
    pub fn drain(&self) {
        let mut q = self.lock();
        let target = q.submitted;
        while q.completed < target {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// `CUDA_ERROR_NOT_READY` while work is pending; the kept error once idle.
    pub fn query(&self) -> CuResult<()> {
        let mut q = self.lock();
        if q.completed < q.submitted {
            return Err(CuError::CUDA_ERROR_NOT_READY);
        }
        q.error.take().map_or(Ok(()), Err)
    }

    /// No more work will come: the worker runs what is queued, then exits (`cuStreamDestroy`
    /// returns at once and the stream's work still completes, as on the driver).
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    pub(crate) fn work(&self) {
        loop {
            let (job, pass) = {
                let mut q = self.lock();
                loop {
                    if let Some(next) = q.jobs.pop_front() {
                        break next;
                    }
                    if q.closed {
                        return;
                    }
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let result =
                catch_unwind(AssertUnwindSafe(job)).unwrap_or(Err(CuError::CUDA_ERROR_UNKNOWN));
            drop(pass);
            let mut q = self.lock();
            if let Err(e) = result {
                q.error.get_or_insert(e);
            }
            q.completed += 1;
            self.changed.notify_all();
        }
    }
}

/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 2;

/// `CU_EVENT_INTERPROCESS` (which needs `CU_EVENT_DISABLE_TIMING`).
pub const EVENT_INTERPROCESS: u32 = 4;

/// The flags `cuEventCreate` accepts: default, blocking sync, disable timing, interprocess.
pub const EVENT_FLAGS: u32 = 0x1 | 0x2 | 0x4;

#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// Records so far, and the last record whose point in its stream was reached.
    pub(crate) recorded: u64,
    pub(crate) reached: u64,
    pub(crate) at: Option<Instant>,
}

/// An event: a point in a stream, reached when the work before it has run.
#[derive(Debug)]
pub struct Event {
    pub flags: u32,
    pub(crate) marks: Mutex<Marks>,
    pub(crate) changed: Condvar,
    /// An interprocess event's counters, shared with every process that opened it (then
    /// `marks` keeps only what is local).
    pub shared: Option<crate::state::ipc_event::SharedMarks>,
}

impl Event {
    /// An event; an interprocess one keeps its records in `shared`.
    pub fn with_marks(
        flags: u32,
        shared: Option<crate::state::ipc_event::SharedMarks>,
    ) -> Arc<Event> {
        Arc::new(Event {
            flags,
            marks: Mutex::new(Marks::default()),
            changed: Condvar::new(),
            shared,
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new record; returns its number, to be passed to [`Event::reach`] when the stream gets
    /// there.
    pub fn record(&self) -> u64 {
        if let Some(s) = &self.shared {
            return s.record();
        }
        let mut m = self.lock();
        m.recorded += 1;
        m.recorded
    }

    /// The stream reached record `n`.
    pub fn reach(&self, n: u64) {
        if let Some(s) = &self.shared {
            s.reach(n);
        }
        let mut m = self.lock();
        if n > m.reached {
            m.reached = n;
            m.at = Some(Instant::now());
        }
        self.changed.notify_all();
    }

    /// The latest record's number (0: never recorded).
    pub fn latest(&self) -> u64 {
        match &self.shared {
            Some(s) => s.recorded(),
            None => self.lock().recorded,
        }
    }

    /// Waits until record `n` was reached.
    pub fn wait_for(&self, n: u64) {
        let mut m = self.lock();
        match &self.shared {
            // Another process may reach it: look at the shared page now and then.
            Some(s) => {
                while s.reached() < n {
                    m = self
                        .changed
                        .wait_timeout(m, std::time::Duration::from_micros(200))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            None => {
                while m.reached < n {
                    m = self.changed.wait(m).unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    /// `CUDA_ERROR_NOT_READY` until the latest record was reached (a never-recorded event is
    /// complete, as on the driver).
    pub fn query(&self) -> CuResult<()> {
        if let Some(s) = &self.shared {
            return if s.reached() < s.recorded() {
                Err(CuError::CUDA_ERROR_NOT_READY)
            } else {
                Ok(())
            };
        }
        let m = self.lock();
        if m.reached < m.recorded {
            Err(CuError::CUDA_ERROR_NOT_READY)
        } else {
            Ok(())
        }
    }

    /// When the latest record was reached, if it was and timing is enabled.
    pub(crate) fn timestamp(&self) -> CuResult<Instant> {
        if self.flags & EVENT_DISABLE_TIMING != 0 {
            return Err(CuError::CUDA_ERROR_INVALID_HANDLE);
        }
        let m = self.lock();
        if m.recorded == 0 {
            return Err(CuError::CUDA_ERROR_INVALID_HANDLE);
        }
        if m.reached < m.recorded {
            return Err(CuError::CUDA_ERROR_NOT_READY);
        }
        m.at.ok_or(CuError::CUDA_ERROR_INVALID_HANDLE)
    }
}

/// Milliseconds from `start` to `end` (negative when `end` came first), as
/// `cuEventElapsedTime` reports.
pub fn elapsed_ms(start: &Event, end: &Event) -> CuResult<f32> {
    let (a, b) = (start.timestamp()?, end.timestamp()?);
    Ok(if b >= a {
        b.duration_since(a).as_secs_f32() * 1e3
    } else {
        -(a.duration_since(b).as_secs_f32() * 1e3)
    })
}
