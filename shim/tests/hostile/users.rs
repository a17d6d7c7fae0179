//! Another user, and capability tokens that were never handed out.

use super::*;

/// What a process of another user gets when it connects to `socket` and sends `request`.
#[derive(Debug, PartialEq, Eq)]
enum Foreign {
    /// `connect` failed with `EACCES`: the file modes kept it out.
    Denied,
    /// Connected, and the shim closed the connection without a reply.
    Refused,
    /// Connected and got reply bytes (the shim served another user).
    Answered,
    /// Something else (errno or a local failure code).
    Other(i32),
}

/// Forks; the child drops to `nobody` (uid/gid 65534) with raw syscalls, connects to `socket`
/// and sends `request`, then reports through its exit status.
fn as_nobody(socket: &Path, request: &[u8]) -> Foreign {
    use std::os::unix::ffi::OsStrExt;
    let path = socket.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    assert!(path.len() < address.sun_path.len());
    for (slot, byte) in address.sun_path.iter_mut().zip(path) {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: the child calls only async-signal-safe functions (raw syscalls, socket, connect,
    // send, poll, recv, _exit) on memory prepared before the fork.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        // SAFETY: see above.
        unsafe {
            let nobody: libc::c_long = 65534;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) != 0
                || libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) != 0
                || libc::geteuid() != 65534
            {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(11);
            }
            let connected = libc::connect(
                fd,
                (&raw const address).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if connected != 0 {
                let errno = *libc::__errno_location();
                libc::_exit(if errno == libc::EACCES {
                    1
                } else {
                    100 + errno
                });
            }
            // The shim may close before the request is even written: EPIPE is a refusal too.
            let _ = libc::send(
                fd,
                request.as_ptr().cast(),
                request.len(),
                libc::MSG_NOSIGNAL,
            );
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&raw mut poll, 1, 5000) != 1 {
                libc::_exit(12);
            }
            let mut byte = 0u8;
            let read = libc::recv(fd, (&raw mut byte).cast(), 1, 0);
            let errno = *libc::__errno_location();
            libc::_exit(match read {
                0 => 0,
                r if r < 0 && errno == libc::ECONNRESET => 0,
                r if r > 0 => 2,
                _ => 13,
            });
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    let waited = unsafe { libc::waitpid(child, &raw mut status, 0) };
    assert_eq!(waited, child);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    match libc::WEXITSTATUS(status) {
        0 => Foreign::Refused,
        1 => Foreign::Denied,
        2 => Foreign::Answered,
        code => Foreign::Other(code),
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn another_user_is_kept_out_by_modes_and_by_credentials() {
    let _serial = serial();
    let mut target = Target::new("uid");
    // SAFETY: getuid has no preconditions.
    let own_uid = unsafe { libc::geteuid() };
    assert_eq!(
        own_uid, 0,
        "this test impersonates another user and needs root"
    );
    let control = target.sandbox.control_dir();
    let inspect = frame(&encoded(&Request::Inspect));

    // The documented modes, on the live worker's directory and socket, owned by its user.
    assert_eq!(mode(&control), 0o700, "control directory");
    assert_eq!(mode(&target.socket), 0o600, "socket");
    let metadata = std::fs::symlink_metadata(&target.socket).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(
        &metadata.file_type()
    ));
    assert_eq!(metadata.uid(), own_uid);
    assert_eq!(std::fs::metadata(&control).unwrap().uid(), own_uid);

    // Another user cannot reach the socket through the 0700 directory.
    assert_eq!(as_nobody(&target.socket, &inspect), Foreign::Denied);

    // A second name for the same socket inode in a directory anyone may traverse: the socket's
    // own 0600 mode still keeps another user out.
    let open_dir = target.sandbox.root.join("open");
    std::fs::create_dir(&open_dir).unwrap();
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&target.sandbox.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = open_dir.join("linked.sock");
    std::fs::hard_link(&target.socket, &link).unwrap();
    assert_eq!(as_nobody(&link, &inspect), Foreign::Denied);

    // Only with the mode loosened does the connection go through; then the shim's credential
    // check refuses it: closed unanswered, and logged.
    std::fs::set_permissions(&link, std::fs::Permissions::from_mode(0o666)).unwrap();
    let outcome = as_nobody(&link, &inspect);
    std::fs::set_permissions(&link, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(&link).unwrap();
    assert_eq!(outcome, Foreign::Refused);
    assert_eq!(mode(&target.socket), 0o600);
    let started = Instant::now();
    while !target.log().contains("refused a connection from uid 65534") {
        assert!(
            started.elapsed() < slack(SETTLE),
            "the refusal was not logged:\n{}",
            target.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    target.check_healthy("a peer of another user");
}

/// Asks the shim for an export with the protocol client: the reply and whether a descriptor
/// came with it.
fn ask_export(target: &Target, request: &Request) -> (Reply, bool) {
    let (reply, fd) = call(&target.endpoint(), request, None, Duration::from_secs(5))
        .expect("the shim answers an export request");
    (reply, fd.is_some())
}

fn check_unauthorized(target: &mut Target, what: &str, request: &Request) {
    let before = target.log().matches("wrong capability token").count();
    let (reply, fd) = ask_export(target, request);
    assert!(!fd, "{what}: a descriptor came with {reply:?}");
    match reply {
        Reply::Refused(r) => {
            assert_eq!(r.code, RefusalCode::Unauthorized, "{what}: {r:?}");
            assert!(
                r.message.as_str().contains("wrong capability token"),
                "{what}: {r:?}"
            );
        }
        other => panic!("{what}: {other:?}"),
    }
    let started = Instant::now();
    while target.log().matches("wrong capability token").count() <= before {
        assert!(
            started.elapsed() < slack(SETTLE),
            "{what}: not logged:\n{}",
            target.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    target.check_healthy(what);
}

#[test]
fn capability_tokens_that_were_never_handed_out_get_no_descriptor() {
    let _serial = serial();
    let mut target = Target::new("capability");
    let x = target.worker.create(2 * MIB, 0, POSIX).unwrap();
    let y = target.worker.create(2 * MIB, 0, POSIX).unwrap();
    let vx = target.worker.map_rw(x, 2 * MIB, 0).unwrap();
    target.worker.fill(vx, 2 * MIB, 5).unwrap();
    let ticket_x_fd = target.worker.export(x).unwrap();
    let ticket_y_fd = target.worker.export(y).unwrap();
    let ticket_x = read_ticket(ticket_x_fd.as_fd()).unwrap();
    let ticket_y = read_ticket(ticket_y_fd.as_fd()).unwrap();
    assert_ne!(ticket_x.capability, ticket_y.capability);
    assert_ne!(ticket_x.handle.allocation, ticket_y.handle.allocation);
    target.rebaseline();

    // The genuine token works (so the refusals below are about the token, nothing else).
    let (reply, fd) = ask_export(&target, &export_request(&ticket_x, ticket_x.capability));
    assert!(fd && matches!(reply, Reply::UnicastExport(_)), "{reply:?}");
    target.fds_settle("a genuine export", SETTLE);

    // Guessing: all-random tokens, a few times.
    for round in 0..8 {
        let guess = CapabilityToken::new(urandom::<16>()).expect("random, not all zero");
        check_unauthorized(
            &mut target,
            &format!("random token #{round}"),
            &export_request(&ticket_x, guess),
        );
    }
    // The token of another allocation of the same creator.
    check_unauthorized(
        &mut target,
        "the token of another allocation",
        &export_request(&ticket_x, ticket_y.capability),
    );
    // The allocation id as the token: only legacy IPC allocations accept that.
    let id_token = CapabilityToken::new(*ticket_x.handle.allocation.as_bytes()).unwrap();
    check_unauthorized(
        &mut target,
        "the allocation id as token of a VMM allocation",
        &export_request(&ticket_x, id_token),
    );
    // A token one bit off.
    let mut bits = *ticket_x.capability.as_bytes();
    bits[15] ^= 1;
    check_unauthorized(
        &mut target,
        "a token one bit off",
        &export_request(&ticket_x, CapabilityToken::new(bits).unwrap()),
    );

    // No token at all, an all-zero token, a short token: not even a request.
    let genuine = encoded(&export_request(&ticket_x, ticket_x.capability));
    let field = genuine
        .windows(11)
        .position(|w| w == b"\xaacapability")
        .expect("the capability field");
    assert_eq!(genuine[15], 0x84, "export body: a map of four entries");
    let mut missing = genuine[..field].to_vec();
    missing[15] = 0x83;
    check_rejected(
        &mut target,
        "a missing token",
        &frame(&missing),
        "missing field `capability`",
    );
    assert!(
        target.log().contains("missing field `capability`"),
        "a missing token is logged:\n{}",
        target.log()
    );
    let mut zero = genuine.clone();
    let token_at = genuine.len() - 16;
    zero[token_at..].fill(0);
    check_rejected(
        &mut target,
        "an all-zero token",
        &frame(&zero),
        "malformed body",
    );
    let mut short = genuine[..genuine.len() - 1].to_vec();
    short[token_at - 1] = 15;
    check_rejected(
        &mut target,
        "a 15-byte token",
        &frame(&short),
        "malformed body",
    );

    // Through another process: a forged ticket (a random token, or another allocation's)
    // fails the import in a second worker, which records nothing and keeps no descriptor.
    let mut importer = support::worker(&target.sandbox, EntryPath::Dlsym, true);
    let importer_fds = importer.open_fd_count().unwrap();
    for (what, capability) in [
        (
            "forged random",
            CapabilityToken::new(urandom::<16>()).unwrap(),
        ),
        ("forged other allocation", ticket_y.capability),
    ] {
        let forged = cuinterpose_protocol::ticket::create_ticket(&Ticket {
            capability,
            ..ticket_x.clone()
        })
        .unwrap();
        let error = importer.import(forged.as_fd()).unwrap_err();
        assert_eq!(error.cuda_code(), Some(INVALID_HANDLE), "{what}: {error}");
    }
    let forged_creator = cuinterpose_protocol::ticket::create_ticket(&Ticket {
        handle: VirtualShareableHandle {
            creator_pid: ticket_y.handle.creator_pid,
            allocation: ticket_y.handle.allocation,
        },
        ..ticket_x.clone()
    })
    .unwrap();
    assert_eq!(
        importer
            .import(forged_creator.as_fd())
            .unwrap_err()
            .cuda_code(),
        Some(INVALID_HANDLE),
        "x's token on y's handle"
    );
    assert_eq!(importer.open_fd_count().unwrap(), importer_fds);
    assert!(
        support::inspect(&target.sandbox, importer.worker_pid())
            .records
            .is_empty()
    );
    target.check_healthy("forged tickets");
    // And the genuine ticket still works, with the creator's bytes.
    let imported = importer.import(ticket_x_fd.as_fd()).unwrap();
    let vi = importer.map_rw(imported, 2 * MIB, 0).unwrap();
    importer.verify(vi, 2 * MIB, 5).unwrap();
}
