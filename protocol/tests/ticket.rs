//! Sealed memfd tickets: round trip, seals, and every way a descriptor fails to be one.
//! (A ticket crossing processes is in `transport.rs`: the peer's multicast export.)

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use cuinterpose_protocol as p;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::uio::pwrite;
use nix::unistd::{Whence, ftruncate, lseek, write};
use p::ticket::{
    InvalidTicket, NotTicket, TICKET_MEMFD_NAME, TICKET_SEALS, TicketError, create_ticket,
    read_ticket,
};
use p::{DecodeError, MAX_TICKET_BYTES, Ticket};

mod support;

use support::check;

fn ticket() -> Ticket {
    Ticket {
        handle: p::VirtualShareableHandle {
            creator_pid: p::NamespacePid::new(0x1122_3344).expect("non-zero"),
            allocation: p::AllocationId::new([0x22; 16]).expect("non-zero"),
        },
        resource: p::ResourceKind::Unicast,
        capability: p::CapabilityToken::new([0x5a; 16]).expect("non-zero"),
    }
}

/// A memfd holding `bytes` with `seals` added (none when empty).
fn memfd(bytes: &[u8], seals: SealFlag) -> OwnedFd {
    let fd = memfd_create(
        "cuinterpose-ticket",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .expect("memfd");
    if !bytes.is_empty() {
        assert_eq!(pwrite(&fd, bytes, 0).expect("pwrite"), bytes.len());
    }
    if !seals.is_empty() {
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).expect("seal");
    }
    fd
}

fn encoded() -> Vec<u8> {
    p::encode(&ticket()).expect("encode")
}

/// One check per way a descriptor is not a ticket.
fn check_not_a_ticket(fd: impl AsFd, expected: NotTicket) {
    match read_ticket(fd.as_fd()) {
        Err(TicketError::NotATicket(reason)) => assert_eq!(reason, expected),
        other => panic!("expected NotATicket({expected:?}), got {other:?}"),
    }
}

/// One check per way a sealed memfd that looks like a ticket is invalid.
fn check_invalid(bytes: &[u8], expected: impl FnOnce(&InvalidTicket) -> bool) {
    let fd = memfd(bytes, TICKET_SEALS);
    match read_ticket(fd.as_fd()) {
        Err(TicketError::Invalid(reason)) => assert!(expected(&reason), "{reason:?}"),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn ticket_round_trips_in_a_sealed_cloexec_memfd() {
    check(|| {
        let fd = create_ticket(&ticket()).expect("create");
        assert_eq!(read_ticket(fd.as_fd()).expect("read"), ticket());
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS).expect("seals");
        assert_eq!(seals, TICKET_SEALS.bits());
        let flags = fcntl(&fd, FcntlArg::F_GETFD).expect("F_GETFD");
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let link = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("link");
        assert!(
            link.to_string_lossy()
                .starts_with(&format!("/memfd:{TICKET_MEMFD_NAME}")),
            "{link:?}"
        );
        assert_eq!(
            fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .expect("stat")
                .len(),
            encoded().len() as u64
        );
        // The file offset is left at 0 for whoever reads it sequentially.
        assert_eq!(lseek(&fd, 0, Whence::SeekCur).expect("offset"), 0);
    });
}

#[test]
fn ticket_cannot_be_changed() {
    check(|| {
        let fd = create_ticket(&ticket()).expect("create");
        let size = encoded().len() as i64;
        assert_eq!(write(&fd, b"x"), Err(Errno::EPERM), "write");
        assert_eq!(pwrite(&fd, b"x", 0), Err(Errno::EPERM), "pwrite");
        assert_eq!(ftruncate(&fd, size + 1), Err(Errno::EPERM), "grow");
        assert_eq!(ftruncate(&fd, size - 1), Err(Errno::EPERM), "shrink");
        assert_eq!(
            fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_FUTURE_WRITE)),
            Err(Errno::EPERM),
            "new seals"
        );
        // SAFETY: asks for a new mapping at an address of the kernel's choice; nothing is
        // dereferenced, and a mapping that unexpectedly succeeds is unmapped below.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        let error = Errno::last();
        if mapping != libc::MAP_FAILED {
            // SAFETY: the mapping just made, of that size, used by nothing.
            unsafe { libc::munmap(mapping, size as usize) };
        }
        assert_eq!(
            mapping,
            libc::MAP_FAILED,
            "writable shared mapping must fail"
        );
        assert_eq!(error, Errno::EPERM, "writable shared mapping");
        assert_eq!(read_ticket(fd.as_fd()).expect("unchanged"), ticket());
    });
}

#[test]
fn descriptors_that_are_not_tickets_are_reported_as_such() {
    check(|| {
        let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
        check_not_a_ticket(&read_end, NotTicket::NotSealable);
        check_not_a_ticket(&write_end, NotTicket::NotSealable);
        check_not_a_ticket(
            fs::File::open("/dev/null").expect("/dev/null"),
            NotTicket::NotSealable,
        );
        let (one, _other) = UnixStream::pair().expect("socketpair");
        check_not_a_ticket(&one, NotTicket::NotSealable);

        // A regular file holding a valid ticket: seals exist only on tmpfs (where a plain file
        // reports just F_SEAL_SEAL), so the reason depends on the file system.
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("ticket-file-{}", std::process::id()));
        fs::write(&path, encoded()).expect("write");
        let file = fs::File::open(&path).expect("open");
        let on_tmpfs = nix::sys::statfs::fstatfs(&file)
            .expect("statfs")
            .filesystem_type()
            == nix::sys::statfs::TMPFS_MAGIC;
        let expected = if on_tmpfs {
            NotTicket::MissingSeals {
                found: libc::F_SEAL_SEAL,
                required: TICKET_SEALS.bits(),
            }
        } else {
            NotTicket::NotSealable
        };
        check_not_a_ticket(&file, expected);
        drop(file);
        fs::remove_file(&path).expect("remove");

        // Valid contents, but unsealed or partly sealed: anyone could still rewrite it.
        check_not_a_ticket(
            memfd(&encoded(), SealFlag::empty()),
            NotTicket::MissingSeals {
                found: 0,
                required: TICKET_SEALS.bits(),
            },
        );
        let partial = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SEAL;
        check_not_a_ticket(
            memfd(&encoded(), partial),
            NotTicket::MissingSeals {
                found: partial.bits(),
                required: TICKET_SEALS.bits(),
            },
        );

        // Sealed, but not our envelope.
        check_not_a_ticket(
            memfd(b"\x7fELF garbage bytes here", TICKET_SEALS),
            NotTicket::NoEnvelope,
        );
        check_not_a_ticket(memfd(b"", TICKET_SEALS), NotTicket::NoEnvelope);
        check_not_a_ticket(memfd(&encoded()[..5], TICKET_SEALS), NotTicket::NoEnvelope);
    });
}

#[test]
fn sealed_memfds_that_look_like_tickets_but_are_wrong_are_invalid() {
    check(|| {
        let mut version = encoded();
        version[9] = p::VERSION + 1;
        check_invalid(
            &version,
            |reason| matches!(reason, InvalidTicket::Decode(DecodeError::Version { found, .. }) if *found == p::VERSION + 1),
        );

        let mut garbage_body = encoded()[..p::envelope::PREFIX_LEN].to_vec();
        garbage_body.extend_from_slice(&[0xc1, 0xc1]);
        check_invalid(&garbage_body, |reason| {
            matches!(reason, InvalidTicket::Decode(DecodeError::Malformed { .. }))
        });

        let mut trailing = encoded();
        trailing.push(0);
        check_invalid(&trailing, |reason| {
            matches!(
                reason,
                InvalidTicket::Decode(DecodeError::Trailing { count: 1, .. })
            )
        });

        let mut oversized = encoded();
        oversized.resize(MAX_TICKET_BYTES + 1, 0);
        check_invalid(&oversized, |reason| {
            matches!(reason, InvalidTicket::Size { size, limit }
                if *size == MAX_TICKET_BYTES as u64 + 1 && *limit == MAX_TICKET_BYTES)
        });

        let truncated = encoded()[..encoded().len() - 3].to_vec();
        check_invalid(&truncated, |reason| {
            matches!(reason, InvalidTicket::Decode(DecodeError::Malformed { .. }))
        });
    });
}

#[test]
fn reading_never_moves_the_shared_file_offset() {
    check(|| {
        let fd = create_ticket(&ticket()).expect("create");
        let duplicate = fd.try_clone().expect("dup");
        assert_eq!(lseek(&fd, 7, Whence::SeekSet).expect("seek"), 7);
        assert_eq!(read_ticket(duplicate.as_fd()).expect("read"), ticket());
        assert_eq!(read_ticket(fd.as_fd()).expect("read"), ticket());
        assert_eq!(lseek(&fd, 0, Whence::SeekCur).expect("offset"), 7);
        assert_eq!(lseek(&duplicate, 0, Whence::SeekCur).expect("offset"), 7);
    });
}
