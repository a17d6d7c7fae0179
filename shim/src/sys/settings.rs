//! The shim's settings: read from the environment once, checked (a malformed value is an
//! error naming its variable), then handed down as a value. The runtime refuses to start on a
//! malformed one, so a process never runs on a silent default it was not asked for.

use cuinterpose_protocol::transport::{CONTROL_DIR_VARIABLE, Timeouts, control_dir_from};
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The real driver's library (a path or a name for `dlopen`); unset or empty: `libcuda.so.1`.
pub const DRIVER_VARIABLE: &str = "CUINTERPOSE_DRIVER";
/// What `dlopen` opens when [`DRIVER_VARIABLE`] names nothing.
pub const DEFAULT_DRIVER: &[u8] = b"libcuda.so.1";

/// `1`: a freed host carrier's memory is kept for the next save that fits.
pub const KEEP_CARRIER_VARIABLE: &str = "CUINTERPOSE_KEEP_CARRIER";
/// `1`: the gate uses full fences on every tracked call instead of registering for expedited
/// `membarrier` (for kernels or sandboxes that refuse it, and for measuring its benefit).
pub const SYMMETRIC_GATE_VARIABLE: &str = "CUINTERPOSE_GATE_SYMMETRIC";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub timeouts: Timeouts,
    /// Where every participant's socket is.
    pub control_dir: PathBuf,
    pub keep_carrier: bool,
    pub symmetric_gate: bool,
}

/// A setting's variable and what is wrong with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError(pub String);

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Settings {
    /// The settings `lookup` gives (the environment, or a test's variables).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, SettingsError> {
        let wrong = |error: &dyn fmt::Display| SettingsError(error.to_string());
        Ok(Self {
            timeouts: Timeouts::from_lookup(&lookup).map_err(|e| wrong(&e))?,
            control_dir: control_dir_from(lookup(CONTROL_DIR_VARIABLE)).map_err(|e| wrong(&e))?,
            keep_carrier: switch(KEEP_CARRIER_VARIABLE, lookup(KEEP_CARRIER_VARIABLE))?,
            symmetric_gate: switch(SYMMETRIC_GATE_VARIABLE, lookup(SYMMETRIC_GATE_VARIABLE))?,
        })
    }
}

/// An on/off variable: `1` on; unset, empty or `0` off; anything else an error.
fn switch(variable: &str, value: Option<OsString>) -> Result<bool, SettingsError> {
    match value.as_ref().map(|v| v.to_str()) {
        None | Some(Some("" | "0")) => Ok(false),
        Some(Some("1")) => Ok(true),
        _ => Err(SettingsError(format!(
            "{variable}={:?}: expected 1 (on) or 0 (off)",
            value.unwrap_or_default()
        ))),
    }
}

/// The driver library [`DRIVER_VARIABLE`] names, read once. Apart from [`Settings`]: the
/// driver is loaded before the runtime starts, and any value is a name `dlopen` judges (its
/// failure names the variable and the value).
pub fn driver_library() -> &'static [u8] {
    static LIBRARY: OnceLock<Vec<u8>> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        std::env::var_os(DRIVER_VARIABLE)
            .filter(|v| !v.is_empty())
            .map_or_else(|| DEFAULT_DRIVER.to_vec(), |v| v.into_encoded_bytes())
    })
}

/// This process's settings, read from its environment on first use.
pub fn current() -> Result<&'static Settings, &'static SettingsError> {
    static SETTINGS: OnceLock<Result<Settings, SettingsError>> = OnceLock::new();
    SETTINGS
        .get_or_init(|| Settings::from_lookup(|name| std::env::var_os(name)))
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(variables: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        Settings::from_lookup(|name| {
            variables
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn settings_default_and_name_the_variable_of_a_bad_value() {
        let defaults = check(&[]).expect("no variables");
        assert_eq!(defaults.timeouts, Timeouts::default());
        assert!(!defaults.keep_carrier && !defaults.symmetric_gate);
        let on = check(&[(KEEP_CARRIER_VARIABLE, "1"), (SYMMETRIC_GATE_VARIABLE, "1")]).unwrap();
        assert!(on.keep_carrier && on.symmetric_gate);
        assert!(!check(&[(KEEP_CARRIER_VARIABLE, "0")]).unwrap().keep_carrier);
        let wrong = check(&[(KEEP_CARRIER_VARIABLE, "yes")]).unwrap_err();
        assert_eq!(
            wrong.0,
            "CUINTERPOSE_KEEP_CARRIER=\"yes\": expected 1 (on) or 0 (off)"
        );
        let timeout = check(&[("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS", "ten")]).unwrap_err();
        assert!(
            timeout.0.contains("CUINTERPOSE_CONTROL_TIMEOUT_SECONDS"),
            "{timeout}"
        );
        let dir = check(&[(CONTROL_DIR_VARIABLE, "relative/dir")]).unwrap_err();
        assert!(dir.0.contains("relative/dir"), "{dir}");
    }
}
