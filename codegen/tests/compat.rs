//! The compatibility checker against the project's own released schema.

use cuinterpose_codegen::{compat, compile};

mod support;

/// The newest released version, which the current schema must match until the next bump.
const LATEST: u32 = 10;

/// The frozen schema of release `version` (`schema/released/v{version}.ron`).
fn released(version: u32) -> String {
    let path = format!(
        "{}/../schema/released/v{version}.ron",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path} is readable: {e}"))
}

fn current() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/protocol.ron"
    ))
    .expect("schema/protocol.ron is readable")
}

/// Release `version` against the one before: exactly `expected`, accepted because of the
/// bump.
fn check_release(version: u32, expected: &[&str]) {
    let old = compile(&format!("v{}.ron", version - 1), &released(version - 1)).expect("valid");
    let new = compile(&format!("v{version}.ron"), &released(version)).expect("valid");
    let report = compat(&old, &new);
    let changes: Vec<String> = report.changes.iter().map(ToString::to_string).collect();
    assert_eq!(changes, expected, "{report}");
    assert!(report.is_compatible());
}

/// Applies `edits` to the released schema and returns the compatibility report's changes as
/// text, plus whether the change is accepted.
fn check(edits: &[(&str, &str)]) -> (Vec<String>, bool) {
    let old_text = released(1);
    let new_text = support::edit(&old_text, edits);
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
    let old = compile("old.ron", &released(LATEST)).expect("valid");
    let new = compile("new.ron", &current()).expect("valid");
    let report = compat(&old, &new);
    assert!(report.changes.is_empty(), "{report}");
}

/// Version 2 (the state digest and progress requests) against version 1: exactly these
/// changes, accepted because of the bump.
#[test]
fn version_2_lists_its_changes() {
    check_release(
        2,
        &[
            "identity StateDigest: added",
            "struct StateFile field digest: added",
            "union Reply variant Progress: added",
            "union Request variant Progress: added",
        ],
    );
}

/// Version 3 (the pool adapter's tickets, pointer handles and records; the coordinator's
/// fail-stop notice) against version 2.
#[test]
fn version_3_lists_its_changes() {
    check_release(
        3,
        &[
            "enum ResourceKind value Pool: added",
            "union Record variant Pool: added",
            "union Record variant PoolMember: added",
            "union Reply variant Stopped: added",
            "union Request variant FailStop: added",
            "layout PoolPointerHandle: added",
        ],
    );
}

/// Version 4 (the phase in every progress answer, which a shim reads before it rolls back on
/// its own; the coordinator's roll_back) against version 3.
#[test]
fn version_4_lists_its_changes() {
    check_release(
        4,
        &[
            "union Reply variant Progress field phase: added",
            "union Reply variant RolledBack: added",
            "union Request variant RollBack: added",
        ],
    );
}

#[test]
fn version_5_lists_its_changes() {
    check_release(
        5,
        &[
            "limit MAX_DEVICES: added",
            "identity DeviceUuid: added",
            "struct StateFile field devices: added",
            "struct Device: added",
            "struct DeviceInventory: added",
            "union Reply variant Inspection field devices: added",
        ],
    );
}

#[test]
fn version_6_lists_its_changes() {
    check_release(6, &["union Reply variant Completed field copy_ns: added"]);
}

/// Version 7: a coordinator killed before the state is published no longer leaves the
/// released workload stranded (the hold, and the held flag a rolling-back importer reads).
#[test]
fn version_7_lists_its_changes() {
    check_release(
        7,
        &[
            "union Reply variant Progress field held: added",
            "union Reply variant Held: added",
            "union Request variant Hold: added",
        ],
    );
}

/// Version 8 (each device a record names carries its UUID) against version 7.
#[test]
fn version_8_lists_its_changes() {
    check_release(
        8,
        &[
            "limit MAX_MESSAGE_BYTES: raised from 33554432 to 50331648",
            "struct Location field uuid: added",
            "union Record variant MulticastBinding field device_uuid: added",
            "union Record variant MulticastDevice field uuid: added",
            "union Record variant Pool field device_uuid: added",
        ],
    );
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
    let edited = released(1).replacen(
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
        released(1).replacen(r#"type: "LocationType""#, r#"type: "LocationKind""#, 1),
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

/// Version 9 (checksummed carrier bytes, and each copy's peak carrier memory) against 8.
#[test]
fn version_9_lists_its_changes() {
    check_release(
        9,
        &[
            "limit MAX_CHUNKS: added",
            "struct StateFile field checksums: added",
            "struct CarrierChecksum: added",
            "union Reply variant Completed field peak_carrier_bytes: added",
            "union Reply variant Completed field checksums: added",
        ],
    );
}

/// Version 10 (the storage carrier: where the bytes go, its staging window and folder) against 9.
#[test]
fn version_10_lists_its_changes() {
    check_release(
        10,
        &[
            "limit CARRIER_CHUNK_BYTES: added",
            "enum RefusalCode value CarrierFailed: added",
            "enum Carrier: added",
            "struct StateFile field carrier: added",
            "union Request variant Execute field carrier: added",
            "union Request variant Execute field staging_bytes: added",
        ],
    );
}
