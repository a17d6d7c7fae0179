//! Log lines on stderr, prefixed with the shim's name and the process id.
//!
//! The shim lives inside someone else's process: it has no logger of its own to configure,
//! and stderr is where an operator looks first.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Writes one `cuinterpose[pid]: ...` line to stderr.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::sys::log::write_line(format_args!($($arg)*))
    };
}

pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    // One write call per line, so lines of concurrent threads and processes do not interleave.
    let line = format!("cuinterpose[{}]: {args}\n", std::process::id());
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Lines about refused peers logged per [`LOG_WINDOW`]; more are counted and summarised, so a
/// hostile peer cannot flood the application's stderr.
pub const LOG_BURST: u32 = 20;
pub const LOG_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Throttle {
    window: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

static THROTTLE: Mutex<Throttle> = Mutex::new(Throttle {
    window: None,
    logged: 0,
    suppressed: 0,
});

/// Logs one line about a refused peer, at most [`LOG_BURST`] per [`LOG_WINDOW`].
pub fn refusal(line: std::fmt::Arguments<'_>) {
    let mut throttle = THROTTLE.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    if throttle
        .window
        .is_none_or(|start| now.duration_since(start) >= LOG_WINDOW)
    {
        if throttle.suppressed > 0 {
            write_line(format_args!(
                "{} more refusals of peers in the last {LOG_WINDOW:?} were not logged",
                throttle.suppressed
            ));
        }
        *throttle = Throttle {
            window: Some(now),
            logged: 0,
            suppressed: 0,
        };
    }
    if throttle.logged < LOG_BURST {
        throttle.logged += 1;
        write_line(line);
    } else {
        throttle.suppressed += 1;
    }
}
