//! A client that never reads its reply.

use super::*;

#[test]
fn a_client_that_never_reads_its_reply_holds_up_nobody() {
    let _serial = serial();
    let mut target = Target::new("reader");
    // Enough records that an inspection reply cannot fit in a socket buffer: one allocation
    // mapped at many addresses.
    let handle = target.worker.create(2 * MIB, 0, POSIX).unwrap();
    let started = Instant::now();
    let mut addresses = Vec::new();
    for _ in 0..2500 {
        addresses.push(target.worker.map_rw(handle, 2 * MIB, 0).unwrap());
    }
    let mapped = started.elapsed();
    let reply = call(
        &target.endpoint(),
        &Request::Inspect,
        None,
        Duration::from_secs(10),
    )
    .unwrap()
    .0;
    let size = cuinterpose_protocol::encode(&reply).unwrap().len();
    assert!(size > 256 << 10, "an inspection of {size} bytes");
    target.rebaseline();

    // Nine clients ask for an inspection and never read it (more than the control queue
    // holds). The coordinator's inspect must still be answered within the second.
    let inspect = frame(&encoded(&Request::Inspect));
    let stalled: Vec<UnixStream> = (0..9)
        .map(|_| {
            let mut s = target.connect();
            s.write_all(&inspect).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let took = target.inspect_within(&format!(
        "with 9 unread inspections of {size} bytes (mapped in {mapped:?})"
    ));
    drop(stalled);
    target.check_healthy("unread replies");
    println!("inspect answered in {took:?} beside 9 unread {size}-byte replies");
}
