//! The workspace keeps its rules (see the crate's documentation).

use std::path::Path;

#[test]
fn the_workspace_keeps_its_rules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let files = cuinterpose_tidy::workspace::read(root).expect("the sources");
    assert!(files.len() > 300, "only {} files found", files.len());
    let problems = cuinterpose_tidy::workspace::check(&files);
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
