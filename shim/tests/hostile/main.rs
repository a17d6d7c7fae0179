//! Hostile peers against a live shim: a `cuinterpose-worker` under the shim over fakecuda,
//! after `init` (its runtime listens on its control socket). Malformed frames, oversized and
//! zero length prefixes, random bytes, wrong versions, trailing bytes, unknown requests, deep
//! nesting, stalled and slow senders, clients that never read their replies, descriptors where
//! none belong, a connection flood and a peer of another user; capability tokens that were
//! never handed out; the modes of the control directory and socket.
//!
//! After each attack the shim must still answer a valid `inspect` from another client within
//! a second, its descriptor count must come back to where it started, and the worker must be
//! alive with working CUDA calls ([`Target::check_healthy`]).
//!
//! The tests run one at a time (a lock): their timings are part of what they check.

#[path = "../support/mod.rs"]
mod support;

use cuinterpose_protocol::ticket::read_ticket;
use cuinterpose_protocol::transport::{Endpoint, REQUEST_FRAME_LIMIT, TransportError, call};
use cuinterpose_protocol::{
    AllocationReference, CapabilityToken, ExportRequest, NamespacePid, Phase, RefusalCode, Reply,
    Request, ResourceKind, Ticket, VirtualShareableHandle,
};
use cuinterpose_testkit::slack;
use cuinterpose_workload::{EntryPath, Output, Worker, WorkerConfig};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use support::{Sandbox, export_request, lib_dir, shim};

const MIB: u64 = 1 << 20;
use cuinterpose_abi::consts::HANDLE_TYPE_POSIX_FD as POSIX;
use cuinterpose_abi::results::CUDA_ERROR_INVALID_HANDLE as INVALID_HANDLE;
/// The shim's control timeout in these tests (`CUINTERPOSE_CONTROL_TIMEOUT_SECONDS`): how long
/// a handler waits for a stalled peer's request.
const SHIM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the shim may take to answer a valid request while (or after) it is attacked.
/// (Upper bounds like this one go through `slack`: `CUINTERPOSE_TEST_TIME_FACTOR` scales them.)
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// How long handler threads may take to finish once their peers are gone.
const SETTLE: Duration = Duration::from_secs(2);
/// The shim's limits (shim/src/runtime/peer.rs, protocol's MAX_MESSAGE_BYTES).
const MAX_CONNECTIONS: usize = 64;
const MAX_MESSAGE_BYTES: u32 = 32 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A worker under the shim, initialised, with its baseline descriptor count.
struct Target {
    worker: Worker,
    /// Namespace pid (the socket's name) and host pid (for /proc); equal here.
    pid: i32,
    host_pid: i32,
    socket: PathBuf,
    log: PathBuf,
    baseline_fds: usize,
    baseline_threads: usize,
    sandbox: Sandbox,
}

impl Target {
    fn new(name: &str) -> Target {
        let sandbox = Sandbox::new(name);
        let log = sandbox.root.join("worker.log");
        let config = WorkerConfig::new(cuinterpose_testkit::build_worker())
            .entry(EntryPath::Dlsym)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("LD_PRELOAD", shim())
            .env("CUINTERPOSE_CONTROL_DIR", sandbox.control_dir())
            .env("FAKECUDA_CONTROL_DIR", sandbox.root.join("fakecuda"))
            .env(
                "CUINTERPOSE_CONTROL_TIMEOUT_SECONDS",
                SHIM_TIMEOUT.as_secs().to_string(),
            )
            .stderr(Output::File(log.clone()));
        let mut worker = Worker::spawn(&config).expect("spawn worker");
        worker.init(0).expect("init");
        let pid = worker.worker_pid();
        let host_pid = worker.worker_host_pid();
        let socket = sandbox
            .control_dir()
            .join(format!("cuinterpose-{pid}.sock"));
        let mut target = Target {
            worker,
            pid,
            host_pid,
            socket,
            log,
            baseline_fds: 0,
            baseline_threads: 0,
            sandbox,
        };
        // Warm up every path the checks use, then take the baseline.
        target.inspect_within("warm-up");
        target.cuda_works("warm-up");
        target.rebaseline();
        target
    }

    /// Takes the baseline once the descriptor and thread counts have been steady for 300 ms
    /// (the worker closes what it passed on after replying).
    fn rebaseline(&mut self) {
        let started = Instant::now();
        let mut last = (self.fds(), self.threads());
        let mut steady = Instant::now();
        while steady.elapsed() < Duration::from_millis(300) {
            assert!(
                started.elapsed() < slack(Duration::from_secs(5)),
                "never steady"
            );
            std::thread::sleep(Duration::from_millis(20));
            let now = (self.fds(), self.threads());
            if now != last {
                last = now;
                steady = Instant::now();
            }
        }
        (self.baseline_fds, self.baseline_threads) = last;
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::for_pid(
            &self.sandbox.control_dir(),
            NamespacePid::new(self.pid as u32).unwrap(),
        )
        .unwrap()
    }

    /// A raw connection to the shim, with generous I/O timeouts so a test never hangs.
    fn connect(&self) -> UnixStream {
        let stream = UnixStream::connect(&self.socket).expect("connect to the shim");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    fn fds(&self) -> usize {
        count_entries(&format!("/proc/{}/fd", self.host_pid))
    }

    fn threads(&self) -> usize {
        count_entries(&format!("/proc/{}/task", self.host_pid))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A valid `inspect` from a fresh client is answered within [`ANSWER_WITHIN`].
    fn inspect_within(&self, what: &str) -> Duration {
        let started = Instant::now();
        let reply = call(
            &self.endpoint(),
            &Request::Inspect,
            None,
            slack(ANSWER_WITHIN),
        );
        let elapsed = started.elapsed();
        match reply {
            Ok((Reply::Inspection(i), None)) => {
                assert_eq!(i.namespace_pid.get(), self.pid as u32, "{what}");
                assert_eq!(i.phase, Phase::Active, "{what}");
            }
            other => panic!("{what}: inspect after {elapsed:?}: {other:?}"),
        }
        assert!(
            elapsed < slack(ANSWER_WITHIN),
            "{what}: inspect took {elapsed:?}"
        );
        elapsed
    }

    /// Allocate, map, write and read back through the shim; release everything.
    fn cuda_works(&mut self, what: &str) {
        let w = &mut self.worker;
        let handle = w
            .create(2 * MIB, 0, POSIX)
            .unwrap_or_else(|e| panic!("{what}: create: {e}"));
        let va = w.map_rw(handle, 2 * MIB, 0).unwrap();
        w.fill(va, 2 * MIB, 77).unwrap();
        w.verify(va, 2 * MIB, 77).unwrap();
        w.unmap(va, 2 * MIB).unwrap();
        w.free_address(va, 2 * MIB).unwrap();
        w.release(handle).unwrap();
    }

    /// Polls until the descriptor count is back to the baseline (handler threads finishing).
    fn fds_settle(&self, what: &str, within: Duration) {
        let started = Instant::now();
        loop {
            let now = self.fds();
            if now == self.baseline_fds {
                return;
            }
            if started.elapsed() > within {
                panic!(
                    "{what}: {now} descriptors open after {within:?}, {} before; the shim's \
                     descriptors: {:?}",
                    self.baseline_fds,
                    fd_targets(self.host_pid)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// After an attack: answers within a second, no descriptor kept, alive, CUDA works.
    fn check_healthy(&mut self, what: &str) {
        self.inspect_within(what);
        self.fds_settle(what, slack(SETTLE));
        match self.worker.try_status() {
            Ok(None) => {}
            other => panic!("{what}: the worker is gone: {other:?}\n{}", self.log()),
        }
        self.cuda_works(what);
        self.fds_settle(what, slack(SETTLE));
        // Handler threads are short-lived: none is left behind either.
        let started = Instant::now();
        while self.threads() > self.baseline_threads {
            assert!(
                started.elapsed() < slack(SETTLE),
                "{what}: {} threads, {} before",
                self.threads(),
                self.baseline_threads
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .count()
}

fn fd_targets(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| {
                    let target = std::fs::read_link(e.path()).unwrap_or_default();
                    format!("{}->{}", e.file_name().to_string_lossy(), target.display())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `body` behind its 4-byte little-endian length.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

fn encoded(request: &Request) -> Vec<u8> {
    cuinterpose_protocol::encode(request).expect("encode")
}

/// Reads one reply frame; `None` when the shim closed the connection first.
fn read_reply(stream: &mut UnixStream) -> Option<Reply> {
    let mut prefix = [0u8; 4];
    match stream.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) =>
        {
            return None;
        }
        Err(e) => panic!("reading a reply: {e}"),
    }
    let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
    stream.read_exact(&mut body).expect("reply body");
    Some(cuinterpose_protocol::decode::<Reply>(&body).expect("a valid reply"))
}

/// After its reply (if any) the shim closes the connection: EOF, not a hang.
fn expect_closed(stream: &mut UnixStream, what: &str) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the shim to close the connection: {other:?}"),
    }
}

/// The shim refused what `stream` sent as invalid, with `text` in its message, then closed.
fn expect_invalid(stream: &mut UnixStream, what: &str, text: &str) {
    match read_reply(stream) {
        Some(Reply::Refused(r)) => {
            assert_eq!(r.code, RefusalCode::Invalid, "{what}: {r:?}");
            assert!(
                r.message.as_str().contains(text),
                "{what}: {:?} does not mention {text:?}",
                r.message.as_str()
            );
        }
        other => panic!("{what}: expected an `invalid` refusal, got {other:?}"),
    }
    expect_closed(stream, what);
}

/// Sends `bytes` in one write and expects an `invalid` refusal mentioning `text`.
fn check_rejected(target: &mut Target, what: &str, bytes: &[u8], text: &str) {
    let mut stream = target.connect();
    stream.write_all(bytes).expect("send");
    expect_invalid(&mut stream, what, text);
    drop(stream);
    target.check_healthy(what);
}

/// A deterministic byte stream (xorshift64*), so a failure can be reproduced.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// Between 1 and `max` bytes.
    fn some_bytes(&mut self, max: u64) -> Vec<u8> {
        let n = 1 + self.next() % max;
        self.bytes(n as usize)
    }
}

/// `N` bytes from the kernel's random source.
fn urandom<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("/dev/urandom");
    bytes
}

fn join_within<T: Send + 'static>(
    thread: std::thread::JoinHandle<T>,
    limit: Duration,
    what: &str,
) -> T {
    let started = Instant::now();
    while !thread.is_finished() {
        assert!(
            started.elapsed() < limit,
            "{what} did not finish in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    thread.join().expect("thread")
}

mod descriptors;
mod frames;
mod readers;
mod users;
