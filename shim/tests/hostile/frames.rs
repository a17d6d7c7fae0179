//! Malformed frames, and stalled and slow senders.

use super::*;

/// The parts, one after the other.
fn joined(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn malformed_frames_are_refused_and_leave_the_shim_serving() {
    let _serial = serial();
    let mut target = Target::new("malformed");
    let inspect = encoded(&Request::Inspect);

    // Length prefixes: over the request limit (checked before any body is read; requests are
    // small, so the shim reads far less than MAX_MESSAGE_BYTES), over the message limit, the
    // largest u32, and zero.
    check_rejected(
        &mut target,
        "length one over the request limit",
        &(REQUEST_FRAME_LIMIT as u32 + 1).to_le_bytes(),
        "a frame of 65537 bytes exceeds the limit of 65536 bytes",
    );
    check_rejected(
        &mut target,
        "length one over the message limit",
        &(MAX_MESSAGE_BYTES + 1).to_le_bytes(),
        "exceeds the limit of 65536 bytes",
    );
    check_rejected(
        &mut target,
        "length u32::MAX",
        &u32::MAX.to_le_bytes(),
        "a frame of 4294967295 bytes exceeds the limit",
    );
    check_rejected(
        &mut target,
        "zero length",
        &0u32.to_le_bytes(),
        "not an envelope",
    );

    // Wrong version in an otherwise valid envelope; trailing bytes after a valid body; a kind
    // the protocol does not have, and a known kind with a field it does not have.
    let with_version = |version: u8| {
        let mut body = inspect.clone();
        body[9] = version;
        body
    };
    let trailing = joined(&[&inspect, &[0xc0, 0xc0, 0xc0]]);
    let unknown = joined(&[&inspect[..15], &[0x81, 0xa4], b"kind", &[0xa6], b"reboot"]);
    let extra = joined(&[
        &inspect[..15],
        &[0x82, 0xa4],
        b"kind",
        &[0xa7],
        b"inspect",
        &[0xa5],
        b"extra",
        &[0x01],
    ]);
    for (what, body, expected) in [
        (
            "version 99",
            with_version(99),
            "protocol version 99 received",
        ),
        ("version 0", with_version(0), "protocol version 0 received"),
        (
            "trailing bytes",
            trailing,
            "3 trailing bytes after the body",
        ),
        ("unknown request kind", unknown, "malformed body"),
        ("an unknown field", extra, "malformed body"),
    ] {
        check_rejected(&mut target, what, &frame(&body), expected);
    }

    // Deep nesting: 12 000 nested (a frame under the request limit) one-element arrays, and as many nested maps, where a
    // request has a map (an export's `allocation`), and as the body itself. The decoder never
    // descends into them (their type is wrong at the first level; unknown data is not
    // buffered), and the depth limit would stop it if it did.
    let depth = 12_000;
    let genuine_export = encoded(&Request::Export(ExportRequest {
        allocation: AllocationReference {
            id: cuinterpose_protocol::AllocationId::new([1; 16]).unwrap(),
            creator_pid: NamespacePid::new(target.pid as u32).unwrap(),
        },
        resource: ResourceKind::Unicast,
        capability: CapabilityToken::new([2; 16]).unwrap(),
    }));
    let allocation = genuine_export
        .windows(11)
        .position(|w| w == b"\xaaallocation")
        .expect("the allocation field")
        + 11;
    for (what, open) in [
        ("deep arrays", &[0x91u8][..]),
        ("deep maps", &[0x81, 0xa2, b'i', b'd'][..]),
    ] {
        let nested = open.repeat(depth); // [[[...]]] or {"id": {"id": ...}}
        let deep = joined(&[&genuine_export[..allocation], &nested, &[0xc0]]);
        check_rejected(
            &mut target,
            what,
            &frame(&deep),
            "malformed body: invalid type",
        );
        let body = joined(&[&inspect[..15], &nested, &[0xc0]]);
        check_rejected(
            &mut target,
            &format!("{what} as the body"),
            &frame(&body),
            "malformed body",
        );
    }

    // A full-size request frame (exactly the request limit) of garbage: read, refused, the
    // buffer freed.
    let mut big = Vec::with_capacity(REQUEST_FRAME_LIMIT + 4);
    big.extend_from_slice(&(REQUEST_FRAME_LIMIT as u32).to_le_bytes());
    big.resize(REQUEST_FRAME_LIMIT + 4, 0xa5);
    check_rejected(&mut target, "64 KiB of garbage", &big, "not an envelope");
    drop(big);

    // Random bytes: as a whole stream (the prefix is random too), as a body behind a valid
    // prefix, and behind a valid envelope header.
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    for round in 0..20 {
        let what = format!("random stream #{round}");
        let mut bytes = noise.bytes(64);
        // Keep the announced length over the limit so the refusal does not wait for a body.
        bytes[3] |= 0x80;
        check_rejected(&mut target, &what, &bytes, "exceeds the limit");

        let body = noise.some_bytes(200);
        let what = format!("random body #{round}");
        check_rejected(&mut target, &what, &frame(&body), "not an envelope");

        let mut enveloped = inspect[..15].to_vec();
        enveloped.extend(noise.some_bytes(200));
        let mut stream = target.connect();
        stream.write_all(&frame(&enveloped)).unwrap();
        // Random MessagePack might even decode as a valid request; what matters is that the
        // shim answers something and closes.
        match read_reply(&mut stream) {
            Some(Reply::Refused(r)) => assert_eq!(r.code, RefusalCode::Invalid, "{r:?}"),
            Some(Reply::Inspection(_)) => {}
            other => panic!("random envelope #{round}: {other:?}"),
        }
        expect_closed(&mut stream, "random envelope");
        target.check_healthy(&format!("random envelope #{round}"));
    }
    assert!(target.worker.try_status().unwrap().is_none());
    // Every refusal was answered, but the log took at most a burst of them (throttled).
    let logged = target.log().matches("refused a request").count();
    assert!((1..=20).contains(&logged), "{logged} refusals logged");
}

#[test]
fn stalled_and_slow_senders_hold_up_nobody() {
    let _serial = serial();
    let mut target = Target::new("stalled");
    let inspect = frame(&encoded(&Request::Inspect));

    // Half a frame (the prefix and part of the body), left open: others are served at once;
    // the shim gives up on it after its control timeout, says why, and closes.
    let mut half = target.connect();
    half.write_all(&inspect[..inspect.len() / 2]).unwrap();
    let mut prefix_only = target.connect();
    prefix_only.write_all(&inspect[..2]).unwrap();
    let opened = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    target.inspect_within("while half a frame is open");
    // The shim holds the two connections (and nothing else, once the inspect's is closed).
    let started = Instant::now();
    while target.fds() != target.baseline_fds + 2 {
        assert!(
            started.elapsed() < slack(SETTLE),
            "{} descriptors with two half frames open, {} before: {:?}",
            target.fds(),
            target.baseline_fds,
            fd_targets(target.host_pid)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for (stream, what) in [
        (&mut half, "half a frame"),
        (&mut prefix_only, "half a prefix"),
    ] {
        expect_invalid(stream, what, "timed out after 2s while receiving a request");
        let waited = opened.elapsed();
        assert!(
            waited >= SHIM_TIMEOUT && waited < SHIM_TIMEOUT + slack(Duration::from_secs(2)),
            "{what}: closed after {waited:?}"
        );
    }
    drop((half, prefix_only));
    target.check_healthy("half frames");

    // A connection that sends nothing at all.
    let mut silent = target.connect();
    let opened = Instant::now();
    expect_invalid(&mut silent, "a silent peer", "timed out after 2s");
    assert!(opened.elapsed() < SHIM_TIMEOUT + slack(Duration::from_secs(2)));
    drop(silent);
    target.check_healthy("a silent peer");

    // Half a frame, then the peer goes away: the handler ends at once.
    let mut gone = target.connect();
    gone.write_all(&inspect[..7]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(gone);
    let started = Instant::now();
    target.fds_settle(
        "half a frame, then closed",
        slack(Duration::from_millis(500)),
    );
    assert!(started.elapsed() < slack(Duration::from_millis(500)));
    target.check_healthy("half a frame, then closed");

    // A valid request one byte at a time (20 ms apart) is answered, and a valid request from
    // someone else meanwhile is answered within the second.
    let slow = {
        let mut stream = target.connect();
        let bytes = inspect.clone();
        std::thread::spawn(move || {
            for byte in bytes {
                stream.write_all(&[byte]).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
            read_reply(&mut stream)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    target.inspect_within("during a byte-by-byte sender");
    match slow.join().unwrap() {
        Some(Reply::Inspection(i)) => assert_eq!(i.namespace_pid.get(), target.pid as u32),
        other => panic!("byte-by-byte inspect: {other:?}"),
    }
    target.check_healthy("byte-by-byte sender");

    // A slowloris: a valid prefix announcing 100 bytes, then one byte every 300 ms, never
    // finishing within the timeout. The deadline is for the whole request, not per byte: it
    // is cut off after the control timeout.
    let mut loris = target.connect();
    loris.write_all(&100u32.to_le_bytes()).unwrap();
    let started = Instant::now();
    let dripping = {
        let mut stream = loris.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut sent = 0;
            while started.elapsed() < SHIM_TIMEOUT + Duration::from_secs(3) {
                if stream.write_all(&[0x40]).is_err() {
                    break;
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            sent
        })
    };
    expect_invalid(&mut loris, "slowloris", "timed out after 2s");
    let cut = started.elapsed();
    assert!(
        cut >= SHIM_TIMEOUT && cut < SHIM_TIMEOUT + slack(Duration::from_secs(1)),
        "slowloris cut after {cut:?}"
    );
    let sent = dripping.join().unwrap();
    assert!(sent >= 6, "the slowloris kept sending ({sent} bytes)");
    drop(loris);
    target.check_healthy("slowloris");
}
