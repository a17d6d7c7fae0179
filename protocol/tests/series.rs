//! A series of exports over one connection: `ExportSeries` and `export_all` against a server
//! thread of this process that answers each export with a descriptor. Every test runs under
//! `check`, which serializes them and fails one that leaks a descriptor.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cuinterpose_protocol as p;
use p::transport::{
    self, EXPORT_WINDOW, Endpoint, ExportSeries, Listener, Timeouts, TransportError,
};
use p::{Reply, Request};

mod support;

use support::{Scratch, check};

fn pid(value: u32) -> p::NamespacePid {
    p::NamespacePid::new(value).expect("non-zero")
}

/// An export of the allocation numbered `n` (its number in the id's first bytes).
fn export(n: u32) -> Request {
    let mut id = [0x11; 16];
    id[..4].copy_from_slice(&n.to_le_bytes());
    Request::Export(p::ExportRequest {
        allocation: p::AllocationReference {
            id: p::AllocationId::new(id).expect("non-zero"),
            creator_pid: pid(5151),
        },
        resource: p::ResourceKind::Unicast,
        capability: p::CapabilityToken::new([0x5a; 16]).expect("non-zero"),
    })
}

fn number_of(request: &Request) -> u64 {
    match request {
        Request::Export(e) => u64::from(u32::from_le_bytes(
            e.allocation.id.as_bytes()[..4].try_into().expect("4"),
        )),
        other => panic!("not an export: {other:?}"),
    }
}

/// Serves one connection: answers the first `answer` exports with an export of size = the
/// allocation's number and a descriptor, then closes (or, with `stall`, stops answering and
/// keeps the connection open until the client goes). Returns the kinds of the requests read.
fn server(dir: &Path, answer: usize, stall: bool) -> (Endpoint, JoinHandle<Vec<&'static str>>) {
    let listener = Listener::bind(dir, pid(5151))
        .expect("bind")
        .with_request_timeout(Duration::from_secs(5))
        .expect("timeout");
    let endpoint = listener.endpoint().clone();
    let handle = thread::spawn(move || {
        let mut connection = listener.accept().expect("accept");
        let mut seen = Vec::new();
        let null = fs::File::open("/dev/null").expect("/dev/null");
        loop {
            let request = match connection.read_request() {
                Ok((request, _)) => request,
                Err(TransportError::PeerClosed { .. }) => break,
                Err(e) => panic!("server: {e}"),
            };
            seen.push(request.kind());
            if seen.len() > answer {
                if stall {
                    // Read on, answering nothing, until the client closes.
                    continue;
                }
                break;
            }
            let reply = Reply::UnicastExport(p::UnicastExportReply {
                size: number_of(&request),
            });
            connection
                .send_reply(&reply, Some(null.as_fd()))
                .expect("reply");
        }
        seen
    });
    (endpoint, handle)
}

fn timeouts(control: Duration) -> Timeouts {
    Timeouts::new(control, Duration::from_secs(60)).expect("timeouts")
}

type ExportResult = Result<(Reply, Option<OwnedFd>), TransportError>;

/// The replies to the exports 1 to `count`, sent by `export_all` with the control timeout
/// `control`.
fn export_replies(endpoint: &Endpoint, count: u32, control: Duration) -> Vec<ExportResult> {
    let requests: Vec<Request> = (1..=count).map(export).collect();
    transport::export_all(endpoint, &requests, &timeouts(control))
        .expect("connect")
        .collect()
}

#[test]
fn a_series_is_answered_in_order_each_with_its_descriptor() {
    check(|| {
        let dir = Scratch::new("order");
        let count = EXPORT_WINDOW * 3 + 5;
        let (endpoint, server) = server(dir.path(), count, false);
        let requests: Vec<Request> = (1..=count as u32).map(export).collect();
        let replies =
            transport::export_all(&endpoint, &requests, &timeouts(Duration::from_secs(5)))
                .expect("connect");
        let mut sizes = Vec::new();
        for reply in replies {
            let (reply, fd) = reply.expect("a reply");
            let fd = fd.expect("an export comes with its descriptor");
            // The descriptor is the server's /dev/null, duplicated into this process.
            let target = fs::read_link(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ))
            .expect("readlink");
            assert_eq!(target, Path::new("/dev/null"));
            match reply {
                Reply::UnicastExport(e) => sizes.push(e.size),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(sizes, (1..=count as u64).collect::<Vec<_>>());
        assert_eq!(server.join().expect("server").len(), count);
    });
}

#[test]
fn only_exports_travel_in_a_series() {
    check(|| {
        let dir = Scratch::new("not-export");
        let (endpoint, server) = server(dir.path(), 1, false);
        let mut series =
            ExportSeries::connect(&endpoint, &timeouts(Duration::from_secs(5))).expect("connect");
        let error = series
            .send(&Request::Inspect)
            .expect_err("an inspect is no export");
        assert!(
            matches!(
                error,
                TransportError::NotAnExport {
                    message: "inspect",
                    ..
                }
            ),
            "{error:?}"
        );
        assert_eq!(error.variant(), "NotAnExport");
        assert!(
            error.to_string().contains("only exports form a series"),
            "{error}"
        );
        // Nothing went out: the server read the export only.
        series.send(&export(7)).expect("an export");
        let (reply, fd) = series.receive().expect("reply");
        assert_eq!(
            reply,
            Reply::UnicastExport(p::UnicastExportReply { size: 7 })
        );
        drop(fd);
        drop(series);
        assert_eq!(server.join().expect("server"), vec!["export"]);
    });
}

#[test]
fn a_server_that_closes_mid_series_ends_it_with_an_error() {
    check(|| {
        let dir = Scratch::new("closes");
        let (endpoint, server) = server(dir.path(), 3, false);
        let replies = export_replies(&endpoint, 10, Duration::from_secs(5));
        assert_eq!(
            replies.len(),
            4,
            "three answers, then the error, then nothing"
        );
        assert!(replies[..3].iter().all(Result::is_ok));
        let error = replies[3].as_ref().expect_err("closed");
        assert!(
            matches!(error, TransportError::PeerClosed { .. }),
            "{error:?}"
        );
        drop(replies);
        server.join().expect("server");
    });
}

#[test]
fn a_server_that_stops_answering_times_out_within_the_control_timeout() {
    check(|| {
        let dir = Scratch::new("stalls");
        let (endpoint, server) = server(dir.path(), 2, true);
        let timeout = Duration::from_millis(400);
        let started = Instant::now();
        let replies = export_replies(&endpoint, 5, timeout);
        let waited = started.elapsed();
        assert_eq!(replies.len(), 3, "{replies:?}");
        let error = replies[2].as_ref().expect_err("stalled");
        assert!(matches!(error, TransportError::Timeout { .. }), "{error:?}");
        assert!(waited >= timeout, "gave up after {waited:?}");
        drop(replies);
        assert_eq!(
            server.join().expect("server").len(),
            5,
            "all five were sent at once"
        );
    });
}

#[test]
fn a_missing_creator_is_refused_at_connect() {
    check(|| {
        let dir = Scratch::new("missing");
        let endpoint = Endpoint::for_pid(dir.path(), pid(5252)).expect("endpoint");
        let error =
            transport::export_all(&endpoint, &[export(1)], &timeouts(Duration::from_secs(1)))
                .expect_err("nobody listens");
        assert_eq!(error.endpoint(), Some(endpoint.path()), "{error:?}");
    });
}
