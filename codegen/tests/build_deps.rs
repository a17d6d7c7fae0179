//! The protocol crate's build script compiles the schema on every build of every crate; what
//! it pulls in is paid by all of them. The command line (`clap`), the Markdown reference
//! (`askama`) and the entry-point generator (`serde_json`) stay behind features it does not
//! enable, as prost-build keeps its extras.

use std::path::Path;
use std::process::Command;

/// Every package `cargo tree` lists under `package` for edge `kinds`, by name.
fn tree(package: &str, kinds: &str) -> Vec<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "--prefix", "none", "-p"])
        .args([package, "-e", kinds, "--format", "{p}"])
        .current_dir(workspace)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn check(package: &str, kinds: &str, absent: &[&str], present: &[&str]) {
    let names = tree(package, kinds);
    for name in absent {
        assert!(
            !names.iter().any(|n| n == name),
            "{package} ({kinds}) pulls in {name}: {names:?}"
        );
    }
    for name in present {
        assert!(
            names.iter().any(|n| n == name),
            "{package} ({kinds}) lacks {name}: {names:?}"
        );
    }
}

#[test]
fn protocol_build_script_stays_lean() {
    check(
        "cuinterpose-protocol",
        "normal,build",
        &["clap", "askama", "serde_json"],
        &["cuinterpose-codegen", "ron", "syn", "prettyplease"],
    );
}

#[test]
fn the_command_line_keeps_its_extras() {
    check(
        "cuinterpose-codegen",
        "normal",
        &[],
        &["clap", "askama", "serde_json"],
    );
}

/// The test kit (which shells out to cargo and panics) is for tests only: no product crate
/// links it.
#[test]
fn product_crates_do_not_link_the_test_kit() {
    for product in [
        "cuinterpose",
        "cuinterpose-shim",
        "cuinterpose-workload",
        "fakecuda",
        "cuinterpose-protocol",
    ] {
        check(product, "normal,build", &["cuinterpose-testkit"], &[]);
    }
    check(
        "cuinterpose-clients",
        "normal",
        &[],
        &["cuinterpose-testkit"],
    );
}
