//! Well-behaved peers: descriptors crossing processes, stalls that hold up nobody.

use super::*;

// ---------------------------------------------------------------- well-behaved peers

pub(crate) fn serve(
    dir: &Path,
    pid: u32,
    connections: usize,
    mode: &str,
    timeout_ms: u64,
) -> PeerProcess {
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

pub(crate) fn export_request(resource: p::ResourceKind) -> Request {
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
            &Request::Execute(p::ExecuteRequest::host(p::Operation::SaveAllocations)),
            None,
            &Timeouts::default(),
        )
        .expect("execute");
        assert_eq!(
            reply,
            Reply::Completed(p::CompletedReply {
                operation: p::Operation::SaveAllocations,
                bytes: 0,
                copy_ns: 0,
                peak_carrier_bytes: 0,
                checksums: Default::default(),
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
    assert_peer_closed(&stalled_lines);
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
        assert_timed_out(&result, IoStage::ReceivingReply, timeout, elapsed);
        // Sent and never answered: it may have changed the peer.
        assert!(result.as_ref().expect_err("timed out").may_have_arrived());
        // The queue is now full: connect itself waits, bounded by SO_SNDTIMEO.
        let start = Instant::now();
        let result = transport::call(&endpoint, &Request::Inspect, None, timeout);
        let elapsed = start.elapsed();
        assert_timed_out(&result, IoStage::ConnectQueueFull, timeout, elapsed);
        // Never connected: nothing reached the peer.
        assert!(!result.as_ref().expect_err("timed out").may_have_arrived());
        peer.finish();
    });
}

#[test]
fn missing_or_dead_listener_is_refused() {
    check(|| {
        let dir = Scratch::new("dead");
        let path = dir.join("cuinterpose-7.sock");
        let endpoint = Endpoint::new(&path).expect("endpoint");
        // A call that must be refused for `expected`: its result.
        let refused = |expected: RefusalReason| {
            let result =
                transport::call(&endpoint, &Request::Inspect, None, Duration::from_secs(1));
            assert!(
                matches!(&result, Err(TransportError::Refused { reason, .. }) if *reason == expected),
                "{result:?}"
            );
            result
        };
        drop(refused(RefusalReason::NoSocket));
        drop(StdListener::bind(&path).expect("bind"));
        let result = refused(RefusalReason::NotListening);
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
