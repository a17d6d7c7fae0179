//! Thin wrappers over the OS calls that back the fake device: memfds for physical memory,
//! anonymous `PROT_NONE` mappings for address reservations, shared file mappings for
//! `cuMemMap`, `mprotect` for access. The `unsafe fn`s here take raw address ranges; their
//! callers own those ranges through the VMM tables.

use crate::error::{CuError, CuResult};
use nix::sys::memfd::{MFdFlags, memfd_create};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Allocation and mapping granularity by default: 2 MiB, as the driver reports for current
/// GPUs.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
static GRANULARITY: AtomicU64 = AtomicU64::new(DEFAULT_GRANULARITY);
/// Threads one large copy is split over (set by `cuInit`).
static COPY_THREADS: AtomicUsize = AtomicUsize::new(1);

/// Allocation and mapping granularity (`FAKECUDA_GRANULARITY_KIB`, read by `cuInit`).
pub fn granularity() -> u64 {
    GRANULARITY.load(Ordering::Relaxed)
}

/// How many threads a large copy is split over (`FAKECUDA_COPY_THREADS`).
pub fn copy_threads() -> usize {
    COPY_THREADS.load(Ordering::Relaxed)
}

/// Sets both at `cuInit`, before anything is allocated.
pub fn configure(granularity: u64, copy_threads: usize) {
    GRANULARITY.store(granularity, Ordering::Relaxed);
    COPY_THREADS.store(copy_threads.max(1), Ordering::Relaxed);
}

/// Orders changes of the fake device's address space against copies into it. A copy holds a
/// read guard from the moment its ranges were validated until its bytes have moved; every
/// unmap, remap or protection change of a device range takes the write guard. So a copy that
/// races an unmap either finishes first or is refused as the driver refuses a copy to an
/// unmapped range: it never touches memory that went away (which was a SIGSEGV).
///
/// Lock order: the driver lock, then this (both sides take the driver lock first).
static ADDRESS_SPACE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by a copy while it moves bytes (see [`ADDRESS_SPACE`]).
pub type CopyGuard = std::sync::RwLockReadGuard<'static, ()>;

/// A read guard for one copy.
pub fn copy_guard() -> CopyGuard {
    ADDRESS_SPACE.read().unwrap_or_else(|p| p.into_inner())
}

fn change_guard() -> std::sync::RwLockWriteGuard<'static, ()> {
    ADDRESS_SPACE.write().unwrap_or_else(|p| p.into_inner())
}

/// Host protection for a CUDA access flag set (0 none, 1 read, 3 read-write).
pub fn prot_for(flags: u32) -> i32 {
    match flags {
        0 => libc::PROT_NONE,
        1 => libc::PROT_READ,
        _ => libc::PROT_READ | libc::PROT_WRITE,
    }
}

pub fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

fn last_os_error() -> CuError {
    CuError::from(nix::Error::last())
}

/// Reserves `size` bytes of address space, `PROT_NONE`. A hint is honoured when that range is
/// free (`MAP_FIXED_NOREPLACE`); otherwise, as CUDA, any suitably aligned range is returned.
pub fn reserve(hint: u64, size: u64, align: u64) -> CuResult<u64> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let len = usize::try_from(size).map_err(|_| CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
    if hint != 0 && hint.is_multiple_of(align) {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; on success the new
        // range is owned by the caller's reservation table.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                flags | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            if p as u64 == hint {
                return Ok(hint);
            }
            // Old kernels ignore the flag and treat the address as a plain hint.
            // SAFETY: `p` is the fresh mapping just created above, owned by nobody else.
            unsafe { libc::munmap(p, len) };
        }
    }
    let over = len
        .checked_add(usize::try_from(align).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)?)
        .ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address; it overlaps nothing.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), over, libc::PROT_NONE, flags, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(last_os_error());
    }
    let start = p as u64;
    let aligned = round_up(start, align).ok_or(CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
    let head = (aligned - start) as usize;
    let tail = over - head - len;
    if head > 0 {
        // SAFETY: trims the unaligned head of the mapping created above.
        unsafe { libc::munmap(p, head) };
    }
    if tail > 0 {
        // SAFETY: trims the tail past the aligned range, still inside the mapping above.
        unsafe { libc::munmap((aligned + size) as *mut libc::c_void, tail) };
    }
    Ok(aligned)
}

/// Returns a reservation to the OS.
///
/// # Safety
/// `[addr, addr+size)` must be a reservation owned by the caller, with no live references.
pub unsafe fn unreserve(addr: u64, size: u64) {
    let _change = change_guard();
    // SAFETY: guaranteed by the caller.
    unsafe { libc::munmap(addr as *mut libc::c_void, size as usize) };
}

/// Replaces whatever is mapped in the range by inaccessible anonymous memory, keeping the
/// address range reserved.
///
/// # Safety
/// The range must lie inside a reservation owned by the caller.
pub unsafe fn unmap_to_reservation(addr: u64, size: u64) -> CuResult<()> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    let _change = change_guard();
    // SAFETY: MAP_FIXED over a range the caller owns.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CuError::CUDA_ERROR_UNMAP_FAILED);
    }
    Ok(())
}

/// Maps `size` bytes of `fd` at `offset` over `[addr, addr+size)`, shared, with `prot`.
///
/// # Safety
/// The range must lie inside a reservation owned by the caller.
pub unsafe fn map_shared(
    addr: u64,
    size: u64,
    fd: BorrowedFd<'_>,
    offset: u64,
    prot: i32,
) -> CuResult<()> {
    let _change = change_guard();
    // SAFETY: MAP_FIXED over a range the caller owns; the file outlives the call and the
    // kernel keeps its own reference for the mapping.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            size as usize,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CuError::CUDA_ERROR_MAP_FAILED);
    }
    Ok(())
}

/// A fresh shared read-write mapping of `fd`'s first `len` bytes at an address the kernel
/// picks (a page two processes share); `None` when the kernel refuses.
pub fn map_page(fd: BorrowedFd<'_>, len: usize) -> Option<*mut libc::c_void> {
    // SAFETY: a new mapping at a kernel-chosen address: no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

/// Changes the protection of a mapped range.
///
/// # Safety
/// The range must be mapped memory owned by the caller.
pub unsafe fn protect(addr: u64, size: u64, prot: i32) -> CuResult<()> {
    let _change = change_guard();
    // SAFETY: guaranteed by the caller.
    let r = unsafe { libc::mprotect(addr as *mut libc::c_void, size as usize, prot) };
    if r != 0 {
        return Err(last_os_error());
    }
    Ok(())
}

/// A memfd of `size` bytes, named so an importer can tell what it holds.
pub fn new_memfd(name: &str, size: u64) -> CuResult<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC)?;
    nix::unistd::ftruncate(
        &fd,
        i64::try_from(size).map_err(|_| CuError::CUDA_ERROR_OUT_OF_MEMORY)?,
    )?;
    Ok(fd)
}

/// The name a memfd was created with (from `/proc/self/fd`), or `None` for other files.
pub fn memfd_name(fd: BorrowedFd<'_>) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let s = link.to_str()?;
    let rest = s.strip_prefix("/memfd:")?;
    Some(rest.strip_suffix(" (deleted)").unwrap_or(rest).to_owned())
}

pub fn file_size(fd: BorrowedFd<'_>) -> CuResult<u64> {
    let st = nix::sys::stat::fstat(fd)?;
    u64::try_from(st.st_size).map_err(|_| CuError::CUDA_ERROR_INVALID_VALUE)
}

/// Reads a whole file into host memory (checkpoint).
pub fn read_all(fd: impl AsFd, size: u64) -> CuResult<Vec<u8>> {
    let len = usize::try_from(size).map_err(|_| CuError::CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = nix::sys::uio::pread(fd.as_fd(), &mut buf[done..], done as i64)?;
        if n == 0 {
            return Err(CuError::CUDA_ERROR_OPERATING_SYSTEM);
        }
        done += n;
    }
    Ok(buf)
}

/// Writes host bytes back into a file (restore).
pub fn write_all(fd: impl AsFd, bytes: &[u8]) -> CuResult<()> {
    let mut done = 0;
    while done < bytes.len() {
        let n = nix::sys::uio::pwrite(fd.as_fd(), &bytes[done..], done as i64)?;
        done += n;
    }
    Ok(())
}

/// The little-endian u64 at `at` in `b` (handles and exported names are laid out so).
pub fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A duplicate of `fd` for handing out (exports): a new close-on-exec descriptor every time.
pub fn dup_cloexec(fd: BorrowedFd<'_>) -> CuResult<OwnedFd> {
    fd.try_clone_to_owned()
        .map_err(|e| CuError::from(nix::Error::from_raw(e.raw_os_error().unwrap_or(0))))
}
