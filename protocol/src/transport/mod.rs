//! Unix-socket transport between the coordinator, shims and their peers.
//!
//! # Wire
//!
//! A frame is a 4-byte little-endian length followed by exactly that many bytes of one
//! envelope ([`crate::envelope`]). The length is checked against
//! [`MAX_MESSAGE_BYTES`](crate::MAX_MESSAGE_BYTES) before any buffer is allocated, and the body
//! buffer grows only as bytes arrive. At most one file descriptor travels with a frame
//! (`SCM_RIGHTS` on its first chunk, never resent after a partial send); descriptors are
//! received with `MSG_CMSG_CLOEXEC` and owned at once, so every error closes them. Two
//! descriptors are [`TransportError::ExcessFds`], more than fit the control buffer
//! [`TransportError::Truncated`]. Export replies carry exactly one descriptor, nothing else
//! carries any.
//!
//! # Endpoints
//!
//! Each process listens on `<control dir>/cuinterpose-<namespace pid>.sock`; the control
//! directory is [`CONTROL_DIR_VARIABLE`] or [`DEFAULT_CONTROL_DIR`] (`/tmp/cuinterpose`). The
//! listener creates it with mode 0700, refuses one that is not ours or that group or others
//! can write to, binds with mode 0600 and checks `SO_PEERCRED` on every connection.
//!
//! # Service model
//!
//! One exchange per connection: connect, one request, one reply, close; the exception is a
//! series of exports ([`ExportSeries`]): a peer may send further export requests on the
//! connection of its first, each answered in order, until it closes. [`Listener::accept`]
//! reads nothing, so a server that hands each [`Connection`] to its own thread (or a bounded
//! queue) is never held up by a slow peer. Every read and write runs against a deadline
//! (re-arming `SO_RCVTIMEO`/`SO_SNDTIMEO` with the time left before each system call, so a peer
//! trickling bytes cannot stretch it), so even a strictly sequential server loses at most one
//! request timeout to a peer that stalls mid-frame.
//!
//! # Timeouts
//!
//! [`Timeouts`]: 10 s for control requests, 3600 s for `save_allocations` and
//! `load_allocations`, overridable by [`CONTROL_TIMEOUT_VARIABLE`] and
//! [`COPY_TIMEOUT_VARIABLE`] (whole seconds; an invalid value is an error).

// Floors, top to bottom: each module imports only from those listed below it.
// 1. The two ends.
mod client;
mod server;
// 2. What both ends share: connecting, credentials, which replies carry a descriptor.
mod socket;
// 3. Frames on the wire, under a deadline.
mod frame;
// 4. Socket paths and timeouts.
mod endpoint;
mod timeouts;
// 5. Errors, and the stages they name.
mod error;
mod stage;

pub use client::{EXPORT_WINDOW, ExportReplies, ExportSeries, call, call_with, export_all};
pub use endpoint::{
    CONTROL_DIR_VARIABLE, DEFAULT_CONTROL_DIR, Endpoint, MAX_SOCKET_PATH_BYTES, control_dir,
    control_dir_from, socket_name,
};
pub use error::{EndpointProblem, Peer, RefusalReason, TransportError};
pub use server::{Connection, Listener, REQUEST_FRAME_LIMIT, peer_allowed};
pub use socket::PeerCredentials;
pub use stage::IoStage;
pub use timeouts::{
    CONTROL_TIMEOUT_VARIABLE, COPY_TIMEOUT_VARIABLE, MAX_TIMEOUT_SECONDS, Timeouts,
};
