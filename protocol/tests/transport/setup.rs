//! Peer credentials, endpoints and timeouts.

use super::*;
use crate::peers::{export_request, serve};

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
fn the_own_uid_and_root_are_allowed_and_others_are_not() {
    assert!(transport::peer_allowed(1000, 1000));
    assert!(transport::peer_allowed(1000, 0));
    assert!(!transport::peer_allowed(1000, 1001));
    assert!(!transport::peer_allowed(0, NOBODY));
}

#[test]
fn a_peer_of_the_own_uid_is_accepted() {
    check(|| {
        let dir = Scratch::new("own-uid");
        let listener = Listener::bind(dir.path(), pid(4647)).expect("bind");
        let path = listener.endpoint().path().to_path_buf();
        let mut command = Command::new(PEER_EXE);
        command.args(["call", path.to_str().expect("utf-8"), "inspect", "5000"]);
        let peer = PeerProcess::start(command);
        let mut connection = listener.accept().expect("own uid accepted");
        let _ = connection.read_request().expect("request");
        drop(connection);
        peer.finish();
    });
}

#[test]
fn foreign_uid_is_refused_and_logged() {
    let test = "foreign_uid_is_refused_and_logged";
    if !nix::unistd::geteuid().is_root() {
        return cuinterpose_testkit::unavailable(
            test,
            "it needs root, to start a peer as another user (nobody)",
        );
    }
    check(|| {
        let dir = Scratch::new("foreign");
        let listener = Listener::bind(dir.path(), pid(4646)).expect("bind");
        let path = listener.endpoint().path().to_path_buf();
        // Test only: open the file system permissions so that the kernel lets the other user
        // reach the socket and the credential check is what refuses it. The helper is copied
        // where that user may execute it.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).expect("chmod");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).expect("chmod");
        let copy = dir.join("peer");
        fs::copy(PEER_EXE, &copy).expect("copy the helper");
        fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut command = Command::new(copy);
        command.uid(NOBODY).gid(NOBODY);
        command.args(["call", path.to_str().expect("utf-8"), "inspect", "5000"]);
        let peer = PeerProcess::start(command);
        let logs = Arc::new(Mutex::new(Vec::new()));
        let result =
            tracing::subscriber::with_default(Capture(Arc::clone(&logs)), || listener.accept());
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
    });
}

#[test]
fn a_control_directory_of_another_owner_is_refused() {
    let test = "a_control_directory_of_another_owner_is_refused";
    if !nix::unistd::geteuid().is_root() {
        return cuinterpose_testkit::unavailable(
            test,
            "it needs root, to give a directory to another user (nobody)",
        );
    }
    check(|| {
        let scratch = Scratch::new("other-owner");
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
        let execute = |operation| Request::Execute(p::ExecuteRequest::host(operation));
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
        for (operation, seconds) in [
            (p::Operation::SaveAllocations, 7200),
            (p::Operation::LoadAllocations, 7200),
            (p::Operation::PrepareUnicast, 3),
        ] {
            assert_eq!(
                custom.for_request(&execute(operation)),
                Duration::from_secs(seconds),
                "{operation:?}"
            );
        }

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

/// The waits derived from the control timeout: what a shim's quiet watcher, a rollback and
/// `begin_checkpoint` allow, each longer than what it must outlast.
#[test]
fn derived_timeouts_follow_the_control_timeout() {
    check(|| {
        let timeouts = Timeouts::new(Duration::from_secs(1), Duration::from_secs(5)).unwrap();
        assert_eq!(timeouts.begin_checkpoint(), Duration::from_secs(2));
        assert_eq!(timeouts.quiet_window(), Duration::from_secs(3));
        assert_eq!(timeouts.roll_back(), Duration::from_secs(6));
        assert!(timeouts.quiet_window() > timeouts.begin_checkpoint());
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
