//! Stale sockets: the control-directory entries of processes that are gone.
//!
//! A killed participant cannot remove its `cuinterpose-<pid>.sock`. Discovery probes every
//! socket: one that refuses connections is not a participant. It is removed only when no
//! process has a socket bound to that path (`/proc/net/unix` lists every bound path of the
//! network namespace), so a shim between its `bind` and its `listen` keeps its socket: that one
//! is kept as a participant and answers a moment later.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use cuinterpose_protocol::NamespacePid;

/// A socket nobody answers on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleSocket {
    pub pid: NamespacePid,
    pub path: PathBuf,
    /// Whether discovery removed the file (no process has it bound).
    pub removed: bool,
}

impl std::fmt::Display for StaleSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} is gone (stale socket {}, {})",
            self.pid,
            self.path.display(),
            if self.removed {
                "removed"
            } else {
                "left in place: cannot tell that no process has it bound"
            }
        )
    }
}

/// What a probe of one socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Something accepted the connection (or may still: anything but a refusal).
    Alive,
    /// The connection was refused: nothing listens.
    Refused,
}

/// Connects to `path` and hangs up at once (a shim treats a connection that sends nothing as a
/// liveness probe).
pub fn probe(path: &Path) -> Probe {
    match UnixStream::connect(path) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Probe::Refused,
        _ => Probe::Alive,
    }
}

/// The paths of every bound Unix socket in this network namespace, from `/proc/net/unix`
/// (`None` when it cannot be read: then nothing is removed).
pub fn bound_paths() -> Option<BTreeSet<PathBuf>> {
    let text = std::fs::read_to_string("/proc/net/unix").ok()?;
    Some(parse_bound_paths(&text))
}

/// `/proc/net/unix`: a header, then one line per socket whose eighth column, when present, is
/// the bound path.
pub fn parse_bound_paths(text: &str) -> BTreeSet<PathBuf> {
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(7))
        .filter(|path| path.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Whether a socket that refused connections may be removed: it is stale when no process has
/// it bound.
pub fn removable(path: &Path, bound: Option<&BTreeSet<PathBuf>>) -> bool {
    bound.is_some_and(|bound| !bound.contains(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_paths_come_from_the_eighth_column() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12345 /run/cuinterpose/cuinterpose-7.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 12346\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 12347 @abstract\n";
        let bound = parse_bound_paths(text);
        assert_eq!(
            bound.into_iter().collect::<Vec<_>>(),
            vec![PathBuf::from("/run/cuinterpose/cuinterpose-7.sock")]
        );
    }

    #[test]
    fn only_an_unbound_socket_is_removable() {
        let bound: BTreeSet<PathBuf> = [PathBuf::from("/d/cuinterpose-7.sock")].into();
        assert!(!removable(Path::new("/d/cuinterpose-7.sock"), Some(&bound)));
        assert!(removable(Path::new("/d/cuinterpose-8.sock"), Some(&bound)));
        assert!(
            !removable(Path::new("/d/cuinterpose-8.sock"), None),
            "unknown: keep it"
        );
    }

    #[test]
    fn a_stale_socket_says_what_happened() {
        let s = StaleSocket {
            pid: NamespacePid::new(42).unwrap(),
            path: PathBuf::from("/d/cuinterpose-42.sock"),
            removed: true,
        };
        assert_eq!(
            s.to_string(),
            "process 42 is gone (stale socket /d/cuinterpose-42.sock, removed)"
        );
    }
}
