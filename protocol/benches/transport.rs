//! Round-trip latency over a real Unix socket to a server thread, one connection per exchange
//! as in production: `inspect` with a small reply, and `export` whose reply carries a
//! descriptor. Prints the median of each from an interleaved timing loop at the end.

use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use cuinterpose_protocol as p;
use p::transport::{self, Endpoint, Listener};

const PID: u32 = 4747;
const TIMEOUT: Duration = Duration::from_secs(10);

struct Server {
    endpoint: Endpoint,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
    dir: PathBuf,
}

fn pid() -> p::NamespacePid {
    p::NamespacePid::new(PID).expect("non-zero")
}

fn export_fd() -> OwnedFd {
    let fd = nix::sys::memfd::memfd_create(
        "cuinterpose-bench-export",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )
    .expect("memfd");
    nix::unistd::ftruncate(&fd, 2 << 20).expect("size");
    fd
}

impl Server {
    /// Serves connections one after another until stopped.
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("cuinterpose-bench-{}", std::process::id()));
        let listener = Listener::bind(&dir, pid()).expect("bind");
        let endpoint = listener.endpoint().clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let fd = export_fd();
            let inspection = p::Reply::Inspection(p::InspectionReply {
                namespace_pid: pid(),
                phase: p::Phase::Active,
                raw_imports: 0,
                records: Vec::new().try_into().expect("empty"),
                devices: p::BoundedVec::default(),
            });
            let export = p::Reply::UnicastExport(p::UnicastExportReply { size: 2 << 20 });
            while !stopping.load(Ordering::Relaxed) {
                let mut connection = listener.accept().expect("accept");
                let Ok((request, _)) = connection.read_request() else {
                    continue;
                };
                let result = match request {
                    p::Request::Export(_) => connection.send_reply(&export, Some(fd.as_fd())),
                    _ => connection.send_reply(&inspection, None),
                };
                result.expect("reply");
            }
        });
        Self {
            endpoint,
            stop,
            thread: Some(thread),
            dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so it sees the flag.
        let _ = transport::call(&self.endpoint, &p::Request::Inspect, None, TIMEOUT);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread");
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn export_request() -> p::Request {
    p::Request::Export(p::ExportRequest {
        allocation: p::AllocationReference {
            id: p::AllocationId::new([0x22; 16]).expect("non-zero"),
            creator_pid: pid(),
        },
        resource: p::ResourceKind::Unicast,
        capability: p::CapabilityToken::new([0x5a; 16]).expect("non-zero"),
    })
}

fn inspect(endpoint: &Endpoint) {
    let (reply, fd) =
        transport::call(endpoint, &p::Request::Inspect, None, TIMEOUT).expect("inspect");
    assert!(fd.is_none());
    black_box(reply);
}

fn export(endpoint: &Endpoint, request: &p::Request) {
    let (reply, fd) = transport::call(endpoint, request, None, TIMEOUT).expect("export");
    assert!(fd.is_some(), "export replies carry a descriptor");
    black_box((reply, fd));
}

fn bench(c: &mut Criterion) {
    let server = Server::start();
    let request = export_request();
    let mut group = c.benchmark_group("transport_round_trip");
    group.bench_function("inspect_small_reply", |b| {
        b.iter(|| inspect(&server.endpoint))
    });
    group.bench_function("export_reply_with_fd", |b| {
        b.iter(|| export(&server.endpoint, &request))
    });
    group.finish();
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

/// Interleaved so that both see the same machine state.
fn medians() {
    let server = Server::start();
    let request = export_request();
    let rounds = 2000;
    let mut inspect_times = Vec::with_capacity(rounds);
    let mut export_times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        inspect(&server.endpoint);
        inspect_times.push(start.elapsed());
        let start = Instant::now();
        export(&server.endpoint, &request);
        export_times.push(start.elapsed());
    }
    println!(
        "median round trip over {rounds} interleaved calls (new connection each): \
         inspect {:.1} µs, export + fd {:.1} µs",
        median(inspect_times),
        median(export_times)
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    medians();
    Criterion::default().configure_from_args().final_summary();
}
