//! Errors of the driving side.

use crate::proto::{ErrorKind, ErrorReply};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// What went wrong talking to a worker. `pid` is always the host PID of the spawned process
/// (the wrapper's, when there is one).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The worker could not be started.
    #[error("cannot spawn worker {program}: {source}")]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    /// A driver call failed: `code` is the raw `CUresult`.
    #[error("worker {pid}: {command}: {message}")]
    Cuda {
        pid: u32,
        command: String,
        code: u32,
        name: String,
        message: String,
    },
    /// A system call in the worker failed.
    #[error("worker {pid}: {command}: {name}: {message}")]
    Errno {
        pid: u32,
        command: String,
        errno: i32,
        name: String,
        message: String,
    },
    /// `Verify` found a different byte.
    #[error("worker {pid}: {command}: {message}")]
    Mismatch {
        pid: u32,
        command: String,
        offset: u64,
        expected: u8,
        found: u8,
        message: String,
    },
    /// A driver symbol could not be resolved through the worker's entry path.
    #[error("worker {pid}: {command}: cannot resolve {symbol}: {message}")]
    Unresolved {
        pid: u32,
        command: String,
        symbol: String,
        /// The resolver's result code, -1 where it gave none.
        code: i64,
        message: String,
    },
    /// The worker refused the request (malformed, out of bounds) or its handler panicked.
    #[error("worker {pid}: {command}: {kind:?}: {message}")]
    Rejected {
        pid: u32,
        command: String,
        kind: ErrorKind,
        message: String,
    },
    /// The worker exited (or closed its control socket) instead of answering.
    #[error("worker {pid} died during {command}: {}", describe_status(.status))]
    Died {
        pid: u32,
        command: String,
        /// `None`: the control socket closed but the process had not exited yet.
        status: Option<ExitStatus>,
    },
    /// No answer within the call's timeout; the worker is unusable afterwards.
    #[error("worker {pid}: {command}: no reply within {after:?}")]
    Timeout {
        pid: u32,
        command: String,
        after: Duration,
    },
    /// An earlier failure left the conversation out of step, or the worker was stopped.
    #[error("worker {pid} is unusable: {reason}")]
    Unusable { pid: u32, reason: String },
    /// The control socket failed for another reason, or the reply made no sense.
    #[error("worker {pid}: {command}: {message}")]
    Protocol {
        pid: u32,
        command: String,
        message: String,
    },
    /// Waiting for or signalling the process failed.
    #[error("worker {pid}: {context}: {source}")]
    Process {
        pid: u32,
        context: String,
        source: std::io::Error,
    },
}

fn describe_status(s: &Option<ExitStatus>) -> String {
    match s {
        Some(s) => s.to_string(),
        None => "control socket closed, process still running".to_owned(),
    }
}

impl WorkloadError {
    /// The `CUresult` of a failed driver call.
    pub fn cuda_code(&self) -> Option<u32> {
        match self {
            WorkloadError::Cuda { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The errno of a failed system call in the worker.
    pub fn errno(&self) -> Option<i32> {
        match self {
            WorkloadError::Errno { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// Whether the worker died instead of answering.
    pub fn is_died(&self) -> bool {
        matches!(self, WorkloadError::Died { .. })
    }

    /// Whether a call timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, WorkloadError::Timeout { .. })
    }

    /// The first mismatching byte of a failed `Verify`: (offset, expected, found).
    pub fn mismatch(&self) -> Option<(u64, u8, u8)> {
        match self {
            WorkloadError::Mismatch {
                offset,
                expected,
                found,
                ..
            } => Some((*offset, *expected, *found)),
            _ => None,
        }
    }

    /// The error a worker's [`ErrorReply`] stands for.
    pub fn from_reply(pid: u32, command: String, e: ErrorReply) -> WorkloadError {
        match e.kind {
            ErrorKind::Cuda => WorkloadError::Cuda {
                pid,
                command,
                code: u32::try_from(e.code).unwrap_or(u32::MAX),
                name: e.name,
                message: e.message,
            },
            ErrorKind::Errno => WorkloadError::Errno {
                pid,
                command,
                errno: i32::try_from(e.code).unwrap_or(-1),
                name: e.name,
                message: e.message,
            },
            ErrorKind::Mismatch => {
                let m = e.mismatch.unwrap_or(crate::proto::Mismatch {
                    offset: u64::MAX,
                    expected: 0,
                    found: 0,
                });
                WorkloadError::Mismatch {
                    pid,
                    command,
                    offset: m.offset,
                    expected: m.expected,
                    found: m.found,
                    message: e.message,
                }
            }
            ErrorKind::Unresolved => WorkloadError::Unresolved {
                pid,
                command,
                symbol: e.name,
                code: e.code,
                message: e.message,
            },
            kind @ (ErrorKind::Request | ErrorKind::Panic) => WorkloadError::Rejected {
                pid,
                command,
                kind,
                message: e.message,
            },
        }
    }
}
