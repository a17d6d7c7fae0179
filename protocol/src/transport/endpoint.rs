//! Where a participant's socket lives.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::{EndpointProblem, TransportError};
use crate::generated::NamespacePid;

/// Names the control directory; every participant and the coordinator must agree on it.
pub const CONTROL_DIR_VARIABLE: &str = "CUINTERPOSE_CONTROL_DIR";
/// The control directory when [`CONTROL_DIR_VARIABLE`] is unset. It must belong to the user
/// running the processes (and not be writable by others); users sharing a machine set the
/// variable to a directory of their own, e.g. under `$XDG_RUNTIME_DIR`.
pub const DEFAULT_CONTROL_DIR: &str = "/tmp/cuinterpose";
/// Longest socket path: `sun_path` is 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// A participant's socket: `<control dir>/cuinterpose-<namespace pid>.sock`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// Any absolute socket path that fits in `sockaddr_un`.
    pub fn new(path: impl Into<PathBuf>) -> Result<Self, TransportError> {
        let path = path.into();
        let problem = if !path.is_absolute() {
            Some(EndpointProblem::NotAbsolute)
        } else if path.as_os_str().as_bytes().contains(&0) {
            Some(EndpointProblem::ContainsNul)
        } else if path.as_os_str().len() > MAX_SOCKET_PATH_BYTES {
            Some(EndpointProblem::TooLong {
                len: path.as_os_str().len(),
                max: MAX_SOCKET_PATH_BYTES,
            })
        } else {
            None
        };
        match problem {
            Some(problem) => Err(TransportError::InvalidEndpoint { path, problem }),
            None => Ok(Self { path }),
        }
    }

    /// The socket of the process with namespace PID `pid` in `dir`.
    pub fn for_pid(dir: &Path, pid: NamespacePid) -> Result<Self, TransportError> {
        Self::new(dir.join(socket_name(pid)))
    }

    /// [`Endpoint::for_pid`] in the directory [`control_dir`] names.
    pub fn from_env(pid: NamespacePid) -> Result<Self, TransportError> {
        Self::for_pid(&control_dir()?, pid)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `cuinterpose-<pid>.sock`.
pub fn socket_name(pid: NamespacePid) -> String {
    format!("cuinterpose-{}.sock", pid.get())
}

/// [`CONTROL_DIR_VARIABLE`] if set, else [`DEFAULT_CONTROL_DIR`]. The value must be an absolute
/// path (a relative one would differ between processes with different working directories).
pub fn control_dir() -> Result<PathBuf, TransportError> {
    control_dir_from(std::env::var_os(CONTROL_DIR_VARIABLE))
}

/// [`control_dir`] for a given value of the variable.
pub fn control_dir_from(value: Option<OsString>) -> Result<PathBuf, TransportError> {
    let Some(value) = value else {
        return Ok(PathBuf::from(DEFAULT_CONTROL_DIR));
    };
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(TransportError::InvalidEndpoint {
            path,
            problem: EndpointProblem::NotAbsolute,
        });
    }
    Ok(path)
}
