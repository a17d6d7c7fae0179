//! Log lines on stderr, prefixed with the shim's name and the process id.
//!
//! The shim lives inside someone else's process: it has no logger of its own to configure,
//! and stderr is where an operator looks first.

/// Writes one `cuinterpose[pid]: ...` line to stderr.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log::write_line(format_args!($($arg)*))
    };
}

pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    // One write call per line, so lines of concurrent threads and processes do not interleave.
    let line = format!("cuinterpose[{}]: {args}\n", std::process::id());
    let _ = std::io::stderr().write_all(line.as_bytes());
}
