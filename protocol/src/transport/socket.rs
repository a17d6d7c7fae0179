//! What both ends share below their own logic: connecting a socket, reading a connection's
//! credentials, and which replies carry a descriptor. Client and server import it; it imports
//! neither, so the two stay out of each other's way.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};

use super::endpoint::Endpoint;
use super::error::{EndpointProblem, Peer, RefusalReason, TransportError};
use super::frame::{self, Deadline};
use super::stage::IoStage;
use crate::generated::Reply;

/// Who is on the other end of an accepted connection, as the kernel recorded at `connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// In this process's PID namespace; 0 when the peer is not visible from it.
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub(crate) fn peer_credentials(socket: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let credentials = socket::getsockopt(&socket, sockopt::PeerCredentials)?;
    Ok(PeerCredentials {
        pid: credentials.pid(),
        uid: credentials.uid(),
        gid: credentials.gid(),
    })
}

/// The connected peer's PID as errors name it (`None` where the kernel does not say).
pub(crate) fn peer_pid(socket: &OwnedFd) -> Option<u32> {
    peer_credentials(socket.as_fd())
        .ok()
        .and_then(|credentials| u32::try_from(credentials.pid).ok())
        .filter(|&pid| pid != 0)
}

/// Connects with `SO_SNDTIMEO` set first: on Linux it also bounds a blocking `connect` waiting
/// for room in a full listen queue.
pub(crate) fn connect_socket(
    endpoint: &Endpoint,
    peer: &Peer,
    deadline: &Deadline,
) -> Result<OwnedFd, TransportError> {
    let io = |during, source| TransportError::Io {
        peer: peer.clone(),
        during,
        source,
    };
    let socket = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|errno| io(IoStage::CreatingSocket, io::Error::from(errno)))?;
    let address = UnixAddr::new(endpoint.path()).map_err(|_| TransportError::InvalidEndpoint {
        path: endpoint.path().to_path_buf(),
        problem: EndpointProblem::TooLong {
            len: endpoint.path().as_os_str().len(),
            max: super::endpoint::MAX_SOCKET_PATH_BYTES,
        },
    })?;
    loop {
        let timed_out = || TransportError::Timeout {
            peer: peer.clone(),
            during: IoStage::ConnectQueueFull,
            after: deadline.total(),
        };
        let left = deadline.remaining_or_none().ok_or_else(timed_out)?;
        frame::set_socket_timeout(socket.as_fd(), libc::SO_SNDTIMEO, left)
            .map_err(|source| io(IoStage::SettingConnectTimeout, source))?;
        match socket::connect(socket.as_raw_fd(), &address) {
            Ok(()) => return Ok(socket),
            // A unix connect interrupted while queued leaves the socket unconnected: retry.
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Err(timed_out()),
            Err(Errno::ECONNREFUSED) => {
                return Err(TransportError::Refused {
                    peer: peer.clone(),
                    reason: RefusalReason::NotListening,
                });
            }
            Err(Errno::ENOENT) => {
                return Err(TransportError::Refused {
                    peer: peer.clone(),
                    reason: RefusalReason::NoSocket,
                });
            }
            Err(errno) => return Err(io(IoStage::Connecting, io::Error::from(errno))),
        }
    }
}

/// Export replies carry exactly one descriptor; every other reply carries none.
pub(crate) fn check_reply_fd(
    peer: &Peer,
    reply: &Reply,
    has_fd: bool,
) -> Result<(), TransportError> {
    let needs_fd = matches!(reply, Reply::UnicastExport(_) | Reply::MulticastExport(_));
    match (needs_fd, has_fd) {
        (true, false) => Err(TransportError::MissingFd {
            peer: peer.clone(),
            message: reply.kind(),
        }),
        (false, true) => Err(TransportError::UnexpectedFd {
            peer: peer.clone(),
            message: reply.kind(),
        }),
        _ => Ok(()),
    }
}
