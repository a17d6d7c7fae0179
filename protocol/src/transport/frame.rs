//! Frames on a Unix stream socket: a 4-byte little-endian length, then that many bytes of one
//! envelope, with at most one file descriptor attached (`SCM_RIGHTS`) to the frame's first
//! bytes.
//!
//! Raw `sendmsg`/`recvmsg` rather than nix's wrappers: on `MSG_CTRUNC` nix refuses to walk the
//! control messages, which would leak the descriptors the kernel did install.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr;
use std::time::{Duration, Instant};

use super::error::{Peer, TransportError};
use super::stage::IoStage;
use crate::generated::MAX_MESSAGE_BYTES;

/// Length of the frame's size prefix.
pub(crate) const PREFIX_BYTES: usize = 4;
/// First body buffer; it grows as bytes arrive, so a peer announcing a large frame and sending
/// nothing costs no memory.
const INITIAL_BODY_BYTES: usize = 64 * 1024;
/// Received descriptors that fit in the control buffer: two, so that one extra is detected as
/// such; a third makes the kernel set `MSG_CTRUNC`.
const RECEIVE_FD_SLOTS: usize = 2;
const FD_BYTES: usize = mem::size_of::<libc::c_int>();

/// A point in time every step of an exchange must finish by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    /// `None` when the duration cannot be added to now (callers validate it first).
    pub(crate) fn after(total: Duration) -> Option<Self> {
        Instant::now()
            .checked_add(total)
            .map(|at| Self { at, total })
    }

    pub(crate) fn total(&self) -> Duration {
        self.total
    }

    /// Time left, or `None` once the deadline has passed.
    pub(crate) fn remaining_or_none(&self) -> Option<Duration> {
        self.at
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }
}

/// Sets `SO_RCVTIMEO` or `SO_SNDTIMEO`. A zero `timeval` means "no timeout" to the kernel, so
/// anything below a microsecond is rounded up.
pub(crate) fn set_socket_timeout(
    socket: BorrowedFd<'_>,
    option: libc::c_int,
    timeout: Duration,
) -> io::Result<()> {
    let mut value = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    if value.tv_sec == 0 && value.tv_usec == 0 {
        value.tv_usec = 1;
    }
    // SAFETY: `value` is a live timeval and the length passed is its size.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            ptr::from_ref(&value).cast(),
            mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the socket timeout to what is left of `deadline`; `Err(Timeout)` when nothing is.
fn arm(
    socket: BorrowedFd<'_>,
    option: libc::c_int,
    deadline: &Deadline,
    peer: &Peer,
    during: IoStage,
) -> Result<(), TransportError> {
    let Some(left) = deadline.remaining_or_none() else {
        return Err(TransportError::Timeout {
            peer: peer.clone(),
            during,
            after: deadline.total(),
        });
    };
    set_socket_timeout(socket, option, left).map_err(|source| TransportError::Io {
        peer: peer.clone(),
        during: IoStage::SettingSocketTimeout,
        source,
    })
}

/// Maps a send or receive failure to the variant callers match on.
fn io_error(error: io::Error, peer: &Peer, during: IoStage, deadline: &Deadline) -> TransportError {
    match error.raw_os_error() {
        // SO_RCVTIMEO / SO_SNDTIMEO expiry.
        Some(libc::EAGAIN) => TransportError::Timeout {
            peer: peer.clone(),
            during,
            after: deadline.total(),
        },
        Some(libc::EPIPE | libc::ECONNRESET) => TransportError::PeerClosed {
            peer: peer.clone(),
            during,
        },
        _ => TransportError::Io {
            peer: peer.clone(),
            during,
            source: error,
        },
    }
}

/// Control buffer of `N` bytes for ancillary data, aligned for `cmsghdr`: 32 hold one
/// outgoing descriptor, 64 the received ones.
#[repr(C)]
struct Control<const N: usize> {
    _align: [libc::cmsghdr; 0],
    bytes: [u8; N],
}

impl<const N: usize> Control<N> {
    fn new() -> Self {
        Self {
            _align: [],
            bytes: [0; N],
        }
    }
}

/// One `sendmsg` of `parts` (empty parts skipped), with `fd` attached when given.
fn sendmsg_once(
    socket: BorrowedFd<'_>,
    parts: &[&[u8]],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|part| !part.is_empty())
        .map(|part| libc::iovec {
            iov_base: part.as_ptr().cast_mut().cast(),
            iov_len: part.len(),
        })
        .collect();
    let mut control = Control::<32>::new();
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut header: libc::msghdr = unsafe { mem::zeroed() };
    header.msg_iov = iov.as_mut_ptr();
    header.msg_iovlen = iov.len() as _;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE / CMSG_LEN are pure arithmetic.
        let (space, length) = unsafe {
            (
                libc::CMSG_SPACE(FD_BYTES as libc::c_uint) as usize,
                libc::CMSG_LEN(FD_BYTES as libc::c_uint) as usize,
            )
        };
        debug_assert!(space <= control.bytes.len());
        header.msg_control = control.bytes.as_mut_ptr().cast();
        header.msg_controllen = space as _;
        // SAFETY: the header points at `control`, which holds `space` bytes aligned for
        // cmsghdr, so CMSG_FIRSTHDR is non-null and its data has room for one int.
        unsafe {
            let message = libc::CMSG_FIRSTHDR(&header);
            (*message).cmsg_level = libc::SOL_SOCKET;
            (*message).cmsg_type = libc::SCM_RIGHTS;
            (*message).cmsg_len = length as _;
            ptr::write_unaligned(
                libc::CMSG_DATA(message).cast::<libc::c_int>(),
                fd.as_raw_fd(),
            );
        }
    }
    loop {
        // SAFETY: the header's iovecs and control buffer live until the call returns.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &header, libc::MSG_NOSIGNAL) };
        if let Ok(sent) = usize::try_from(sent) {
            return Ok(sent);
        }
        let error = io::Error::last_os_error();
        // EINTR means nothing was sent (a partial send returns a count), so the descriptor
        // has not gone yet and retrying with it is correct.
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Sends one frame: `body` behind its length prefix, `fd` attached to the first chunk only.
pub(crate) fn send_frame(
    socket: BorrowedFd<'_>,
    body: &[u8],
    fd: Option<BorrowedFd<'_>>,
    deadline: &Deadline,
    peer: &Peer,
    during: IoStage,
) -> Result<(), TransportError> {
    let size = u32::try_from(body.len())
        .ok()
        .filter(|&size| size as usize <= MAX_MESSAGE_BYTES)
        .ok_or_else(|| TransportError::Oversized {
            peer: peer.clone(),
            size: body.len() as u64,
            limit: MAX_MESSAGE_BYTES,
        })?;
    let prefix = size.to_le_bytes();
    let total = PREFIX_BYTES + body.len();
    let mut sent = 0;
    let mut fd = fd;
    while sent < total {
        arm(socket, libc::SO_SNDTIMEO, deadline, peer, during)?;
        let parts: [&[u8]; 2] = if sent < PREFIX_BYTES {
            [&prefix[sent..], body]
        } else {
            [&[], &body[sent - PREFIX_BYTES..]]
        };
        let count = sendmsg_once(socket, &parts, fd)
            .map_err(|error| io_error(error, peer, during, deadline))?;
        if count == 0 {
            return Err(TransportError::PeerClosed {
                peer: peer.clone(),
                during,
            });
        }
        // The descriptor went with the first accepted byte; a partial send must not resend it.
        fd = None;
        sent += count;
    }
    Ok(())
}

/// One `recvmsg` into `buffer`. Every descriptor that arrives is wrapped in an `OwnedFd` and
/// pushed to `fds` before anything else can fail, so every error path closes it. Returns the
/// byte count and whether the kernel truncated the ancillary data.
fn recvmsg_once(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let mut control = Control::<64>::new();
    // SAFETY: pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE((RECEIVE_FD_SLOTS * FD_BYTES) as libc::c_uint) } as usize;
    debug_assert!(space <= control.bytes.len());
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut header: libc::msghdr = unsafe { mem::zeroed() };
    let received = loop {
        header.msg_iov = &raw mut iov;
        header.msg_iovlen = 1;
        header.msg_control = control.bytes.as_mut_ptr().cast();
        header.msg_controllen = space as _;
        header.msg_flags = 0;
        // SAFETY: the header points at `iov` (into `buffer`) and `control`, both live and
        // writable for the lengths given.
        let received =
            unsafe { libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
        if let Ok(received) = usize::try_from(received) {
            break received;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    // SAFETY: after a successful recvmsg, msg_control/msg_controllen describe the control
    // messages the kernel wrote (also when it set MSG_CTRUNC: it shrinks msg_controllen to what
    // fit), so CMSG_FIRSTHDR/CMSG_NXTHDR stay within `control`.
    unsafe {
        // SAFETY: CMSG_LEN(0) is arithmetic.
        let header_len = libc::CMSG_LEN(0) as usize;
        let mut message = libc::CMSG_FIRSTHDR(&header);
        while !message.is_null() {
            let length = (*message).cmsg_len as usize;
            if (*message).cmsg_level == libc::SOL_SOCKET
                && (*message).cmsg_type == libc::SCM_RIGHTS
                && length >= header_len
            {
                let data = libc::CMSG_DATA(message).cast::<libc::c_int>();
                for index in 0..(length - header_len) / FD_BYTES {
                    let raw = ptr::read_unaligned(data.add(index));
                    // SAFETY: SCM_RIGHTS installed this descriptor in our table for us alone.
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            message = libc::CMSG_NXTHDR(&header, message);
        }
    }
    Ok((received, header.msg_flags & libc::MSG_CTRUNC != 0))
}

/// Receives bytes until `buffer` is full, checking the ancillary data of every chunk.
fn receive_exact(
    socket: BorrowedFd<'_>,
    buffer: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: &Deadline,
    peer: &Peer,
    during: IoStage,
) -> Result<(), TransportError> {
    let mut filled = 0;
    while filled < buffer.len() {
        arm(socket, libc::SO_RCVTIMEO, deadline, peer, during)?;
        let (count, truncated) = recvmsg_once(socket, &mut buffer[filled..], fds)
            .map_err(|error| io_error(error, peer, during, deadline))?;
        if truncated {
            return Err(TransportError::Truncated { peer: peer.clone() });
        }
        if fds.len() > 1 {
            return Err(TransportError::ExcessFds {
                peer: peer.clone(),
                count: fds.len(),
            });
        }
        if count == 0 {
            return Err(TransportError::PeerClosed {
                peer: peer.clone(),
                during,
            });
        }
        filled += count;
    }
    Ok(())
}

/// Receives one frame: its body and the descriptor that came with it, if any. The length is
/// checked against `limit` (at most `MAX_MESSAGE_BYTES`) before any body buffer exists.
pub(crate) fn receive_frame(
    socket: BorrowedFd<'_>,
    deadline: &Deadline,
    peer: &Peer,
    during: IoStage,
    limit: usize,
) -> Result<(Vec<u8>, Option<OwnedFd>), TransportError> {
    let limit = limit.min(MAX_MESSAGE_BYTES);
    let mut fds = Vec::with_capacity(RECEIVE_FD_SLOTS);
    let mut prefix = [0u8; PREFIX_BYTES];
    receive_exact(socket, &mut prefix, &mut fds, deadline, peer, during)?;
    let size = u32::from_le_bytes(prefix);
    let length = size as usize;
    if length > limit {
        return Err(TransportError::Oversized {
            peer: peer.clone(),
            size: u64::from(size),
            limit,
        });
    }
    let mut body = Vec::new();
    let mut filled = 0;
    while filled < length {
        if filled == body.len() {
            let grow = body.len().max(INITIAL_BODY_BYTES).min(length - body.len());
            body.resize(body.len() + grow, 0);
        }
        let end = body.len();
        receive_exact(
            socket,
            &mut body[filled..end],
            &mut fds,
            deadline,
            peer,
            during,
        )?;
        filled = end;
    }
    Ok((body, fds.pop()))
}
