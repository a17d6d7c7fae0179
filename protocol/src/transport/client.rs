//! The calling side: one connection per exchange, or one for a series of exports.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

use super::endpoint::Endpoint;
use super::error::{EndpointProblem, Peer, RefusalReason, TransportError};
use super::frame::{self, Deadline};
use super::server::{check_reply_fd, peer_credentials};
use super::timeouts::{Timeouts, check_duration};
use crate::envelope;
use crate::generated::{Reply, Request};

fn deadline(peer: &Peer, timeout: Duration) -> Result<Deadline, TransportError> {
    check_duration(&format!("timeout for {peer}"), timeout)?;
    Deadline::after(timeout).ok_or_else(|| TransportError::InvalidTimeout {
        setting: format!("timeout for {peer}"),
        value: format!("{timeout:?}"),
        reason: "too far in the future",
    })
}

/// What a client was doing when an error came before any byte of its request was sent (see
/// [`TransportError::may_have_arrived`]).
pub(crate) const CREATING_SOCKET: &str = "creating a socket";
pub(crate) const SETTING_CONNECT_TIMEOUT: &str = "setting the connect timeout";
pub(crate) const CONNECTING: &str = "connecting";
pub(crate) const CONNECT_QUEUE_FULL: &str = "connecting (the listen queue is full)";

/// The connected peer's PID as errors name it (`None` where the kernel does not say).
fn peer_pid(socket: &OwnedFd) -> Option<u32> {
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
    .map_err(|errno| io(CREATING_SOCKET, io::Error::from(errno)))?;
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
            during: CONNECT_QUEUE_FULL,
            after: deadline.total(),
        };
        let left = deadline.remaining_or_none().ok_or_else(timed_out)?;
        frame::set_socket_timeout(socket.as_fd(), libc::SO_SNDTIMEO, left)
            .map_err(|source| io(SETTING_CONNECT_TIMEOUT, source))?;
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
            Err(errno) => return Err(io(CONNECTING, io::Error::from(errno))),
        }
    }
}

/// Sends `request` to `endpoint` and waits for the reply; connecting, sending and receiving
/// together take at most `timeout`.
///
/// `fd` travels with the request exactly when [`Request::carries_fd`] (the storage carrier's
/// folder for its copies): a missing one is [`TransportError::MissingFd`], one with any other
/// request [`TransportError::UnexpectedFd`], both before connecting (the descriptor is
/// closed). The reply's descriptor comes back with export replies (always exactly one) and
/// never with any other. A [`Reply::Refused`] is a reply,
/// not an error.
pub fn call(
    endpoint: &Endpoint,
    request: &Request,
    fd: Option<OwnedFd>,
    timeout: Duration,
) -> Result<(Reply, Option<OwnedFd>), TransportError> {
    exchange(endpoint, request, fd, timeout, None)
}

/// [`call`] with the control timeout for connecting, then [`Timeouts::for_request`] for sending
/// the request and receiving the reply.
pub fn call_with(
    endpoint: &Endpoint,
    request: &Request,
    fd: Option<OwnedFd>,
    timeouts: &Timeouts,
) -> Result<(Reply, Option<OwnedFd>), TransportError> {
    exchange(
        endpoint,
        request,
        fd,
        timeouts.control(),
        Some(timeouts.for_request(request)),
    )
}

/// Export requests a series keeps in flight: their requests (about 130 bytes each) and replies
/// (about 50 bytes and a descriptor) fit the default Unix socket buffers many times over, so
/// neither side can block writing while the other writes too.
pub const EXPORT_WINDOW: usize = 32;

/// A series of export requests to one creator over one connection: every [`send`](Self::send)
/// is answered, in order, by one [`receive`](Self::receive). Each request and each reply has
/// the request timeout of its own. Dropping the series closes the connection.
#[derive(Debug)]
pub struct ExportSeries {
    socket: OwnedFd,
    peer: Peer,
    timeout: Duration,
}

impl ExportSeries {
    /// Connects to `endpoint` within the control timeout.
    pub fn connect(endpoint: &Endpoint, timeouts: &Timeouts) -> Result<Self, TransportError> {
        let mut peer = Peer::new(endpoint.path());
        let socket = connect_socket(endpoint, &peer, &deadline(&peer, timeouts.control())?)?;
        peer.pid = peer_pid(&socket);
        Ok(ExportSeries {
            socket,
            peer,
            timeout: timeouts.control(),
        })
    }

    /// Sends one more request; only exports may travel in a series.
    pub fn send(&mut self, request: &Request) -> Result<(), TransportError> {
        if !matches!(request, Request::Export(_)) {
            return Err(TransportError::NotAnExport {
                peer: self.peer.clone(),
                message: request.kind(),
            });
        }
        let body = envelope::encode(request).map_err(|source| TransportError::Encode {
            peer: self.peer.clone(),
            source,
        })?;
        let deadline = deadline(&self.peer, self.timeout)?;
        frame::send_frame(
            self.socket.as_fd(),
            &body,
            None,
            &deadline,
            &self.peer,
            "sending an export request of a series",
        )
    }

    /// The reply to the oldest request not yet answered.
    pub fn receive(&mut self) -> Result<(Reply, Option<OwnedFd>), TransportError> {
        let deadline = deadline(&self.peer, self.timeout)?;
        let (bytes, fd) = frame::receive_frame(
            self.socket.as_fd(),
            &deadline,
            &self.peer,
            "receiving a reply of a series of exports",
            crate::generated::MAX_MESSAGE_BYTES,
        )?;
        let reply = envelope::decode::<Reply>(&bytes)
            .map_err(|error| TransportError::decode(&self.peer, error))?;
        check_reply_fd(&self.peer, &reply, fd.is_some())?;
        Ok((reply, fd))
    }
}

/// Sends every one of `requests` (exports) to `endpoint` over one connection and yields the
/// replies in request order, keeping at most [`EXPORT_WINDOW`] unanswered: replies are read as
/// the caller takes them, so a caller that closes each descriptor before the next holds few
/// open however long the series. A refusal is a reply; a transport error ends the series (the
/// iterator yields it, then nothing).
pub fn export_all<'a>(
    endpoint: &Endpoint,
    requests: &'a [Request],
    timeouts: &Timeouts,
) -> Result<ExportReplies<'a>, TransportError> {
    Ok(ExportReplies {
        series: ExportSeries::connect(endpoint, timeouts)?,
        requests,
        sent: 0,
        received: 0,
        failed: false,
    })
}

/// The replies of [`export_all`], in request order.
#[derive(Debug)]
pub struct ExportReplies<'a> {
    series: ExportSeries,
    requests: &'a [Request],
    sent: usize,
    received: usize,
    failed: bool,
}

impl Iterator for ExportReplies<'_> {
    type Item = Result<(Reply, Option<OwnedFd>), TransportError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.received == self.requests.len() {
            return None;
        }
        while self.sent < self.requests.len() && self.sent - self.received < EXPORT_WINDOW {
            if let Err(e) = self.series.send(&self.requests[self.sent]) {
                self.failed = true;
                return Some(Err(e));
            }
            self.sent += 1;
        }
        let reply = self.series.receive();
        self.received += 1;
        self.failed = reply.is_err();
        Some(reply)
    }
}

/// `then`: a fresh budget for the exchange once connected; `None` keeps the connect deadline.
fn exchange(
    endpoint: &Endpoint,
    request: &Request,
    fd: Option<OwnedFd>,
    connect_timeout: Duration,
    then: Option<Duration>,
) -> Result<(Reply, Option<OwnedFd>), TransportError> {
    let mut peer = Peer::new(endpoint.path());
    match (request.carries_fd(), fd.is_some()) {
        (true, false) => {
            return Err(TransportError::MissingFd {
                peer,
                message: request.kind(),
            });
        }
        (false, true) => {
            return Err(TransportError::UnexpectedFd {
                peer,
                message: request.kind(),
            });
        }
        _ => {}
    }
    // Validate every timeout before touching the socket.
    let connect_deadline = deadline(&peer, connect_timeout)?;
    if let Some(timeout) = then {
        deadline(&peer, timeout)?;
    }
    let body = envelope::encode(request).map_err(|source| TransportError::Encode {
        peer: peer.clone(),
        source,
    })?;
    let socket = connect_socket(endpoint, &peer, &connect_deadline)?;
    peer.pid = peer_pid(&socket);
    let deadline = match then {
        Some(timeout) => deadline(&peer, timeout)?,
        None => connect_deadline,
    };
    frame::send_frame(
        socket.as_fd(),
        &body,
        fd.as_ref().map(AsFd::as_fd),
        &deadline,
        &peer,
        "sending the request",
    )?;
    let (bytes, fd) = frame::receive_frame(
        socket.as_fd(),
        &deadline,
        &peer,
        "receiving the reply",
        crate::generated::MAX_MESSAGE_BYTES,
    )?;
    let reply =
        envelope::decode::<Reply>(&bytes).map_err(|error| TransportError::decode(&peer, error))?;
    check_reply_fd(&peer, &reply, fd.is_some())?;
    Ok((reply, fd))
}
