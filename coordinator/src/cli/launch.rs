//! `cuinterpose launch`: find the shim and run a command with it preloaded.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cuinterpose_protocol::transport::CONTROL_DIR_VARIABLE;

use super::settings::{Failure, Usage, control_dir};

/// Names the shim library `launch` preloads when `--shim` is not given.
pub const SHIM_VARIABLE: &str = "CUINTERPOSE_SHIM";
/// The shim's file name, looked for next to the `cuinterpose` executable.
pub const SHIM_FILE_NAME: &str = "libcuinterpose.so";

/// The shim `launch` preloads: `--shim`, else $CUINTERPOSE_SHIM, else next to `exe`.
pub fn shim_path(flag: Option<PathBuf>, variable: Option<OsString>, exe: &Path) -> PathBuf {
    flag.or_else(|| {
        variable
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| {
        exe.parent()
            .unwrap_or_else(|| Path::new("."))
            .join(SHIM_FILE_NAME)
    })
}

/// `LD_PRELOAD` with `shim` first, keeping what was there.
pub fn preload_value(shim: &Path, existing: Option<OsString>) -> OsString {
    let mut value = OsString::from(shim);
    if let Some(existing) = existing.filter(|existing| !existing.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

pub(super) fn launch(
    shim: Option<PathBuf>,
    control: Option<PathBuf>,
    command: Vec<OsString>,
) -> Result<ExitCode, Failure> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("cuinterpose"));
    let shim = shim_path(shim, std::env::var_os(SHIM_VARIABLE), &exe);
    let shim = std::fs::canonicalize(&shim).map_err(|error| {
        Usage(format!(
            "shim {}: {error} (build it with `cargo build -p cuinterpose-shim`, or pass --shim)",
            shim.display()
        ))
    })?;
    let (program, args) = command.split_first().expect("clap requires a command");
    let mut child = std::process::Command::new(program);
    child.args(args).env(
        "LD_PRELOAD",
        preload_value(&shim, std::env::var_os("LD_PRELOAD")),
    );
    if let Some(control) = control {
        let dir = control_dir(Some(control))?;
        child.env(CONTROL_DIR_VARIABLE, dir);
    }
    let error = child.exec();
    eprintln!(
        "cuinterpose: cannot run {}: {error}",
        Path::new(program).display()
    );
    Ok(ExitCode::from(
        if error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        },
    ))
}
