//! Application traffic while a checkpoint runs: threads that keep writing and reading device
//! memory (synchronous and stream-ordered copies and memsets), each checking that every write
//! the driver acknowledged is still there the next time it reads, and that it reads back what
//! it just wrote. They stand in for an engine's scheduler, data-loader and proxy threads.

use super::driver::DriverLibrary;
use super::failure;
use crate::proto::{ErrorReply, TrafficMode, TrafficReport, TrafficThread};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

type PrimaryRetain = unsafe extern "C" fn(*mut *mut c_void, i32) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type StreamCreate = unsafe extern "C" fn(*mut *mut c_void, u32) -> u32;
type StreamSync = unsafe extern "C" fn(*mut c_void) -> u32;
type StreamDestroy = unsafe extern "C" fn(*mut c_void) -> u32;
type HtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> u32;
type DtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> u32;
type HtoDAsync = unsafe extern "C" fn(u64, *const c_void, usize, *mut c_void) -> u32;
type DtoHAsync = unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_void) -> u32;
type MemsetD8 = unsafe extern "C" fn(u64, u8, usize) -> u32;
type MemsetD8Async = unsafe extern "C" fn(u64, u8, usize, *mut c_void) -> u32;

/// The driver functions a traffic thread calls, resolved on the worker's main thread through
/// its entry path (so they are the shim's wrappers when the shim is loaded).
#[derive(Clone, Copy)]
struct Api {
    retain: PrimaryRetain,
    set_current: SetCurrent,
    stream_create: StreamCreate,
    stream_sync: StreamSync,
    stream_destroy: StreamDestroy,
    htod: HtoD,
    dtoh: DtoH,
    htod_async: HtoDAsync,
    dtoh_async: DtoHAsync,
    memset: MemsetD8,
    memset_async: MemsetD8Async,
}

macro_rules! resolve {
    ($d:expr, $exact:literal, $unsuffixed:literal, $ty:ty) => {{
        let p = $d.function($exact, $unsuffixed)?;
        // SAFETY: `p` is the driver's entry point of that name; `$ty` is its cuda.h prototype.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

impl Api {
    fn resolve(d: &DriverLibrary) -> Result<Api, ErrorReply> {
        Ok(Api {
            retain: resolve!(
                d,
                "cuDevicePrimaryCtxRetain",
                "cuDevicePrimaryCtxRetain",
                PrimaryRetain
            ),
            set_current: resolve!(d, "cuCtxSetCurrent", "cuCtxSetCurrent", SetCurrent),
            stream_create: resolve!(d, "cuStreamCreate", "cuStreamCreate", StreamCreate),
            stream_sync: resolve!(d, "cuStreamSynchronize", "cuStreamSynchronize", StreamSync),
            stream_destroy: resolve!(d, "cuStreamDestroy_v2", "cuStreamDestroy", StreamDestroy),
            htod: resolve!(d, "cuMemcpyHtoD_v2", "cuMemcpyHtoD", HtoD),
            dtoh: resolve!(d, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", DtoH),
            htod_async: resolve!(d, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync", HtoDAsync),
            dtoh_async: resolve!(d, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync", DtoHAsync),
            memset: resolve!(d, "cuMemsetD8_v2", "cuMemsetD8", MemsetD8),
            memset_async: resolve!(d, "cuMemsetD8Async", "cuMemsetD8Async", MemsetD8Async),
        })
    }
}

/// Running traffic threads.
#[derive(Debug)]
pub struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<TrafficReport>>,
}

/// The bytes a write of sequence number `seq` leaves in a slot of `len` bytes.
fn expected(mode: TrafficMode, seq: u64, len: usize) -> Vec<u8> {
    match mode {
        TrafficMode::Memset | TrafficMode::MemsetAsync => vec![(seq % 251) as u8 + 1; len],
        TrafficMode::Copy | TrafficMode::CopyAsync => (0..len)
            .map(|i| {
                (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> ((i % 8) * 8)) as u8 ^ (i / 8) as u8
            })
            .collect(),
    }
}

struct Run {
    api: Api,
    spec: TrafficThread,
    stream: *mut c_void,
    report: TrafficReport,
}

impl Run {
    fn count_error(&mut self, function: &str, code: u32) {
        *self
            .report
            .errors
            .entry(format!(
                "{function}: {}",
                crate::cuda::error_name_or_code(code)
            ))
            .or_insert(0) += 1;
    }

    fn inconsistent(&mut self, what: String) {
        self.report.inconsistencies += 1;
        if self.report.first_inconsistency.is_none() {
            self.report.first_inconsistency = Some(what);
        }
    }

    /// Reads the slot; `None` after a failed read (counted).
    fn read(&mut self, buf: &mut [u8]) -> Option<()> {
        let (address, n) = (self.spec.address, buf.len());
        // SAFETY: `buf` holds `n` writable bytes; the stream is ours (or null).
        let (function, code) = unsafe {
            match self.spec.mode {
                TrafficMode::CopyAsync | TrafficMode::MemsetAsync => {
                    let r = (self.api.dtoh_async)(buf.as_mut_ptr().cast(), address, n, self.stream);
                    if r != 0 {
                        ("cuMemcpyDtoHAsync", r)
                    } else {
                        ("cuStreamSynchronize", (self.api.stream_sync)(self.stream))
                    }
                }
                _ => (
                    "cuMemcpyDtoH",
                    (self.api.dtoh)(buf.as_mut_ptr().cast(), address, n),
                ),
            }
        };
        if code != 0 {
            self.count_error(function, code);
            return None;
        }
        Some(())
    }

    /// Writes `bytes`; whether the driver acknowledged it.
    fn write(&mut self, bytes: &[u8]) -> bool {
        let (address, n) = (self.spec.address, bytes.len());
        let value = bytes.first().copied().unwrap_or(0);
        // SAFETY: `bytes` holds `n` readable bytes that outlive the synchronization below.
        let (function, code) = unsafe {
            match self.spec.mode {
                TrafficMode::Copy => (
                    "cuMemcpyHtoD",
                    (self.api.htod)(address, bytes.as_ptr().cast(), n),
                ),
                TrafficMode::Memset => ("cuMemsetD8", (self.api.memset)(address, value, n)),
                TrafficMode::CopyAsync | TrafficMode::MemsetAsync => {
                    let r = if self.spec.mode == TrafficMode::CopyAsync {
                        (self.api.htod_async)(address, bytes.as_ptr().cast(), n, self.stream)
                    } else {
                        (self.api.memset_async)(address, value, n, self.stream)
                    };
                    if r != 0 {
                        ("an async write", r)
                    } else {
                        ("cuStreamSynchronize", (self.api.stream_sync)(self.stream))
                    }
                }
            }
        };
        if code != 0 {
            self.count_error(function, code);
            return false;
        }
        true
    }

    fn run(mut self, device: i32, stop: &AtomicBool) -> TrafficReport {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-parameters; the functions are the driver's (see Api).
        unsafe {
            let r = (self.api.retain)(&mut ctx, device);
            if r != 0 {
                self.count_error("cuDevicePrimaryCtxRetain", r);
                return self.report;
            }
            let r = (self.api.set_current)(ctx);
            if r != 0 {
                self.count_error("cuCtxSetCurrent", r);
                return self.report;
            }
            if matches!(
                self.spec.mode,
                TrafficMode::CopyAsync | TrafficMode::MemsetAsync
            ) {
                let r = (self.api.stream_create)(&mut self.stream, 0);
                if r != 0 {
                    self.count_error("cuStreamCreate", r);
                    return self.report;
                }
            }
        }
        let len = self.spec.size as usize;
        let mut buf = vec![0u8; len];
        // The sequence number of the last acknowledged write; None until the first, and
        // after a failed write (its bytes are then unknown).
        let mut acked: Option<u64> = None;
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(last) = acked
                && self.read(&mut buf).is_some()
                && buf != expected(self.spec.mode, last, len)
            {
                self.inconsistent(format!(
                    "iteration {}: the acknowledged write {last} at {:#x} is gone (found {:02x?}…)",
                    self.report.iterations,
                    self.spec.address,
                    &buf[..buf.len().min(8)]
                ));
            }
            seq += 1;
            let bytes = expected(self.spec.mode, seq, len);
            if self.write(&bytes) {
                acked = Some(seq);
                if self.read(&mut buf).is_some() && buf != bytes {
                    self.inconsistent(format!(
                        "iteration {}: read back other bytes than write {seq} at {:#x}",
                        self.report.iterations, self.spec.address
                    ));
                }
            } else {
                acked = None;
            }
            self.report.iterations += 1;
        }
        if !self.stream.is_null() {
            // SAFETY: a stream this thread created.
            unsafe { (self.api.stream_destroy)(self.stream) };
        }
        self.report.last_acknowledged = acked;
        self.report
    }
}

impl Traffic {
    pub fn start(
        d: &DriverLibrary,
        device: i32,
        threads: Vec<TrafficThread>,
    ) -> Result<Traffic, ErrorReply> {
        let api = Api::resolve(d)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (index, spec) in threads.into_iter().enumerate() {
            if spec.size == 0 || spec.size > crate::proto::MAX_TRANSFER {
                return Err(failure::request(format!(
                    "traffic thread {index}: size {} is not in 1..={}",
                    spec.size,
                    crate::proto::MAX_TRANSFER
                )));
            }
            let stop = Arc::clone(&stop);
            let run = Run {
                api,
                spec,
                stream: std::ptr::null_mut(),
                report: TrafficReport {
                    address: spec.address,
                    mode: spec.mode,
                    iterations: 0,
                    errors: BTreeMap::new(),
                    inconsistencies: 0,
                    first_inconsistency: None,
                    last_acknowledged: None,
                },
            };
            let handle = std::thread::Builder::new()
                .name(format!("traffic-{index}"))
                .spawn(move || run.run(device, &stop))
                .map_err(|e| {
                    failure::request(format!("cannot spawn traffic thread {index}: {e}"))
                })?;
            handles.push(handle);
        }
        Ok(Traffic {
            stop,
            threads: handles,
        })
    }

    /// Stops every thread and collects what each saw.
    pub fn stop(self) -> Result<Vec<TrafficReport>, ErrorReply> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| failure::request("a traffic thread panicked"))
            })
            .collect()
    }
}

// SAFETY: the raw stream pointer is null when a Run moves to its thread, and afterwards is
// used only by the thread that created it.
unsafe impl Send for Run {}

/// `SynchronizeInThread`: a detached thread makes the current context of `device` current and
/// calls `cuStreamSynchronize(0)` once.
pub fn synchronize_in_thread(d: &DriverLibrary, device: i32) -> Result<(), ErrorReply> {
    let api = Api::resolve(d)?;
    std::thread::Builder::new()
        .name("synchronize".into())
        .spawn(move || {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-parameter; the functions are the driver's (see Api); the null
            // stream is the legacy default stream.
            unsafe {
                if (api.retain)(&mut ctx, device) == 0 && (api.set_current)(ctx) == 0 {
                    (api.stream_sync)(std::ptr::null_mut());
                }
            }
        })
        .map(drop)
        .map_err(|e| failure::request(format!("cannot spawn the synchronize thread: {e}")))
}
