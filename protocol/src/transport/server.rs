//! The listening side: one socket per process, credentials checked on every connection.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};

use super::endpoint::Endpoint;
use super::error::{EndpointProblem, Peer, RefusalReason, TransportError};
use super::frame::{self, Deadline};
use super::socket::{PeerCredentials, check_reply_fd, connect_socket, peer_credentials};
use super::stage::IoStage;
use super::timeouts::{Timeouts, check_duration};
use crate::envelope;
use crate::generated::{NamespacePid, Reply, Request};

/// Pending connections the kernel queues before `connect` blocks (bounded by `SO_SNDTIMEO` on
/// the client side).
const BACKLOG: i32 = 64;
/// How long the stale-socket probe waits for a listener with a full queue.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The largest request frame a server reads. Every request of this protocol version is a
/// fixed-shape message of a few hundred bytes at most (no collections), so anything larger is
/// refused as oversized before a body buffer exists: 64 handler threads each buffering a
/// 48 MiB (`MAX_MESSAGE_BYTES`) garbage frame would cost the application 3 GiB.
pub const REQUEST_FRAME_LIMIT: usize = 64 * 1024;

/// Our own user and root may connect; nobody else.
pub fn peer_allowed(own_uid: u32, peer_uid: u32) -> bool {
    peer_uid == own_uid || peer_uid == 0
}

/// A bound, listening participant socket. Dropping it removes the socket file if it is still
/// the one this listener created.
#[derive(Debug)]
pub struct Listener {
    socket: UnixListener,
    endpoint: Endpoint,
    own_uid: u32,
    request_timeout: Duration,
    /// Device and inode of the socket file, so drop never removes a successor's socket.
    file: (u64, u64),
}

impl Listener {
    /// Creates `dir` (mode 0700) if needed, checks that it belongs to us and that neither group
    /// nor others can write to it, removes a stale socket of a dead process, and listens on
    /// `cuinterpose-<pid>.sock` with mode 0600. Requests are read with the default control
    /// timeout; see [`Listener::with_request_timeout`].
    pub fn bind(dir: &Path, pid: NamespacePid) -> Result<Self, TransportError> {
        let endpoint = Endpoint::for_pid(dir, pid)?;
        let own_uid = nix::unistd::geteuid().as_raw();
        prepare_directory(dir, own_uid)?;
        let path = endpoint.path();
        let invalid = |problem| TransportError::InvalidEndpoint {
            path: path.to_path_buf(),
            problem,
        };
        let io_problem = |during| move |source| invalid(EndpointProblem::Io { during, source });
        remove_stale_socket(&endpoint)?;

        let socket = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|errno| io_problem(IoStage::CreatingListenSocket)(io::Error::from(errno)))?;
        let address = UnixAddr::new(path)
            .map_err(|errno| io_problem(IoStage::BuildingSocketAddress)(io::Error::from(errno)))?;
        match socket::bind(socket.as_raw_fd(), &address) {
            Ok(()) => {}
            Err(Errno::EADDRINUSE) => return Err(invalid(EndpointProblem::InUse)),
            Err(errno) => return Err(io_problem(IoStage::Binding)(io::Error::from(errno))),
        }
        // chmod on the path between bind and listen: nobody can connect before it has its final
        // mode, and the process-wide umask (shared with the application's threads) stays as is.
        // fchmod on a socket would change the socket inode, not the file.
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))
            .map_err(io_problem(IoStage::SettingSocketMode))?;
        let metadata = fs::symlink_metadata(path).map_err(io_problem(IoStage::InspectingSocket))?;
        let backlog = Backlog::new(BACKLOG)
            .map_err(|errno| io_problem(IoStage::ChoosingBacklog)(io::Error::from(errno)))?;
        socket::listen(&socket, backlog)
            .map_err(|errno| io_problem(IoStage::Listening)(io::Error::from(errno)))?;
        Ok(Self {
            socket: UnixListener::from(socket),
            endpoint,
            own_uid,
            request_timeout: Timeouts::DEFAULT_CONTROL,
            file: (metadata.dev(), metadata.ino()),
        })
    }

    /// Bounds reading each request and sending its reply on accepted connections.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self, TransportError> {
        check_duration(
            &format!("request timeout of {}", self.endpoint.path().display()),
            timeout,
        )?;
        self.request_timeout = timeout;
        Ok(self)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Waits for the next connection and checks its credentials; reads nothing, so handing the
    /// connection to another thread keeps a slow peer from holding up the next one.
    ///
    /// A peer running as another user (root excepted) is logged, disconnected and reported as
    /// [`TransportError::Refused`]; the caller simply accepts again.
    pub fn accept(&self) -> Result<Connection, TransportError> {
        let mut peer = Peer::new(self.endpoint.path());
        let stream = loop {
            match self.socket.accept() {
                Ok((stream, _)) => break stream,
                // The client gave up between connect and accept; wait for the next one.
                Err(error) if error.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(source) => {
                    return Err(TransportError::Io {
                        peer,
                        during: IoStage::AcceptingConnection,
                        source,
                    });
                }
            }
        };
        let socket = OwnedFd::from(stream);
        let credentials =
            peer_credentials(socket.as_fd()).map_err(|source| TransportError::Io {
                peer: peer.clone(),
                during: IoStage::ReadingCredentials,
                source,
            })?;
        peer.pid = u32::try_from(credentials.pid).ok().filter(|&pid| pid != 0);
        if !peer_allowed(self.own_uid, credentials.uid) {
            tracing::warn!(
                endpoint = %self.endpoint.path().display(),
                peer_pid = credentials.pid,
                peer_uid = credentials.uid,
                own_uid = self.own_uid,
                "refused a connection from another user"
            );
            drop(socket);
            return Err(TransportError::Refused {
                peer,
                reason: RefusalReason::ForeignUid {
                    uid: credentials.uid,
                },
            });
        }
        Ok(Connection {
            socket,
            peer,
            credentials,
            timeout: self.request_timeout,
        })
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let path = self.endpoint.path();
        if let Ok(metadata) = fs::symlink_metadata(path)
            && (metadata.dev(), metadata.ino()) == self.file
            && let Err(error) = fs::remove_file(path)
        {
            tracing::warn!(endpoint = %path.display(), %error, "could not remove the socket");
        }
    }
}

/// Creates the control directory or checks the existing one.
fn prepare_directory(dir: &Path, own_uid: u32) -> Result<(), TransportError> {
    let invalid = |problem| TransportError::InvalidEndpoint {
        path: dir.to_path_buf(),
        problem,
    };
    // Mode applies to every directory created; umask can only remove bits, never add them.
    if let Err(source) = DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        if source.kind() == io::ErrorKind::AlreadyExists {
            return Err(invalid(EndpointProblem::NotADirectory));
        }
        return Err(invalid(EndpointProblem::Io {
            during: IoStage::CreatingControlDirectory,
            source,
        }));
    }
    let metadata = fs::metadata(dir).map_err(|source| {
        invalid(EndpointProblem::Io {
            during: IoStage::InspectingControlDirectory,
            source,
        })
    })?;
    if !metadata.is_dir() {
        return Err(invalid(EndpointProblem::NotADirectory));
    }
    if metadata.uid() != own_uid {
        return Err(invalid(EndpointProblem::WrongOwner {
            owner: metadata.uid(),
            own: own_uid,
        }));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(invalid(EndpointProblem::WritableByOthers { mode }));
    }
    Ok(())
}

/// Removes the socket file of a process that is gone: only a socket, and only when connecting
/// to it is refused. A live listener (even one with a full queue) is left alone.
fn remove_stale_socket(endpoint: &Endpoint) -> Result<(), TransportError> {
    let path = endpoint.path();
    let invalid = |problem| TransportError::InvalidEndpoint {
        path: path.to_path_buf(),
        problem,
    };
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(invalid(EndpointProblem::Io {
                during: IoStage::InspectingExistingSocket,
                source,
            }));
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(invalid(EndpointProblem::NotASocket));
    }
    let peer = Peer::new(path);
    let probe_deadline = Deadline::after(PROBE_TIMEOUT).ok_or_else(|| {
        invalid(EndpointProblem::Io {
            during: IoStage::ProbingExistingSocket,
            source: io::Error::other("clock overflow"),
        })
    })?;
    match connect_socket(endpoint, &peer, &probe_deadline) {
        // Someone listens (or its queue is full, which also means it is alive).
        Ok(_) | Err(TransportError::Timeout { .. }) => Err(invalid(EndpointProblem::InUse)),
        Err(TransportError::Refused {
            reason: RefusalReason::NotListening,
            ..
        }) => fs::remove_file(path).map_err(|source| {
            invalid(EndpointProblem::Io {
                during: IoStage::RemovingStaleSocket,
                source,
            })
        }),
        // Vanished between the check and the probe: nothing to remove.
        Err(TransportError::Refused {
            reason: RefusalReason::NoSocket,
            ..
        }) => Ok(()),
        Err(error) => Err(invalid(EndpointProblem::Io {
            during: IoStage::ProbingExistingSocket,
            source: io::Error::other(error.to_string()),
        })),
    }
}

/// One accepted connection: one request in, one reply out (or, for a series of exports,
/// several of each in turn).
#[derive(Debug)]
pub struct Connection {
    socket: OwnedFd,
    peer: Peer,
    credentials: PeerCredentials,
    timeout: Duration,
}

impl Connection {
    /// The peer's PID, uid and gid as recorded by the kernel when it connected.
    pub fn credentials(&self) -> PeerCredentials {
        self.credentials
    }

    /// The endpoint and peer PID, as errors name them.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Replaces the listener's request timeout for this connection.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), TransportError> {
        check_duration(&format!("timeout of {}", self.peer), timeout)?;
        self.timeout = timeout;
        Ok(())
    }

    fn deadline(&self) -> Result<Deadline, TransportError> {
        Deadline::after(self.timeout).ok_or_else(|| TransportError::InvalidTimeout {
            setting: format!("timeout of {}", self.peer),
            value: format!("{:?}", self.timeout),
            reason: "too far in the future",
        })
    }

    /// Reads one request within the connection's timeout, with its descriptor: exactly the
    /// requests of [`Request::carries_fd`] come with one (`MissingFd` otherwise), any other
    /// that brings one is refused as `UnexpectedFd` (the descriptor is closed).
    pub fn read_request(&mut self) -> Result<(Request, Option<OwnedFd>), TransportError> {
        let deadline = self.deadline()?;
        let (bytes, fd) = frame::receive_frame(
            self.socket.as_fd(),
            &deadline,
            &self.peer,
            IoStage::ReceivingRequest,
            REQUEST_FRAME_LIMIT,
        )?;
        let request = envelope::decode::<Request>(&bytes)
            .map_err(|error| TransportError::decode(&self.peer, error))?;
        match (request.carries_fd(), fd.is_some()) {
            (true, false) => Err(TransportError::MissingFd {
                peer: self.peer.clone(),
                message: request.kind(),
            }),
            (false, true) => Err(TransportError::UnexpectedFd {
                peer: self.peer.clone(),
                message: request.kind(),
            }),
            _ => Ok((request, fd)),
        }
    }

    /// Sends `reply`; export replies must come with their descriptor and no other reply may.
    pub fn send_reply(
        &mut self,
        reply: &Reply,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), TransportError> {
        check_reply_fd(&self.peer, reply, fd.is_some())?;
        let body = envelope::encode(reply).map_err(|source| TransportError::Encode {
            peer: self.peer.clone(),
            source,
        })?;
        let deadline = self.deadline()?;
        frame::send_frame(
            self.socket.as_fd(),
            &body,
            fd,
            &deadline,
            &self.peer,
            IoStage::SendingReply,
        )
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}
