//! A host copy that races an unmap or an access revocation of its device range gets the
//! driver's error, never a signal: threads of real clients keep copying while others tear
//! memory down (and the shim unmaps shared ranges during a checkpoint).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use support::*;

const CHUNK: usize = 64 << 10;

/// What the copier saw: successful copies and refused ones (by code).
#[derive(Debug, Default)]
struct Seen {
    copied: u64,
    refused: Vec<u32>,
}

/// Copies into and out of `[p, p + GRAN)` in `CHUNK`s until `stop`.
fn copier(ctx: usize, p: u64, stop: Arc<AtomicBool>) -> Seen {
    let cu = cuda();
    ok(cu.cuCtxSetCurrent(ctx));
    let mut seen = Seen::default();
    let mut host = vec![7u8; CHUNK];
    let mut offset = 0;
    while !stop.load(Ordering::Relaxed) {
        let at = p + offset as u64;
        let r = if (offset / CHUNK).is_multiple_of(2) {
            cu.cuMemcpyHtoD_v2(at, host.as_ptr().cast(), CHUNK)
        } else {
            cu.cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), at, CHUNK)
        };
        match r {
            SUCCESS => seen.copied += 1,
            code => seen.refused.push(code),
        }
        offset = (offset + CHUNK) % GRAN;
    }
    seen
}

/// Runs `rounds` races of a copier against `teardown(p)` on a freshly mapped range.
fn check(rounds: usize, teardown: impl Fn(&Cuda, u64), expected: &[u32]) {
    let cu = cuda();
    let ctx = cu.setup(0);
    let mut total = Seen::default();
    for _ in 0..rounds {
        let h = cu.create(GRAN, 0, 0);
        let p = cu.map_rw(h, GRAN, 0);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || copier(ctx, p, stop))
        };
        std::thread::sleep(std::time::Duration::from_micros(300));
        teardown(cu, p);
        std::thread::sleep(std::time::Duration::from_micros(300));
        stop.store(true, Ordering::Relaxed);
        let seen = thread.join().expect("the copier survives");
        total.copied += seen.copied;
        total.refused.extend(seen.refused);
        // Whatever state the range is in, it can be torn down completely.
        let _ = cu.cuMemUnmap(p, GRAN);
        ok(cu.cuMemAddressFree(p, GRAN));
        ok(cu.cuMemRelease(h));
    }
    assert!(total.copied > 0, "some copies ran before the teardown");
    assert!(
        !total.refused.is_empty(),
        "some copies came after the teardown and were refused"
    );
    for code in &total.refused {
        assert!(
            expected.contains(code),
            "a copy after teardown returned {code}, expected one of {expected:?}"
        );
    }
}

#[test]
fn copies_racing_an_unmap_are_refused_not_killed() {
    let _serial = serial();
    check(40, |cu, p| ok(cu.cuMemUnmap(p, GRAN)), &[INVALID_VALUE]);
}

#[test]
fn copies_racing_an_access_revocation_are_refused_not_killed() {
    let _serial = serial();
    // Flags 0: no access for device 0 any more.
    check(40, |cu, p| ok(cu.grant(p, GRAN, 0, 0)), &[ILLEGAL_ADDRESS]);
}
