//! The storage carrier: each shared allocation this process created goes to a file of the
//! checkpoint directory's `carrier/` folder (`carrier/<allocation id>`), through a staging
//! window of whole chunks, instead of a host arena held for the whole checkpoint.
//!
//! A save copies chunk after chunk from the device into a free slot of the window while
//! writer threads hash the filled slots (XXH3-64, as the host carrier does) and write them
//! with `O_DIRECT` at their offset; every file is then cut to its size, synced, and the folder
//! synced, before the reply. A load reads the chunks back with several reader threads, each
//! hashing its chunk against the save's checksum before the chunk is copied to the device, so
//! a damaged or truncated file stops the load at the first bad chunk, naming file and offset.
//! Host memory held at once is the window; a failed save removes the files it wrote.
//!
//! The folder's descriptor comes with the request; the process keeps it until `hold` (its own
//! rollback may need the files before the state is published), never across a dump.

use super::carrier::{self, CHUNK, Direction, TransferError, Transferred, checksum_of};
use crate::driver::{Driver, HostMemory, Stream};
use crate::state::progress;
use crate::state::registry::Allocation;
use crate::state::stored::Stored;
use cuinterpose_protocol::{AllocationId, CarrierChecksum, carrier_file_name};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use twox_hash::XxHash3_64;

/// `O_DIRECT` transfers are multiples of this (the largest logical block size in use).
const ALIGN: usize = 4096;
/// Writer or reader threads beside the copying one.
const MAX_WORKERS: usize = 4;

/// Where a file is, for errors: the folder as this process sees it, and the name. A folder
/// the coordinator detached from its file system (the root of a mount of its own) reads as
/// `/`: the file is then named `carrier/NAME`, which the coordinator names in full.
fn path_of(folder: BorrowedFd, name: &str) -> String {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&folder);
    let dir = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|p| p.display().to_string())
        .ok()
        .filter(|dir| dir != "/")
        .unwrap_or_else(|| cuinterpose_protocol::CARRIER_FOLDER.into());
    format!("{dir}/{name}")
}

fn failed(
    folder: BorrowedFd,
    name: &str,
    what: &str,
    error: impl std::fmt::Display,
) -> TransferError {
    TransferError::File {
        path: path_of(folder, name),
        what: format!("{what}: {error}"),
    }
}

/// The staging window's memory, its number of slots and their length; a window smaller than
/// one chunk is refused before any byte moves. Never more slots than keep the copy and every
/// worker busy at once, or than `jobs` have chunks, and no slot longer than the largest chunk
/// of `jobs` (whole blocks): small allocations stage little.
fn staging(window: u64, jobs: &[&Allocation]) -> Result<(HostMemory, usize, usize), TransferError> {
    let chunks = cuinterpose_protocol::window_chunks(window)
        .map_err(|e| TransferError::Window(e.to_string()))?;
    let sizes = jobs
        .iter()
        .map(|a| usize::try_from(a.size).unwrap_or(usize::MAX));
    let needed: usize = sizes.clone().map(|size| size.div_ceil(CHUNK)).sum();
    let largest = sizes.max().unwrap_or(0);
    let slot_len = aligned(largest.min(CHUNK)).max(ALIGN);
    let slots = usize::try_from(chunks)
        .unwrap_or(usize::MAX)
        .min(MAX_WORKERS + 1)
        .min(needed.max(1));
    let memory = HostMemory::new(slots * slot_len).map_err(TransferError::Driver)?;
    Ok((memory, slots, slot_len))
}

/// Saves `jobs` into files of `folder`, staging at most `window` bytes (rounded down to whole
/// chunks, at most what keeps every worker busy): the files' record, what was copied, and
/// the host memory staged.
pub fn save(
    d: &Driver,
    folder: OwnedFd,
    jobs: &[&Allocation],
    through: &BTreeMap<AllocationId, u64>,
    window: u64,
) -> Result<(Stored, Transferred, u64), TransferError> {
    let (mut memory, slots, slot_len) = staging(window, jobs)?;
    let total = jobs.iter().map(|a| a.size).fold(0u64, u64::saturating_add);
    progress::start(Direction::Save.operation(), total);
    let mut written: Vec<String> = Vec::new();
    let result = carrier::pinned(d, jobs, &mut memory, |bytes| {
        let done = carrier::each_allocation(d, jobs, through, Direction::Save, |a, address| {
            let name = carrier_file_name(&a.reference.id);
            let file = create(folder.as_fd(), &name)?;
            written.push(name.clone());
            save_file(d, a, address, &file, bytes, (slots, slot_len))
                .and_then(|checksum| finish(&file, a.size).map(|()| checksum))
                .map_err(|e| e.at(folder.as_fd(), &name))
        })?;
        File::from(
            folder
                .try_clone()
                .map_err(|e| failed(folder.as_fd(), ".", "duplicating the folder", e))?,
        )
        .sync_all()
        .map_err(|e| failed(folder.as_fd(), ".", "syncing the folder", e))?;
        Ok(done)
    });
    progress::finish();
    match result {
        Ok(done) => {
            progress::add_copy_time(done.copying);
            let stored = Stored {
                folder: Some(folder),
                sizes: jobs.iter().map(|a| (a.reference.id, a.size)).collect(),
                checksums: done
                    .checksums
                    .iter()
                    .map(|c| (c.allocation, c.clone()))
                    .collect(),
                window,
            };
            Ok((stored, done, memory.len() as u64))
        }
        Err(error) => {
            // Nothing half-written stays behind; the device memory still holds the bytes.
            for name in &written {
                let _ = unlinkat(folder.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
            Err(error)
        }
    }
}

/// Loads `jobs` back from the files of `folder` (the request's, or the one the save kept).
pub fn load(
    d: &Driver,
    stored: &Stored,
    folder: BorrowedFd,
    jobs: &[&Allocation],
    window: u64,
) -> Result<(Transferred, u64), TransferError> {
    let (mut memory, slots, slot_len) = staging(window, jobs)?;
    let total = jobs.iter().map(|a| a.size).fold(0u64, u64::saturating_add);
    progress::start(Direction::Load.operation(), total);
    let result = carrier::pinned(d, jobs, &mut memory, |bytes| {
        carrier::each_allocation(d, jobs, &BTreeMap::new(), Direction::Load, |a, address| {
            let id = a.reference.id;
            let saved = stored
                .checksums
                .get(&id)
                .filter(|c| c.size == a.size && c.chunk_bytes == CHUNK as u64)
                .ok_or(TransferError::NoChecksum { allocation: id })?;
            let name = carrier_file_name(&id);
            open(folder, &name, a.size)
                .and_then(|file| load_file(d, a, address, &file, bytes, (slots, slot_len), saved))
                .map_err(|e| e.at(folder, &name))
        })
    });
    progress::finish();
    if let Ok(done) = &result {
        progress::add_copy_time(done.copying);
    }
    result.map(|done| (done, memory.len() as u64))
}

/// A failure inside one file's transfer, before it is told which file.
enum FileError {
    Io(&'static str, std::io::Error),
    Short {
        offset: u64,
        expected: usize,
        got: usize,
    },
    Other(TransferError),
}

impl From<TransferError> for FileError {
    fn from(error: TransferError) -> Self {
        Self::Other(error)
    }
}

impl From<crate::sys::error::CuError> for FileError {
    fn from(error: crate::sys::error::CuError) -> Self {
        Self::Other(TransferError::Driver(error))
    }
}

impl FileError {
    fn at(self, folder: BorrowedFd, name: &str) -> TransferError {
        match self {
            Self::Io(what, error) => failed(folder, name, what, error),
            Self::Short {
                offset,
                expected,
                got,
            } => failed(
                folder,
                name,
                "reading",
                format!(
                    "short read at offset {offset}: {got} of {expected} bytes (the file is \
                     truncated)"
                ),
            ),
            Self::Other(TransferError::Mismatch {
                allocation,
                offset,
                len,
                saved,
                found,
            }) => failed(
                folder,
                name,
                "verifying",
                format!(
                    "allocation {allocation}: the {len} bytes at offset {offset} hash to \
                         {found:#018x}, but save_allocations recorded {saved:#018x} (the file \
                         was damaged after the save); nothing was put back in service"
                ),
            ),
            Self::Other(error) => error,
        }
    }
}

fn create(folder: BorrowedFd, name: &str) -> Result<File, TransferError> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_DIRECT | OFlag::O_CLOEXEC;
    openat(folder, name, flags, Mode::from_bits_truncate(0o600))
        .map(File::from)
        .map_err(|errno| {
            // A file system without O_DIRECT creates the file, then refuses to open it so.
            let _ = unlinkat(folder, name, UnlinkatFlags::NoRemoveDir);
            let why = if errno == nix::errno::Errno::EINVAL {
                format!(
                    "{errno} (the filesystem does not support O_DIRECT: put the checkpoint \
                     directory on one that does, e.g. ext4, xfs or tmpfs, or use --carrier host)"
                )
            } else {
                errno.to_string()
            };
            failed(folder, name, "creating", why)
        })
}

fn open(folder: BorrowedFd, name: &str, size: u64) -> Result<File, FileError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECT | OFlag::O_CLOEXEC;
    let file = openat(folder, name, flags, Mode::empty())
        .map(File::from)
        .map_err(|errno| FileError::Io("opening", errno.into()))?;
    let len = file
        .metadata()
        .map_err(|e| FileError::Io("reading its size", e))?
        .len();
    if len != size {
        return Err(FileError::Io(
            "checking its size",
            std::io::Error::other(format!(
                "it holds {len} bytes, the allocation {size} (the file was truncated or \
                 replaced)"
            )),
        ));
    }
    Ok(file)
}

/// Cuts the padded last block off and makes the file durable.
fn finish(file: &File, size: u64) -> Result<(), FileError> {
    file.set_len(size)
        .map_err(|e| FileError::Io("setting its size", e))?;
    file.sync_all().map_err(|e| FileError::Io("syncing", e))
}

fn aligned(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

/// One chunk of one file: where, how long, which.
struct Piece<'s> {
    slot: &'s mut [u8],
    index: usize,
    len: usize,
}

/// Device to file: this thread copies chunks into free slots, workers hash and write them.
fn save_file(
    d: &Driver,
    a: &Allocation,
    mut device_address: u64,
    file: &File,
    window: &mut [u8],
    (slots, slot_len): (usize, usize),
) -> Result<CarrierChecksum, FileError> {
    let size = usize::try_from(a.size).map_err(|_| crate::sys::error::CuError::INVALID_VALUE)?;
    let count = size.div_ceil(CHUNK);
    let hashes = Mutex::new(vec![0u64; count]);
    let error: Mutex<Option<FileError>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (free_tx, free_rx) = mpsc::channel::<&mut [u8]>();
        for slot in window.chunks_mut(slot_len).take(slots) {
            let _ = free_tx.send(slot);
        }
        let (work_tx, work_rx) = mpsc::channel::<Piece>();
        let work_rx = Arc::new(Mutex::new(work_rx));
        for _ in 0..slots.saturating_sub(1).clamp(1, MAX_WORKERS) {
            let (work_rx, free_tx) = (Arc::clone(&work_rx), free_tx.clone());
            let (hashes, error, stop) = (&hashes, &error, &stop);
            scope.spawn(move || {
                loop {
                    let Ok(piece) = work_rx.lock().unwrap_or_else(|p| p.into_inner()).recv() else {
                        return;
                    };
                    let hash = XxHash3_64::oneshot(&piece.slot[..piece.len]);
                    hashes.lock().unwrap_or_else(|p| p.into_inner())[piece.index] = hash;
                    // The tail of a last chunk pads to a whole block; the file is cut back later.
                    piece.slot[piece.len..aligned(piece.len)].fill(0);
                    let offset = (piece.index * CHUNK) as u64;
                    if !stop.load(Ordering::SeqCst) {
                        match file.write_all_at(&piece.slot[..aligned(piece.len)], offset) {
                            Ok(()) => progress::advance(piece.len as u64),
                            Err(e) => {
                                stop.store(true, Ordering::SeqCst);
                                error
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .get_or_insert(FileError::Io("writing", e));
                            }
                        }
                    }
                    let _ = free_tx.send(piece.slot);
                }
            });
        }
        drop(free_tx);
        for index in 0..count {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(slot) = free_rx.recv() else { break };
            let len = CHUNK.min(size - index * CHUNK);
            let copied = Stream::scope(d, |stream| {
                stream.copy_to_host(&mut slot[..len], device_address)
            });
            if let Err(e) = copied {
                stop.store(true, Ordering::SeqCst);
                error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e.into());
                break;
            }
            device_address += len as u64;
            let _ = work_tx.send(Piece { slot, index, len });
        }
        drop(work_tx);
    });
    if let Some(error) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(error);
    }
    Ok(checksum_of(
        a,
        hashes.into_inner().unwrap_or_else(|p| p.into_inner()),
    )?)
}

/// File to device: workers read and verify chunks into free slots, this thread copies each
/// verified chunk to the device and frees its slot.
fn load_file(
    d: &Driver,
    a: &Allocation,
    device_address: u64,
    file: &File,
    window: &mut [u8],
    (slots, slot_len): (usize, usize),
    saved: &CarrierChecksum,
) -> Result<CarrierChecksum, FileError> {
    let size = usize::try_from(a.size).map_err(|_| crate::sys::error::CuError::INVALID_VALUE)?;
    let count = size.div_ceil(CHUNK);
    if saved.chunks.len() != count {
        return Err(TransferError::NoChecksum {
            allocation: a.reference.id,
        }
        .into());
    }
    let stop = AtomicBool::new(false);
    let mut first_error: Option<FileError> = None;
    std::thread::scope(|scope| {
        let (free_tx, free_rx) = mpsc::channel::<&mut [u8]>();
        for slot in window.chunks_mut(slot_len).take(slots) {
            let _ = free_tx.send(slot);
        }
        let free_rx = Arc::new(Mutex::new(free_rx));
        let next = Arc::new(Mutex::new(0usize));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Piece, FileError>>();
        for _ in 0..slots.saturating_sub(1).clamp(1, MAX_WORKERS) {
            let (free_rx, next, ready_tx, stop) = (
                Arc::clone(&free_rx),
                Arc::clone(&next),
                ready_tx.clone(),
                &stop,
            );
            scope.spawn(move || {
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(slot) = free_rx.lock().unwrap_or_else(|p| p.into_inner()).recv() else {
                        return;
                    };
                    let index = {
                        let mut next = next.lock().unwrap_or_else(|p| p.into_inner());
                        *next += 1;
                        *next - 1
                    };
                    if index >= count {
                        return;
                    }
                    let len = CHUNK.min(size - index * CHUNK);
                    let piece =
                        read_chunk(file, slot, index, len, a.reference.id, saved.chunks[index]);
                    if ready_tx.send(piece).is_err() {
                        return;
                    }
                }
            });
        }
        drop(ready_tx);
        let mut loaded = 0;
        while loaded < count {
            let Ok(piece) = ready_rx.recv() else { break };
            let piece = match piece {
                Ok(piece) => piece,
                Err(error) => {
                    stop.store(true, Ordering::SeqCst);
                    first_error.get_or_insert(error);
                    break;
                }
            };
            let target = device_address + (piece.index * CHUNK) as u64;
            if let Err(e) = Stream::scope(d, |stream| {
                stream.copy_to_device(target, &piece.slot[..piece.len])
            }) {
                stop.store(true, Ordering::SeqCst);
                first_error.get_or_insert(e.into());
                break;
            }
            progress::advance(piece.len as u64);
            loaded += 1;
            let _ = free_tx.send(piece.slot);
        }
        // Workers waiting for a slot see the channel closed and end.
        stop.store(true, Ordering::SeqCst);
        drop(free_tx);
        while ready_rx.recv().is_ok() {}
    });
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(checksum_of(a, saved.chunks.to_vec())?)
}

/// Reads chunk `index` (`len` bytes) into `slot` and checks it hashes to `saved`.
fn read_chunk<'s>(
    file: &File,
    slot: &'s mut [u8],
    index: usize,
    len: usize,
    allocation: AllocationId,
    saved: u64,
) -> Result<Piece<'s>, FileError> {
    let offset = (index * CHUNK) as u64;
    let want = aligned(len);
    let mut got = 0;
    // O_DIRECT reads stop at the end of the file: the last block comes back short of `want`.
    while got < len {
        match file.read_at(&mut slot[got..want], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FileError::Io("reading", e)),
        }
    }
    if got < len {
        return Err(FileError::Short {
            offset,
            expected: len,
            got,
        });
    }
    let found = XxHash3_64::oneshot(&slot[..len]);
    if found != saved {
        return Err(TransferError::Mismatch {
            allocation,
            offset,
            len: len as u64,
            saved,
            found,
        }
        .into());
    }
    Ok(Piece { slot, index, len })
}
