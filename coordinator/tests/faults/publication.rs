//! The state's publication stopped or killed at each step: the state is complete or absent,
//! never partial, and restore says which. The child process that publishes lives here too.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cuinterpose_coordinator::checkpoint_dir;
use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::{Run, Stage};
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state::{self, PublishHook, PublishStep, StateError};
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{NamespacePid, Phase, StateFile};

use crate::faults::workload::{Workload, drive, prepare};
use crate::support::sandbox::Sandbox;

pub(crate) const ROLE: &str = "CUI_FAULTS_ROLE";
pub(crate) const INPUT: &str = "CUI_FAULTS_INPUT";
pub(crate) const DIR: &str = "CUI_FAULTS_DIR";
pub(crate) const KILL_AT: &str = "CUI_FAULTS_KILL_AT";

/// Stops publication after one step with an error (the coordinator dying there, as far as the
/// file system can tell), checking the final name after every step.
pub(crate) struct FailAt {
    pub(crate) dir: PathBuf,
    pub(crate) step: PublishStep,
    pub(crate) seen: Vec<(PublishStep, bool)>,
}

impl PublishHook for FailAt {
    fn after(&mut self, step: PublishStep) -> std::io::Result<()> {
        let present = match state::load(&self.dir) {
            Ok(_) => true,
            Err(StateError::Missing { .. }) => false,
            Err(error) => panic!("a partial state after {step:?}: {error}"),
        };
        self.seen.push((step, present));
        if step == self.step {
            return Err(std::io::Error::other("the coordinator stops here"));
        }
        Ok(())
    }
}

/// Names in `dir` other than the state file.
pub(crate) fn leftovers(dir: &Path) -> Vec<String> {
    let mut names = cuinterpose_testkit::file_names(dir);
    names.retain(|name| name != checkpoint_dir::STATE_FILE_NAME);
    names
}

pub(crate) fn publication_interrupted(sandbox: &Sandbox) {
    for step in PublishStep::ALL {
        let mut workload = Workload::start(sandbox, "publish");
        let session = workload.session(Duration::from_secs(5));
        let dir = sandbox.fresh("checkpoint");
        let mut hook = FailAt {
            dir: dir.clone(),
            step,
            seen: Vec::new(),
        };
        let mut run = Run::capture(workload.pids());
        let mut publish = |state: &StateFile| {
            state::publish_with(&dir, state, &mut hook)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let (result, _) = drive(&session, &mut run, &mut publish, &mut |_| {});
        let error = result.expect_err("publication stopped");
        assert_eq!(error.stage, Stage::PublishState, "{error}");
        assert!(error.mutated && error.exit_code() == 2, "{error}");
        let message = error.to_string();
        assert!(
            message.contains(
                "prepare failed in phase publish_state: coordinator: cannot publish the state:"
            ) && message.contains(&format!("publication stopped after step {step:?}"))
                && message.contains("FAIL-STOP"),
            "{message}"
        );
        let published = step >= PublishStep::Published;
        assert_eq!(
            hook.seen.last(),
            Some(&(step, published)),
            "{:?}",
            hook.seen
        );
        assert!(
            leftovers(&dir).is_empty(),
            "{step:?}: {:?}",
            leftovers(&dir)
        );
        assert_eq!(workload.phases(), [Phase::Released; 3]);
        let restored = commands::restore(&session, &dir, &mut |_| {});
        if published {
            // Complete: restore works from it, and the sharing is back.
            assert_eq!(state::load(&dir).expect("complete"), *run.state().unwrap());
            restored.expect("restore from a state published before the stop");
            workload.check_shared(7);
        } else {
            // Absent: restore says so before contacting anyone.
            let error = restored.expect_err("no state");
            assert!(
                matches!(error, CommandError::State(StateError::Missing { .. })),
                "{error}"
            );
            assert_eq!(error.exit_code(), 1);
            assert_eq!(workload.phases(), [Phase::Released; 3]);
        }
        println!(
            "  stopped after {step:?}: state {}",
            if published { "complete" } else { "absent" }
        );
    }
}

/// The child: publishes the state in `$CUI_FAULTS_INPUT` into `$CUI_FAULTS_DIR`, killing
/// itself with SIGKILL after step `$CUI_FAULTS_KILL_AT`; or, with `ready`, says so on stdout
/// and publishes (the parent kills it at a moment of its choosing).
pub(crate) fn publisher() {
    struct Kill(Option<PublishStep>);
    impl PublishHook for Kill {
        fn after(&mut self, step: PublishStep) -> std::io::Result<()> {
            if self.0 == Some(step) {
                // SAFETY: raise(2) has no preconditions; SIGKILL ends the process here.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            Ok(())
        }
    }
    let input = std::env::var_os(INPUT).expect(INPUT);
    let dir = PathBuf::from(std::env::var_os(DIR).expect(DIR));
    let state = state::load_file(Path::new(&input)).expect("input state");
    let at = std::env::var(KILL_AT).expect(KILL_AT);
    let step = PublishStep::ALL
        .into_iter()
        .find(|step| format!("{step:?}") == at);
    if step.is_none() {
        assert_eq!(at, "ready");
        let mut out = std::io::stdout();
        out.write_all(b"ready\n").unwrap();
        out.flush().unwrap();
    }
    state::publish_with(&dir, &state, &mut Kill(step)).expect("publish");
}

pub(crate) fn publisher_command(input: &Path, dir: &Path, kill_at: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("current exe"));
    command
        .env(ROLE, "publish")
        .env(INPUT, input)
        .env(DIR, dir)
        .env(KILL_AT, kill_at);
    command
}

/// Complete (equal to `expected`) or absent, never partial.
pub(crate) fn complete_or_absent(dir: &Path, expected: &StateFile) -> bool {
    match state::load(dir) {
        Ok(state) => {
            assert_eq!(state, *expected, "{}", dir.display());
            true
        }
        Err(StateError::Missing { .. }) => false,
        Err(error) => panic!("a partial state: {error}"),
    }
}

pub(crate) fn publisher_killed(sandbox: &Sandbox) {
    // The state of a real capture, as the child's input.
    let workload = Workload::start(sandbox, "killed-publisher");
    let input_dir = prepare(sandbox, &workload);
    let expected = state::load(&input_dir).expect("state");
    let input = checkpoint_dir::state(&input_dir);
    drop(workload);

    for step in PublishStep::ALL {
        let dir = sandbox.fresh("checkpoint");
        let status = publisher_command(&input, &dir, &format!("{step:?}"))
            .status()
            .expect("run the publisher");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{step:?}: {status}");
        let published = complete_or_absent(&dir, &expected);
        assert_eq!(published, step >= PublishStep::Published, "{step:?}");
        // A killed publisher leaves its temp file (no destructor ran) until the next
        // publication in that directory removes it; it is never mistaken for the state, and
        // never blocks a later one.
        let left = leftovers(&dir);
        assert!(
            left.iter()
                .all(|name| name.starts_with(".cuinterpose.state.") && name.ends_with(".tmp")),
            "{step:?}: {left:?}"
        );
        if !published {
            let error = commands::restore(
                &Session::open(&dir, &[NamespacePid::new(1).unwrap()], Timeouts::default())
                    .expect("session"),
                &dir,
                &mut |_| {},
            )
            .expect_err("no state");
            assert!(
                matches!(error, CommandError::State(StateError::Missing { .. })),
                "{error}"
            );
            state::publish(&dir, &expected).expect("a later publication is not blocked");
            assert!(complete_or_absent(&dir, &expected));
            // ... and that publication removed the dead publisher's temp file.
            assert_eq!(leftovers(&dir), Vec::<String>::new(), "{step:?}");
        }
        println!(
            "  killed after {step:?}: state {}, {} temp file(s) left",
            if published { "complete" } else { "absent" },
            left.len()
        );
    }

    // Killed at arbitrary moments of a publication: complete or absent every time.
    let mut seed = 0x5eed_u64;
    let (mut complete, mut absent) = (0, 0);
    for _ in 0..20 {
        let dir = sandbox.fresh("checkpoint");
        let mut child = publisher_command(&input, &dir, "ready")
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the publisher");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("ready");
        assert_eq!(line, "ready\n");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 3000));
        let _ = child.kill();
        let _ = child.wait();
        if complete_or_absent(&dir, &expected) {
            complete += 1;
        } else {
            absent += 1;
        }
    }
    println!("  killed at random moments: {complete} complete, {absent} absent, 0 partial");
}
