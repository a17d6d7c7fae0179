//! A misbehaving client: the listener side refuses what it sends.

use super::*;

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
            peak_carrier_bytes: 0,
            checksums: Default::default(),
        });
        connection.send_reply(&reply, None).expect("reply");
    }
    drop(connection);
    let lines = peer.finish();
    (result, elapsed, lines)
}

/// `scenario`'s request fails at once with an error `expect` accepts; the peer's report.
fn check_request(scenario: &str, expect: impl FnOnce(&TransportError) -> bool) -> Vec<String> {
    let mut report = Vec::new();
    check(|| {
        let (result, elapsed, lines) = request_from_peer(scenario, Duration::from_secs(10));
        let error = result.expect_err("a bad request must fail");
        assert!(expect(&error), "{scenario}: {error:?}");
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
    check_request(
        "huge",
        |error| matches!(error, TransportError::Oversized { size, .. } if *size == u64::from(u32::MAX)),
    );
}

#[test]
fn zero_length_frame_is_malformed() {
    check_request("zero", not_an_envelope);
}

#[test]
fn garbage_bytes_are_malformed() {
    check_request("garbage", not_an_envelope);
    check_request("bad-body", |error| {
        matches!(
            error,
            TransportError::Malformed {
                source: DecodeError::Malformed { .. },
                ..
            }
        )
    });
}

#[test]
fn wrong_version_is_its_own_error() {
    check_request("version", |error| {
        matches!(error, TransportError::Version { found, expected, .. }
                if *found == p::VERSION + 1 && *expected == p::VERSION)
    });
}

#[test]
fn trailing_bytes_are_malformed() {
    check_request("trailing", |error| {
        matches!(
            error,
            TransportError::Malformed {
                source: DecodeError::Trailing { count: 1, .. },
                ..
            }
        )
    });
}

#[test]
fn descriptor_on_a_request_is_unexpected_and_closed() {
    for scenario in ["fd", "late-fd"] {
        let lines = check_request(scenario, |error| {
            matches!(
                error,
                TransportError::UnexpectedFd {
                    message: "inspect",
                    ..
                }
            )
        });
        assert_fds_closed(scenario, &lines);
    }
}

/// The storage carrier's copies must bring the folder's descriptor, and nothing else may
/// bring one: both are refused before connecting (no socket is needed to tell).
#[test]
fn only_storage_copies_send_a_descriptor() {
    let endpoint =
        cuinterpose_protocol::transport::Endpoint::new("/nonexistent/cuinterpose-1.sock")
            .expect("a valid path");
    let storage = Request::Execute(p::ExecuteRequest::storage(
        p::Operation::SaveAllocations,
        p::carrier::CHUNK_BYTES,
    ));
    let error =
        transport::call(&endpoint, &storage, None, Duration::from_secs(1)).expect_err("no folder");
    assert!(
        matches!(
            error,
            TransportError::MissingFd {
                message: "execute",
                ..
            }
        ),
        "{error:?}"
    );
    let host = Request::Execute(p::ExecuteRequest::host(p::Operation::SaveAllocations));
    let fd = fs::File::open("/dev/null").expect("/dev/null");
    let error = transport::call(&endpoint, &host, Some(fd.into()), Duration::from_secs(1))
        .expect_err("a descriptor with a host copy");
    assert!(
        matches!(
            error,
            TransportError::UnexpectedFd {
                message: "execute",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn two_descriptors_in_one_frame_are_excess_and_closed() {
    let lines = check_request("two-fds", |error| {
        matches!(error, TransportError::ExcessFds { count: 2, .. })
    });
    assert_fds_closed("two-fds", &lines);
}

#[test]
fn many_descriptors_truncate_the_ancillary_data_and_are_closed() {
    let lines = check_request("many-fds", |error| {
        matches!(error, TransportError::Truncated { .. })
    });
    assert_fds_closed("many-fds", &lines);
}

#[test]
fn peer_closing_mid_frame_or_before_is_peer_closed() {
    for scenario in ["cut", "close"] {
        check_request(scenario, |error| {
            matches!(error, TransportError::PeerClosed { .. })
        });
    }
}

#[test]
fn half_a_frame_times_out_within_the_request_timeout() {
    check(|| {
        let timeout = Duration::from_millis(400);
        let (result, elapsed, lines) = request_from_peer("half", timeout);
        assert_timed_out(&result, IoStage::ReceivingRequest, timeout, elapsed);
        assert_peer_closed(&lines);
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
            peak_carrier_bytes: 0,
            checksums: Default::default(),
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
            peak_carrier_bytes: 0,
            checksums: Default::default(),
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
