//! Settings that only the environment can carry: the CUDA driver the coordinator loads reads
//! its own variables (fakecuda's control directory), and the CRIU hook takes the settings its
//! file and the workload provide. A running process's environment is never changed (other
//! threads, and the driver, may read it at any time): the program starts again in this
//! process, same PID and descriptors, with the variables added.

use std::ffi::OsStr;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Set to this process's PID in the environment of the program started again (the PID stays
/// the same), so that a variable that still does not arrive is an error rather than a loop.
/// Its children (the demo's CRIU, which runs the hook) inherit it under another PID and ignore
/// it.
pub const RESTARTED_VARIABLE: &str = "CUINTERPOSE_RESTARTED_PID";

/// The variables of `wanted` the environment (`lookup`) lacks or holds another value of.
pub fn missing(
    wanted: &[(String, String)],
    lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<&(String, String)> {
    wanted
        .iter()
        .filter(|(name, value)| lookup(name).as_deref() != Some(OsStr::new(value)))
        .collect()
}

/// Returns when the environment already holds `wanted`; otherwise starts this program again
/// with them and returns only the error that prevented it.
pub fn with_environment(wanted: &[(String, String)]) -> Result<(), io::Error> {
    let missing = missing(wanted, |name| std::env::var_os(name));
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|(name, _)| name.as_str()).collect();
    let me = std::process::id().to_string();
    if std::env::var_os(RESTARTED_VARIABLE).is_some_and(|pid| pid == me.as_str()) {
        return Err(io::Error::other(format!(
            "started again with {} set, and still without them",
            names.join(", ")
        )));
    }
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_default();
    let exe = std::env::current_exe()?;
    let error = Command::new(&exe)
        .arg0(arg0)
        .args(args)
        .envs(missing.iter().map(|(name, value)| (name, value)))
        .env(RESTARTED_VARIABLE, &me)
        .exec();
    Err(io::Error::new(
        error.kind(),
        format!(
            "starting {} again with {}: {error}",
            exe.display(),
            names.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::missing;

    #[test]
    fn only_absent_or_different_variables_are_missing() {
        let wanted = [
            ("A".to_owned(), "1".to_owned()),
            ("B".to_owned(), "2".to_owned()),
            ("C".to_owned(), "3".to_owned()),
        ];
        let found = missing(&wanted, |name| match name {
            "A" => Some("1".into()),
            "B" => Some("other".into()),
            _ => None,
        });
        let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["B", "C"]);
    }
}
