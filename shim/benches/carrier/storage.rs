//! The carrier bench's storage mode (`CUINTERPOSE_BENCH_CARRIER=storage`): which directory and
//! window, the plain write and read it is measured against, and its table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Fresh, MIB};

/// Which carrier this run measures.
#[derive(Clone)]
pub enum Carrier {
    Host,
    Storage { dir: PathBuf, staging: u64 },
}

pub fn carrier() -> Carrier {
    match std::env::var("CUINTERPOSE_BENCH_CARRIER").as_deref() {
        Ok("storage") => {
            let dir = std::env::var_os("CUINTERPOSE_BENCH_DIR").map_or_else(
                || {
                    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join("../target/cuinterpose-bench-storage")
                },
                PathBuf::from,
            );
            let mib: u64 = std::env::var("CUINTERPOSE_BENCH_STAGING_MIB").map_or(256, |v| {
                v.parse().expect("CUINTERPOSE_BENCH_STAGING_MIB: MiB")
            });
            Carrier::Storage {
                dir,
                staging: mib << 20,
            }
        }
        Ok("host") | Err(_) => Carrier::Host,
        Ok(other) => panic!("CUINTERPOSE_BENCH_CARRIER: host or storage, not {other}"),
    }
}

/// `source` written to `path` in 64 MiB writes, then synced (`dd bs=64M conv=fsync`).
pub fn plain_write(path: &Path, source: &[u8]) {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path).unwrap();
    for block in source.chunks(64 * MIB) {
        file.write_all(block).unwrap();
    }
    file.sync_all().unwrap();
}

/// `path` read in 64 MiB `O_DIRECT` reads into fresh memory (`dd iflag=direct bs=64M`),
/// kept until the clock stops.
pub fn plain_read(path: &Path, size: usize) -> Fresh {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let mut fresh = Fresh::anonymous(size.next_multiple_of(2 * MIB), 1);
    let mut done = 0;
    let target = fresh.slice();
    while done < size {
        let len = (64 * MIB).min(target.len() - done);
        let n =
            std::os::unix::fs::FileExt::read_at(&file, &mut target[done..done + len], done as u64)
                .unwrap();
        assert!(n > 0, "the plain file ends early");
        done += n;
    }
    fresh
}

/// The storage sweep's table, from the medians `get` gives and each size's `peaks`.
pub fn report(
    dir: &Path,
    staging: u64,
    sizes: &BTreeSet<usize>,
    get: impl Fn(usize, &str) -> Duration,
    peaks: &BTreeMap<usize, u64>,
) {
    let gbps = |size: usize, took: Duration| size as f64 / 1e9 / took.as_secs_f64();
    println!(
        "\nstorage carrier sweep in {} (window {} MiB; medians of this run; GB/s; ratio = plain \
         time / carrier time; peak = carrier host memory / bytes):",
        dir.display(),
        staging >> 20
    );
    println!(
        "{:>9} | {:>6} {:>6} | {:>6} {:>6} {:>6} | {:>11} {:>11} {:>11} | {:>9}",
        "MiB",
        "save",
        "load",
        "write",
        "read",
        "fill",
        "save/write",
        "load/read",
        "load/floor",
        "peak"
    );
    for &size in sizes {
        let (save, load) = (get(size, "save"), get(size, "load"));
        let (write, read) = (get(size, "limit_write"), get(size, "limit_read"));
        let fill = get(size, "limit_memfd");
        println!(
            "{:>9} | {:>6.2} {:>6.2} | {:>6.2} {:>6.2} {:>6.2} | {:>10.2}x {:>10.2}x {:>10.2}x | {:>8.3}x",
            size / MIB,
            gbps(size, save),
            gbps(size, load),
            gbps(size, write),
            gbps(size, read),
            gbps(size, fill),
            write.as_secs_f64() / save.as_secs_f64(),
            read.as_secs_f64() / load.as_secs_f64(),
            read.max(fill).as_secs_f64() / load.as_secs_f64(),
            peaks.get(&size).copied().unwrap_or(0) as f64 / size as f64,
        );
    }
}
