//! Encode + decode of a maximal inspection reply (MAX_RECORDS records): the generated bounded
//! types against a plain `#[derive(Serialize, Deserialize)]` twin of the same shape that
//! produces the same bytes, measured in one run. Prints the ratio generated / twin.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use cuinterpose_protocol as p;
use serde::{Deserialize, Serialize};

fn reference(index: u32) -> p::AllocationReference {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&(index + 1).to_le_bytes());
    p::AllocationReference {
        id: p::AllocationId::new(id).expect("non-zero"),
        creator_pid: p::NamespacePid::new(1000 + index % 8).expect("non-zero"),
    }
}

fn access() -> p::BoundedVec<p::AccessDescriptor, { p::MAX_ACCESS }> {
    (0..4)
        .map(|device| p::AccessDescriptor {
            location: p::Location {
                location_type: p::LocationType::Device,
                id: device,
                uuid: None,
            },
            flags: p::AccessFlags::ProtReadWrite,
        })
        .collect::<Vec<_>>()
        .try_into()
        .expect("within MAX_ACCESS")
}

/// Half allocations, half mappings: the shape of a real engine's inspection.
fn generated_reply() -> p::Reply {
    let records: Vec<p::Record> = (0..p::MAX_RECORDS as u32)
        .map(|index| {
            if index % 2 == 0 {
                p::Record::Allocation(p::AllocationRecord {
                    allocation: reference(index / 2),
                    size: 2 << 20,
                    properties: p::AllocationProperties {
                        allocation_type: p::AllocationType::Pinned,
                        location: p::Location {
                            location_type: p::LocationType::Device,
                            id: (index % 8) as i32,
                            uuid: None,
                        },
                        handle_types: p::HandleTypes::POSIX_FILE_DESCRIPTOR,
                    },
                    host_carrier: index % 4 == 0,
                    handle_count: 1,
                })
            } else {
                p::Record::Mapping(p::MappingRecord {
                    allocation: reference(index / 2),
                    address: 0x7f00_0000_0000 + u64::from(index) * (2 << 20),
                    size: 2 << 20,
                    offset: 0,
                    access: access(),
                })
            }
        })
        .collect();
    p::Reply::Inspection(p::InspectionReply {
        namespace_pid: p::NamespacePid::new(1000).expect("non-zero"),
        phase: p::Phase::Active,
        raw_imports: 0,
        records: records.try_into().expect("MAX_RECORDS records"),
        devices: p::BoundedVec::default(),
    })
}

mod twin {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    pub enum Reply {
        Inspection {
            namespace_pid: u32,
            phase: Phase,
            raw_imports: u64,
            records: Vec<Record>,
            /// Empty in this bench (the records are what is measured); any element type
            /// encodes an empty list the same way.
            devices: Vec<Location>,
        },
    }

    #[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Phase {
        Active,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    pub enum Record {
        Allocation {
            allocation: Reference,
            size: u64,
            properties: Properties,
            host_carrier: bool,
            handle_count: u64,
        },
        Mapping {
            allocation: Reference,
            address: u64,
            size: u64,
            offset: u64,
            access: Vec<Access>,
        },
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Reference {
        #[serde(serialize_with = "bytes", deserialize_with = "id")]
        pub id: [u8; 16],
        pub creator_pid: u32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Properties {
        pub allocation_type: u32,
        pub location: Location,
        pub handle_types: u32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Location {
        pub location_type: u32,
        pub id: i32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Access {
        pub location: Location,
        pub flags: u32,
    }

    fn bytes<S: Serializer>(value: &[u8; 16], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }

    fn id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<[u8; 16], D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = [u8; 16];
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("16 bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<[u8; 16], E> {
                v.try_into().map_err(|_| E::invalid_length(v.len(), &self))
            }
        }
        deserializer.deserialize_bytes(V)
    }
}

/// The twin's encoding path: the same envelope prefix, the same rmp-serde settings.
fn twin_encode(reply: &twin::Reply) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&[0x82, 0xa7]);
    out.extend_from_slice(b"version");
    out.push(p::VERSION);
    out.push(0xa4);
    out.extend_from_slice(b"body");
    reply
        .serialize(&mut rmp_serde::Serializer::new(&mut out).with_struct_map())
        .expect("twin encodes");
    out
}

fn twin_decode(bytes: &[u8]) -> twin::Reply {
    let mut deserializer = rmp_serde::Deserializer::new(std::io::Cursor::new(&bytes[15..]));
    deserializer.set_max_depth(p::MAX_DEPTH + 1);
    twin::Reply::deserialize(&mut deserializer).expect("twin decodes")
}

fn generated_round_trip(reply: &p::Reply) -> p::Reply {
    let bytes = p::encode(reply).expect("encodes");
    p::decode::<p::Reply>(&bytes).expect("decodes")
}

fn twin_round_trip(reply: &twin::Reply) -> twin::Reply {
    twin_decode(&twin_encode(reply))
}

fn inputs() -> (p::Reply, twin::Reply) {
    let generated = generated_reply();
    let bytes = p::encode(&generated).expect("encodes");
    let twin = twin_decode(&bytes);
    assert_eq!(
        twin_encode(&twin),
        bytes,
        "the twin must produce the same bytes"
    );
    (generated, twin)
}

fn bench(c: &mut Criterion) {
    let (generated, twin) = inputs();
    let mut group = c.benchmark_group("inspection_reply_max_records");
    group.sample_size(20);
    group.bench_function("generated_bounded", |b| {
        b.iter(|| generated_round_trip(black_box(&generated)))
    });
    group.bench_function("plain_derive_twin", |b| {
        b.iter(|| twin_round_trip(black_box(&twin)))
    });
    group.finish();
}

/// Interleaved timing of both, so the printed ratio compares like with like.
fn ratio() {
    let (generated, twin) = inputs();
    let mut generated_time = Duration::ZERO;
    let mut twin_time = Duration::ZERO;
    for _ in 0..15 {
        let start = Instant::now();
        black_box(generated_round_trip(black_box(&generated)));
        generated_time += start.elapsed();
        let start = Instant::now();
        black_box(twin_round_trip(black_box(&twin)));
        twin_time += start.elapsed();
    }
    println!(
        "inspection reply, {} records, {} bytes: generated {:.2} ms, twin {:.2} ms per round trip, ratio generated/twin = {:.3} (target <= 1.10)",
        p::MAX_RECORDS,
        p::encode(&generated).expect("encodes").len(),
        generated_time.as_secs_f64() * 1000.0 / 15.0,
        twin_time.as_secs_f64() * 1000.0 / 15.0,
        generated_time.as_secs_f64() / twin_time.as_secs_f64()
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    ratio();
    Criterion::default().configure_from_args().final_summary();
}
