//! Transport between real processes: the test binary on one side, the
//! `cuinterpose-transport-peer` helper (fork + exec) on the other, well-behaved or misbehaving
//! on purpose. Every test runs under `check`, which serializes the tests of this binary and
//! compares the number of open descriptors before and after.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener as StdListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cuinterpose_protocol as p;
use p::transport::{
    self, Endpoint, EndpointProblem, IoStage, Listener, RefusalReason, Timeouts, TransportError,
};
use p::{DecodeError, Reply, Request};

const PEER_EXE: &str = env!("CARGO_BIN_EXE_cuinterpose-transport-peer");
/// Scheduling slack allowed on top of a timeout.
const SLACK: Duration = Duration::from_millis(1500);

/// `result` timed out `during` after `timeout`, which is about how long it took (`elapsed`).
fn assert_timed_out<T: std::fmt::Debug>(
    result: &Result<T, TransportError>,
    during: IoStage,
    timeout: Duration,
    elapsed: Duration,
) {
    assert!(
        matches!(result, Err(TransportError::Timeout { during: d, after, .. })
            if *d == during && *after == timeout),
        "{result:?}"
    );
    assert!(
        elapsed >= timeout && elapsed < timeout + SLACK,
        "{elapsed:?}"
    );
}

/// The peer's report says it saw this side close the connection.
fn assert_peer_closed(lines: &[String]) {
    assert!(
        lines.iter().any(|line| line.starts_with("peer-closed")),
        "{lines:?}"
    );
}

/// The peer's report after `case` says it closed every descriptor it received.
fn assert_fds_closed(case: &str, lines: &[String]) {
    assert!(
        lines.contains(&"fds-closed".to_string()),
        "{case}: {lines:?}"
    );
}

/// Whether `error` is a frame whose bytes hold no envelope.
fn not_an_envelope(error: &TransportError) -> bool {
    matches!(
        error,
        TransportError::Malformed {
            source: DecodeError::NotEnvelope { .. },
            ..
        }
    )
}

// ---------------------------------------------------------------- allocation high-water mark

/// Records the largest single allocation, to show an oversized length prefix allocates nothing.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

// ---------------------------------------------------------------- harness

#[path = "../support/mod.rs"]
mod support;

use support::{Scratch, check};

fn pid(value: u32) -> p::NamespacePid {
    p::NamespacePid::new(value).expect("non-zero")
}

/// A helper process and the lines it prints.
struct PeerProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: Option<JoinHandle<()>>,
}

impl PeerProcess {
    fn spawn(args: &[&str]) -> Self {
        let mut command = Command::new(PEER_EXE);
        command.args(args);
        Self::start(command)
    }

    fn start(mut command: Command) -> Self {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawn the transport peer");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        let reader = thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            reader: Some(reader),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a line from the transport peer")
    }

    /// Closes its stdin, waits for it to exit and returns what it still printed.
    fn finish(mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.child.try_wait().expect("try_wait").is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "transport peer did not exit");
            thread::sleep(Duration::from_millis(10));
        }
        if let Some(reader) = self.reader.take() {
            reader.join().expect("reader thread");
        }
        self.lines.try_iter().collect()
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if let Some(reader) = self.reader.take() {
                let _ = reader.join();
            }
        }
    }
}

fn assert_names_endpoint(error: &TransportError, path: &Path) {
    assert_eq!(error.endpoint(), Some(path), "{error}");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

mod client;
mod peers;
mod server;
mod setup;
