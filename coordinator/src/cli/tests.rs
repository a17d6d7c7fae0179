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
fn carrier_flags_choose_the_carriage() {
    use super::args::{CarrierArgs, CarrierChoice};
    use super::settings::carriage;
    use crate::plan::Carriage;
    let args = |carrier, staging_mib| CarrierArgs {
        carrier,
        staging_mib,
    };
    let storage = Carriage::Storage {
        staging_bytes: 256 << 20,
    };
    // auto: storage where the checkpoint directory is kept, host where it is temporary.
    assert_eq!(
        carriage(&args(CarrierChoice::Auto, 256), true).unwrap(),
        storage
    );
    assert_eq!(
        carriage(&args(CarrierChoice::Auto, 256), false).unwrap(),
        Carriage::Host
    );
    assert_eq!(
        carriage(&args(CarrierChoice::Storage, 256), false).unwrap(),
        storage
    );
    assert_eq!(
        carriage(&args(CarrierChoice::Host, 256), true).unwrap(),
        Carriage::Host
    );
    // A window under one chunk is a usage error naming the flag; with the host carrier the
    // window is not used.
    let error = carriage(&args(CarrierChoice::Storage, 1), false).unwrap_err();
    assert!(
        error.0.contains("--staging-mib 1") && error.0.contains("too small"),
        "{error:?}"
    );
    assert!(carriage(&args(CarrierChoice::Host, 1), false).is_ok());
    assert_eq!(
        run([
            "cuinterpose",
            "prepare",
            "--checkpoint-dir",
            "/tmp/cuinterpose-never-written",
            "--staging-mib",
            "63"
        ]),
        ExitCode::from(EXIT_USAGE)
    );
    assert!(!Path::new("/tmp/cuinterpose-never-written").exists());
}

#[test]
fn the_hooks_carrier_comes_from_its_settings() {
    use super::settings::Usage;
    use crate::plan::Carriage;
    let check = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        super::settings::hook_carriage(|name| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, value)| value.clone())
        })
    };
    let storage = |mib: u64| Carriage::Storage {
        staging_bytes: mib << 20,
    };
    // Unset or empty: auto, and an image directory is kept, so the storage carrier.
    assert_eq!(check(&[]).unwrap(), storage(256));
    assert_eq!(
        check(&[("CUINTERPOSE_CARRIER", " ")]).unwrap(),
        storage(256)
    );
    assert_eq!(
        check(&[("CUINTERPOSE_CARRIER", "Host")]).unwrap(),
        Carriage::Host
    );
    assert_eq!(
        check(&[
            ("CUINTERPOSE_CARRIER", "storage"),
            ("CUINTERPOSE_STAGING_MIB", "128")
        ])
        .unwrap(),
        storage(128)
    );
    let refused = |pairs: &[(&str, &str)], names: &[&str]| {
        let Usage(why) = check(pairs).unwrap_err();
        assert!(names.iter().all(|n| why.contains(n)), "{why}");
    };
    refused(
        &[("CUINTERPOSE_CARRIER", "disk")],
        &["CUINTERPOSE_CARRIER", "\"disk\"", "auto, host or storage"],
    );
    refused(
        &[("CUINTERPOSE_STAGING_MIB", "lots")],
        &["CUINTERPOSE_STAGING_MIB", "\"lots\""],
    );
    refused(
        &[("CUINTERPOSE_STAGING_MIB", "1")],
        &["CUINTERPOSE_STAGING_MIB", "too small"],
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
