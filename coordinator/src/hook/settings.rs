//! Where the hook's settings come from. CRIU passes its own environment on to action
//! scripts, so under plain CRIU the usual variables work; container engines start the OCI
//! runtime (and so CRIU) with an environment of their own, so the hook also reads:
//!
//! 1. its environment (wins);
//! 2. the settings file [`SETTINGS_FILE`] (or `$CUINTERPOSE_HOOK_SETTINGS`): `NAME=VALUE`
//!    lines for the variables in [`ALLOWED`], `#` comments;
//! 3. for the control directories and the carrier only, the environment of the workload's own
//!    processes (`/proc/<pid>/environ`), read inside the workload's root. Never the driver
//!    library: the hook runs as root, and a path a container chose must not decide what it
//!    loads.

use std::path::{Path, PathBuf};

/// The settings file the hook reads when it exists.
pub const SETTINGS_FILE: &str = "/etc/cuinterpose/criu-hook.conf";
/// Names another settings file.
pub const SETTINGS_VARIABLE: &str = "CUINTERPOSE_HOOK_SETTINGS";

/// The variables a settings file may set.
pub const ALLOWED: [&str; 9] = [
    "CUINTERPOSE_DRIVER",
    "CUINTERPOSE_DEVICE_MAP",
    "CUINTERPOSE_CARRIER",
    "CUINTERPOSE_STAGING_MIB",
    "CUINTERPOSE_CONTROL_DIR",
    "CUINTERPOSE_CONTROL_TIMEOUT_SECONDS",
    "CUINTERPOSE_COPY_TIMEOUT_SECONDS",
    "FAKECUDA_CONTROL_DIR",
    "FAKECUDA_LIBCUDA",
];

/// The variables the hook may take from the workload's own processes: the control directories
/// and how its shared bytes are carried (the carrier folder it is given is detached from the
/// host's file system, and the staging window is its own memory). Never the driver library.
pub const FROM_WORKLOAD: [&str; 4] = [
    "CUINTERPOSE_CONTROL_DIR",
    "FAKECUDA_CONTROL_DIR",
    "CUINTERPOSE_CARRIER",
    "CUINTERPOSE_STAGING_MIB",
];

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// The settings file's `NAME=VALUE` pairs; a missing default file is no settings.
pub fn read(path: &Path, required: bool) -> Result<Vec<(String, String)>, SettingsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if !required && error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Vec::new());
        }
        Err(source) => {
            return Err(SettingsError::Unreadable {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut pairs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_text = line.trim();
        if line_text.is_empty() || line_text.starts_with('#') {
            continue;
        }
        let invalid = |reason: String| SettingsError::Invalid {
            path: path.to_path_buf(),
            line: index + 1,
            reason,
        };
        let (name, value) = line_text
            .split_once('=')
            .ok_or_else(|| invalid(format!("expected NAME=VALUE, found {line_text:?}")))?;
        let name = name.trim();
        if !ALLOWED.contains(&name) {
            return Err(invalid(format!(
                "{name} cannot be set here (allowed: {})",
                ALLOWED.join(", ")
            )));
        }
        pairs.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok(pairs)
}

/// The settings file to read: `$CUINTERPOSE_HOOK_SETTINGS` (which must exist), else the
/// default (which may be absent).
pub fn file(lookup: impl Fn(&str) -> Option<String>) -> (PathBuf, bool) {
    match lookup(SETTINGS_VARIABLE) {
        Some(path) => (PathBuf::from(path), true),
        None => (PathBuf::from(SETTINGS_FILE), false),
    }
}

/// `name` as the first process of `pids` that has it in its environment set it.
pub fn from_workload(pids: &[u32], name: &str) -> Option<String> {
    pids.iter().find_map(|pid| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        environ.split(|byte| *byte == 0).find_map(|entry| {
            let entry = std::str::from_utf8(entry).ok()?;
            entry
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
                .map(str::to_owned)
        })
    })
}

/// The variables to set before the hook runs: the settings file's, then the workload's
/// control directories (`FAKECUDA_CONTROL_DIR` seen through the root's mounts), each only
/// where `lookup` (the environment) has none.
pub fn gather(
    lookup: impl Fn(&str) -> Option<String>,
    root: Option<u32>,
) -> Result<Vec<(String, String)>, SettingsError> {
    let (path, required) = file(&lookup);
    let mut set: Vec<(String, String)> = read(&path, required)?
        .into_iter()
        .filter(|(name, _)| lookup(name).is_none())
        .collect();
    let Some(root) = root else {
        return Ok(set);
    };
    let pids: Vec<u32> = crate::process::tree(Path::new("/proc"), root)
        .map(|tree| tree.iter().map(|process| process.host_pid).collect())
        .unwrap_or_default();
    for name in FROM_WORKLOAD {
        if lookup(name).is_some() || set.iter().any(|(set_name, _)| set_name == name) {
            continue;
        }
        if let Some(value) = from_workload(&pids, name) {
            let value = match name {
                // The hook's own fake driver opens it directly: through the root's mounts.
                "FAKECUDA_CONTROL_DIR" => super::control_dir_for(Path::new(&value), root)
                    .display()
                    .to_string(),
                _ => value,
            };
            set.push((name.to_owned(), value));
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settings_file_sets_only_allowed_names_and_says_where_it_is_wrong() {
        let dir = cuinterpose_testkit::fixtures::TempDir::new("settings").expect("dir");
        let path = dir.path().join("hook.conf");
        std::fs::write(
            &path,
            "# comment\n\nCUINTERPOSE_DRIVER = /opt/libcuda.so.1\nFAKECUDA_CONTROL_DIR=/x\nCUINTERPOSE_CARRIER=host\n",
        )
        .unwrap();
        assert_eq!(
            read(&path, true).expect("valid"),
            [
                (
                    "CUINTERPOSE_DRIVER".to_owned(),
                    "/opt/libcuda.so.1".to_owned()
                ),
                ("FAKECUDA_CONTROL_DIR".to_owned(), "/x".to_owned()),
                ("CUINTERPOSE_CARRIER".to_owned(), "host".to_owned())
            ]
        );
        std::fs::write(&path, "CUINTERPOSE_DRIVER=/a\nLD_PRELOAD=/evil.so\n").unwrap();
        let error = read(&path, true).expect_err("not allowed").to_string();
        assert!(
            error.ends_with("hook.conf:2: LD_PRELOAD cannot be set here (allowed: CUINTERPOSE_DRIVER, CUINTERPOSE_DEVICE_MAP, CUINTERPOSE_CARRIER, CUINTERPOSE_STAGING_MIB, CUINTERPOSE_CONTROL_DIR, CUINTERPOSE_CONTROL_TIMEOUT_SECONDS, CUINTERPOSE_COPY_TIMEOUT_SECONDS, FAKECUDA_CONTROL_DIR, FAKECUDA_LIBCUDA)"),
            "{error}"
        );
        std::fs::write(&path, "just words\n").unwrap();
        let error = read(&path, true).expect_err("no =").to_string();
        assert!(
            error.contains("hook.conf:1: expected NAME=VALUE"),
            "{error}"
        );
        let missing = dir.path().join("absent.conf");
        assert!(read(&missing, false).expect("optional").is_empty());
        assert!(read(&missing, true).is_err());
    }

    #[test]
    fn the_workload_environment_is_read_per_process() {
        let me = std::process::id();
        let path = std::env::var("PATH").ok();
        assert_eq!(from_workload(&[me], "PATH"), path);
        assert_eq!(from_workload(&[me], "CUINTERPOSE_NO_SUCH_VARIABLE"), None);
    }
}
