//! Framing on a Unix stream socket: a little-endian `u32` length, then that many bytes of
//! JSON. At most one file descriptor rides on a frame, attached (`SCM_RIGHTS`) to the
//! `sendmsg` that carries the frame's first byte; the receiver collects it from whichever
//! `recvmsg` returns it (`MSG_CMSG_CLOEXEC`) and closes any surplus.

use crate::proto::MAX_FRAME;
use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr, recvmsg, sendmsg, setsockopt, sockopt,
};
use nix::sys::time::TimeVal;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Why a frame could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the socket before the first byte of a frame.
    #[error("peer closed the connection")]
    Closed,
    /// The peer closed the socket in the middle of a frame.
    #[error("peer closed the connection mid-frame")]
    Truncated,
    /// The deadline passed.
    #[error("timed out")]
    Timeout,
    /// A length over [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// A socket call failed.
    #[error("{op}: {errno}")]
    Sys { op: &'static str, errno: Errno },
}

impl WireError {
    /// Whether the error means the peer is gone (closed or reset).
    pub fn peer_gone(&self) -> bool {
        matches!(
            self,
            WireError::Closed
                | WireError::Truncated
                | WireError::Sys {
                    errno: Errno::EPIPE | Errno::ECONNRESET,
                    ..
                }
        )
    }
}

/// Arms `SO_SNDTIMEO`/`SO_RCVTIMEO` for what is left until `deadline` (none: block).
fn arm(sock: BorrowedFd<'_>, deadline: Option<Instant>, send: bool) -> Result<(), WireError> {
    let left = match deadline {
        None => Duration::ZERO,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(WireError::Timeout);
            }
            // A zero timeval means "no timeout": never arm less than a microsecond.
            left.max(Duration::from_micros(1))
        }
    };
    let tv = TimeVal::new(
        left.as_secs() as libc::time_t,
        libc::suseconds_t::from(left.subsec_micros()),
    );
    let r = if send {
        setsockopt(&sock, sockopt::SendTimeout, &tv)
    } else {
        setsockopt(&sock, sockopt::ReceiveTimeout, &tv)
    };
    r.map_err(|errno| WireError::Sys {
        op: "setsockopt(timeout)",
        errno,
    })
}

/// Sends one frame holding `payload`, with `attach` riding on it.
pub fn send_frame(
    sock: BorrowedFd<'_>,
    payload: &[u8],
    attach: Option<BorrowedFd<'_>>,
    deadline: Option<Instant>,
) -> Result<(), WireError> {
    if payload.len() > MAX_FRAME {
        return Err(WireError::TooLarge(payload.len()));
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    let fds: Vec<RawFd> = attach.iter().map(AsRawFd::as_raw_fd).collect();
    let mut sent = 0usize;
    while sent < frame.len() {
        if deadline.is_some() {
            arm(sock, deadline, true)?;
        }
        let iov = [IoSlice::new(&frame[sent..])];
        let cmsgs: Vec<ControlMessage<'_>> = if sent == 0 && !fds.is_empty() {
            vec![ControlMessage::ScmRights(&fds)]
        } else {
            Vec::new()
        };
        match sendmsg::<UnixAddr>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => sent += n,
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => return Err(WireError::Timeout),
            Err(errno) => {
                return Err(WireError::Sys {
                    op: "sendmsg",
                    errno,
                });
            }
        }
    }
    Ok(())
}

/// Reads into `buf` completely, collecting any descriptors into `fds`. `Ok(false)`: the peer
/// closed the socket before the first byte.
fn recv_exact(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Option<Instant>,
) -> Result<bool, WireError> {
    let mut got = 0usize;
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    while got < buf.len() {
        if deadline.is_some() {
            arm(sock, deadline, false)?;
        }
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let r = recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let msg = match r {
            Ok(m) => m,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Err(WireError::Timeout),
            Err(errno) => {
                return Err(WireError::Sys {
                    op: "recvmsg",
                    errno,
                });
            }
        };
        let n = msg.bytes;
        // A truncated control buffer still installs the descriptors that fit; nix refuses
        // to iterate then, and they would leak, so the buffer is sized for several.
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for fd in raw {
                        // SAFETY: SCM_RIGHTS just installed `fd` in this process; nothing
                        // else owns it.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
        }
        if n == 0 {
            return if got == 0 {
                Ok(false)
            } else {
                Err(WireError::Truncated)
            };
        }
        got += n;
    }
    Ok(true)
}

/// Receives one frame: its payload and the first descriptor that came with it (surplus
/// descriptors are closed).
pub fn recv_frame(
    sock: BorrowedFd<'_>,
    deadline: Option<Instant>,
) -> Result<(Vec<u8>, Option<OwnedFd>), WireError> {
    let mut fds = Vec::new();
    let mut len = [0u8; 4];
    if !recv_exact(sock, &mut len, &mut fds, deadline)? {
        return Err(WireError::Closed);
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(WireError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    if !recv_exact(sock, &mut payload, &mut fds, deadline)? && len > 0 {
        return Err(WireError::Truncated);
    }
    let first = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok((payload, first))
}
