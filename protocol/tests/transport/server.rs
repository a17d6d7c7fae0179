//! A misbehaving server: the calling side refuses what it answers.

use super::*;

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

/// `scenario`'s reply to an inspect fails at once with an error `expect` accepts; the peer's
/// report.
fn check_reply(
    scenario: &str,
    kind: &str,
    expect: impl FnOnce(&TransportError) -> bool,
) -> Vec<String> {
    let mut report = Vec::new();
    check(|| {
        let (result, elapsed, lines) = call_peer(scenario, kind, Duration::from_secs(10));
        let error = result.expect_err("a bad reply must fail");
        assert!(expect(&error), "{scenario}: {error:?}");
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
            assert_timed_out(&result, IoStage::ReceivingReply, timeout, elapsed);
            assert_peer_closed(&lines);
        });
    }
}

#[test]
fn bad_replies_get_the_matching_error() {
    check_reply("close", "inspection", |error| {
        // The request was read, so it may have arrived.
        error.may_have_arrived()
            && matches!(
                error,
                TransportError::PeerClosed {
                    during: IoStage::ReceivingReply,
                    ..
                }
            )
    });
    check_reply("cut", "inspection", |error| {
        matches!(error, TransportError::PeerClosed { .. })
    });
    check_reply("oversized", "inspection", |error| {
        matches!(error, TransportError::Oversized { .. })
    });
    check_reply("garbage", "inspection", not_an_envelope);
    check_reply("version", "inspection", |error| {
        matches!(error, TransportError::Version { .. })
    });
    check_reply("trailing", "export", |error| {
        matches!(
            error,
            TransportError::Malformed {
                source: DecodeError::Trailing { .. },
                ..
            }
        )
    });
    check_reply("no-fd", "export", |error| {
        matches!(
            error,
            TransportError::MissingFd {
                message: "unicast_export",
                ..
            }
        )
    });
}

#[test]
fn descriptors_where_none_belong_are_closed() {
    for kind in ["inspection", "refused"] {
        let lines = check_reply(
            "fd",
            kind,
            |error| matches!(error, TransportError::UnexpectedFd { message, .. } if *message == kind),
        );
        assert_fds_closed(kind, &lines);
    }
    let lines = check_reply("two-fds", "export", |error| {
        matches!(error, TransportError::ExcessFds { count: 2, .. })
    });
    assert_fds_closed("two-fds", &lines);
    let lines = check_reply("many-fds", "export", |error| {
        matches!(error, TransportError::Truncated { .. })
    });
    assert_fds_closed("many-fds", &lines);
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
