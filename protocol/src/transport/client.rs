//! The calling side: one connection per exchange, or one for a series of exports.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use super::endpoint::Endpoint;
use super::error::{Peer, TransportError};
use super::frame::{self, Deadline};
use super::socket::{check_reply_fd, connect_socket, peer_pid};
use super::stage::IoStage;
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
            IoStage::SendingSeriesExport,
        )
    }

    /// The reply to the oldest request not yet answered.
    pub fn receive(&mut self) -> Result<(Reply, Option<OwnedFd>), TransportError> {
        let deadline = deadline(&self.peer, self.timeout)?;
        let (bytes, fd) = frame::receive_frame(
            self.socket.as_fd(),
            &deadline,
            &self.peer,
            IoStage::ReceivingSeriesReply,
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
        IoStage::SendingRequest,
    )?;
    let (bytes, fd) = frame::receive_frame(
        socket.as_fd(),
        &deadline,
        &peer,
        IoStage::ReceivingReply,
        crate::generated::MAX_MESSAGE_BYTES,
    )?;
    let reply =
        envelope::decode::<Reply>(&bytes).map_err(|error| TransportError::decode(&peer, error))?;
    check_reply_fd(&peer, &reply, fd.is_some())?;
    Ok((reply, fd))
}
