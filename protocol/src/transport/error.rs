//! Transport errors: every one names the socket path, and the peer's PID where it is known.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::stage::IoStage;
use crate::envelope::{DecodeError, EncodeError};

/// The socket an error happened on and, once known (after connect or accept), the peer's PID
/// as `SO_PEERCRED` reports it in this process's PID namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub endpoint: PathBuf,
    pub pid: Option<u32>,
}

impl Peer {
    pub fn new(endpoint: impl Into<PathBuf>) -> Self {
        Self {
            endpoint: endpoint.into(),
            pid: None,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "socket {}", self.endpoint.display())?;
        if let Some(pid) = self.pid {
            write!(f, " (peer pid {pid})")?;
        }
        Ok(())
    }
}

/// Why a connection was refused before any message was exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The socket file exists but nothing listens on it (`ECONNREFUSED`).
    NotListening,
    /// There is no socket file at the path (`ENOENT`): the participant is not running.
    NoSocket,
    /// The peer runs as another user (neither ours nor root); the listener closed it.
    ForeignUid { uid: u32 },
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotListening => f.write_str("nothing listens on the socket"),
            Self::NoSocket => f.write_str("no socket exists at this path"),
            Self::ForeignUid { uid } => write!(f, "peer uid {uid} is neither ours nor root"),
        }
    }
}

/// What is wrong with a socket path or its control directory.
#[derive(Debug, thiserror::Error)]
pub enum EndpointProblem {
    #[error("not an absolute path")]
    NotAbsolute,
    #[error("contains a NUL byte")]
    ContainsNul,
    #[error("{len} bytes long; a Unix socket path holds at most {max} bytes")]
    TooLong { len: usize, max: usize },
    #[error("the control directory exists but is not a directory")]
    NotADirectory,
    #[error("the control directory is owned by uid {owner}, not by this process's uid {own}")]
    WrongOwner { owner: u32, own: u32 },
    #[error("the control directory has mode {mode:o}: group or others can write to it")]
    WritableByOthers { mode: u32 },
    #[error("another process listens on this socket")]
    InUse,
    #[error("a file that is not a socket is in the way")]
    NotASocket,
    #[error("{during}: {source}")]
    Io { during: IoStage, source: io::Error },
}

/// A failed exchange. A peer's [`crate::Reply::Refused`] answer is not an error: it is returned
/// as the reply.
///
/// After any error the connection must be dropped, never retried: part of a frame or a file
/// descriptor may already have crossed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{peer}: timed out after {after:?} while {during}")]
    Timeout {
        peer: Peer,
        during: IoStage,
        after: Duration,
    },
    #[error("{peer}: the peer closed the connection while {during}")]
    PeerClosed { peer: Peer, during: IoStage },
    #[error("{peer}: a frame of {size} bytes exceeds the limit of {limit} bytes")]
    Oversized { peer: Peer, size: u64, limit: usize },
    #[error("{peer}: {source}")]
    Malformed { peer: Peer, source: DecodeError },
    #[error("{peer}: protocol version {found} received; this build speaks {expected}")]
    Version { peer: Peer, found: u8, expected: u8 },
    #[error("{peer}: a file descriptor came with `{message}`, which carries none; it was closed")]
    UnexpectedFd { peer: Peer, message: &'static str },
    #[error("{peer}: `{message}` came without the file descriptor it must carry")]
    MissingFd { peer: Peer, message: &'static str },
    #[error("{peer}: `{message}` after an export on one connection: only exports form a series")]
    NotAnExport { peer: Peer, message: &'static str },
    #[error("{peer}: {count} file descriptors came with one frame (at most one); all were closed")]
    ExcessFds { peer: Peer, count: usize },
    #[error(
        "{peer}: ancillary data truncated (more file descriptors than one frame may carry); \
         the received ones were closed"
    )]
    Truncated { peer: Peer },
    #[error("{peer}: connection refused: {reason}")]
    Refused { peer: Peer, reason: RefusalReason },
    #[error("{peer}: {during}: {source}")]
    Io {
        peer: Peer,
        during: IoStage,
        source: io::Error,
    },
    #[error("{peer}: cannot encode the message: {source}")]
    Encode { peer: Peer, source: EncodeError },
    #[error("invalid timeout {setting} = {value:?}: {reason}")]
    InvalidTimeout {
        /// The environment variable, or the call the timeout was given to.
        setting: String,
        value: String,
        reason: &'static str,
    },
    #[error("invalid endpoint {}: {problem}", path.display())]
    InvalidEndpoint {
        path: PathBuf,
        problem: EndpointProblem,
    },
}

impl TransportError {
    /// The socket path the error concerns, where there is one.
    pub fn endpoint(&self) -> Option<&std::path::Path> {
        match self {
            Self::Timeout { peer, .. }
            | Self::PeerClosed { peer, .. }
            | Self::Oversized { peer, .. }
            | Self::Malformed { peer, .. }
            | Self::Version { peer, .. }
            | Self::UnexpectedFd { peer, .. }
            | Self::MissingFd { peer, .. }
            | Self::NotAnExport { peer, .. }
            | Self::ExcessFds { peer, .. }
            | Self::Truncated { peer }
            | Self::Refused { peer, .. }
            | Self::Io { peer, .. }
            | Self::Encode { peer, .. } => Some(&peer.endpoint),
            Self::InvalidEndpoint { path, .. } => Some(path),
            Self::InvalidTimeout { .. } => None,
        }
    }

    /// Whether the request can have reached the peer, and so changed it. `false` only for
    /// errors of a call that sent nothing: the endpoint or a timeout refused, the request not
    /// encodable, the connection refused or failed, or a full listen queue that never took
    /// it. Anything once sending began is `true`, a partial frame included (the peer may
    /// have read all of it before the error), as is a descriptor where none belongs (a
    /// request's is refused before connecting, a reply's after).
    pub fn may_have_arrived(&self) -> bool {
        match self {
            Self::Refused { .. }
            | Self::InvalidEndpoint { .. }
            | Self::InvalidTimeout { .. }
            | Self::Encode { .. } => false,
            Self::Timeout { during, .. } | Self::Io { during, .. } => !during.before_sending(),
            _ => true,
        }
    }

    /// The variant's name, for logs and for test helpers that report across processes.
    pub fn variant(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "Timeout",
            Self::PeerClosed { .. } => "PeerClosed",
            Self::Oversized { .. } => "Oversized",
            Self::Malformed { .. } => "Malformed",
            Self::Version { .. } => "Version",
            Self::UnexpectedFd { .. } => "UnexpectedFd",
            Self::MissingFd { .. } => "MissingFd",
            Self::NotAnExport { .. } => "NotAnExport",
            Self::ExcessFds { .. } => "ExcessFds",
            Self::Truncated { .. } => "Truncated",
            Self::Refused { .. } => "Refused",
            Self::Io { .. } => "Io",
            Self::Encode { .. } => "Encode",
            Self::InvalidTimeout { .. } => "InvalidTimeout",
            Self::InvalidEndpoint { .. } => "InvalidEndpoint",
        }
    }

    /// Maps a decode failure: a version mismatch gets its own variant, the rest are malformed.
    pub(crate) fn decode(peer: &Peer, error: DecodeError) -> Self {
        match error {
            DecodeError::Version {
                found, expected, ..
            } => Self::Version {
                peer: peer.clone(),
                found,
                expected,
            },
            source => Self::Malformed {
                peer: peer.clone(),
                source,
            },
        }
    }
}
