//! Each rule on small made-up trees that break it (and on ones that keep it), so the tidy test
//! cannot pass by finding nothing.

use std::collections::BTreeMap;

use cuinterpose_tidy::rules::{self, Floors, Parsed};
use cuinterpose_tidy::workspace::{SHIM, TRANSPORT};

fn tree(files: &[(&str, &str)]) -> Parsed {
    let files: BTreeMap<String, String> = files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect();
    Parsed::new(&files)
}

/// The problems `table` finds in `files` start with `expected`, one each, in order.
fn check(table: &Floors, files: &[(&str, &str)], expected: &[&str]) {
    let found = rules::floors(&tree(files), table);
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(
            found.starts_with(expected),
            "{found:?} does not start with {expected:?}"
        );
    }
}

#[test]
fn an_import_that_runs_up_a_floor_is_named() {
    check(
        &SHIM,
        &[(
            "shim/src/sys/log.rs",
            "fn f() { crate::state::process::lock(); }\n",
        )],
        &["shim/src/sys/log.rs:1: sys imports from state, a floor above it"],
    );
    check(
        &SHIM,
        &[(
            "shim/src/state/gate.rs",
            "use crate::{driver::os, calls::vmm};\nfn f() { log!(\"{}\", crate::lifecycle::X); }\n",
        )],
        &[
            "shim/src/state/gate.rs:1: state imports from calls, a floor above it",
            "shim/src/state/gate.rs:2: state imports from lifecycle, a floor above it",
        ],
    );
    check(
        &TRANSPORT,
        &[
            (
                "protocol/src/transport/frame.rs",
                "use super::socket::connect;\n",
            ),
            ("protocol/src/transport/socket.rs", "pub fn connect() {}\n"),
        ],
        &["protocol/src/transport/frame.rs:1: frame imports from socket, a floor above it"],
    );
}

#[test]
fn imports_downward_in_comments_and_in_strings_are_fine() {
    check(
        &SHIM,
        &[
            (
                "shim/src/calls/vmm.rs",
                "// see crate::ffi::exports\nuse crate::state::registry;\nuse super::track;\nfn f() { crate::log!(\"crate::runtime\"); let _ = \"crate::ffi::x\"; }\n",
            ),
            ("shim/src/calls/track.rs", "pub(super) fn g() {}\n"),
        ],
        &[],
    );
    // Two modules of one floor may import each other one way.
    check(
        &TRANSPORT,
        &[
            (
                "protocol/src/transport/client.rs",
                "use super::server::x;\n",
            ),
            ("protocol/src/transport/server.rs", "use super::frame::y;\n"),
            ("protocol/src/transport/frame.rs", "pub fn y() {}\n"),
        ],
        &[],
    );
}

#[test]
fn a_crate_without_a_table_is_named() {
    assert_eq!(
        rules::tables_cover(&["shim", "newcrate"], &[SHIM, TRANSPORT]),
        ["newcrate: no table of floors"]
    );
    assert!(rules::tables_cover(&["shim"], &[SHIM]).is_empty());
}

#[test]
fn inline_modules_and_quoted_code_are_read_as_written() {
    // `super` inside an inline module is the file's own module: no edge to the folder above.
    check(
        &SHIM,
        &[
            (
                "shim/src/calls/vmm.rs",
                "pub mod hex { pub fn x() {} }\npub mod other { fn f() { super::hex::x(); } }\n",
            ),
            ("shim/src/calls/mod.rs", "pub mod vmm;\n"),
        ],
        &[],
    );
    // Two `super`s from an inline module climb one folder: here up a floor.
    check(
        &SHIM,
        &[(
            "shim/src/state/gate.rs",
            "mod inner { fn f() { super::super::super::calls::vmm::g(); } }\n",
        )],
        &["shim/src/state/gate.rs:1: state imports from calls, a floor above it"],
    );
    // `quote!` writes another crate's code: its paths are not imports.
    check(
        &SHIM,
        &[(
            "shim/src/sys/log.rs",
            "fn f() { quote! { crate::state::x() }; }\n",
        )],
        &[],
    );
}

#[test]
fn a_circle_inside_a_folder_is_named() {
    check(
        &SHIM,
        &[
            ("shim/src/lifecycle/begin.rs", "use super::step::Done;\n"),
            (
                "shim/src/lifecycle/step.rs",
                "fn f() { super::begin::begin(); }\n",
            ),
        ],
        &["shim/src/lifecycle: import circle begin → step"],
    );
    // A module that uses its folder's own items: the folder's file declares it.
    check(
        &SHIM,
        &[
            (
                "shim/src/lifecycle/mod.rs",
                "pub mod begin;\npub struct Outcome(pub bool);\n",
            ),
            (
                "shim/src/lifecycle/begin.rs",
                "fn f(outcome: &super::Outcome) -> bool { outcome.0 }\n",
            ),
        ],
        &["shim/src/lifecycle: import circle begin → mod"],
    );
    // The FFI edge's entry points may call each other.
    check(
        &SHIM,
        &[
            ("shim/src/ffi/a.rs", "use super::b::x;\n"),
            ("shim/src/ffi/b.rs", "use super::a::y;\n"),
        ],
        &[],
    );
}

#[test]
fn an_allowance_for_circles_that_are_gone_is_named() {
    let table = Floors {
        circles_in: &["lifecycle"],
        ..SHIM
    };
    check(
        &table,
        &[
            ("shim/src/lifecycle/begin.rs", "use super::step::Done;\n"),
            ("shim/src/lifecycle/step.rs", "pub struct Done;\n"),
        ],
        &["shim/src/lifecycle: allowed import circles, but has none"],
    );
}

#[test]
fn unsafe_outside_its_floors_is_named() {
    check(
        &SHIM,
        &[("shim/src/calls/vmm.rs", "fn f() { unsafe { g() } }\n")],
        &["shim/src/calls/vmm.rs:1: unsafe code outside"],
    );
    check(
        &SHIM,
        &[(
            "shim/src/state/gate.rs",
            "fn f() { call!(d, cuInit(0)); }\n",
        )],
        &["shim/src/state/gate.rs:1: unsafe code outside"],
    );
    check(
        &SHIM,
        &[("shim/src/lifecycle/step.rs", "\n// this is unsafe\n")],
        &["shim/src/lifecycle/step.rs:2: the word `unsafe` outside"],
    );
    check(
        &SHIM,
        &[
            ("shim/src/driver/os.rs", "pub fn f() { unsafe { g() } }\n"),
            (
                "shim/src/ffi/exports.rs",
                "pub unsafe extern \"C\" fn cuInit() {}\n",
            ),
        ],
        &[],
    );
}

#[test]
fn the_environment_is_read_only_by_the_settings() {
    check(
        &SHIM,
        &[(
            "shim/src/state/arena.rs",
            "use std::env;\nfn f() -> bool { env::var_os(\"X\").is_some() }\n",
        )],
        &["shim/src/state/arena.rs:2: reads the environment"],
    );
    check(
        &SHIM,
        &[(
            "shim/src/sys/settings.rs",
            "fn f() -> bool { std::env::var_os(\"X\").is_some() }\n",
        )],
        &[],
    );
}

#[test]
fn stray_files_a_wrong_listing_and_unparsable_files_are_named() {
    check(
        &SHIM,
        &[("shim/src/ops.rs", "\n")],
        &["shim/src/ops.rs: not inside a floor"],
    );
    check(
        &SHIM,
        &[(
            "shim/src/lib.rs",
            "pub mod ffi;\npub mod runtime;\npub mod lifecycle;\npub mod calls;\npub mod state;\npub mod sys;\npub mod driver;\n",
        )],
        &["shim/src/lib.rs: declares"],
    );
    let broken = tree(&[("shim/src/calls/vmm.rs", "fn f( {\n")]);
    let errors = broken.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("shim/src/calls/vmm.rs:1:"),
        "{errors:?}"
    );
}

#[test]
fn long_files_are_named_unless_generated() {
    let long = "fn f() {}\n".repeat(601);
    let files = tree(&[
        ("shim/src/calls/vmm.rs", long.as_str()),
        ("shim/src/ffi/generated.rs", long.as_str()),
        ("coordinator/tests/live.rs", long.as_str()),
    ]);
    assert_eq!(
        rules::file_lengths(&files, 600, &["shim/src/ffi/generated.rs"]),
        [
            "coordinator/tests/live.rs: 601 lines (at most 600)",
            "shim/src/calls/vmm.rs: 601 lines (at most 600)",
        ]
    );
}

#[test]
fn long_functions_are_named_and_their_allowlist_only_shrinks() {
    let body = |name: &str, lines: usize| {
        format!(
            "fn {name}() {{\n{}}}\n",
            "    let _ = 1;\n".repeat(lines - 2)
        )
    };
    let text = format!(
        "{}{}impl S {{\n{}}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
        body("long", 151),
        body("short", 150),
        body("method", 160),
        body("in_a_test", 200)
    );
    let files = tree(&[
        ("coordinator/src/a.rs", text.as_str()),
        ("coordinator/tests/b.rs", body("test_helper", 300).as_str()),
    ]);
    assert_eq!(
        rules::function_lengths(&files, 150, &[]),
        [
            "coordinator/src/a.rs:1: fn long is 151 lines (at most 150)",
            "coordinator/src/a.rs:303: fn S::method is 160 lines (at most 150)",
        ]
    );
    assert_eq!(
        rules::function_lengths(
            &files,
            150,
            &[
                "coordinator/src/a.rs::long",
                "coordinator/src/a.rs::S::method",
                "coordinator/src/a.rs::short"
            ]
        ),
        [
            "coordinator/src/a.rs::short: allowed to be long, but no longer over 150 lines: remove it from the list"
        ]
    );
}

#[test]
fn crates_that_need_no_unsafe_forbid_it() {
    let files = tree(&[
        (
            "abi/src/lib.rs",
            "//! The ABI.\n\n#![forbid(unsafe_code)]\n",
        ),
        ("testkit/src/lib.rs", "//! Tests.\n"),
        (
            "testkit/src/bin/tool.rs",
            "#![forbid(unsafe_code)]\nfn main() {}\n",
        ),
        ("shim/src/lib.rs", "//! The shim.\n"),
    ]);
    assert_eq!(
        rules::forbid_unsafe(
            &files,
            &["abi", "testkit", "shim", "newcomer"],
            &["abi", "testkit"],
            &["shim"]
        ),
        [
            "newcomer: in neither list: forbid unsafe code or say why it needs it",
            "testkit/src/lib.rs: crate testkit needs no unsafe code: start with #![forbid(unsafe_code)]",
        ]
    );
}

#[test]
fn glob_imports_outside_tests_are_named_and_their_allowlist_only_shrinks() {
    let files = tree(&[
        (
            "fakecuda/src/ffi/init.rs",
            "use super::*;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        ("fakecuda/src/ffi/mod.rs", "mod init;\npub use init::*;\n"),
        (
            "fakecuda/src/vmm.rs",
            "use crate::state::vmm::{Vmm, Backing};\n",
        ),
        ("fakecuda/tests/a.rs", "use std::io::*;\n"),
        (
            "fakecuda/src/driver.rs",
            "#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
    ]);
    assert_eq!(
        rules::globs(&files, &[]),
        [
            "fakecuda/src/ffi/init.rs:1: a glob import: name what the file takes",
            "fakecuda/src/ffi/mod.rs:2: a glob import: name what the file takes",
        ]
    );
    assert_eq!(
        rules::globs(
            &files,
            &[
                "fakecuda/src/ffi/init.rs",
                "fakecuda/src/ffi/mod.rs",
                "fakecuda/src/vmm.rs"
            ]
        ),
        ["fakecuda/src/vmm.rs: allowed glob imports, but has none: remove it from the list"]
    );
}
