//! Host carriers across whole toggles (native checkpoint and restore through fakecuda): a save
//! reads through the application's own mapping where one covers the allocation readable, and
//! through an alias otherwise (a partial or read-only mapping); the `completed` replies time the
//! transfers, give the carrier's peak memory and the XXH3-64 of every 64 MiB chunk (the load's
//! the same as the save's); with `CUINTERPOSE_KEEP_CARRIER=1` later toggles reuse the
//! carrier's memory and still keep every byte, also when the carried set grows past it.

mod support;

use cuinterpose_protocol::{CompletedReply, ExecuteRequest, Operation, Reply, Request};
use cuinterpose_workload::{EntryPath, Worker};
use std::os::fd::AsFd;
use support::{Sandbox, ask, worker_with};

const MIB: u64 = 1 << 20;

/// One shared allocation of `creator`, imported and mapped by `importer`.
struct Shared {
    creator_va: u64,
    importer_va: u64,
    size: u64,
}

/// Shares `size` bytes; the creator maps `mapped` of them (all, or a part: the save then
/// needs an alias), read-write.
fn share(creator: &mut Worker, importer: &mut Worker, size: u64, mapped: u64) -> Shared {
    let handle = creator.create(size, 0, 1).expect("create");
    let creator_va = creator.map_rw(handle, mapped, 0).expect("creator maps");
    let ticket = creator.export(handle).expect("export");
    let imported = importer.import(ticket.as_fd()).expect("import");
    let importer_va = importer.map_rw(imported, size, 0).expect("importer maps");
    Shared {
        creator_va,
        importer_va,
        size,
    }
}

/// Every operation of a toggle with the native checkpoint between; the creator's copy
/// replies.
fn toggle(sandbox: &Sandbox, creator: i32, importer: i32) -> Vec<CompletedReply> {
    use Operation as O;
    let pids = [creator, importer];
    for pid in pids {
        assert!(matches!(
            ask(sandbox, pid, &Request::BeginCheckpoint),
            Reply::Inspection(_)
        ));
    }
    let mut copies = Vec::new();
    let mut run = |operations: &[O]| {
        for &operation in operations {
            for pid in pids {
                match ask(
                    sandbox,
                    pid,
                    &Request::Execute(ExecuteRequest::host(operation)),
                ) {
                    Reply::Completed(done) => {
                        let copy = matches!(operation, O::SaveAllocations | O::LoadAllocations);
                        assert!(
                            (done.copy_ns > 0) == (copy && done.bytes > 0),
                            "{operation} in {pid}: {done:?}"
                        );
                        if pid == creator && copy {
                            copies.push(done);
                        } else {
                            assert!(done.checksums.is_empty(), "{operation} in {pid}: {done:?}");
                            assert_eq!(done.peak_carrier_bytes, 0, "{operation} in {pid}");
                        }
                    }
                    other => panic!("{operation} in {pid}: {other:?}"),
                }
            }
        }
    };
    run(&cuinterpose_protocol::CAPTURE_OPERATIONS);
    for pid in pids {
        support::native(sandbox, pid, "lock");
        support::native(sandbox, pid, "checkpoint");
    }
    for pid in pids {
        support::native(sandbox, pid, "restore");
        support::native(sandbox, pid, "unlock");
    }
    run(&cuinterpose_protocol::RESTORE_OPERATIONS);
    // The verifying inspection, which lets the application's calls go on.
    for pid in pids {
        support::inspect(sandbox, pid);
    }
    copies
}

/// Both processes read `seed`'s pattern where each maps `shared` (the creator the `mapped`
/// bytes it maps, which start the allocation).
fn check_bytes(
    creator: &mut Worker,
    importer: &mut Worker,
    shared: &Shared,
    mapped: u64,
    seed: u64,
) {
    importer
        .verify(shared.importer_va, shared.size, seed)
        .expect("the importer reads the saved bytes");
    creator
        .verify(shared.creator_va, mapped, seed)
        .expect("the creator's mapping shows the same bytes");
}

/// The save's and the load's checksums are the same, one per carried allocation, each the
/// XXH3-64 of its 64 MiB chunks of `seed`'s pattern (allocations of `sizes`).
fn check_checksums(copies: &[CompletedReply], sizes: &[u64], seed: u64) {
    let (save, load) = (&copies[0].checksums, &copies[1].checksums);
    assert_eq!(save, load, "the load hashed what the save did");
    let mut expected: Vec<(u64, Vec<u64>)> = sizes
        .iter()
        .map(|&size| {
            let bytes = cuinterpose_workload::pattern(seed, size as usize);
            let chunks = bytes.chunks(64 << 20).map(twox_hash::XxHash3_64::oneshot);
            (size, chunks.collect())
        })
        .collect();
    let mut found: Vec<(u64, Vec<u64>)> = save
        .iter()
        .map(|c| {
            assert_eq!(c.chunk_bytes, 64 << 20, "{c:?}");
            (c.size, c.chunks.to_vec())
        })
        .collect();
    expected.sort();
    found.sort();
    assert_eq!(found, expected);
}

fn check(env: &[(&str, &str)], toggles: u64) {
    let sandbox = Sandbox::new("carrier");
    let mut creator = worker_with(&sandbox, EntryPath::Dlsym, true, env);
    let mut importer = worker_with(&sandbox, EntryPath::Dlsym, true, env);
    let (c, i) = (creator.worker_pid(), importer.worker_pid());
    // Mapped whole by its creator (read through that mapping), and mapped in part (an alias).
    let whole = share(&mut creator, &mut importer, 8 * MIB, 8 * MIB);
    let part = share(&mut creator, &mut importer, 4 * MIB, 2 * MIB);
    let mut carried = 12 * MIB;
    let mut grown: Vec<Shared> = Vec::new();
    for round in 0..toggles {
        let seed = 40 + round;
        for s in [&whole, &part].into_iter().chain(&grown) {
            importer.fill(s.importer_va, s.size, seed).expect("fill");
        }
        let copies = toggle(&sandbox, c, i);
        assert_eq!(
            copies
                .iter()
                .map(|done| (done.operation, done.bytes))
                .collect::<Vec<_>>(),
            [
                (Operation::SaveAllocations, carried),
                (Operation::LoadAllocations, carried)
            ]
        );
        let sizes: Vec<u64> = [&whole, &part]
            .into_iter()
            .chain(&grown)
            .map(|s| s.size)
            .collect();
        check_checksums(&copies, &sizes, seed);
        let kept = env.contains(&("CUINTERPOSE_KEEP_CARRIER", "1"));
        for done in &copies {
            // The arena holds the carried bytes; a kept one may be larger.
            assert!(
                done.peak_carrier_bytes == carried || kept && done.peak_carrier_bytes > carried,
                "{done:?}"
            );
        }
        check_bytes(&mut creator, &mut importer, &whole, 8 * MIB, seed);
        check_bytes(&mut creator, &mut importer, &part, 2 * MIB, seed);
        for s in &grown {
            check_bytes(&mut creator, &mut importer, s, 2 * MIB, seed);
        }
        // The next toggle carries more than the kept memory holds.
        grown.push(share(&mut creator, &mut importer, 2 * MIB, 2 * MIB));
        carried += 2 * MIB;
    }
}

#[test]
fn saves_read_through_the_application_or_an_alias_and_keep_bytes() {
    check(&[], 2);
}

#[test]
fn a_kept_carrier_is_reused_and_keeps_bytes() {
    check(&[("CUINTERPOSE_KEEP_CARRIER", "1")], 3);
}

/// An allocation of three chunks (two of 64 MiB and a shorter one), read through an alias:
/// a checksum per chunk.
#[test]
fn a_large_allocation_is_checksummed_chunk_by_chunk() {
    let sandbox = Sandbox::new("carrier");
    let mut creator = worker_with(&sandbox, EntryPath::Dlsym, true, &[]);
    let mut importer = worker_with(&sandbox, EntryPath::Dlsym, true, &[]);
    let (c, i) = (creator.worker_pid(), importer.worker_pid());
    let large = share(&mut creator, &mut importer, 130 * MIB, 2 * MIB);
    importer
        .fill(large.importer_va, large.size, 9)
        .expect("fill");
    let copies = toggle(&sandbox, c, i);
    assert_eq!(copies[0].checksums[0].chunks.len(), 3);
    check_checksums(&copies, &[130 * MIB], 9);
    check_bytes(&mut creator, &mut importer, &large, 2 * MIB, 9);
}
