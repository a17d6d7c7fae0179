//! Structure of the multi-process tests: a child role is never a test function. Children run
//! their role from the binary's `child_roles` constructor, before the harness starts, so a
//! bare `cargo test -p fakecuda --test FILE` runs only tests that test something.

use std::path::{Path, PathBuf};

/// Each test target: its root file and the text of every file it is built from.
fn targets() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let path = entry.expect("entry").path();
        if path.file_name().is_some_and(|n| n == "tidy.rs") {
            continue; // this file names what it looks for
        }
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read");
            targets.push((path, text));
        } else if path.join("main.rs").exists() {
            let mut text = String::new();
            for file in std::fs::read_dir(&path).expect("target dir") {
                let file = file.expect("entry").path();
                if file.extension().is_some_and(|e| e == "rs") {
                    text += &std::fs::read_to_string(&file).expect("read");
                }
            }
            targets.push((path.join("main.rs"), text));
        }
    }
    targets.sort();
    targets
}

const CONSTRUCTOR: &str = "#[ctor::ctor(unsafe)]\nfn child_roles() {\n    run_role(&[";

#[test]
fn every_binary_that_starts_children_dispatches_them_before_the_harness() {
    let mut starting = 0;
    for (root, text) in targets() {
        let root_text = std::fs::read_to_string(&root).expect("read");
        let starts_children = text.contains("role_command(");
        let dispatches = root_text.contains(CONSTRUCTOR);
        assert_eq!(
            starts_children,
            dispatches,
            "{}: a binary that starts children with role_command() declares them in its \
             `child_roles` constructor ({CONSTRUCTOR:?}), and only such a binary",
            root.display()
        );
        assert!(
            !text.contains("child_role()") && !text.contains("fn child_role_dispatch"),
            "{}: a role is dispatched by run_role() from the constructor, not by a test",
            root.display()
        );
        starting += usize::from(starts_children);
    }
    assert!(
        starting >= 8,
        "the multi-process test binaries were found: {starting}"
    );
}
