//! Sealed memfd tickets: what the application receives instead of a CUDA export FD.
//!
//! A ticket is a memfd named [`TICKET_MEMFD_NAME`] holding one envelope-encoded
//! [`Ticket`], sealed against writing, growing, shrinking and further seals, so whoever
//! receives it (by `SCM_RIGHTS`, through relays, or by `pidfd_getfd`) reads exactly what the
//! creator wrote. It is read with `pread` at offset 0: every duplicate of the descriptor shares
//! one file offset, which must not move under the application.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::fstat;
use nix::sys::uio::{pread, pwrite};

use crate::envelope::{self, DecodeError, EncodeError, PREFIX_LEN};
use crate::generated::{MAX_TICKET_BYTES, Ticket};

/// Name of every ticket memfd (`/proc/<pid>/fd/<n>` shows `/memfd:cuinterpose-ticket`).
pub const TICKET_MEMFD_NAME: &str = "cuinterpose-ticket";

/// The seals a ticket carries: no write, no grow, no shrink, no further seals.
pub const TICKET_SEALS: SealFlag = SealFlag::F_SEAL_WRITE
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_SHRINK)
    .union(SealFlag::F_SEAL_SEAL);

/// Why a descriptor is not a ticket at all; the shim then treats it as a raw driver FD.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotTicket {
    #[error("the descriptor does not support seals (not a memfd)")]
    NotSealable,
    #[error("the memfd lacks the ticket seals (has {found:#x}, needs {required:#x})")]
    MissingSeals { found: i32, required: i32 },
    #[error("the contents do not start with a cuinterpose envelope")]
    NoEnvelope,
}

/// A sealed memfd that starts like a ticket but is not a valid one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidTicket {
    #[error("{size} bytes exceed the ticket limit of {limit}")]
    Size { size: u64, limit: usize },
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    #[error("not a cuinterpose ticket: {0}")]
    NotATicket(NotTicket),
    #[error("invalid cuinterpose ticket: {0}")]
    Invalid(InvalidTicket),
    #[error("cannot encode the ticket: {0}")]
    Encode(#[from] EncodeError),
    #[error("{during}: {source}")]
    Io {
        during: &'static str,
        source: io::Error,
    },
}

fn io_error(during: &'static str) -> impl FnOnce(Errno) -> TicketError {
    move |errno| TicketError::Io {
        during,
        source: io::Error::from(errno),
    }
}

/// Creates a sealed, close-on-exec memfd holding `ticket`. Its file offset stays at 0.
pub fn create_ticket(ticket: &Ticket) -> Result<OwnedFd, TicketError> {
    // encode::<Ticket> enforces MAX_TICKET_BYTES.
    let bytes = envelope::encode(ticket)?;
    let fd = memfd_create(
        TICKET_MEMFD_NAME,
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(io_error("creating the ticket memfd"))?;
    positional(
        bytes.len(),
        "writing the ticket",
        io::ErrorKind::WriteZero,
        |written| pwrite(&fd, &bytes[written..], written as libc::off_t),
    )?;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(TICKET_SEALS)).map_err(io_error("sealing the ticket"))?;
    Ok(fd)
}

/// Runs `step(done)`, one `pread`/`pwrite` at byte `done`, until `len` bytes are done,
/// retrying on EINTR; a step that moves nothing fails with `short`.
fn positional(
    len: usize,
    during: &'static str,
    short: io::ErrorKind,
    mut step: impl FnMut(usize) -> nix::Result<usize>,
) -> Result<(), TicketError> {
    let mut done = 0;
    while done < len {
        match step(done) {
            Ok(0) => {
                return Err(TicketError::Io {
                    during,
                    source: io::Error::from(short),
                });
            }
            Ok(count) => done += count,
            Err(Errno::EINTR) => {}
            Err(errno) => return Err(io_error(during)(errno)),
        }
    }
    Ok(())
}

/// Reads `buffer.len()` bytes at `offset` without touching the shared file offset.
fn pread_exact(fd: BorrowedFd<'_>, buffer: &mut [u8], offset: usize) -> Result<(), TicketError> {
    // Sealed against shrinking, so a short file here means a size we were not told.
    positional(
        buffer.len(),
        "reading the ticket",
        io::ErrorKind::UnexpectedEof,
        |filled| pread(fd, &mut buffer[filled..], (offset + filled) as libc::off_t),
    )
}

/// Reads and validates a ticket.
///
/// [`TicketError::NotATicket`]: not sealable (pipes, sockets, regular files, devices), a memfd
/// without all of [`TICKET_SEALS`], or contents that do not start with an envelope prefix.
/// [`TicketError::Invalid`]: a sealed memfd that starts like an envelope but is larger than
/// `MAX_TICKET_BYTES`, of another protocol version, or does not decode.
pub fn read_ticket(fd: BorrowedFd<'_>) -> Result<Ticket, TicketError> {
    let found = match fcntl(fd, FcntlArg::F_GET_SEALS) {
        Ok(found) => found,
        // EINVAL: the file type has no seals (only shmem/hugetlbfs files do).
        Err(Errno::EINVAL) => return Err(TicketError::NotATicket(NotTicket::NotSealable)),
        Err(errno) => return Err(io_error("reading the seals")(errno)),
    };
    let required = TICKET_SEALS.bits();
    if found & required != required {
        return Err(TicketError::NotATicket(NotTicket::MissingSeals {
            found,
            required,
        }));
    }
    let size = fstat(fd)
        .map_err(io_error("reading the ticket size"))?
        .st_size;
    let size = u64::try_from(size).unwrap_or(0);
    // The envelope prefix is the ticket's magic (any version byte counts as ours, so a
    // ticket of another version is reported as invalid, not as foreign).
    let mut head = [0u8; PREFIX_LEN];
    let head_len = usize::try_from(size).map_or(PREFIX_LEN, |size| size.min(PREFIX_LEN));
    pread_exact(fd, &mut head[..head_len], 0)?;
    if !envelope::has_envelope_prefix(&head[..head_len]) {
        return Err(TicketError::NotATicket(NotTicket::NoEnvelope));
    }
    if size > MAX_TICKET_BYTES as u64 {
        return Err(TicketError::Invalid(InvalidTicket::Size {
            size,
            limit: MAX_TICKET_BYTES,
        }));
    }
    let mut bytes = vec![0u8; size as usize];
    pread_exact(fd, &mut bytes, 0)?;
    envelope::decode::<Ticket>(&bytes).map_err(|error| TicketError::Invalid(error.into()))
}
