//! Unit tests of the command line: its definition, usage errors, where the shim is found.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use super::*;
use clap::CommandFactory;

#[test]
fn cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn usage_errors_exit_64() {
    assert_eq!(
        run(["cuinterpose", "frobnicate"]),
        ExitCode::from(EXIT_USAGE)
    );
    assert_eq!(run(["cuinterpose", "prepare"]), ExitCode::from(EXIT_USAGE));
    assert_eq!(
        run([
            "cuinterpose",
            "restore",
            "--dir",
            "/a",
            "--checkpoint-dir",
            "/b"
        ]),
        ExitCode::from(EXIT_USAGE)
    );
    assert_eq!(
        run(["cuinterpose", "inspect", "--control-dir", "relative/dir"]),
        ExitCode::from(EXIT_USAGE)
    );
    assert_eq!(
        run([
            "cuinterpose",
            "inspect",
            "--control-dir",
            "/tmp",
            "--pid",
            "0"
        ]),
        ExitCode::from(EXIT_USAGE)
    );
}

#[test]
fn shim_is_found_next_to_the_executable() {
    let exe = Path::new("/opt/cuinterpose/bin/cuinterpose");
    assert_eq!(
        shim_path(None, None, exe),
        Path::new("/opt/cuinterpose/bin/libcuinterpose.so")
    );
    assert_eq!(
        shim_path(None, Some("/x/shim.so".into()), exe),
        Path::new("/x/shim.so")
    );
    assert_eq!(
        shim_path(Some("/y/shim.so".into()), Some("/x/shim.so".into()), exe),
        Path::new("/y/shim.so")
    );
    assert_eq!(
        preload_value(Path::new("/s.so"), Some("/other.so".into())),
        OsString::from("/s.so:/other.so")
    );
    assert_eq!(
        preload_value(Path::new("/s.so"), Some("".into())),
        OsString::from("/s.so")
    );
}
