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
    self, Endpoint, EndpointProblem, Listener, RefusalReason, Timeouts, TransportError,
};
use p::{DecodeError, Reply, Request};

const PEER_EXE: &str = env!("CARGO_BIN_EXE_cuinterpose-transport-peer");
/// Scheduling slack allowed on top of a timeout.
const SLACK: Duration = Duration::from_millis(1500);

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

// ---------------------------------------------------------------- a misbehaving client

/// The helper connects and sends `scenario`'s request bytes; this process reads the request.
/// Returns the result, how long reading took, and the helper's report.
fn request_from_peer(
    scenario: &str,
    timeout: Duration,
) -> (Result<Request, TransportError>, Duration, Vec<String>) {
    let dir = Scratch::new(&format!("request-{scenario}"));
    let listener = Listener::bind(dir.path(), pid(4242))
        .expect("bind")
        .with_request_timeout(timeout)
        .expect("timeout");
    let path = listener.endpoint().path().to_path_buf();
    let peer = PeerProcess::spawn(&["send", path.to_str().expect("utf-8"), scenario]);
    let mut connection = listener.accept().expect("accept");
    assert_eq!(connection.credentials().pid, peer.pid());
    assert_eq!(
        connection.credentials().uid,
        nix::unistd::geteuid().as_raw()
    );
    LARGEST.store(0, Ordering::Relaxed);
    let start = Instant::now();
    let result = connection.read_request().map(|(request, fd)| {
        assert!(fd.is_none());
        request
    });
    let elapsed = start.elapsed();
    if let Err(error) = &result {
        assert_names_endpoint(error, &path);
        assert!(
            error
                .to_string()
                .contains(&format!("peer pid {}", peer.pid())),
            "{error}"
        );
    } else {
        let reply = Reply::Completed(p::CompletedReply {
            operation: p::Operation::PrepareUnicast,
            bytes: 0,
            copy_ns: 0,
        });
        connection.send_reply(&reply, None).expect("reply");
    }
    drop(connection);
    let lines = peer.finish();
    (result, elapsed, lines)
}

fn check_request(scenario: &str, expect: impl FnOnce(&TransportError)) -> Vec<String> {
    let mut report = Vec::new();
    check(|| {
        let (result, elapsed, lines) = request_from_peer(scenario, Duration::from_secs(10));
        let error = result.expect_err("a bad request must fail");
        expect(&error);
        // Each of these fails on what arrived, without waiting for the timeout.
        assert!(
            elapsed < Duration::from_secs(2),
            "{scenario}: took {elapsed:?}"
        );
        report = lines;
    });
    report
}

#[test]
fn oversized_length_prefix_is_refused_before_allocating() {
    check(|| {
        let (result, elapsed, _) = request_from_peer("oversized", Duration::from_secs(10));
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            // A server reads requests under the tighter request limit.
            matches!(result, Err(TransportError::Oversized { size, limit, .. })
                if size == p::MAX_MESSAGE_BYTES as u64 + 1
                    && limit == cuinterpose_protocol::transport::REQUEST_FRAME_LIMIT),
            "{result:?}"
        );
        assert!(largest < 1 << 20, "largest allocation {largest} bytes");
        // The peer keeps the connection open: failing at once shows no body was awaited.
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    });
    check_request("huge", |error| {
        assert!(
            matches!(error, TransportError::Oversized { size, .. } if *size == u64::from(u32::MAX)),
            "{error:?}"
        )
    });
}

#[test]
fn zero_length_frame_is_malformed() {
    check_request("zero", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::NotEnvelope { .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
}

#[test]
fn garbage_bytes_are_malformed() {
    check_request("garbage", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::NotEnvelope { .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
    check_request("bad-body", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::Malformed { .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
}

#[test]
fn wrong_version_is_its_own_error() {
    check_request("version", |error| {
        assert!(
            matches!(error, TransportError::Version { found, expected, .. }
                if *found == p::VERSION + 1 && *expected == p::VERSION),
            "{error:?}"
        )
    });
}

#[test]
fn trailing_bytes_are_malformed() {
    check_request("trailing", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::Trailing { count: 1, .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
}

#[test]
fn descriptor_on_a_request_is_unexpected_and_closed() {
    for scenario in ["fd", "late-fd"] {
        let lines = check_request(scenario, |error| {
            assert!(
                matches!(
                    error,
                    TransportError::UnexpectedFd {
                        message: "request",
                        ..
                    }
                ),
                "{error:?}"
            )
        });
        assert!(
            lines.contains(&"fds-closed".to_string()),
            "{scenario}: {lines:?}"
        );
    }
}

#[test]
fn two_descriptors_in_one_frame_are_excess_and_closed() {
    let lines = check_request("two-fds", |error| {
        assert!(
            matches!(error, TransportError::ExcessFds { count: 2, .. }),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
}

#[test]
fn many_descriptors_truncate_the_ancillary_data_and_are_closed() {
    let lines = check_request("many-fds", |error| {
        assert!(
            matches!(error, TransportError::Truncated { .. }),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
}

#[test]
fn peer_closing_mid_frame_or_before_is_peer_closed() {
    for scenario in ["cut", "close"] {
        check_request(scenario, |error| {
            assert!(
                matches!(error, TransportError::PeerClosed { .. }),
                "{error:?}"
            )
        });
    }
}

#[test]
fn half_a_frame_times_out_within_the_request_timeout() {
    check(|| {
        let timeout = Duration::from_millis(400);
        let (result, elapsed, lines) = request_from_peer("half", timeout);
        assert!(
            matches!(result, Err(TransportError::Timeout { during: "receiving a request", after, .. }) if after == timeout),
            "{result:?}"
        );
        assert!(
            elapsed >= timeout && elapsed < timeout + SLACK,
            "{elapsed:?}"
        );
        assert!(
            lines.iter().any(|line| line.starts_with("peer-closed")),
            "{lines:?}"
        );
    });
}

#[test]
fn fragmented_frame_is_reassembled() {
    check(|| {
        let (result, _, lines) = request_from_peer("fragmented", Duration::from_secs(10));
        assert_eq!(result.expect("fragmented request"), Request::Inspect);
        // The peer received the whole reply frame, then our close.
        let completed = p::encode(&Reply::Completed(p::CompletedReply {
            operation: p::Operation::PrepareUnicast,
            bytes: 0,
            copy_ns: 0,
        }))
        .expect("encode");
        let expected = format!("peer-closed received={}", completed.len() + 4);
        assert!(lines.contains(&expected), "{lines:?}");
    });
}

#[test]
fn reply_descriptor_rules_are_enforced_before_sending() {
    check(|| {
        let dir = Scratch::new("reply-rules");
        let listener = Listener::bind(dir.path(), pid(4243)).expect("bind");
        let path = listener.endpoint().path().to_path_buf();
        let peer = PeerProcess::spawn(&["send", path.to_str().expect("utf-8"), "valid"]);
        let mut connection = listener.accept().expect("accept");
        assert_eq!(
            connection.read_request().expect("request").0,
            Request::Inspect
        );
        let export = Reply::UnicastExport(p::UnicastExportReply { size: 1 });
        let error = connection
            .send_reply(&export, None)
            .expect_err("export without fd");
        assert!(
            matches!(
                error,
                TransportError::MissingFd {
                    message: "unicast_export",
                    ..
                }
            ),
            "{error:?}"
        );
        let inspection = Reply::Completed(p::CompletedReply {
            operation: p::Operation::PrepareUnicast,
            bytes: 0,
            copy_ns: 0,
        });
        let fd = fs::File::open("/dev/null").expect("/dev/null");
        let error = connection
            .send_reply(&inspection, Some(fd.as_fd()))
            .expect_err("completed with fd");
        assert!(
            matches!(
                error,
                TransportError::UnexpectedFd {
                    message: "completed",
                    ..
                }
            ),
            "{error:?}"
        );
        drop(fd);
        connection
            .send_reply(&inspection, None)
            .expect("a valid reply");
        drop(connection);
        let lines = peer.finish();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].starts_with("peer-closed received="), "{lines:?}");
    });
}

// ---------------------------------------------------------------- a misbehaving server

type CallResult = Result<(Reply, Option<OwnedFd>), TransportError>;

/// The helper binds, reads our request properly and answers with `scenario` around a valid
/// reply of `kind`; this process calls it.
fn call_peer(scenario: &str, kind: &str, timeout: Duration) -> (CallResult, Duration, Vec<String>) {
    let dir = Scratch::new(&format!("reply-{scenario}-{kind}"));
    let peer = PeerProcess::spawn(&[
        "reply",
        dir.path().to_str().expect("utf-8"),
        "4343",
        scenario,
        kind,
    ]);
    assert_eq!(peer.line(), "ready");
    let endpoint = Endpoint::for_pid(dir.path(), pid(4343)).expect("endpoint");
    let start = Instant::now();
    let result = transport::call(&endpoint, &Request::Inspect, None, timeout);
    let elapsed = start.elapsed();
    if let Err(error) = &result {
        assert_names_endpoint(error, endpoint.path());
        assert!(
            error
                .to_string()
                .contains(&format!("peer pid {}", peer.pid())),
            "{error}"
        );
    }
    let lines = peer.finish();
    (result, elapsed, lines)
}

fn check_reply(scenario: &str, kind: &str, expect: impl FnOnce(&TransportError)) -> Vec<String> {
    let mut report = Vec::new();
    check(|| {
        let (result, elapsed, lines) = call_peer(scenario, kind, Duration::from_secs(10));
        let error = result.expect_err("a bad reply must fail");
        expect(&error);
        assert!(
            elapsed < Duration::from_secs(2),
            "{scenario}: took {elapsed:?}"
        );
        assert_eq!(
            lines.first().map(String::as_str),
            Some("request inspect"),
            "{lines:?}"
        );
        report = lines;
    });
    report
}

#[test]
fn peer_that_never_answers_times_out() {
    for scenario in ["silent", "half"] {
        check(|| {
            let timeout = Duration::from_millis(500);
            let (result, elapsed, lines) = call_peer(scenario, "inspection", timeout);
            assert!(
                matches!(result, Err(TransportError::Timeout { during: "receiving the reply", after, .. }) if after == timeout),
                "{result:?}"
            );
            assert!(
                elapsed >= timeout && elapsed < timeout + SLACK,
                "{elapsed:?}"
            );
            assert!(
                lines.iter().any(|line| line.starts_with("peer-closed")),
                "{lines:?}"
            );
        });
    }
}

#[test]
fn bad_replies_get_the_matching_error() {
    check_reply("close", "inspection", |error| {
        assert!(
            matches!(
                error,
                TransportError::PeerClosed {
                    during: "receiving the reply",
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.may_have_arrived(), "the request was read: {error}");
    });
    check_reply("cut", "inspection", |error| {
        assert!(
            matches!(error, TransportError::PeerClosed { .. }),
            "{error:?}"
        )
    });
    check_reply("oversized", "inspection", |error| {
        assert!(
            matches!(error, TransportError::Oversized { .. }),
            "{error:?}"
        )
    });
    check_reply("garbage", "inspection", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::NotEnvelope { .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
    check_reply("version", "inspection", |error| {
        assert!(matches!(error, TransportError::Version { .. }), "{error:?}")
    });
    check_reply("trailing", "export", |error| {
        assert!(
            matches!(
                error,
                TransportError::Malformed {
                    source: DecodeError::Trailing { .. },
                    ..
                }
            ),
            "{error:?}"
        )
    });
    check_reply("no-fd", "export", |error| {
        assert!(
            matches!(
                error,
                TransportError::MissingFd {
                    message: "unicast_export",
                    ..
                }
            ),
            "{error:?}"
        )
    });
}

#[test]
fn descriptors_where_none_belong_are_closed() {
    let lines = check_reply("fd", "inspection", |error| {
        assert!(
            matches!(
                error,
                TransportError::UnexpectedFd {
                    message: "inspection",
                    ..
                }
            ),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
    let lines = check_reply("fd", "refused", |error| {
        assert!(
            matches!(
                error,
                TransportError::UnexpectedFd {
                    message: "refused",
                    ..
                }
            ),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
    let lines = check_reply("two-fds", "export", |error| {
        assert!(
            matches!(error, TransportError::ExcessFds { count: 2, .. }),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
    let lines = check_reply("many-fds", "export", |error| {
        assert!(
            matches!(error, TransportError::Truncated { .. }),
            "{error:?}"
        )
    });
    assert!(lines.contains(&"fds-closed".to_string()), "{lines:?}");
}

#[test]
fn refused_reply_is_a_reply_not_an_error() {
    check(|| {
        let (result, _, _) = call_peer("valid", "refused", Duration::from_secs(10));
        let (reply, fd) = result.expect("a refusal is a reply");
        assert!(fd.is_none());
        assert!(
            matches!(&reply, Reply::Refused(refused) if refused.code == p::RefusalCode::OutOfOrder),
            "{reply:?}"
        );
    });
}

// ---------------------------------------------------------------- well-behaved peers

fn serve(dir: &Path, pid: u32, connections: usize, mode: &str, timeout_ms: u64) -> PeerProcess {
    let peer = PeerProcess::spawn(&[
        "serve",
        dir.to_str().expect("utf-8"),
        &pid.to_string(),
        &connections.to_string(),
        mode,
        &timeout_ms.to_string(),
    ]);
    assert_eq!(peer.line(), "ready");
    peer
}

fn export_request(resource: p::ResourceKind) -> Request {
    Request::Export(p::ExportRequest {
        allocation: p::AllocationReference {
            id: p::AllocationId::new([0x22; 16]).expect("non-zero"),
            creator_pid: pid(4444),
        },
        resource,
        capability: p::CapabilityToken::new([0x5a; 16]).expect("non-zero"),
    })
}

#[test]
fn descriptor_crosses_processes_and_is_usable() {
    check(|| {
        let dir = Scratch::new("serve-fd");
        let peer = serve(dir.path(), 4444, 5, "threaded", 5000);
        let endpoint = Endpoint::for_pid(dir.path(), pid(4444)).expect("endpoint");
        let timeout = Duration::from_secs(10);

        let (reply, fd) =
            transport::call(&endpoint, &Request::Inspect, None, timeout).expect("inspect");
        assert!(fd.is_none());
        assert!(
            matches!(&reply, Reply::Inspection(inspection) if inspection.namespace_pid == pid(4444)),
            "{reply:?}"
        );

        let (reply, fd) = transport::call(
            &endpoint,
            &export_request(p::ResourceKind::Unicast),
            None,
            timeout,
        )
        .expect("unicast export");
        let fd = fd.expect("export replies carry a descriptor");
        let expected = format!("bytes from peer {}", peer.pid());
        assert_eq!(
            reply,
            Reply::UnicastExport(p::UnicastExportReply {
                size: expected.len() as u64
            })
        );
        let mut bytes = vec![0u8; expected.len()];
        assert_eq!(
            nix::sys::uio::pread(&fd, &mut bytes, 0).expect("pread"),
            expected.len()
        );
        assert_eq!(bytes, expected.as_bytes());
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).expect("F_GETFD");
        assert_ne!(
            flags & libc::FD_CLOEXEC,
            0,
            "received descriptors are close-on-exec"
        );
        drop(fd);

        // A ticket made by the other process reads back here, seals intact.
        let request = export_request(p::ResourceKind::Multicast);
        let (reply, fd) =
            transport::call(&endpoint, &request, None, timeout).expect("multicast export");
        assert!(matches!(reply, Reply::MulticastExport(_)), "{reply:?}");
        let ticket = p::ticket::read_ticket(fd.as_ref().expect("ticket").as_fd()).expect("ticket");
        let Request::Export(export) = &request else {
            unreachable!()
        };
        assert_eq!(ticket.handle.allocation, export.allocation.id);
        assert_eq!(ticket.handle.creator_pid, export.allocation.creator_pid);
        assert_eq!(ticket.capability, export.capability);
        drop(fd);

        let (reply, _) = transport::call_with(
            &endpoint,
            &Request::Execute(p::ExecuteRequest {
                operation: p::Operation::SaveAllocations,
            }),
            &Timeouts::default(),
        )
        .expect("execute");
        assert_eq!(
            reply,
            Reply::Completed(p::CompletedReply {
                operation: p::Operation::SaveAllocations,
                bytes: 0,
                copy_ns: 0
            })
        );
        let (reply, _) = transport::call(&endpoint, &Request::BeginCheckpoint, None, timeout)
            .expect("begin_checkpoint");
        assert!(matches!(reply, Reply::Refused(_)), "{reply:?}");

        let lines = peer.finish();
        assert_eq!(lines.last().map(String::as_str), Some("done"), "{lines:?}");
        assert_eq!(
            lines
                .iter()
                .filter(|line| line.starts_with("served"))
                .count(),
            5,
            "{lines:?}"
        );
    });
}

/// A client that sends half a frame and stalls, then a normal client: a threaded server answers
/// the second at once; a sequential one after at most its request timeout.
fn stalled_then_normal(mode: &str, request_timeout: Duration) -> (Duration, Vec<String>) {
    let dir = Scratch::new(&format!("stall-{mode}"));
    let server = serve(
        dir.path(),
        4545,
        2,
        mode,
        request_timeout.as_millis() as u64,
    );
    let endpoint = Endpoint::for_pid(dir.path(), pid(4545)).expect("endpoint");
    let stalled = PeerProcess::spawn(&["send", endpoint.path().to_str().expect("utf-8"), "half"]);
    assert_eq!(stalled.line(), "sent");
    let start = Instant::now();
    let (reply, _) = transport::call(&endpoint, &Request::Inspect, None, Duration::from_secs(10))
        .expect("the next client is served");
    let elapsed = start.elapsed();
    assert!(matches!(reply, Reply::Inspection(_)), "{reply:?}");
    let lines = server.finish();
    let stalled_lines = stalled.finish();
    assert!(
        stalled_lines
            .iter()
            .any(|line| line.starts_with("peer-closed")),
        "{stalled_lines:?}"
    );
    (elapsed, lines)
}

#[test]
fn stalled_peer_does_not_block_the_next_client() {
    check(|| {
        let (elapsed, lines) = stalled_then_normal("threaded", Duration::from_millis(1500));
        assert!(elapsed < Duration::from_millis(1000), "{elapsed:?}");
        assert_eq!(lines, ["served inspect", "error Timeout", "done"]);
    });
    check(|| {
        let timeout = Duration::from_millis(800);
        let (elapsed, lines) = stalled_then_normal("sequential", timeout);
        assert!(elapsed < timeout + SLACK, "{elapsed:?}");
        assert_eq!(lines, ["error Timeout", "served inspect", "done"]);
    });
}

#[test]
fn full_listen_queue_and_silent_listener_time_out() {
    check(|| {
        let dir = Scratch::new("stuck");
        let path = dir.join("stuck.sock");
        let peer = PeerProcess::spawn(&["stuck", path.to_str().expect("utf-8")]);
        assert_eq!(peer.line(), "ready");
        let endpoint = Endpoint::new(&path).expect("endpoint");
        let timeout = Duration::from_millis(300);
        // The first connection fits the queue of one and is never accepted.
        let start = Instant::now();
        let result = transport::call(&endpoint, &Request::Inspect, None, timeout);
        let elapsed = start.elapsed();
        assert!(
            matches!(
                result,
                Err(TransportError::Timeout {
                    during: "receiving the reply",
                    ..
                })
            ),
            "{result:?}"
        );
        // Sent and never answered: it may have changed the peer.
        assert!(result.as_ref().expect_err("timed out").may_have_arrived());
        assert!(
            elapsed >= timeout && elapsed < timeout + SLACK,
            "{elapsed:?}"
        );
        // The queue is now full: connect itself waits, bounded by SO_SNDTIMEO.
        let start = Instant::now();
        let result = transport::call(&endpoint, &Request::Inspect, None, timeout);
        let elapsed = start.elapsed();
        assert!(
            matches!(
                result,
                Err(TransportError::Timeout {
                    during: "connecting (the listen queue is full)",
                    ..
                })
            ),
            "{result:?}"
        );
        // Never connected: nothing reached the peer.
        assert!(!result.as_ref().expect_err("timed out").may_have_arrived());
        assert!(
            elapsed >= timeout && elapsed < timeout + SLACK,
            "{elapsed:?}"
        );
        peer.finish();
    });
}

#[test]
fn missing_or_dead_listener_is_refused() {
    check(|| {
        let dir = Scratch::new("dead");
        let path = dir.join("cuinterpose-7.sock");
        let endpoint = Endpoint::new(&path).expect("endpoint");
        let result = transport::call(&endpoint, &Request::Inspect, None, Duration::from_secs(1));
        assert!(
            matches!(
                &result,
                Err(TransportError::Refused {
                    reason: RefusalReason::NoSocket,
                    ..
                })
            ),
            "{result:?}"
        );
        drop(StdListener::bind(&path).expect("bind"));
        let result = transport::call(&endpoint, &Request::Inspect, None, Duration::from_secs(1));
        assert!(
            matches!(
                &result,
                Err(TransportError::Refused {
                    reason: RefusalReason::NotListening,
                    ..
                })
            ),
            "{result:?}"
        );
        if let Err(error) = &result {
            assert_names_endpoint(error, &path);
            assert!(!error.may_have_arrived(), "{error}");
        }
    });
}

#[test]
fn call_refuses_a_request_descriptor_and_zero_timeout_before_connecting() {
    check(|| {
        // Nothing exists at this path: an error other than NoSocket proves no connect happened.
        let endpoint = Endpoint::new("/nonexistent/cuinterpose-1.sock").expect("endpoint");
        let fd = OwnedFd::from(fs::File::open("/dev/null").expect("/dev/null"));
        let result = transport::call(
            &endpoint,
            &Request::Inspect,
            Some(fd),
            Duration::from_secs(1),
        );
        assert!(
            matches!(
                &result,
                Err(TransportError::UnexpectedFd {
                    message: "inspect",
                    ..
                })
            ),
            "{result:?}"
        );
        let result = transport::call(&endpoint, &Request::Inspect, None, Duration::ZERO);
        assert!(
            matches!(&result, Err(TransportError::InvalidTimeout { .. })),
            "{result:?}"
        );
        assert!(!result.expect_err("refused").may_have_arrived());
        let result = transport::call(
            &endpoint,
            &Request::Inspect,
            None,
            Duration::from_secs(u64::MAX),
        );
        assert!(
            matches!(&result, Err(TransportError::InvalidTimeout { .. })),
            "{result:?}"
        );
    });
}

// ---------------------------------------------------------------- peer credentials

/// Collects the messages and fields of every event logged while installed.
struct Capture(Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = format!("{} ", event.metadata().level());
        event.record(&mut Fields(&mut text));
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(text);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

const NOBODY: u32 = 65534;

#[test]
fn foreign_uid_is_refused_and_logged() {
    check(|| {
        assert!(transport::peer_allowed(1000, 1000));
        assert!(transport::peer_allowed(1000, 0));
        assert!(!transport::peer_allowed(1000, 1001));
        assert!(!transport::peer_allowed(0, NOBODY));
        let dir = Scratch::new("foreign");
        let listener = Listener::bind(dir.path(), pid(4646)).expect("bind");
        let path = listener.endpoint().path().to_path_buf();
        let root = nix::unistd::geteuid().is_root();
        let mut command = if root {
            // Test only: open the file system permissions so that the kernel lets the other
            // user reach the socket and the credential check is what refuses it. The helper is
            // copied where that user may execute it.
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).expect("chmod");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
            let copy = dir.join("peer");
            fs::copy(PEER_EXE, &copy).expect("copy the helper");
            fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod");
            let mut command = Command::new(copy);
            command.uid(NOBODY).gid(NOBODY);
            command
        } else {
            // Without root no other uid exists to test with; the own uid must be accepted.
            Command::new(PEER_EXE)
        };
        command.args(["call", path.to_str().expect("utf-8"), "inspect", "5000"]);
        let peer = PeerProcess::start(command);
        let logs = Arc::new(Mutex::new(Vec::new()));
        let result =
            tracing::subscriber::with_default(Capture(Arc::clone(&logs)), || listener.accept());
        if !root {
            let mut connection = result.expect("own uid accepted");
            let _ = connection.read_request().expect("request");
            drop(connection);
            peer.finish();
            return;
        }
        match &result {
            Err(TransportError::Refused {
                peer: refused,
                reason: RefusalReason::ForeignUid { uid: NOBODY },
            }) => assert_eq!(refused.pid, Some(peer.pid() as u32)),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(result.expect_err("refused").to_string().contains("65534"));
        let line = peer.line();
        assert!(line.starts_with("error PeerClosed"), "{line}");
        peer.finish();
        let logs = logs.lock().expect("logs").clone();
        assert!(
            logs.iter().any(|line| line.starts_with("WARN")
                && line.contains("refused a connection from another user")
                && line.contains("peer_uid=65534")),
            "{logs:?}"
        );
    });
}

// ---------------------------------------------------------------- endpoints

fn invalid_endpoint(result: Result<Listener, TransportError>) -> EndpointProblem {
    match result {
        Err(TransportError::InvalidEndpoint { problem, .. }) => problem,
        other => panic!("expected InvalidEndpoint, got {other:?}"),
    }
}

#[test]
fn listener_makes_a_private_directory_and_socket_and_removes_it() {
    check(|| {
        let scratch = Scratch::new("private");
        let dir = scratch.join("nested/control");
        let listener = Listener::bind(&dir, pid(77)).expect("bind");
        let path = dir.join("cuinterpose-77.sock");
        assert_eq!(listener.endpoint().path(), path);
        let dir_mode = fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        let socket = fs::symlink_metadata(&path).expect("socket");
        assert!(socket.file_type().is_socket());
        assert_eq!(socket.permissions().mode() & 0o777, 0o600);
        drop(listener);
        assert!(!path.exists(), "the listener removes its socket");
    });
}

#[test]
fn unsafe_control_directories_are_refused() {
    check(|| {
        let scratch = Scratch::new("unsafe-dirs");
        let shared = scratch.join("shared");
        fs::create_dir(&shared).expect("mkdir");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o770)).expect("chmod");
        let problem = invalid_endpoint(Listener::bind(&shared, pid(1)));
        assert!(
            matches!(problem, EndpointProblem::WritableByOthers { mode: 0o770 }),
            "{problem:?}"
        );

        let file = scratch.join("file");
        fs::write(&file, b"x").expect("write");
        let problem = invalid_endpoint(Listener::bind(&file, pid(1)));
        assert!(
            matches!(problem, EndpointProblem::NotADirectory),
            "{problem:?}"
        );

        let long = scratch.join(&"d".repeat(120));
        let problem = invalid_endpoint(Listener::bind(&long, pid(1)));
        assert!(
            matches!(problem, EndpointProblem::TooLong { max: 107, .. }),
            "{problem:?}"
        );

        if nix::unistd::geteuid().is_root() {
            let other = scratch.join("other");
            fs::create_dir(&other).expect("mkdir");
            fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).expect("chmod");
            nix::unistd::chown(&other, Some(NOBODY.into()), None).expect("chown");
            let problem = invalid_endpoint(Listener::bind(&other, pid(1)));
            assert!(
                matches!(
                    problem,
                    EndpointProblem::WrongOwner {
                        owner: NOBODY,
                        own: 0
                    }
                ),
                "{problem:?}"
            );
        }
    });
}

#[test]
fn stale_sockets_are_replaced_but_live_ones_and_other_files_are_not() {
    check(|| {
        let dir = Scratch::new("stale");
        let path = dir.join("cuinterpose-5.sock");
        drop(StdListener::bind(&path).expect("bind a socket and leave it behind"));
        let listener = Listener::bind(dir.path(), pid(5)).expect("stale socket replaced");
        drop(listener);

        // A live listener in another process keeps its socket; our probe is its one connection.
        let server = serve(dir.path(), 6, 1, "sequential", 2000);
        let problem = invalid_endpoint(Listener::bind(dir.path(), pid(6)));
        assert!(matches!(problem, EndpointProblem::InUse), "{problem:?}");
        let lines = server.finish();
        assert_eq!(lines, ["error PeerClosed", "done"]);

        let blocker = dir.join("cuinterpose-8.sock");
        fs::write(&blocker, b"not a socket").expect("write");
        let problem = invalid_endpoint(Listener::bind(dir.path(), pid(8)));
        assert!(
            matches!(problem, EndpointProblem::NotASocket),
            "{problem:?}"
        );
        assert_eq!(fs::read(&blocker).expect("still there"), b"not a socket");
    });
}

#[test]
fn control_directory_comes_from_the_environment_or_the_default() {
    check(|| {
        assert_eq!(
            transport::control_dir_from(None).expect("default"),
            Path::new(transport::DEFAULT_CONTROL_DIR)
        );
        assert_eq!(transport::DEFAULT_CONTROL_DIR, "/tmp/cuinterpose");
        assert_eq!(
            transport::control_dir_from(Some("/run/user/1000/cui".into())).expect("absolute"),
            Path::new("/run/user/1000/cui")
        );
        let result = transport::control_dir_from(Some("relative/dir".into()));
        assert!(
            matches!(
                result,
                Err(TransportError::InvalidEndpoint {
                    problem: EndpointProblem::NotAbsolute,
                    ..
                })
            ),
            "{result:?}"
        );
        assert_eq!(
            Endpoint::for_pid(Path::new("/tmp/cuinterpose"), pid(1234))
                .expect("endpoint")
                .path(),
            Path::new("/tmp/cuinterpose/cuinterpose-1234.sock")
        );
    });
}

// ---------------------------------------------------------------- timeouts

fn lookup(
    control: Option<&'static str>,
    copy: Option<&'static str>,
) -> impl Fn(&str) -> Option<std::ffi::OsString> {
    move |name| match name {
        transport::CONTROL_TIMEOUT_VARIABLE => control.map(Into::into),
        transport::COPY_TIMEOUT_VARIABLE => copy.map(Into::into),
        _ => None,
    }
}

#[test]
fn timeouts_default_override_and_reject_invalid_values() {
    check(|| {
        let defaults = Timeouts::from_lookup(lookup(None, None)).expect("defaults");
        assert_eq!(defaults, Timeouts::default());
        assert_eq!(defaults.control(), Duration::from_secs(10));
        assert_eq!(defaults.copy(), Duration::from_secs(3600));
        let custom = Timeouts::from_lookup(lookup(Some("3"), Some("7200"))).expect("custom");
        assert_eq!(custom.control(), Duration::from_secs(3));
        assert_eq!(custom.copy(), Duration::from_secs(7200));
        let execute = |operation| Request::Execute(p::ExecuteRequest { operation });
        assert_eq!(
            custom.for_request(&Request::Inspect),
            Duration::from_secs(3)
        );
        assert_eq!(
            custom.for_request(&Request::BeginCheckpoint),
            Duration::from_secs(6),
            "the shim drains for up to the control timeout, then synchronizes and inspects"
        );
        assert_eq!(custom.drain(), Duration::from_secs(3));
        assert_eq!(
            custom.for_request(&export_request(p::ResourceKind::Unicast)),
            Duration::from_secs(3)
        );
        assert_eq!(
            custom.for_request(&execute(p::Operation::SaveAllocations)),
            Duration::from_secs(7200)
        );
        assert_eq!(
            custom.for_request(&execute(p::Operation::LoadAllocations)),
            Duration::from_secs(7200)
        );
        assert_eq!(
            custom.for_request(&execute(p::Operation::PrepareUnicast)),
            Duration::from_secs(3)
        );

        for bad in [
            "",
            "abc",
            "0",
            "-1",
            "+5",
            " 5",
            "5s",
            "1.5",
            "604801",
            "99999999999999999999999",
        ] {
            for (control, copy, variable) in [
                (Some(bad), None, transport::CONTROL_TIMEOUT_VARIABLE),
                (None, Some(bad), transport::COPY_TIMEOUT_VARIABLE),
            ] {
                match Timeouts::from_lookup(lookup(control, copy)) {
                    Err(TransportError::InvalidTimeout { setting, value, .. }) => {
                        assert_eq!(setting, variable);
                        assert_eq!(value, bad);
                    }
                    other => panic!("{variable}={bad:?} gave {other:?}"),
                }
            }
        }
        let result = Timeouts::new(Duration::ZERO, Duration::from_secs(1));
        assert!(
            matches!(result, Err(TransportError::InvalidTimeout { .. })),
            "{result:?}"
        );
    });
}

#[test]
fn timeouts_are_read_from_the_process_environment() {
    check(|| {
        let run = |control: &str, copy: &str| {
            let mut command = Command::new(PEER_EXE);
            command
                .arg("timeouts")
                .env(transport::CONTROL_TIMEOUT_VARIABLE, control)
                .env(transport::COPY_TIMEOUT_VARIABLE, copy);
            let peer = PeerProcess::start(command);
            let line = peer.line();
            peer.finish();
            line
        };
        assert_eq!(run("5", "7200"), "ok control=5 copy=7200");
        let line = run("ten", "7200");
        assert!(line.starts_with("error InvalidTimeout"), "{line}");
        assert!(line.contains(transport::CONTROL_TIMEOUT_VARIABLE), "{line}");
        let line = run("5", "0");
        assert!(line.starts_with("error InvalidTimeout"), "{line}");
        assert!(line.contains(transport::COPY_TIMEOUT_VARIABLE), "{line}");
    });
}
