//! The lifecycle section: the phase chain the shim and the coordinator are generated from.
//! One test per rule, each asserting the message and that it points at the offending literal
//! (`/*@*/` marks where).

use cuinterpose_codegen::{compile, markdown, rust};

mod support;

const BASE: &str = concat!(
    schema_head!(),
    r#"    ],
    enums: [
        (name: "Phase", doc: "p", encoding: Name, values: [
            (name: "Active", doc: "a"), (name: "Frozen", doc: "f"),
            (name: "Saved", doc: "s"), (name: "Loaded", doc: "l"),
        ]),
        (name: "Op", doc: "o", encoding: Name, values: [
            (name: "Save", doc: "s"), (name: "Load", doc: "l"), (name: "Resume", doc: "r"),
        ]),
        (name: "Code", doc: "c", encoding: Cuda(cudarc: "X"), values: [
            (name: "One", value: 1, cuda: "ONE", doc: "o"),
        ]),
    ],
    identities: [],
    structs: [(name: "Body", doc: "b", fields: [(name: "op", type: "Op", doc: "o")])],
    unions: [],
    layouts: [],
    messages: [(body: "Body", limit: "MAX_MESSAGE_BYTES", doc: "b")],
    lifecycle: (phases: "Phase", operations: "Op", doc: "the chain", chain: [
        (operation: "Save", from: "Frozen", to: "Saved", stage: Capture),
        (operation: "Load", from: "Saved", to: "Loaded", stage: Restore),
        (operation: "Resume", from: "Loaded", to: "Active", stage: Restore),
    ]),
)
"#
);

fn edit(from: &str, to: &str) -> String {
    support::edit(BASE, &[(from, to)])
}

/// Compiles the base schema with one edit and asserts `message` at the `/*@*/` marker.
fn check(from: &str, to: &str, message: &str) {
    let text = edit(from, to);
    support::assert_diagnostic(&text, support::marker(&text), message);
}

#[test]
fn the_chain_generates_both_sides() {
    let ir = compile("test.ron", BASE).expect("valid");
    let code = rust(&ir).expect("emits");
    for expected in [
        "pub const fn from_phase(self) -> Phase",
        "Op::Load => Phase::Saved,",
        "Op::Resume => Phase::Active,",
        "pub const CAPTURE_OPERATIONS: [Op; 1] = [Op::Save];",
        "pub const RESTORE_OPERATIONS: [Op; 2] = [Op::Load, Op::Resume];",
    ] {
        assert!(code.contains(expected), "missing `{expected}` in:\n{code}");
    }
    let doc = markdown(&ir).expect("renders");
    assert!(
        doc.contains("| `Load` | restore | `Saved` | `Loaded` |"),
        "{doc}"
    );
}

#[test]
fn a_schema_without_a_lifecycle_emits_none() {
    let text = edit(
        r#"    lifecycle: (phases: "Phase", operations: "Op", doc: "the chain", chain: [
        (operation: "Save", from: "Frozen", to: "Saved", stage: Capture),
        (operation: "Load", from: "Saved", to: "Loaded", stage: Restore),
        (operation: "Resume", from: "Loaded", to: "Active", stage: Restore),
    ]),
"#,
        "",
    );
    let ir = compile("test.ron", &text).expect("valid");
    assert!(!rust(&ir).expect("emits").contains("CAPTURE_OPERATIONS"));
}

#[test]
fn the_enums_must_exist_and_be_name_encoded() {
    check(
        r#"phases: "Phase","#,
        r#"phases: /*@*/"Stage","#,
        "lifecycle phases `Stage` is not a declared enum",
    );
    check(
        r#"operations: "Op","#,
        r#"operations: /*@*/"Code","#,
        "lifecycle operations `Code` must be a name-encoded enum",
    );
}

#[test]
fn every_operation_once() {
    check(
        r#"(operation: "Resume", from: "Loaded", to: "Active", stage: Restore),"#,
        r#"(operation: /*@*/"Load", from: "Loaded", to: "Active", stage: Restore),"#,
        "lifecycle: `Load` appears twice in the chain",
    );
    check(
        r#"(operation: "Resume", from: "Loaded", to: "Active", stage: Restore),"#,
        r#"(operation: /*@*/"Rewind", from: "Loaded", to: "Active", stage: Restore),"#,
        "lifecycle: `Rewind` is not a value of Op",
    );
    check(
        r#"(name: "Resume", doc: "r"),"#,
        r#"(name: "Resume", doc: "r"), (name: /*@*/"Skip", doc: "s"),"#,
        "lifecycle: operation `Skip` has no place in the chain",
    );
}

#[test]
fn phases_are_values_and_the_chain_is_contiguous() {
    check(
        r#"(operation: "Load", from: "Saved", to: "Loaded", stage: Restore),"#,
        r#"(operation: /*@*/"Load", from: "Saved", to: "Gone", stage: Restore),"#,
        "lifecycle: `Load` names `Gone`, which is not a value of Phase",
    );
    check(
        r#"(operation: "Resume", from: "Loaded", to: "Active", stage: Restore),"#,
        r#"(operation: /*@*/"Resume", from: "Frozen", to: "Active", stage: Restore),"#,
        "lifecycle: `Resume` starts from `Frozen`, but `Load` before it leads to `Loaded`",
    );
}

#[test]
fn capture_comes_before_restore() {
    check(
        r#"(operation: "Resume", from: "Loaded", to: "Active", stage: Restore),"#,
        r#"(operation: /*@*/"Resume", from: "Loaded", to: "Active", stage: Capture),"#,
        "lifecycle: capture operation `Resume` comes after restore operation `Load`",
    );
}
