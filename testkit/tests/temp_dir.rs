//! The tests' temp directories: unique, removed on drop, and short enough for the sockets the
//! tests put in them whatever the test's name.

use cuinterpose_testkit::fixtures::TempDir;
use std::os::unix::net::UnixListener;

/// A test named at length gets a directory where a socket two levels down (the deepest the
/// tests use, with the largest pid Linux hands out) still binds.
#[test]
fn a_long_label_leaves_room_for_sockets() {
    let label = "plain_criu_with_the_hook_restores_onto_another_machine_and_then_some";
    let dir = TempDir::new(label).expect("temp dir");
    let name = dir.path().file_name().unwrap().to_str().unwrap().to_owned();
    assert!(name.starts_with("cui-plain_criu_with_the_h"), "{name}");
    assert!(!name.contains("machine"), "the label is cut: {name}");
    for (sub, socket) in [
        ("fakecuda", "fakecuda-4194304.sock"),
        ("control", "cuinterpose-4194304.sock"),
    ] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        let path = dir.path().join(sub).join(socket);
        UnixListener::bind(&path).unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
    }
}

#[test]
fn directories_are_unique_private_and_removed_on_drop() {
    use std::os::unix::fs::PermissionsExt;
    let a = TempDir::new("same").unwrap();
    let b = TempDir::new("same").unwrap();
    assert_ne!(a.path(), b.path());
    let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    std::fs::write(a.path().join("file"), b"x").unwrap();
    let path = a.path().to_owned();
    drop(a);
    assert!(!path.exists(), "removed with its content");
}
