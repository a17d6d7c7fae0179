//! Native checkpoint through fakecuda, and the whole-tree compositions (`checkpoint`,
//! `restore --dir`, `toggle`) on real processes: each member process initialises fakecuda and
//! serves a fake shim on its own participant socket.
//!
//! `harness = false`: the same executable is the test and, with `CUI_TEST_ROLE=member`, a
//! member process of the workload.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::Duration;

use cuinterpose_coordinator::native::{NativeDriver, NativeError, NativeStep, ProcessState};
use cuinterpose_coordinator::{checkpoint_dir, process, state};
use cuinterpose_protocol::{
    AllocationId, AllocationRecord, AllocationReference, NamespacePid, Record, StateFile,
};
use cuinterpose_testkit::fixtures::{FakeParticipant, SIZE, TempDir};
use cuinterpose_testkit::{cargo_build, target_profile_dir};
use serde_json::Value;
use support::FakeShim;
use support::cli::{self, check_exit, path};
use support::harness::Test;

const ROLE: &str = "CUI_TEST_ROLE";
const CHILDREN: &str = "CUI_TEST_CHILDREN";
const CONTROL: &str = "CUI_TEST_CONTROL_DIR";
const LIBRARY: &str = "CUI_TEST_FAKECUDA";

fn main() {
    if support::harness::as_child(ROLE, "member", member) {
        return;
    }
    let tests: [Test<Path>; 3] = [
        ("native_steps_through_fakecuda", native_steps),
        (
            "checkpoint_and_restore_a_process_tree",
            checkpoint_and_restore,
        ),
        ("toggle_in_place_and_refusals", toggle_and_refusals),
    ];
    support::harness::run(&tests, fakecuda);
}

/// Builds fakecuda (`libcuda.so`) into this target directory and returns its path.
fn fakecuda() -> PathBuf {
    cargo_build("fakecuda", &["--lib"]);
    let library = target_profile_dir().join("libcuda.so");
    assert!(library.exists(), "{}", library.display());
    library
}

/// A member of the workload: spawns its children, initialises fakecuda, serves a fake shim
/// holding one private allocation, prints `ready <pid>` once its children are ready, and lives
/// until its stdin closes.
fn member() {
    let control = PathBuf::from(std::env::var_os(CONTROL).expect("control dir"));
    let library = PathBuf::from(std::env::var_os(LIBRARY).expect("fakecuda"));
    let children: usize = std::env::var(CHILDREN)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let mut kids: Vec<Member> = (0..children)
        .map(|_| Member::spawn(&control, &library, 0))
        .collect();

    // SAFETY: loading fakecuda runs no initialisers with preconditions.
    let cuda = unsafe { libloading::Library::new(&library) }.expect("dlopen fakecuda");
    // SAFETY: `CUresult cuInit(unsigned int flags)`.
    let init = unsafe { cuda.get::<unsafe extern "C" fn(u32) -> u32>(b"cuInit") }.expect("cuInit");
    // SAFETY: plain C call with a flags argument of 0.
    assert_eq!(unsafe { init(0) }, 0, "cuInit");

    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let pid = process::parse_namespace_pid(&status).expect("NSpid");
    let mut id = [0xa1; 16];
    id[..4].copy_from_slice(&pid.get().to_be_bytes());
    let allocation = AllocationRecord {
        allocation: AllocationReference {
            id: AllocationId::new(id).expect("non-zero"),
            creator_pid: pid,
        },
        size: SIZE,
        properties: cuinterpose_testkit::fixtures::properties(),
        host_carrier: false,
        handle_count: 1,
    };
    let shim = FakeShim::start(
        &control,
        FakeParticipant::new(pid, vec![Record::Allocation(allocation)]),
        None,
    );
    for kid in &mut kids {
        kid.wait_ready();
    }
    println!("ready {pid}");
    std::io::stdout().flush().expect("flush");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(shim);
    for kid in kids {
        kid.stop();
    }
    drop(cuda);
}

/// A member process, stopped (stdin closed, then reaped) on drop.
struct Member {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: Option<NamespacePid>,
}

impl Member {
    fn spawn(control: &Path, library: &Path, children: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
            .env(ROLE, "member")
            .env(CHILDREN, children.to_string())
            .env(CONTROL, control)
            .env(LIBRARY, library)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a member");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child: Some(child),
            stdin,
            stdout,
            pid: None,
        }
    }

    fn wait_ready(&mut self) -> NamespacePid {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read ready");
        let pid = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("member said {line:?}"));
        self.pid = Some(pid);
        pid
    }

    fn host_pid(&self) -> u32 {
        self.child.as_ref().expect("child").id()
    }

    fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        drop(self.stdin.take());
        if let Some(mut child) = self.child.take() {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Member processes (a root and its children) in a fresh control directory, fakecuda's native
/// checkpoint API, and the `cuinterpose` binary on that driver and those participants.
struct Tree<'a> {
    /// Stopped before the control directory is removed.
    root: Member,
    /// Every member's host PID.
    pids: Vec<u32>,
    driver: NativeDriver,
    library: &'a Path,
    control: TempDir,
}

impl<'a> Tree<'a> {
    /// A root member with `children` children, all ready.
    fn start(library: &'a Path, children: usize) -> Self {
        let control = TempDir::new("ctl").expect("control dir");
        let mut root = Member::spawn(control.path(), library, children);
        root.wait_ready();
        let pids = tree_pids(root.host_pid());
        let driver = NativeDriver::load_from(library).expect("load fakecuda");
        Self {
            root,
            pids,
            driver,
            library,
            control,
        }
    }

    fn native_states(&self) -> Vec<ProcessState> {
        self.pids
            .iter()
            .map(|pid| self.driver.state(*pid).expect("state"))
            .collect()
    }

    /// Runs `cuinterpose ARGS --control-dir CONTROL`.
    fn output(&self, args: &[&str]) -> Output {
        let mut args = args.to_vec();
        args.extend(["--control-dir", path(self.control.path())]);
        cli::cuinterpose(
            &args,
            &[
                ("CUINTERPOSE_DRIVER", path(self.library)),
                ("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "10"),
            ],
        )
    }

    /// [`Tree::output`], which must exit with `code`: its stdout if that is 0, else its
    /// stderr.
    fn check(&self, args: &[&str], code: i32) -> String {
        let (stdout, stderr) = check_exit(&self.output(args), code);
        if code == 0 { stdout } else { stderr }
    }

    /// Phases of every participant per `cuinterpose inspect --json`.
    fn shim_phases(&self) -> Vec<String> {
        cli::participant_phases(&self.output(&["inspect", "--json"]))
    }
}

fn tree_pids(root: u32) -> Vec<u32> {
    process::tree(Path::new("/proc"), root)
        .expect("tree")
        .iter()
        .map(|process| process.host_pid)
        .collect()
}

fn native_steps(library: &Path) {
    let tree = Tree::start(library, 0);
    let (pid, driver) = (tree.root.host_pid(), &tree.driver);
    assert_eq!(driver.state(pid).expect("state"), ProcessState::Running);
    driver.suspend(pid, 5_000).expect("lock and checkpoint");
    assert_eq!(
        driver.state(pid).expect("state"),
        ProcessState::Checkpointed
    );
    let error = driver.suspend(pid, 5_000).expect_err("suspend twice");
    assert!(
        matches!(
            error,
            NativeError::WrongState {
                step: NativeStep::Lock,
                found: ProcessState::Checkpointed,
                ..
            }
        ),
        "{error}"
    );
    driver.resume(pid).expect("restore and unlock");
    assert_eq!(driver.state(pid).expect("state"), ProcessState::Running);

    // A step out of order is the driver's refusal, named.
    let error = driver.unlock(pid).expect_err("unlock a running process");
    let text = error.to_string();
    assert!(
        matches!(
            error,
            NativeError::Call {
                step: NativeStep::Unlock,
                ..
            }
        ) && text.starts_with(&format!("process {pid}: native unlock failed: CUDA_ERROR_")),
        "{text}"
    );
    // A process that never initialised CUDA.
    let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep");
    let error = driver.state(sleeper.id()).expect_err("not a CUDA process");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        error.to_string().contains("CUDA_ERROR_NOT_INITIALIZED"),
        "{error}"
    );
    assert!(matches!(
        driver.state(0),
        Err(NativeError::InvalidPid { pid: 0 })
    ));
    tree.root.stop();
}

fn checkpoint_and_restore(library: &Path) {
    let tree = Tree::start(library, 2);
    let checkpoint = TempDir::new("ckpt").expect("checkpoint dir");
    assert_eq!(tree.pids.len(), 3, "{:?}", tree.pids);

    let stdout = tree.check(
        &[
            "checkpoint",
            "--pid",
            &tree.root.host_pid().to_string(),
            "--dir",
            path(checkpoint.path()),
            "--json",
        ],
        0,
    );
    let report: Value = cli::final_json(&stdout);
    assert_eq!(report["command"], "checkpoint");
    let names = cli::phase_names(&report);
    let mut expected = cuinterpose_testkit::fixtures::capture_phases();
    expected.extend(["native_lock", "native_checkpoint"]);
    assert_eq!(names, expected);
    assert_eq!(report["phases"][8]["participants"], 3);
    assert_eq!(tree.native_states(), [ProcessState::Checkpointed; 3]);
    assert_eq!(tree.shim_phases(), ["released"; 3]);
    assert!(checkpoint.path().join("cuinterpose.state").exists());
    assert!(checkpoint.path().join("cuinterpose.processes").exists());

    refuse_wrong_states(&tree, checkpoint.path());

    // Without --pid: the processes the checkpoint recorded.
    let stdout = tree.check(&["restore", "--dir", path(checkpoint.path())], 0);
    assert!(stdout.starts_with("restore: ok in "), "{stdout}");
    assert!(
        stdout.contains("check_state")
            && stdout.contains("native_restore")
            && stdout.contains("native_unlock"),
        "{stdout}"
    );
    assert_eq!(tree.native_states(), [ProcessState::Running; 3]);
    assert_eq!(tree.shim_phases(), ["active"; 3]);

    // A coordinator killed after the native lock (or between the native restore and unlock)
    // leaves processes locked: `restore --dir` unlocks those, restores and unlocks the
    // checkpointed ones, and puts the workload back.
    let again = TempDir::new("ckpt").expect("checkpoint dir");
    let root = tree.root.host_pid().to_string();
    tree.check(
        &["checkpoint", "--pid", &root, "--dir", path(again.path())],
        0,
    );
    tree.driver
        .restore_onto(tree.pids[1], &[])
        .expect("one process restored natively, still locked");
    assert_eq!(
        tree.native_states(),
        [
            ProcessState::Checkpointed,
            ProcessState::Locked,
            ProcessState::Checkpointed
        ]
    );
    let stdout = tree.check(&["restore", "--dir", path(again.path())], 0);
    assert!(
        stdout.starts_with("restore: ok in ") && stdout.contains("native_unlock"),
        "{stdout}"
    );
    assert_eq!(tree.native_states(), [ProcessState::Running; 3]);
    assert_eq!(tree.shim_phases(), ["active"; 3]);
    tree.root.stop();
}

/// States that decode but do not describe the checkpointed processes, each refused with exit
/// 1 before the native restore: the processes stay checkpointed and released, and only one
/// verdict is printed.
fn refuse_wrong_states(tree: &Tree, good: &Path) {
    let saved = state::load(good).expect("the good state");
    // One allocation 2 MiB larger, in the first participant.
    let mut map = saved.participants.clone().into_inner();
    let (&first, records) = map.iter_mut().next().expect("a participant");
    let mut list = records.clone().into_vec();
    let Record::Allocation(allocation) = &mut list[0] else {
        panic!("an allocation record: {list:?}");
    };
    allocation.size += 2 << 20;
    *records = list.try_into().expect("bounded");
    let participants = map.try_into().expect("bounded");
    let edited = StateFile {
        digest: saved.digest,
        participants,
        devices: saved.devices.clone(),
        checksums: saved.checksums.clone(),
        carrier: saved.carrier,
    };
    let resealed = StateFile::seal(
        edited.participants.clone(),
        saved.devices.clone(),
        saved.checksums.clone(),
        saved.carrier,
    );
    for (what, state, expected) in [
        (
            "edited in place",
            &edited,
            "corrupt checkpoint state: integrity check failed: the file's digest is ".to_owned(),
        ),
        (
            "resealed",
            &resealed,
            format!(
                "restore failed in phase check_state: participant {first}: records differ from \
                 the checkpoint (2 differences)"
            ),
        ),
    ] {
        let dir = TempDir::new("wrong").expect("dir");
        std::fs::copy(
            good.join("cuinterpose.processes"),
            dir.path().join("cuinterpose.processes"),
        )
        .expect("copy the process list");
        std::fs::write(
            checkpoint_dir::state(dir.path()),
            cuinterpose_protocol::encode(state).expect("encodes"),
        )
        .expect("write the state");
        let stderr = tree.check(&["restore", "--dir", path(dir.path())], 1);
        assert!(stderr.contains(&expected), "{what}: {stderr}");
        assert!(!stderr.contains("FAIL-STOP"), "{what}: {stderr}");
        assert_eq!(
            tree.native_states(),
            [ProcessState::Checkpointed; 3],
            "{what}"
        );
        assert_eq!(tree.shim_phases(), ["released"; 3], "{what}");
    }
    // `state show` refuses the edited file too.
    let dir = TempDir::new("wrong").expect("dir");
    std::fs::write(
        checkpoint_dir::state(dir.path()),
        cuinterpose_protocol::encode(&edited).expect("encodes"),
    )
    .expect("write the state");
    let (_, stderr) = check_exit(
        &cli::cuinterpose(&["state", "show", path(dir.path())], &[]),
        1,
    );
    assert!(stderr.contains("integrity check failed"), "{stderr}");
}

fn toggle_and_refusals(library: &Path) {
    let tree = Tree::start(library, 1);
    let root_pid = tree.root.host_pid().to_string();

    let stdout = tree.check(&["toggle", "--pid", &root_pid, "--json"], 0);
    let report: Value = cli::final_json(&stdout);
    assert_eq!(report["command"], "toggle");
    assert_eq!(report["checkpoint_dir"], Value::Null);
    let phases = cli::phase_names(&report);
    assert_eq!(phases.first(), Some(&"inspect"));
    assert_eq!(phases.last(), Some(&"verify"));
    // capture (with its hold), native checkpoint, the state checked, native restore, restore.
    assert_eq!(phases.len(), 7 + 2 + 1 + 2 + 8);
    assert_eq!(tree.native_states(), [ProcessState::Running; 2]);
    assert_eq!(tree.shim_phases(), ["active"; 2]);

    // A directory that already holds a state: refused before anything is locked.
    let checkpoint = TempDir::new("ckpt").expect("checkpoint dir");
    std::fs::write(checkpoint.path().join("cuinterpose.state"), b"old").expect("write");
    let stderr = tree.check(
        &[
            "checkpoint",
            "--pid",
            &root_pid,
            "--dir",
            path(checkpoint.path()),
        ],
        1,
    );
    assert!(
        stderr.contains("a checkpoint state already exists"),
        "{stderr}"
    );
    assert_eq!(tree.native_states(), [ProcessState::Running; 2]);
    assert_eq!(tree.shim_phases(), ["active"; 2]);

    // A state that does not decode: refused before any native step.
    let stderr = tree.check(
        &[
            "restore",
            "--dir",
            path(checkpoint.path()),
            "--pid",
            &root_pid,
        ],
        1,
    );
    assert!(stderr.contains("corrupt checkpoint state"), "{stderr}");

    // Restoring processes that are running: refused before anything changes.
    let kept = TempDir::new("ckpt").expect("checkpoint dir");
    tree.check(
        &["toggle", "--pid", &root_pid, "--dir", path(kept.path())],
        0,
    );
    assert!(kept.path().join("cuinterpose.state").exists());
    let stderr = tree.check(&["restore", "--dir", path(kept.path())], 1);
    assert!(
        stderr.contains("native restore needs state checkpointed, the process is running"),
        "{stderr}"
    );
    assert_eq!(tree.native_states(), [ProcessState::Running; 2]);
    tree.root.stop();
}
