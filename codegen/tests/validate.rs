//! One test per schema error: each asserts the message and that it points at the offending
//! token. In an edited schema, `/*@*/` marks where the diagnostic must point.

use cuinterpose_codegen::compile;

mod support;

const BASE: &str = concat!(
    schema_head!(),
    r#"        (name: "MAX_ITEMS", value: 4, doc: "i"),
    ],
    enums: [
        (name: "Color", doc: "c", encoding: Cuda(cudarc: "X"), values: [
            (name: "Red", value: 1, cuda: "RED", doc: "r"),
            (name: "Blue", value: 2, cuda: "BLUE", doc: "b"),
        ], rejected: [(value: 0, cuda: "INVALID", reason: "invalid")]),
        (name: "Perm", doc: "p", encoding: CudaFlags(cudarc: "Y"), values: [
            (name: "Read", value: 1, cuda: "READ", doc: "r"),
            (name: "Write", value: 2, cuda: "WRITE", doc: "w"),
        ]),
        (name: "Mode", doc: "m", encoding: Name, values: [(name: "Fast", doc: "f")]),
    ],
    identities: [(name: "Pid", doc: "p", repr: U32), (name: "Id", doc: "i", repr: Bytes16)],
    structs: [
        (name: "Item", doc: "i", fields: [
            (name: "color", type: "Color", doc: "c"),
            (name: "owner", type: "Pid", doc: "o"),
        ]),
    ],
    unions: [
        (name: "Body", doc: "b", variants: [
            (name: "Items", doc: "i", fields: [(name: "items", type: "list<Item, MAX_ITEMS>", doc: "i")]),
            (name: "Empty", doc: "e", fields: []),
        ]),
    ],
    layouts: [
        (name: "Handle", doc: "h", size: 8, fields: [
            (name: "magic", offset: 0, kind: Magic("HD")),
            (name: "version", offset: 2, kind: Version),
            (name: "reserved", offset: 3, kind: Reserved(size: 1)),
            (name: "owner", offset: 4, kind: Value(type: "Pid")),
        ]),
    ],
    messages: [(body: "Body", limit: "MAX_MESSAGE_BYTES", doc: "b")],
)
"#
);

/// The base schema with `edits` applied.
fn edit(edits: &[(&str, &str)]) -> String {
    support::edit(BASE, edits)
}

/// Compiles an edited schema and asserts one diagnostic with `message`, at the marker or at
/// `at` (line, column) when given.
fn check(edits: &[(&str, &str)], message: &str, at: Option<(usize, usize)>) {
    let text = edit(edits);
    support::assert_diagnostic(&text, at.unwrap_or_else(|| support::marker(&text)), message);
}

#[test]
fn base_schema_compiles() {
    let ir = compile("test.ron", BASE).expect("the base schema is valid");
    assert_eq!(ir.messages[0].depth, 3);
}

#[test]
fn the_project_schema_compiles() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/protocol.ron");
    let text = std::fs::read_to_string(path).expect("schema is readable");
    compile("schema/protocol.ron", &text).expect("schema/protocol.ron is valid");
}

#[test]
fn syntax_error_points_at_line_and_column() {
    let text = edit(&[("version: 1,", "version: 1")]);
    let error = compile("test.ron", &text).expect_err("missing comma");
    let first = error.iter().next().expect("one diagnostic").to_string();
    assert!(first.starts_with("test.ron:4:5: "), "{first}");
}

#[test]
fn unknown_schema_key_is_a_syntax_error() {
    let text = edit(&[("version: 1,", "version: 1, colour: 2,")]);
    let error = compile("test.ron", &text).expect_err("unknown key");
    let first = error.iter().next().expect("one diagnostic").to_string();
    assert!(
        first.starts_with("test.ron:3:") && first.contains("colour"),
        "{first}"
    );
}

#[test]
fn unknown_type() {
    check(
        &[(r#"type: "Color", doc: "c""#, r#"type: "Colour", doc: "c""#)],
        "unknown type `Colour`",
        Some((24, 36)),
    );
}

#[test]
fn duplicate_type_name() {
    check(
        &[
            (r#"(name: "Mode", doc: "m""#, r#"(name: "Item", doc: "m""#),
            (
                r#"(name: "Item", doc: "i", fields"#,
                r#"(name: /*@*/"Item", doc: "i", fields"#,
            ),
        ],
        "duplicate type name `Item`",
        None,
    );
}

#[test]
fn duplicate_field() {
    check(
        &[(
            r#"(name: "owner", type: "Pid""#,
            r#"(name: /*@*/"color", type: "Pid""#,
        )],
        "duplicate field `color` in `Item`",
        None,
    );
}

#[test]
fn enum_value_collision() {
    check(
        &[(
            r#"(name: "Blue", value: 2"#,
            r#"(name: /*@*/"Blue", value: 1"#,
        )],
        "value 1 of `Blue` collides with `Red` in enum `Color`",
        None,
    );
}

#[test]
fn rejected_value_collides_with_a_value() {
    check(
        &[
            (r#"reason: "invalid""#, r#"reason: /*@*/"invalid""#),
            ("(value: 0, cuda", "(value: 2, cuda"),
        ],
        "rejected value 2 of enum `Color` collides with `Blue`",
        None,
    );
}

#[test]
fn flag_is_not_a_single_bit() {
    check(
        &[(
            r#"(name: "Write", value: 2"#,
            r#"(name: /*@*/"Write", value: 6"#,
        )],
        "flag `Write` = 6 of `Perm` is not a single bit",
        None,
    );
}

#[test]
fn cuda_value_without_its_constant() {
    check(
        &[(
            r#"(name: "Blue", value: 2, cuda: "BLUE","#,
            r#"(name: /*@*/"Blue", value: 2,"#,
        )],
        "value `Blue` of CUDA enum `Color` must name the CUDA constant it mirrors (`cuda`)",
        None,
    );
}

#[test]
fn cuda_constant_that_is_not_an_identifier() {
    // Found by fuzzing (fuzz/artifacts/schema/crash-51f3cbc1…): the generator used to panic
    // building the compile-time check against cudarc.
    check(
        &[(r#"cuda: "BLUE","#, r#"cuda: /*@*/"BL=UE","#)],
        "CUDA constant `BL=UE` in enum `Color` must be SCREAMING_SNAKE_CASE",
        None,
    );
    check(
        &[(
            r#"(value: 0, cuda: "INVALID""#,
            r#"(value: 0, cuda: /*@*/"in valid""#,
        )],
        "CUDA constant `in valid` in enum `Color` must be SCREAMING_SNAKE_CASE",
        None,
    );
}

#[test]
fn cudarc_type_that_is_not_an_identifier() {
    check(
        &[(r#"Cuda(cudarc: "X")"#, r#"Cuda(cudarc: /*@*/"X::Y")"#)],
        "cudarc type `X::Y` of enum `Color` must be a Rust identifier",
        None,
    );
}

#[test]
fn name_enum_value_with_an_integer() {
    check(
        &[(
            r#"(name: "Fast", doc: "f")"#,
            r#"(name: /*@*/"Fast", value: 3, doc: "f")"#,
        )],
        "value `Fast` of name enum `Mode` cannot have an integer value or a CUDA constant",
        None,
    );
}

#[test]
fn undefined_bound() {
    check(
        &[("list<Item, MAX_ITEMS>", "list<Item, MAX_THINGS>")],
        "undefined limit `MAX_THINGS`",
        Some((30, 82)),
    );
}

#[test]
fn unclosed_type_argument_list() {
    check(
        &[("list<Item, MAX_ITEMS>", "list<Item, MAX_ITEMS")],
        "unclosed `<`",
        Some((30, 91)),
    );
}

#[test]
fn wrong_number_of_type_arguments() {
    check(
        &[("list<Item, MAX_ITEMS>", "list<Item>")],
        "`list` takes 2 arguments: list<TYPE, LIMIT>",
        Some((30, 71)),
    );
}

#[test]
fn map_key_must_be_an_integer_or_identity() {
    check(
        &[("list<Item, MAX_ITEMS>", "map<Item, Item, MAX_ITEMS>")],
        "map key `Item` must be an integer or an identity",
        Some((30, 75)),
    );
}

#[test]
fn union_field_named_like_the_tag() {
    check(
        &[(r#"(name: "items", type"#, r#"(name: /*@*/"kind", type"#)],
        "field `kind` of variant `Items` collides with the union tag",
        None,
    );
}

#[test]
fn field_name_must_be_snake_case() {
    check(
        &[(
            r#"(name: "owner", type: "Pid""#,
            r#"(name: /*@*/"Owner", type: "Pid""#,
        )],
        "field name `Owner` must be snake_case and not a Rust keyword",
        None,
    );
}

#[test]
fn type_that_contains_itself() {
    check(
        &[
            (
                r#"(name: "Item", doc: "i""#,
                r#"(name: /*@*/"Item", doc: "i""#,
            ),
            (
                r#"type: "Pid", doc: "o""#,
                r#"type: "option<Item>", doc: "o""#,
            ),
        ],
        "type `Item` contains itself",
        None,
    );
}

#[test]
fn variant_struct_name_collision() {
    check(
        &[
            (
                r#"(name: "Item", doc: "i""#,
                r#"(name: "EmptyBody", doc: "i""#,
            ),
            (
                r#"type: "list<Item, MAX_ITEMS>""#,
                r#"type: "list<EmptyBody, MAX_ITEMS>""#,
            ),
            (
                r#"(name: "Empty", doc: "e""#,
                r#"(name: /*@*/"Empty", doc: "e""#,
            ),
        ],
        "variant `Empty` of `Body` generates struct `EmptyBody`, which is already defined",
        None,
    );
}

#[test]
fn layout_fields_overlap() {
    check(
        &[(
            r#"(name: "reserved", offset: 3"#,
            r#"(name: /*@*/"reserved", offset: 2"#,
        )],
        "field `reserved` at offset 2 overlaps the previous field (which ends at 3)",
        None,
    );
}

#[test]
fn layout_gap() {
    check(
        &[
            (
                r#"(name: "reserved", offset: 3, kind: Reserved(size: 1)),"#,
                "",
            ),
            (
                r#"(name: "owner", offset: 4"#,
                r#"(name: /*@*/"owner", offset: 4"#,
            ),
        ],
        "gap of 1 bytes before field `owner` at offset 4 (declare it reserved)",
        None,
    );
}

#[test]
fn layout_field_beyond_size() {
    check(
        &[
            (r#"size: 8, fields"#, r#"size: 6, fields"#),
            (
                r#"(name: "owner", offset"#,
                r#"(name: /*@*/"owner", offset"#,
            ),
        ],
        "field `owner` ends at 8, beyond the layout size 6",
        None,
    );
}

#[test]
fn layout_leaves_bytes_undeclared() {
    check(
        &[(
            r#"(name: "Handle", doc: "h", size: 8"#,
            r#"(name: /*@*/"Handle", doc: "h", size: 12"#,
        )],
        "layout `Handle` leaves bytes 8..12 undeclared (declare them reserved)",
        None,
    );
}

#[test]
fn layout_without_magic() {
    check(
        &[
            (
                r#"(name: "Handle", doc: "h""#,
                r#"(name: /*@*/"Handle", doc: "h""#,
            ),
            (r#"kind: Magic("HD")"#, r#"kind: Reserved(size: 2)"#),
        ],
        "layout `Handle` has no magic: a foreign buffer could not be told apart",
        None,
    );
}

#[test]
fn layout_value_without_fixed_size() {
    check(
        &[(
            r#"(name: "owner", offset: 4, kind: Value(type: "Pid"))"#,
            r#"(name: /*@*/"owner", offset: 4, kind: Value(type: "Item"))"#,
        )],
        "type `Item` of layout field `owner` has no fixed size",
        None,
    );
}

#[test]
fn nonzero_applies_to_unsigned_integers() {
    check(
        &[(
            r#"(name: "owner", offset: 4, kind: Value(type: "Pid"))"#,
            r#"(name: /*@*/"owner", offset: 4, kind: Value(type: "Pid", nonzero: true))"#,
        )],
        "`nonzero` applies to unsigned integers, not `Pid` (identities are never zero already)",
        None,
    );
}

#[test]
fn version_digit_needs_a_one_digit_version() {
    check(
        &[
            ("version: 1,", "version: 36,"),
            (
                r#"(name: "version", offset: 2, kind: Version)"#,
                r#"(name: /*@*/"version", offset: 2, kind: VersionDigit)"#,
            ),
        ],
        "version 36 cannot be written as one ASCII digit (0-9, then A-Z) in `Handle`",
        None,
    );
}

#[test]
fn version_out_of_range() {
    check(
        &[("version: 1,", "/*@*/version: 0,")],
        "version 0 is out of range: it must be 1..=127",
        None,
    );
}

#[test]
fn required_limit_missing() {
    check(
        &[
            (r#"(name: "MAX_DEPTH", value: 8, doc: "d"),"#, ""),
            ("    limits: [", "    /*@*/limits: ["),
        ],
        "required limit `MAX_DEPTH` is missing",
        None,
    );
}

#[test]
fn message_deeper_than_max_depth() {
    check(
        &[
            (
                r#"(name: "MAX_DEPTH", value: 8"#,
                r#"(name: "MAX_DEPTH", value: 2"#,
            ),
            (
                r#"messages: [(body: "Body""#,
                r#"messages: [(body: /*@*/"Body""#,
            ),
        ],
        "message `Body` nests 3 levels, more than MAX_DEPTH = 2",
        None,
    );
}

#[test]
fn unknown_message_body() {
    check(
        &[(
            r#"messages: [(body: "Body""#,
            r#"messages: [(body: /*@*/"Bodies""#,
        )],
        "unknown message body `Bodies`",
        None,
    );
}

#[test]
fn message_body_must_be_a_struct_or_union() {
    check(
        &[(
            r#"messages: [(body: "Body""#,
            r#"messages: [(body: /*@*/"Color""#,
        )],
        "message body `Color` must be a struct or a union",
        None,
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let text = edit(&[
        (r#"type: "Color", doc: "c""#, r#"type: "Colour", doc: "c""#),
        ("list<Item, MAX_ITEMS>", "list<Item, MAX_THINGS>"),
    ]);
    let error = compile("test.ron", &text).expect_err("two errors");
    assert_eq!(error.iter().count(), 2, "{error}");
}
