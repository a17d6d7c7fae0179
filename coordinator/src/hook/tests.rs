//! Unit tests of the hook's parsing: actions, the CRIU process behind the image directory,
//! the control directory as the hook reaches it, the status lines.

use super::*;

#[test]
fn actions_round_trip_and_others_pass() {
    for name in [
        "pre-dump",
        "post-dump",
        "pre-restore",
        "pre-resume",
        "post-resume",
    ] {
        let action = Action::parse(name);
        assert!(!matches!(action, Action::Other(_)), "{name}");
        assert_eq!(action.name(), name);
    }
    assert_eq!(
        Action::parse("network-lock"),
        Action::Other("network-lock".into())
    );
}

#[test]
fn the_image_directory_names_the_criu_process() {
    assert_eq!(criu_pid_of(Path::new("/proc/4242/fd/7")), Some(4242));
    assert_eq!(criu_pid_of(Path::new("/tmp/images")), None);
    assert_eq!(criu_pid_of(Path::new("/proc/self/fd/7")), None);
}

#[test]
fn a_root_in_this_mount_namespace_sees_the_control_directory_as_is() {
    let dir = Path::new("/tmp/cuinterpose");
    assert_eq!(control_dir_for(dir, std::process::id()), dir);
}

#[test]
fn the_context_comes_from_criu_variables_only() {
    let lookup = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    };
    let error = Context::from_lookup(lookup(&[])).expect_err("no action");
    assert!(matches!(error, HookError::NotFromCriu), "{error}");
    assert_eq!(error.exit_code(), 64);
    let context = Context::from_lookup(lookup(&[
        (ACTION_VARIABLE, "post-dump"),
        (INIT_PID_VARIABLE, "17"),
        (IMAGE_DIR_VARIABLE, "/"),
    ]))
    .expect("context");
    assert_eq!(context.action, Action::PostDump);
    assert_eq!(context.init_pid, Some(17));
    assert_eq!(context.image_dir.as_deref(), Some(Path::new("/")));
    assert_eq!(context.criu_pid, None);
}

#[test]
fn status_lines_say_what_happened() {
    let dir = cuinterpose_testkit::fixtures::TempDir::new("status").expect("dir");
    let ok: Result<Done, HookError> = Ok(Done::skipped("nothing to do at network-lock"));
    record(Some(dir.path()), "network-lock", &ok);
    let failed: Result<Done, HookError> = Err(HookError::NotFromCriu);
    record(Some(dir.path()), "pre-dump", &failed);
    let lines = read_status(dir.path());
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["status"], "skipped");
    assert_eq!(lines[1]["status"], "failed");
    assert_eq!(lines[1]["exit_code"], 64);
}
