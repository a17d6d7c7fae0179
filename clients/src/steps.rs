//! Small driver sequences the scenarios share (each a few worker calls).

use crate::{GRAN, POSIX};
use cuinterpose_workload::Worker;
use std::time::{Duration, Instant};

/// `cuMemCreate` of one POSIX-exportable granule on `device`, mapped read-write for it and
/// filled with the pattern of `seed`: (handle, address).
pub fn exportable(w: &mut Worker, device: i32, seed: u64) -> (u64, u64) {
    let handle = w.create(GRAN, device, POSIX).expect("cuMemCreate");
    let address = w.map_rw(handle, GRAN, device).expect("map");
    w.fill(address, GRAN, seed).expect("fill");
    (handle, address)
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

/// `cuMemImportFromShareableHandle` of the worker's own descriptor `fd` (POSIX), which it keeps.
pub fn import_number(w: &mut Worker, fd: i32) -> Result<u64, cuinterpose_workload::WorkloadError> {
    w.import_with(
        &cuinterpose_workload::Command::Import {
            handle_type: POSIX,
            fd: Some(fd),
            shareable: None,
            keep: false,
        },
        None,
    )
    .map(|(handle, _)| handle)
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
