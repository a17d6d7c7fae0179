//! The compatibility checker against the project's own released schema.

use cuinterpose_codegen::{compat, compile};

fn released() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v1.ron"
    ))
    .expect("schema/released/v1.ron is readable")
}

/// The newest released schema, which the current one must match until the next bump.
fn latest_released() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v6.ron"
    ))
    .expect("schema/released/v6.ron is readable")
}

fn released_v5() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v5.ron"
    ))
    .expect("schema/released/v5.ron is readable")
}

fn released_v4() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v4.ron"
    ))
    .expect("schema/released/v4.ron is readable")
}

fn released_v3() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v3.ron"
    ))
    .expect("schema/released/v3.ron is readable")
}

fn released_v2() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/released/v2.ron"
    ))
    .expect("schema/released/v2.ron is readable")
}

fn current() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/protocol.ron"
    ))
    .expect("schema/protocol.ron is readable")
}

/// Applies `edits` to the released schema and returns the compatibility report's changes as
/// text, plus whether the change is accepted.
fn check(edits: &[(&str, &str)]) -> (Vec<String>, bool) {
    let old_text = released();
    let mut new_text = old_text.clone();
    for (from, to) in edits {
        assert_eq!(
            new_text.matches(from).count(),
            1,
            "anchor `{from}` must be unique"
        );
        new_text = new_text.replacen(from, to, 1);
    }
    let old = compile("old.ron", &old_text).expect("released schema is valid");
    let new = compile("new.ron", &new_text).expect("edited schema is valid");
    let report = compat(&old, &new);
    (
        report.changes.iter().map(ToString::to_string).collect(),
        report.is_compatible(),
    )
}

#[test]
fn current_schema_matches_the_released_one() {
    let old = compile("old.ron", &latest_released()).expect("valid");
    let new = compile("new.ron", &current()).expect("valid");
    let report = compat(&old, &new);
    assert!(report.changes.is_empty(), "{report}");
}

/// Version 2 (the state digest and progress requests) against version 1: exactly these
/// changes, accepted because of the bump.
#[test]
fn version_2_lists_its_changes() {
    let old = compile("v1.ron", &released()).expect("valid");
    let new = compile("v2.ron", &released_v2()).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changes,
        [
            "identity StateDigest: added",
            "struct StateFile field digest: added",
            "union Reply variant Progress: added",
            "union Request variant Progress: added",
        ],
        "{report}"
    );
    assert!(report.is_compatible());
}

/// Version 3 (the pool adapter's tickets, pointer handles and records; the coordinator's
/// fail-stop notice) against version 2.
#[test]
fn version_3_lists_its_changes() {
    let old = compile("v2.ron", &released_v2()).expect("valid");
    let new = compile("v3.ron", &released_v3()).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changes,
        [
            "enum ResourceKind value Pool: added",
            "union Record variant Pool: added",
            "union Record variant PoolMember: added",
            "union Reply variant Stopped: added",
            "union Request variant FailStop: added",
            "layout PoolPointerHandle: added",
        ],
        "{report}"
    );
    assert!(report.is_compatible());
}

/// Version 4 (the phase in every progress answer, which a shim reads before it rolls back on
/// its own; the coordinator's roll_back) against version 3.
#[test]
fn version_4_lists_its_changes() {
    let old = compile("v3.ron", &released_v3()).expect("valid");
    let new = compile("v4.ron", &released_v4()).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changes,
        [
            "union Reply variant Progress field phase: added",
            "union Reply variant RolledBack: added",
            "union Request variant RollBack: added",
        ],
        "{report}"
    );
    assert!(report.is_compatible());
}

#[test]
fn version_5_lists_its_changes() {
    let old = compile("v4.ron", &released_v4()).expect("valid");
    let new = compile("v5.ron", &released_v5()).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changes,
        [
            "limit MAX_DEVICES: added",
            "identity DeviceUuid: added",
            "struct StateFile field devices: added",
            "struct Device: added",
            "struct DeviceInventory: added",
            "union Reply variant Inspection field devices: added",
        ],
        "{report}"
    );
    assert!(report.is_compatible());
}

#[test]
fn version_6_lists_its_changes() {
    let old = compile("v5.ron", &released_v5()).expect("valid");
    let new = compile("v6.ron", &latest_released()).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changes,
        ["union Reply variant Completed field copy_ns: added"],
        "{report}"
    );
    assert!(report.is_compatible());
}

#[test]
fn documentation_is_not_wire_visible() {
    let (changes, ok) = check(&[("doc: \"Who gets access.\"", "doc: \"Who may touch it.\"")]);
    assert!(changes.is_empty() && ok, "{changes:?}");
}

#[test]
fn retyped_field_fails_without_a_version_bump() {
    let (changes, ok) = check(&[(
        r#"(name: "id", type: "i32", doc: "Device ordinal"#,
        r#"(name: "id", type: "i64", doc: "Device ordinal"#,
    )]);
    assert_eq!(
        changes,
        ["struct Location field id: type changed from `i32` to `i64`"]
    );
    assert!(!ok);
}

#[test]
fn version_bump_accepts_changes() {
    let (changes, ok) = check(&[
        (
            r#"(name: "id", type: "i32", doc: "Device ordinal"#,
            r#"(name: "id", type: "i64", doc: "Device ordinal"#,
        ),
        ("    version: 1,", "    version: 2,"),
    ]);
    assert_eq!(changes.len(), 1);
    assert!(ok);
}

#[test]
fn renamed_field() {
    let (changes, ok) = check(&[(
        r#"(name: "creator_pid", type: "NamespacePid", doc: "The creating process.")"#,
        r#"(name: "creator", type: "NamespacePid", doc: "The creating process.")"#,
    )]);
    assert_eq!(
        changes,
        ["struct AllocationReference field creator_pid: renamed to `creator`"]
    );
    assert!(!ok);
}

#[test]
fn removed_and_added_fields() {
    let (changes, _) = check(&[(
        r#"(name: "flags", type: "AccessFlags", doc: "What access."),"#,
        r#"(name: "granted", type: "bool", doc: "What access."), (name: "extra", type: "u8", doc: "x"),"#,
    )]);
    assert_eq!(
        changes,
        [
            "struct AccessDescriptor field flags: removed",
            "struct AccessDescriptor field granted: added",
            "struct AccessDescriptor field extra: added",
        ]
    );
}

#[test]
fn enum_value_changed_and_added() {
    let (changes, ok) = check(&[
        (
            r#"(name: "ProtRead", value: 1,"#,
            r#"(name: "ProtRead", value: 5,"#,
        ),
        (
            r#"(name: "Busy", doc: "The control queue is full; try again later."),"#,
            r#"(name: "Busy", doc: "The control queue is full; try again later."), (name: "Later", doc: "x"),"#,
        ),
    ]);
    assert_eq!(
        changes,
        [
            "enum AccessFlags value ProtRead: wire value changed from 1 to 5",
            "enum RefusalCode value Later: added",
        ]
    );
    assert!(!ok);
}

#[test]
fn limit_lowered() {
    let (changes, ok) = check(&[("value: 32,\n", "value: 16,\n")]);
    assert_eq!(changes, ["limit MAX_ACCESS: lowered from 32 to 16"]);
    assert!(!ok);
}

#[test]
fn layout_changed() {
    let (changes, ok) = check(&[(r#"kind: Magic("CUI")"#, r#"kind: Magic("CUX")"#)]);
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(
        changes
            .iter()
            .all(|c| c.starts_with("layout VirtualShareableHandle: field `magic@0+3"))
    );
    assert!(!ok);
}

#[test]
fn variant_removed() {
    let (changes, ok) = check(&[(
        r#"(name: "Inspect", doc: "Report the current records; read-only.", fields: []),"#,
        "",
    )]);
    assert_eq!(changes, ["union Request variant Inspect: removed"]);
    assert!(!ok);
}

#[test]
fn cli_exits_non_zero_on_an_unbumped_change() {
    let dir = std::env::temp_dir().join(format!("cuinterpose-compat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let new_path = dir.join("new.ron");
    let edited = released().replacen(
        r#"type: "i32", doc: "Device ordinal"#,
        r#"type: "u32", doc: "Device ordinal"#,
        1,
    );
    std::fs::write(&new_path, edited).expect("write edited schema");
    let old_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/released/v1.ron");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cuinterpose-codegen"))
        .args(["compat", old_path])
        .arg(&new_path)
        .output()
        .expect("run the CLI");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("struct Location field id: type changed from `i32` to `u32`"),
        "{stdout}"
    );
    assert!(stdout.contains("need a version bump"), "{stdout}");
    let same = std::process::Command::new(env!("CARGO_BIN_EXE_cuinterpose-codegen"))
        .args(["compat", old_path, old_path])
        .output()
        .expect("run the CLI");
    assert_eq!(same.status.code(), Some(0));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn cli_check_reports_positions() {
    let dir = std::env::temp_dir().join(format!("cuinterpose-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.ron");
    std::fs::write(
        &path,
        released().replacen(r#"type: "LocationType""#, r#"type: "LocationKind""#, 1),
    )
    .expect("write");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cuinterpose-codegen"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("run the CLI");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    let expected_prefix = format!("{}:", path.display());
    assert!(
        stderr.starts_with(&expected_prefix) && stderr.contains(": unknown type `LocationKind`"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}
