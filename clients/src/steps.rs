//! Small driver sequences the scenarios share (each a few worker calls).

use crate::names::{GRAN, POSIX};
use cuinterpose_workload::Worker;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// `cuMemCreate` of one POSIX-exportable granule on `device`, mapped read-write for it and
/// filled with the pattern of `seed`: (handle, address).
pub fn exportable(w: &mut Worker, device: i32, seed: u64) -> (u64, u64) {
    let handle = w.create(GRAN, device, POSIX).expect("cuMemCreate");
    let address = w.map_rw(handle, GRAN, device).expect("map");
    w.fill(address, GRAN, seed).expect("fill");
    (handle, address)
}

/// [`exportable`], then exported as a POSIX FD: (handle, address, FD).
pub fn exported(w: &mut Worker, device: i32, seed: u64) -> (u64, u64, OwnedFd) {
    let (handle, address) = exportable(w, device, seed);
    let fd = w.export(handle).expect("export");
    (handle, address, fd)
}

/// `writer` fills the granule at `written` with the pattern of `seed` and `reader` must read
/// that pattern at `read`: both map the same memory.
pub fn crosses(writer: &mut Worker, written: u64, reader: &mut Worker, read: u64, seed: u64) {
    writer.fill(written, GRAN, seed).expect("fill");
    reader.verify(read, GRAN, seed).expect("the writer's bytes");
}

/// Reserves a granule, maps `handle` there and grants `device` read-write: the address.
pub fn map_granule(w: &mut Worker, handle: u64, device: i32) -> u64 {
    w.map_rw(handle, GRAN, device).expect("map")
}

/// `cuMemUnmap` + `cuMemAddressFree` of a range mapped by [`map_granule`] or `map_rw`.
pub fn unmap_free(w: &mut Worker, address: u64, size: u64) {
    w.unmap(address, size).expect("cuMemUnmap");
    w.free_address(address, size).expect("cuMemAddressFree");
}

/// [`unmap_free`] of the granule at `address`, then `cuMemRelease` of `handle`.
pub fn unmap_release(w: &mut Worker, address: u64, handle: u64) {
    unmap_free(w, address, GRAN);
    w.release(handle).expect("cuMemRelease");
}

/// `from` exports `handle` as a POSIX FD and `to` imports it; the FD is closed at once: `to`'s
/// handle.
pub fn share(from: &mut Worker, to: &mut Worker, handle: u64) -> u64 {
    let fd = from.export(handle).expect("export");
    to.import(fd.as_fd()).expect("import")
}

/// `from` exports `handle` as a POSIX FD and sends it to `to`, which keeps it (SCM_RIGHTS
/// without an import); the FD is closed here at once: its number in `to`'s table.
pub fn hand_over(from: &mut Worker, handle: u64, to: &mut Worker) -> i32 {
    let fd = from.export(handle).expect("export");
    to.hold_fd(fd.as_fd()).expect("receive the FD")
}

/// torch symmetric memory's pattern: `owner` exports `handle` and imports its own export, as
/// `peer` does from the same FD, which is closed then: (the owner's import, the peer's).
pub fn import_own_export(owner: &mut Worker, peer: &mut Worker, handle: u64) -> (u64, u64) {
    let fd = owner.export(handle).expect("export");
    let own = owner
        .import(fd.as_fd())
        .expect("the exporter imports its own FD");
    let theirs = peer.import(fd.as_fd()).expect("import");
    (own, theirs)
}

/// The worker's open descriptor count, waiting up to 2 s for it to become `expected`: a
/// peer's connection to the shim's socket (an import asking this creator for its FD) lingers a
/// moment after the peer got its answer.
pub fn settled_fd_count(w: &mut Worker, expected: u64) -> u64 {
    settled(&expected, Duration::from_secs(2), || {
        w.open_fd_count().expect("count descriptors")
    })
}

/// Reads `read()` every 20 ms until it gives `expected` or `timeout` has passed: the last
/// reading.
pub fn settled<T: PartialEq>(expected: &T, timeout: Duration, mut read: impl FnMut() -> T) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let now = read();
        if now == *expected || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The worker's open descriptor count once no peer connection lingers (the least of a few
/// readings 50 ms apart), for a baseline.
pub fn quiet_fd_count(w: &mut Worker) -> u64 {
    (0..3)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(50));
            }
            w.open_fd_count().expect("count descriptors")
        })
        .min()
        .expect("three readings")
}
