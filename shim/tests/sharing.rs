//! Sharing between Rust worker processes under the shim: every worker entry path, the exact
//! records `inspect` reports for a three-process topology, capability checks, raw imports,
//! deduplication, re-export and descriptor hygiene.

mod support;

use cuinterpose_protocol::ticket::{create_ticket, read_ticket};
use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AllocationProperties, AllocationRecord, AllocationReference,
    AllocationType, BoundedVec, CapabilityToken, HandleTypes, InspectionReply, Location,
    MappingRecord, NamespacePid, Phase, Record, RefusalCode, Reply, Request, Ticket,
    VirtualShareableHandle,
};
use cuinterpose_workload::{EntryPath, Grant, Worker};
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::Duration;
use support::{Sandbox, ask, export_request, fake_runtime, inspect, share_program, worker};

const MIB: u64 = 1 << 20;
use cuinterpose_abi::consts::HANDLE_TYPE_POSIX_FD as POSIX;
use cuinterpose_abi::results::CUDA_ERROR_INVALID_HANDLE as INVALID_HANDLE;

fn entry_paths() -> Vec<EntryPath> {
    vec![
        EntryPath::Dlsym,
        EntryPath::Default,
        EntryPath::Next,
        EntryPath::ProcAddress(12030),
        EntryPath::ProcAddress(12000),
        EntryPath::ProcAddress(10020),
        EntryPath::ProcAddressV1(12000),
        EntryPath::Runtime(fake_runtime().to_path_buf()),
    ]
}

/// Creator and importer, both Rust programs reaching the driver through `entry`: bytes cross
/// in both directions and the application only ever sees logical handles.
fn check_share(entry: EntryPath) {
    let sandbox = Sandbox::new("rust-share");
    let mut a = worker(&sandbox, entry.clone(), true);
    let mut b = worker(&sandbox, entry.clone(), true);
    let (handle, va, ticket) = filled_export(&mut a, 4 * MIB, 11);
    assert_eq!(handle >> 48, 0xC0DE, "{entry:?}: {handle:#x}");
    let imported = b.import(ticket.as_fd()).unwrap();
    assert_eq!(imported >> 48, 0xC0DE, "{entry:?}");
    let vb = b.map_rw(imported, 4 * MIB, 0).unwrap();
    b.verify(vb, 4 * MIB, 11).unwrap();
    b.fill(vb, MIB, 12).unwrap();
    a.verify(va, MIB, 12).unwrap();
}

/// A new allocation of `size` bytes in `w`, mapped read-write on device 0 and filled from
/// `seed`, and its export: (handle, address, ticket).
fn filled_export(w: &mut Worker, size: u64, seed: u64) -> (u64, u64, std::os::fd::OwnedFd) {
    let handle = w.create(size, 0, POSIX).unwrap();
    let va = w.map_rw(handle, size, 0).unwrap();
    w.fill(va, size, seed).unwrap();
    (handle, va, w.export(handle).unwrap())
}

#[test]
fn rust_workers_share_through_every_entry_path() {
    for entry in entry_paths() {
        check_share(entry);
    }
}

fn pid(w: &Worker) -> i32 {
    w.worker_pid()
}

fn reference(owner: &Worker, id: cuinterpose_protocol::AllocationId) -> AllocationReference {
    AllocationReference {
        id,
        creator_pid: NamespacePid::new(pid(owner) as u32).unwrap(),
    }
}

fn device_properties() -> AllocationProperties {
    AllocationProperties {
        allocation_type: AllocationType::Pinned,
        location: Location::device(0),
        handle_types: HandleTypes::POSIX_FILE_DESCRIPTOR,
    }
}

fn access(device: i32, flags: AccessFlags) -> AccessDescriptor {
    AccessDescriptor::device(device, flags)
}

fn allocation_record(r: AllocationReference, size: u64, carrier: bool, handles: u64) -> Record {
    Record::Allocation(AllocationRecord {
        allocation: r,
        size,
        properties: device_properties(),
        host_carrier: carrier,
        handle_count: handles,
    })
}

fn mapping_record(
    r: AllocationReference,
    address: u64,
    size: u64,
    offset: u64,
    grants: Vec<AccessDescriptor>,
) -> Record {
    Record::Mapping(MappingRecord {
        allocation: r,
        address,
        size,
        offset,
        access: BoundedVec::try_from(grants).unwrap(),
    })
}

/// `records` as a process that lists `devices` reports them: each device named by its UUID
/// beside the ordinal, sorted.
fn named(mut records: Vec<Record>, devices: &[cuinterpose_protocol::Device]) -> Vec<Record> {
    assert!(
        devices.len() >= 2,
        "fakecuda lists its devices: {devices:?}"
    );
    records.iter_mut().for_each(|r| r.name_devices(devices));
    records.sort();
    records
}

/// Asserts that `process`'s inspection reports exactly `records` (devices named as it lists
/// them).
fn check_records(process: &str, inspection: &InspectionReply, records: Vec<Record>) {
    assert_eq!(
        inspection.records.to_vec(),
        named(records, &inspection.devices),
        "the records of {process}"
    );
}

/// Read-write (3) or read-only (1) access for device `id`, as the worker grants it.
fn device_grant(id: i32, flags: u32) -> Grant {
    Grant {
        location_type: 1,
        id,
        flags,
    }
}

/// The id the creator's shim gave the only shared allocation.
fn shared_id(sandbox: &Sandbox, creator: &Worker) -> cuinterpose_protocol::AllocationId {
    let inspection = inspect(sandbox, pid(creator));
    inspection
        .records
        .iter()
        .find_map(|r| match r {
            Record::Allocation(a) if a.host_carrier => Some(a.allocation.id),
            _ => None,
        })
        .expect("a shared allocation")
}

#[test]
fn inspect_reports_a_three_process_topology_exactly() {
    let sandbox = Sandbox::new("topology");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::ProcAddress(12030), true);
    let mut c = worker(&sandbox, EntryPath::Default, true);
    // A: one shared allocation of 4 MiB, one private of 2 MiB; both mapped read-write.
    let shared = a.create(4 * MIB, 0, POSIX).unwrap();
    let private = a.create(2 * MIB, 0, POSIX).unwrap();
    let va = a.map_rw(shared, 4 * MIB, 0).unwrap();
    let vp = a.map_rw(private, 2 * MIB, 0).unwrap();
    let ticket = a.export(shared).unwrap();
    // B: the whole allocation, read-only for device 0 and read-write for device 1.
    let hb = b.import(ticket.as_fd()).unwrap();
    let vb = b.reserve(4 * MIB).unwrap();
    b.map(vb, 4 * MIB, 0, hb).unwrap();
    b.set_access(vb, 4 * MIB, &[device_grant(0, 1), device_grant(1, 3)])
        .unwrap();
    // C: the second half only, read-write for device 1, and the handle released at once.
    let hc = c.import(ticket.as_fd()).unwrap();
    let vc = c.reserve(2 * MIB).unwrap();
    c.map(vc, 2 * MIB, 2 * MIB, hc).unwrap();
    c.set_access(vc, 2 * MIB, &[device_grant(1, 3)]).unwrap();
    c.release(hc).unwrap();

    let ia = inspect(&sandbox, pid(&a));
    let id = shared_id(&sandbox, &a);
    let private_id = ia
        .records
        .iter()
        .find_map(|r| match r {
            Record::Allocation(x) if !x.host_carrier => Some(x.allocation.id),
            _ => None,
        })
        .unwrap();
    let x = reference(&a, id);
    let p = reference(&a, private_id);
    let rw0 = access(0, AccessFlags::ProtReadWrite);
    assert_eq!(ia.phase, Phase::Active);
    assert_eq!(ia.raw_imports, 0);
    check_records(
        "A",
        &ia,
        vec![
            allocation_record(x.clone(), 4 * MIB, true, 1),
            allocation_record(p.clone(), 2 * MIB, false, 1),
            mapping_record(x.clone(), va, 4 * MIB, 0, vec![rw0.clone()]),
            mapping_record(p, vp, 2 * MIB, 0, vec![rw0]),
        ],
    );
    let b_grants = vec![
        access(0, AccessFlags::ProtRead),
        access(1, AccessFlags::ProtReadWrite),
    ];
    check_records(
        "B",
        &inspect(&sandbox, pid(&b)),
        vec![
            allocation_record(x.clone(), 4 * MIB, false, 1),
            mapping_record(x.clone(), vb, 4 * MIB, 0, b_grants),
        ],
    );
    let c_grants = vec![access(1, AccessFlags::ProtReadWrite)];
    check_records(
        "C",
        &inspect(&sandbox, pid(&c)),
        vec![
            allocation_record(x.clone(), 4 * MIB, false, 0),
            mapping_record(x, vc, 2 * MIB, 2 * MIB, c_grants),
        ],
    );
    // Unmapping C's only mapping drops its record: nothing holds the allocation there any more.
    c.unmap(vc, 2 * MIB).unwrap();
    assert!(inspect(&sandbox, pid(&c)).records.is_empty());
}

#[test]
fn a_wrong_capability_token_gets_no_descriptor() {
    let sandbox = Sandbox::new("token");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::Dlsym, true);
    let handle = a.create(2 * MIB, 0, POSIX).unwrap();
    let ticket_fd = a.export(handle).unwrap();
    let ticket = read_ticket(ticket_fd.as_fd()).unwrap();
    let wrong = CapabilityToken::new([7; 16]).unwrap();
    assert_ne!(ticket.capability, wrong);
    // Asked directly: refused as unauthorized, no descriptor.
    let request = export_request(&ticket, wrong);
    match ask(&sandbox, pid(&a), &request) {
        Reply::Refused(r) => assert_eq!(r.code, RefusalCode::Unauthorized, "{r:?}"),
        other => panic!("{other:?}"),
    }
    // A forged ticket with the wrong token: the import fails and records nothing.
    let forged = create_ticket(&Ticket {
        capability: wrong,
        ..ticket.clone()
    })
    .unwrap();
    let err = b.import(forged.as_fd()).unwrap_err();
    assert_eq!(err.cuda_code(), Some(INVALID_HANDLE), "{err}");
    assert!(inspect(&sandbox, pid(&b)).records.is_empty());
    // A ticket naming a creator that does not exist.
    let orphan = create_ticket(&Ticket {
        handle: VirtualShareableHandle {
            creator_pid: NamespacePid::new(u32::MAX - 7).unwrap(),
            allocation: ticket.handle.allocation,
        },
        ..ticket.clone()
    })
    .unwrap();
    assert_eq!(
        b.import(orphan.as_fd()).unwrap_err().cuda_code(),
        Some(INVALID_HANDLE)
    );
    // The genuine ticket still works.
    b.import(ticket_fd.as_fd()).unwrap();
}

#[test]
fn a_raw_descriptor_import_is_passed_through_and_counted() {
    let sandbox = Sandbox::new("raw");
    let mut plain = worker(&sandbox, EntryPath::Dlsym, false);
    let mut shimmed = worker(&sandbox, EntryPath::Dlsym, true);
    let (_, _, fd) = filled_export(&mut plain, 2 * MIB, 5);
    let raw = shimmed.import(fd.as_fd()).unwrap();
    assert_ne!(raw >> 48, 0xC0DE, "a raw import keeps the driver's handle");
    let vr = shimmed.map_rw(raw, 2 * MIB, 0).unwrap();
    shimmed.verify(vr, 2 * MIB, 5).unwrap();
    assert_eq!(inspect(&sandbox, pid(&shimmed)).raw_imports, 1);
    shimmed.unmap(vr, 2 * MIB).unwrap();
    shimmed.release(raw).unwrap();
    assert_eq!(inspect(&sandbox, pid(&shimmed)).raw_imports, 0);
}

#[test]
fn importing_twice_names_one_record_and_re_export_names_the_creator() {
    let sandbox = Sandbox::new("dedupe");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::Dlsym, true);
    let mut c = worker(&sandbox, EntryPath::Dlsym, true);
    let (handle, _, ticket) = filled_export(&mut a, 2 * MIB, 3);
    let first = b.import(ticket.as_fd()).unwrap();
    let second = b.import(ticket.as_fd()).unwrap();
    let records = inspect(&sandbox, pid(&b)).records;
    let allocations: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Allocation(x) => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(allocations.len(), 1, "{records:?}");
    assert_eq!(allocations[0].handle_count, 2);
    assert_ne!(first, second);
    // B re-exports its import: the ticket still names A, and C reaches A's memory through it.
    let again = b.export(second).unwrap();
    let relayed = read_ticket(again.as_fd()).unwrap();
    assert_eq!(relayed.handle.creator_pid.get(), pid(&a) as u32);
    let hc = c.import(again.as_fd()).unwrap();
    let vc = c.map_rw(hc, 2 * MIB, 0).unwrap();
    c.verify(vc, 2 * MIB, 3).unwrap();
    // The exporter importing its own export gets a handle to its own record.
    let own = a.import(ticket.as_fd()).unwrap();
    assert_ne!(own, handle);
    let records = inspect(&sandbox, pid(&a)).records;
    assert_eq!(
        records
            .iter()
            .filter(|r| matches!(r, Record::Allocation(_)))
            .count(),
        1
    );
}

#[test]
fn sharing_cycles_leak_no_descriptors() {
    let sandbox = Sandbox::new("fds");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::Dlsym, true);
    let cycle = |a: &mut Worker, b: &mut Worker| {
        let handle = a.create(2 * MIB, 0, POSIX).unwrap();
        let va = a.map_rw(handle, 2 * MIB, 0).unwrap();
        let ticket = a.export(handle).unwrap();
        let hb = b.import(ticket.as_fd()).unwrap();
        drop(ticket);
        let vb = b.map_rw(hb, 2 * MIB, 0).unwrap();
        b.unmap(vb, 2 * MIB).unwrap();
        b.free_address(vb, 2 * MIB).unwrap();
        b.release(hb).unwrap();
        a.unmap(va, 2 * MIB).unwrap();
        a.free_address(va, 2 * MIB).unwrap();
        a.release(handle).unwrap();
    };
    cycle(&mut a, &mut b);
    let before = (a.open_fd_count().unwrap(), b.open_fd_count().unwrap());
    for _ in 0..20 {
        cycle(&mut a, &mut b);
    }
    // The creator's handler thread closes the connection and the duplicate FD it sent just
    // after the importer has them: wait for the counts to settle, then compare. `before` may
    // itself hold the first cycle's connection still closing, so fewer is no leak; one
    // descriptor left per cycle would be 20 more.
    let settled = |now: (u64, u64)| now.0 <= before.0 && now.1 <= before.1;
    let settle = std::time::Instant::now();
    let mut now = (a.open_fd_count().unwrap(), b.open_fd_count().unwrap());
    while !settled(now) && settle.elapsed() < cuinterpose_testkit::slack(Duration::from_secs(2)) {
        std::thread::sleep(Duration::from_millis(20));
        now = (a.open_fd_count().unwrap(), b.open_fd_count().unwrap());
    }
    assert!(
        settled(now),
        "descriptors after 20 sharing cycles: {now:?}, before them {before:?}"
    );
    assert!(inspect(&sandbox, pid(&a)).records.is_empty());
    assert!(inspect(&sandbox, pid(&b)).records.is_empty());
}

/// A `share pool|pool-import SOCKET PATH` process (with the shim or without), its stdin and
/// its stdout.
fn pool_process(
    sandbox: &Sandbox,
    role: &str,
    socket: &str,
    shim: bool,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = sandbox
        .command(share_program(), shim)
        .args([role, socket, "dlsym"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, stdin, out)
}

fn said(out: &mut impl std::io::BufRead, what: &str) {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with(what), "expected {what:?}, got {line:?}");
}

/// A device pool exportable as POSIX FDs is the shim's own (the pool adapter): exporting it
/// leaves the process checkpointable, and inspection reports it until it is destroyed. A pool the shim cannot rebuild (imported from a process
/// without the shim) is never silent: inspection refuses, naming it, until it is destroyed.
#[test]
fn shared_memory_pools_are_adapted_or_refused_by_name() {
    use std::io::Write;
    let sandbox = Sandbox::new("pool");
    // The shim's pool: exported, and inspection answers.
    let (mut own, mut stdin, mut out) = pool_process(&sandbox, "pool", "-", true);
    said(&mut out, "exported");
    let inspection = inspect(&sandbox, own.id() as i32);
    match &inspection.records[..] {
        [cuinterpose_protocol::Record::Pool(pool)] => {
            assert_eq!(pool.pool.creator_pid.get(), own.id(), "{pool:?}");
            assert_eq!(pool.device, 0);
        }
        other => panic!("one pool record: {other:?}"),
    }
    writeln!(stdin, "destroy").unwrap();
    said(&mut out, "destroyed");
    let inspection = inspect(&sandbox, own.id() as i32);
    assert!(inspection.records.is_empty(), "{inspection:?}");
    writeln!(stdin, "exit").unwrap();
    assert!(own.wait().unwrap().success());

    // A driver pool from a process without the shim, imported under it.
    let socket = sandbox.root.join("pool.sock");
    let socket = socket.to_str().unwrap();
    let (mut creator, mut creator_in, mut creator_out) =
        pool_process(&sandbox, "pool", socket, false);
    let (mut importer, mut stdin, mut out) = pool_process(&sandbox, "pool-import", socket, true);
    said(&mut creator_out, "exported");
    said(&mut out, "imported");
    let pid = importer.id() as i32;
    match ask(&sandbox, pid, &cuinterpose_protocol::Request::Inspect) {
        cuinterpose_protocol::Reply::Refused(r) => {
            assert_eq!(r.code, cuinterpose_protocol::RefusalCode::Unsupported);
            let message = r.message.as_str();
            assert!(
                message.contains("memory-pool sharing cannot be checkpointed")
                    && message.contains("was imported from another process"),
                "{message}"
            );
        }
        other => panic!("inspection while a foreign pool is imported: {other:?}"),
    }
    writeln!(stdin, "destroy").unwrap();
    said(&mut out, "destroyed");
    let inspection = inspect(&sandbox, pid);
    assert!(inspection.records.is_empty());
    writeln!(stdin, "exit").unwrap();
    writeln!(creator_in, "destroy").unwrap();
    said(&mut creator_out, "destroyed");
    writeln!(creator_in, "exit").unwrap();
    assert!(importer.wait().unwrap().success());
    assert!(creator.wait().unwrap().success());
}

#[test]
fn a_creator_serves_a_series_of_exports_on_one_connection() {
    use cuinterpose_protocol::transport::{Endpoint, ExportSeries, Timeouts};
    use std::io::{Read, Write};
    let sandbox = Sandbox::new("series");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let small = a.create(2 * MIB, 0, POSIX).unwrap();
    let large = a.create(4 * MIB, 0, POSIX).unwrap();
    let small = read_ticket(a.export(small).unwrap().as_fd()).unwrap();
    let large = read_ticket(a.export(large).unwrap().as_fd()).unwrap();
    let ask_for = export_request;
    let endpoint = Endpoint::for_pid(
        &sandbox.control_dir(),
        NamespacePid::new(pid(&a) as u32).unwrap(),
    )
    .unwrap();
    let timeouts = Timeouts::new(Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    let mut series = ExportSeries::connect(&endpoint, &timeouts).unwrap();
    // A refusal in the middle answers that request only; the series goes on.
    let wrong = CapabilityToken::new([7; 16]).unwrap();
    for request in [
        ask_for(&small, small.capability),
        ask_for(&large, wrong),
        ask_for(&large, large.capability),
    ] {
        series.send(&request).unwrap();
    }
    let sizes: Vec<_> = (0..3)
        .map(|_| match series.receive().unwrap() {
            (Reply::UnicastExport(e), Some(_fd)) => Ok(e.size),
            (Reply::Refused(r), None) => Err(r.code),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        sizes,
        vec![Ok(2 * MIB), Err(RefusalCode::Unauthorized), Ok(4 * MIB)]
    );
    drop(series);
    // Anything but an export after an export is refused as invalid, and the connection ends.
    let mut stream = std::os::unix::net::UnixStream::connect(endpoint.path()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut bytes = Vec::new();
    for request in [ask_for(&small, small.capability), Request::Inspect] {
        let body = cuinterpose_protocol::encode(&request).unwrap();
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&body);
    }
    stream.write_all(&bytes).unwrap();
    let mut replies = Vec::new();
    let mut everything = Vec::new();
    stream.read_to_end(&mut everything).unwrap();
    let mut rest = &everything[..];
    while rest.len() >= 4 {
        let length = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        replies.push(cuinterpose_protocol::decode::<Reply>(&rest[4..4 + length]).unwrap());
        rest = &rest[4 + length..];
    }
    assert!(rest.is_empty(), "a partial frame: {rest:?}");
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert!(matches!(replies[0], Reply::UnicastExport(_)), "{replies:?}");
    match &replies[1] {
        Reply::Refused(r) => {
            assert_eq!(r.code, RefusalCode::Invalid);
            assert!(
                r.message.as_str().contains("only exports form a series"),
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The shim serves on.
    assert_eq!(inspect(&sandbox, pid(&a)).phase, Phase::Active);
}
