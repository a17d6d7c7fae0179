//! prepare and restore against fake shims behind real sockets, through the library and through
//! the `cuinterpose` binary; participants that die or stall mid-phase.

mod support;

use cuinterpose_coordinator::events::Event;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::Stage;
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    CAPTURE_OPERATIONS, NamespacePid, Operation, Phase, RESTORE_OPERATIONS, Record, Request,
};
use cuinterpose_testkit::fixtures::{SIZE, TempDir, pid, shared_topology, state_file};
use serde_json::Value;
use support::cli::{check_contains, check_exit, cuinterpose, path};
use support::{FakeShim, Misbehaviour, Trigger, start_all};

/// Fake shims serving `shared_topology(first)` in a fresh control directory (one of them
/// misbehaving, if asked), and a fresh checkpoint directory.
struct Scene {
    /// Dropped first: a fake shim is stopped through its socket in the control directory.
    fakes: Vec<FakeShim>,
    topology: BTreeMap<NamespacePid, Vec<Record>>,
    control: TempDir,
    checkpoint: TempDir,
}

impl Scene {
    fn start(first: u32, misbehaving: Option<(u32, Trigger, Misbehaviour)>) -> Self {
        let control = TempDir::new("ctl").expect("control dir");
        let checkpoint = TempDir::new("ckpt").expect("checkpoint dir");
        let topology = shared_topology(first);
        let fakes = start_all(control.path(), &topology, misbehaving);
        Self {
            fakes,
            topology,
            control,
            checkpoint,
        }
    }

    fn ctl(&self) -> &str {
        path(self.control.path())
    }

    fn ckpt(&self) -> &str {
        path(self.checkpoint.path())
    }

    /// A session with every participant of the control directory.
    fn session(&self, timeout_seconds: u64) -> Session {
        let timeout = Duration::from_secs(timeout_seconds);
        let timeouts = Timeouts::new(timeout, timeout).expect("timeouts");
        Session::open(self.control.path(), &[], timeouts).expect("session")
    }

    fn phases(&self) -> Vec<Phase> {
        self.fakes.iter().map(FakeShim::phase).collect()
    }

    /// `cuinterpose ARGS --checkpoint-dir CKPT --control-dir CTL` with `env`, which exits with
    /// `code`: (stdout, stderr).
    fn check(&self, args: &[&str], env: &[(&str, &str)], code: i32) -> (String, String) {
        let mut args = args.to_vec();
        args.extend(["--checkpoint-dir", self.ckpt(), "--control-dir", self.ctl()]);
        check_exit(&cuinterpose(&args, env), code)
    }
}

#[test]
fn prepare_then_restore_through_the_library() {
    let scene = Scene::start(101, None);
    let (fakes, checkpoint) = (&scene.fakes, &scene.checkpoint);
    let session = scene.session(5);
    assert_eq!(session.participants(), [pid(101), pid(102), pid(103)]);

    let (mut seen, mut started) = (Vec::new(), Vec::new());
    let report = commands::prepare(&session, checkpoint.path(), &mut |event| match event {
        Event::Started { phase, .. } => started.push(phase.to_string()),
        Event::Done(phase) => seen.push(phase.name.clone()),
        Event::Copy(_) => {}
    })
    .expect("prepare");
    assert_eq!(started, seen, "each phase is announced before it ends");
    assert_eq!(seen, cuinterpose_testkit::fixtures::capture_phases());
    assert_eq!(report.bytes(), SIZE);
    assert_eq!(report.checkpoint_dir.as_deref(), Some(checkpoint.path()));
    assert_eq!(scene.phases(), [Phase::Released; 3]);
    assert_eq!(
        state::load(checkpoint.path()).expect("state"),
        state_file(&scene.topology)
    );

    // A second prepare into the same directory is refused before anyone is contacted.
    let before: Vec<usize> = fakes.iter().map(|fake| fake.requests().len()).collect();
    let error = commands::prepare(&session, checkpoint.path(), &mut |_| {}).expect_err("again");
    assert!(
        matches!(
            error,
            CommandError::State(state::StateError::AlreadyExists { .. })
        ),
        "{error}"
    );
    assert_eq!(error.exit_code(), 1);
    let after: Vec<usize> = fakes.iter().map(|fake| fake.requests().len()).collect();
    assert_eq!(before, after);

    let report = commands::restore(&session, checkpoint.path(), &mut |_| {}).expect("restore");
    let names: Vec<&str> = report.phases.iter().map(|p| p.name.as_str()).collect();
    // The restore reports inspect, each restore operation of the schema, then verify.
    let restores = RESTORE_OPERATIONS.map(|o| o.wire_name());
    assert_eq!(names, [&["inspect"], &restores[..], &["verify"]].concat());
    assert_eq!(report.bytes(), SIZE);
    assert_eq!(scene.phases(), [Phase::Active; 3]);
    // What the first participant was asked: the capture, then the restore (verify asks
    // inspect).
    let captures = CAPTURE_OPERATIONS.map(|o| o.wire_name());
    let asked = [
        &["inspect", "begin_checkpoint"],
        &captures[..],
        &["hold", "inspect"],
        &restores[..],
        &["inspect"],
    ]
    .concat();
    assert_eq!(fakes[0].requests(), asked);
}

#[test]
fn prepare_then_restore_through_the_binary() {
    let scene = Scene::start(201, None);
    let (ctl, ckpt) = (scene.ctl(), scene.ckpt());

    let (stdout, _) = check_exit(
        &cuinterpose(&["inspect", "--control-dir", ctl, "--json"], &[]),
        0,
    );
    let value: Value = serde_json::from_str(&stdout).expect("inspect JSON");
    assert_eq!(value["valid"], true);
    assert_eq!(value["summary"]["bytes_to_save"], SIZE);
    assert_eq!(value["participants"]["202"]["phase"], "active");
    assert_eq!(
        value["participants"]["201"]["records"][0]["allocation"]["id"],
        "01a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
    );
    let (stdout, _) = check_exit(
        &cuinterpose(
            &["inspect", "--pid", "202"],
            &[("CUINTERPOSE_CONTROL_DIR", ctl)],
        ),
        1,
    );
    assert!(
        stdout.contains("participant 202: allocation 01a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1 (creator 201): imported from participant 201, which is not a participant"),
        "{stdout}"
    );

    let (stdout, stderr) = scene.check(&["prepare", "--json"], &[], 0);
    let report: Value = support::cli::final_json(&stdout);
    assert_eq!(report["command"], "prepare");
    assert_eq!(report["bytes"], SIZE);
    assert_eq!(report["phases"][3]["phase"], "save_allocations");
    assert_eq!(report["participants"], serde_json::json!([201, 202, 203]));
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(scene.phases(), [Phase::Released; 3]);

    let (stdout, _) = check_exit(
        &cuinterpose(&["state", "show", ckpt, "--format", "json"], &[]),
        0,
    );
    let shown: Value = serde_json::from_str(&stdout).expect("state JSON");
    let record = &shown["participants"]["201"][0];
    assert_eq!(record["kind"], "allocation");
    assert_eq!(record["properties"]["location"]["type"], "device");
    assert_eq!(
        record["properties"]["handle_types"],
        serde_json::json!(["posix_file_descriptor"])
    );
    let (yaml, _) = check_exit(&cuinterpose(&["state", "show", ckpt], &[]), 0);
    // Keys in order: the carrier (storage: `prepare` keeps its directory), the checksums of
    // the creator's carried allocation (a fake participant's stand-in values, in hex), the
    // devices (none here: no driver), then the records.
    let sums = &shown["checksums"]["201"][0];
    assert_eq!(
        sums["xxh3_64"],
        serde_json::json!(["0000000000000000"]),
        "{shown}"
    );
    assert!(
        yaml.starts_with(&format!(
            "carrier: storage\nchecksums:\n  \"201\":\n    - allocation: \"{}\"\n      chunk_bytes: 67108864\n      \
             size: {}\n      xxh3_64:\n        - \"0000000000000000\"\ndevices:\n  machine: []\n  \
             participants: {{}}\nparticipants:\n  \"201\":\n    - ",
            sums["allocation"].as_str().expect("an id"),
            sums["size"],
        )),
        "{yaml}"
    );
    assert!(yaml.contains("kind: multicast_binding"), "{yaml}");
    // Addresses in hex, as `inspect` prints them.
    let mapping = shown["participants"]["201"]
        .as_array()
        .expect("records")
        .iter()
        .find(|r| r["kind"] == "mapping")
        .expect("a mapping record");
    let address = mapping["address"].as_str().expect("a hex string");
    assert!(address.starts_with("0x"), "{mapping}");
    assert!(
        yaml.contains(&format!("address: {address}"))
            || yaml.contains(&format!("address: \"{address}\"")),
        "{yaml}"
    );

    let (stdout, stderr) = scene.check(&["restore"], &[], 0);
    assert!(stdout.starts_with("restore: ok in "), "{stdout}");
    assert!(stdout.contains("load_allocations"), "{stdout}");
    assert!(stderr.contains("cuinterpose: verify done in"), "{stderr}");
    assert_eq!(scene.phases(), [Phase::Active; 3]);

    // Restoring again: every participant is active now, not released: refused, unchanged.
    let (_, stderr) = scene.check(&["restore"], &[], 1);
    assert!(
        stderr.contains("restore failed in phase inspect: participant 201: in phase active, expected phase released"),
        "{stderr}"
    );
    assert!(
        stderr.contains("nothing was changed in any participant"),
        "{stderr}"
    );
}

fn is_save(request: &Request) -> bool {
    matches!(request, Request::Execute(e) if e.operation == Operation::SaveAllocations)
}

fn is_prepare_unicast(request: &Request) -> bool {
    matches!(request, Request::Execute(e) if e.operation == Operation::PrepareUnicast)
}

fn is_inspect(request: &Request) -> bool {
    matches!(request, Request::Inspect)
}

/// A capture stopped before prepare_unicast is rolled back: every participant is asked to put
/// itself back, the records are compared with the frozen ones, and the workload resumes.
#[test]
fn a_participant_that_closes_during_save_fails_the_run_naming_it_and_is_rolled_back() {
    let scene = Scene::start(301, Some((302, is_save, Misbehaviour::Close)));
    let session = scene.session(5);
    let started = Instant::now();
    let error =
        commands::prepare(&session, scene.checkpoint.path(), &mut |_| {}).expect_err("prepare");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let CommandError::Run(run) = &error else {
        panic!("{error}");
    };
    assert_eq!(run.stage, Stage::Execute(Operation::SaveAllocations));
    assert_eq!(run.participants(), [pid(302)]);
    assert!(run.mutated && run.rolled_back);
    assert_eq!(error.exit_code(), 3);
    let message = error.to_string();
    assert!(
        message.contains("prepare failed in phase save_allocations: participant 302: no reply:")
            && message.contains("cuinterpose-302.sock")
            && message.contains("closed the connection"),
        "{message}"
    );
    assert!(
        message.contains("ABORTED") && !message.contains("FAIL-STOP"),
        "{message}"
    );
    // No state was published, nobody was told to fail-stop, and everyone is active again.
    assert!(matches!(
        state::load(scene.checkpoint.path()),
        Err(state::StateError::Missing { .. })
    ));
    assert!(run.told.is_empty(), "{message}");
    assert_eq!(scene.phases(), [Phase::Active; 3]);
    drop(scene);

    // The same through the binary: exit 3, aborted.
    let scene = Scene::start(301, Some((302, is_save, Misbehaviour::Close)));
    let (stdout, stderr) = scene.check(&["prepare", "--json"], &[], 3);
    assert!(
        stderr.contains("cuinterpose: prepare failed in phase save_allocations: participant 302")
            && stderr.contains("ABORTED"),
        "{stderr}"
    );
    let value: Value = support::cli::final_json(&stdout);
    assert_eq!(value["status"], "aborted");
    assert_eq!(value["phase"], "save_allocations");
    assert_eq!(value["mutated"], true);
    assert_eq!(value["rolled_back"], true);
    assert_eq!(value["failures"][0]["participant"], 302);
}

#[test]
fn a_silent_participant_fails_after_the_control_timeout() {
    // Through the binary, with the timeout from the environment: silent at inspect, nothing
    // changed.
    let scene = Scene::start(401, Some((403, is_inspect, Misbehaviour::Silent)));
    let started = Instant::now();
    let (_, stderr) = scene.check(
        &["prepare"],
        &[("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "1")],
        1,
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    check_contains(
        "stderr",
        &stderr,
        &[
            "prepare failed in phase inspect: participant 403: no reply:",
            "timed out after 1s",
            "nothing was changed in any participant",
        ],
    );
    assert_eq!(scene.phases(), [Phase::Active; 3]);
    drop(scene);

    // Through the library: silent at every prepare_unicast, after mutation. It is waited for
    // (settle, prepare_unicast sent again while it reports saved) for the quiet window, three
    // control timeouts, and then the run is fail-stop.
    let scene = Scene::start(401, Some((401, is_prepare_unicast, Misbehaviour::Silent)));
    let session = scene.session(1);
    let started = Instant::now();
    let error =
        commands::prepare(&session, scene.checkpoint.path(), &mut |_| {}).expect_err("prepare");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(4) && elapsed < Duration::from_secs(9),
        "{elapsed:?}"
    );
    let CommandError::Run(run) = &error else {
        panic!("{error}");
    };
    assert_eq!(run.stage, Stage::Execute(Operation::PrepareUnicast));
    assert!(run.participants().iter().all(|p| *p == pid(401)), "{error}");
    assert!(
        error
            .to_string()
            .contains("then, waiting for every participant to be released ("),
        "{error}"
    );
    assert_eq!(error.exit_code(), 2);
    // The others finished prepare_unicast and were told to fail-stop.
    assert_eq!(run.told, [pid(402), pid(403)], "{error}");
    assert_eq!(scene.phases()[1..], [Phase::Failed, Phase::Failed]);
}

#[test]
fn missing_participants_are_named_before_anything_changes() {
    let mut scene = Scene::start(501, None);
    commands::prepare(&scene.session(5), scene.checkpoint.path(), &mut |_| {}).expect("prepare");

    // Restore with one participant gone (its socket removed with it).
    let gone = scene.fakes.pop().expect("503");
    drop(gone);
    let (_, stderr) = scene.check(&["restore"], &[], 1);
    assert!(
        stderr.contains("restore failed in phase check_state: coordinator: the live participants are not the checkpointed ones (checkpointed but not live: [503]; live but not checkpointed: [])"),
        "{stderr}"
    );
    // Naming it explicitly: the missing socket is a transport failure of that participant.
    let (_, stderr) = scene.check(
        &["restore", "--pid", "501", "--pid", "502", "--pid", "503"],
        &[],
        1,
    );
    assert!(
        stderr.contains("restore failed in phase inspect: participant 503: no reply:")
            && stderr.contains("no socket exists at this path"),
        "{stderr}"
    );
    assert_eq!(scene.phases(), [Phase::Released; 2]);

    // No sockets at all.
    let empty = TempDir::new("ctl").expect("control dir");
    let (_, stderr) = check_exit(
        &cuinterpose(&["inspect", "--control-dir", path(empty.path())], &[]),
        1,
    );
    assert!(
        stderr.contains("no participants: no cuinterpose-<pid>.sock socket in"),
        "{stderr}"
    );
}

#[test]
fn restore_of_a_missing_state_names_the_state_even_with_no_participant() {
    let control = TempDir::new("ctl-empty").expect("control dir");
    let missing = control.path().join("no-such-checkpoint");
    let (_, stderr) = check_exit(
        &cuinterpose(
            &[
                "restore",
                "--checkpoint-dir",
                path(&missing),
                "--control-dir",
                path(control.path()),
            ],
            &[],
        ),
        1,
    );
    assert!(
        stderr.contains("cuinterpose.state: no checkpoint state here"),
        "{stderr}"
    );
}

#[test]
fn toggle_help_lists_the_steps_and_what_criu_needs() {
    let (stdout, _) = check_exit(&cuinterpose(&["toggle", "--help"], &[]), 0);
    for needed in [
        "begin_checkpoint",
        "native lock and checkpoint",
        "a final inspect compared record by record",
        "exits 3",
        "needs --dir for the images",
    ] {
        assert!(
            stdout.contains(needed),
            "`{needed}` missing from:\n{stdout}"
        );
    }
}

/// A socket nothing listens on and no process has bound: the file a killed participant left.
fn stale_socket(dir: &std::path::Path, pid: u32) -> std::path::PathBuf {
    let path = dir.join(format!("cuinterpose-{pid}.sock"));
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    assert!(path.exists(), "the file outlives its listener");
    path
}

#[test]
fn a_stale_socket_is_named_removed_and_left_out() {
    let scene = Scene::start(701, None);
    let stale = stale_socket(scene.control.path(), 799);
    // A session leaves the gone process out and removes its socket.
    let session = scene.session(5);
    assert_eq!(session.participants(), [pid(701), pid(702), pid(703)]);
    assert_eq!(session.gone().len(), 1);
    assert_eq!(session.gone()[0].pid, pid(799));
    assert!(session.gone()[0].removed);
    assert!(!stale.exists(), "removed: no process had it bound");
    // Through the binary: inspect still succeeds and says what it left out.
    let stale = stale_socket(scene.control.path(), 798);
    let (stdout, stderr) = check_exit(
        &cuinterpose(&["inspect", "--control-dir", scene.ctl()], &[]),
        0,
    );
    let gone = [
        "process 798 is gone (stale socket",
        "cuinterpose-798.sock, removed)",
    ];
    check_contains("stderr", &stderr, &gone);
    check_contains("stdout", &stdout, &["topology: valid: 3 participants"]);
    assert!(!stale.exists());
}

#[test]
fn only_stale_sockets_are_no_participants_naming_them() {
    let control = TempDir::new("ctl-stale").expect("control dir");
    let stale = stale_socket(control.path(), 4242);
    let (_, stderr) = check_exit(
        &cuinterpose(&["inspect", "--control-dir", path(control.path())], &[]),
        1,
    );
    assert!(
        stderr.contains("no participants: no cuinterpose-<pid>.sock socket in")
            && stderr.contains("process 4242 is gone (stale socket"),
        "{stderr}"
    );
    assert!(!stale.exists(), "removed");
}

#[test]
fn a_socket_bound_but_not_yet_listening_is_kept() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, socket};
    let scene = Scene::start(801, None);
    // A shim between its bind and its listen: connections are refused, but the path is bound.
    let path = scene.control.path().join("cuinterpose-899.sock");
    let starting = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&starting),
        &UnixAddr::new(&path).expect("address"),
    )
    .expect("bind");
    let (live, gone) =
        cuinterpose_coordinator::session::discover_live(scene.control.path()).expect("discover");
    assert!(gone.is_empty(), "{gone:?}");
    assert!(live.contains(&pid(899)), "kept as a participant: {live:?}");
    assert!(path.exists(), "not removed");
    drop(starting);
    let _ = std::fs::remove_file(&path);
}
