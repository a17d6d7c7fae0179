//! The coordinator's control plane for 8 processes × 1000 shared allocations (each created by
//! one participant and imported by the next): `prepare` (inspect, validate, begin, the three
//! capture phases, publish the state) and `restore` (load and check the state, the six
//! restore phases, the final comparison), against fake shims on real sockets that copy
//! nothing. The baseline, measured in the same run, is one `inspect` broadcast of the same
//! records: the messaging no coordinator can avoid.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cuinterpose_coordinator::commands;
use cuinterpose_coordinator::session::Session;
use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_protocol::{
    AllocationId, AllocationRecord, AllocationReference, BoundedVec, MappingRecord, NamespacePid,
    Record,
};
use cuinterpose_testkit::fixtures::{TempDir, properties, read_write};

const PROCESSES: u32 = 8;
const ALLOCATIONS: u32 = 1000;
const SIZE: u64 = 2 << 20;

fn reference(creator: u32, n: u32) -> AllocationReference {
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&creator.to_le_bytes());
    bytes[4..8].copy_from_slice(&n.to_le_bytes());
    bytes[15] = 1;
    AllocationReference {
        id: AllocationId::new(bytes).unwrap(),
        creator_pid: NamespacePid::new(creator).unwrap(),
    }
}

fn records_of(pid: u32) -> Vec<Record> {
    let previous = if pid == 101 { 100 + PROCESSES } else { pid - 1 };
    let mut records = Vec::new();
    for (creator, carrier) in [(pid, true), (previous, false)] {
        for n in 0..ALLOCATIONS {
            let allocation = reference(creator, n);
            records.push(Record::Allocation(AllocationRecord {
                allocation: allocation.clone(),
                size: SIZE,
                properties: properties(),
                host_carrier: carrier,
                handle_count: 1,
            }));
            records.push(Record::Mapping(MappingRecord {
                allocation,
                address: 0x7f00_0000_0000 + u64::from(n) * SIZE + if carrier { 0 } else { 1 << 40 },
                size: SIZE,
                offset: 0,
                access: BoundedVec::try_from(vec![read_write(0)]).unwrap(),
            }));
        }
    }
    records.sort();
    records
}

fn bench(c: &mut Criterion) {
    let control = TempDir::new("bench-control").unwrap();
    let topology: BTreeMap<NamespacePid, Vec<Record>> = (101..101 + PROCESSES)
        .map(|pid| (NamespacePid::new(pid).unwrap(), records_of(pid)))
        .collect();
    let _shims = support::start_all(control.path(), &topology, None);
    let pids: Vec<NamespacePid> = topology.keys().copied().collect();
    let session = Session::open(control.path(), &pids, Timeouts::from_env().unwrap()).unwrap();
    let mut quiet = |_: &cuinterpose_coordinator::events::Event| {};

    let mut group = c.benchmark_group("control_plane_8x1000");
    group.sample_size(10);
    group.bench_function("inspect_broadcast_baseline", |b| {
        b.iter(|| assert_eq!(session.inspect().len(), PROCESSES as usize))
    });
    // Each iteration runs a whole prepare + restore (the fake shims must return to active);
    // only the named half is timed.
    let mut cycle = |time_prepare: bool| {
        let dir = TempDir::new("bench-state").unwrap();
        let started = Instant::now();
        commands::prepare(&session, dir.path(), &mut quiet).unwrap();
        let prepare = started.elapsed();
        let started = Instant::now();
        commands::restore(&session, dir.path(), &mut quiet).unwrap();
        let restore = started.elapsed();
        if time_prepare { prepare } else { restore }
    };
    group.bench_function("prepare", |b| {
        b.iter_custom(|iterations| (0..iterations).map(|_| cycle(true)).sum::<Duration>())
    });
    group.bench_function("restore", |b| {
        b.iter_custom(|iterations| (0..iterations).map(|_| cycle(false)).sum::<Duration>())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
