//! One example of every request, reply, record, the state file, the ticket and each layout.
//! Shared by the wire snapshot tests (and usable as fuzz seeds).

#![allow(dead_code)]

use cuinterpose_protocol as p;

pub fn pid(value: u32) -> p::NamespacePid {
    p::NamespacePid::new(value).expect("non-zero pid")
}

pub fn id(fill: u8) -> p::AllocationId {
    p::AllocationId::new([fill; 16]).expect("non-zero id")
}

pub fn token(fill: u8) -> p::CapabilityToken {
    p::CapabilityToken::new([fill; 16]).expect("non-zero token")
}

pub fn reference(fill: u8, creator: u32) -> p::AllocationReference {
    p::AllocationReference {
        id: id(fill),
        creator_pid: pid(creator),
    }
}

/// A 2 MiB binding at offset 0 of multicast object 0x22 from `source`, on `device`.
fn binding(source: p::BindingSource, version: p::BindingVersion, device: i32) -> p::Record {
    p::Record::MulticastBinding(p::MulticastBindingRecord {
        object: reference(0x22, 100),
        source,
        multicast_offset: 0,
        size: 2 << 20,
        flags: 0,
        version,
        device,
        device_uuid: Some(gpu(device)),
    })
}

/// The UUID of the examples' GPU `ordinal` (as [`devices`] lists it).
pub fn gpu(ordinal: i32) -> p::DeviceUuid {
    p::DeviceUuid::new([0x5a + ordinal as u8; 16]).expect("non-zero uuid")
}

pub fn device(ordinal: i32) -> p::Location {
    p::Location {
        location_type: p::LocationType::Device,
        id: ordinal,
        uuid: Some(gpu(ordinal)),
    }
}

pub fn access(
    grants: &[(i32, p::AccessFlags)],
) -> p::BoundedVec<p::AccessDescriptor, { p::MAX_ACCESS }> {
    grants
        .iter()
        .map(|&(ordinal, flags)| p::AccessDescriptor {
            location: device(ordinal),
            flags,
        })
        .collect::<Vec<_>>()
        .try_into()
        .expect("within MAX_ACCESS")
}

pub fn multicast_properties() -> p::MulticastProperties {
    p::MulticastProperties {
        device_count: 2,
        size: 2 << 20,
        handle_types: p::HandleTypes::POSIX_FILE_DESCRIPTOR,
        flags: 0,
    }
}

pub fn records() -> Vec<(&'static str, p::Record)> {
    vec![
        (
            "allocation",
            p::Record::Allocation(p::AllocationRecord {
                allocation: reference(0x11, 100),
                size: 4 << 20,
                properties: p::AllocationProperties {
                    allocation_type: p::AllocationType::Pinned,
                    location: device(0),
                    handle_types: p::HandleTypes::POSIX_FILE_DESCRIPTOR,
                },
                host_carrier: true,
                handle_count: 1,
            }),
        ),
        (
            "mapping",
            p::Record::Mapping(p::MappingRecord {
                allocation: reference(0x11, 100),
                address: 0x7f12_3400_0000,
                size: 2 << 20,
                offset: 2 << 20,
                access: access(&[
                    (0, p::AccessFlags::ProtReadWrite),
                    (1, p::AccessFlags::ProtRead),
                ]),
            }),
        ),
        (
            "multicast",
            p::Record::Multicast(p::MulticastRecord {
                object: reference(0x22, 100),
                properties: multicast_properties(),
                handle_count: 1,
            }),
        ),
        (
            "multicast_device",
            p::Record::MulticastDevice(p::MulticastDeviceRecord {
                object: reference(0x22, 100),
                device: 1,
                uuid: Some(gpu(1)),
            }),
        ),
        (
            "multicast_binding_memory",
            binding(
                p::BindingSource::Memory(p::MemoryBindingSource {
                    member: p::MemberRange {
                        allocation: reference(0x11, 100),
                        offset: 0,
                    },
                }),
                p::BindingVersion::V1,
                0,
            ),
        ),
        (
            "multicast_binding_address",
            binding(
                p::BindingSource::Address(p::AddressBindingSource {
                    address: 0x7f12_3400_0000,
                    member: None,
                }),
                p::BindingVersion::V2,
                1,
            ),
        ),
        (
            "multicast_mapping",
            p::Record::MulticastMapping(p::MulticastMappingRecord {
                object: reference(0x22, 100),
                address: 0x7f56_0000_0000,
                size: 2 << 20,
                offset: 0,
                flags: 0,
                access: access(&[(0, p::AccessFlags::ProtReadWrite)]),
            }),
        ),
        (
            "pool",
            p::Record::Pool(p::PoolRecord {
                pool: reference(0x55, 100),
                device: 0,
                max_size: 64 << 20,
                release_threshold: 1 << 20,
                device_uuid: Some(gpu(0)),
                access: access(&[(1, p::AccessFlags::ProtRead)]),
            }),
        ),
        (
            "pool_member",
            p::Record::PoolMember(p::PoolMemberRecord {
                pool: reference(0x55, 100),
                allocation: reference(0x11, 100),
                requested_size: 3 << 20,
            }),
        ),
    ]
}

pub fn requests() -> Vec<(&'static str, p::Request)> {
    vec![
        ("inspect", p::Request::Inspect),
        ("begin_checkpoint", p::Request::BeginCheckpoint),
        ("progress", p::Request::Progress),
        ("roll_back", p::Request::RollBack),
        ("hold", p::Request::Hold),
        (
            "fail_stop",
            p::Request::FailStop(p::FailStopRequest {
                reason: p::BoundedString::truncating("prepare failed in phase prepare_unicast"),
            }),
        ),
        (
            "execute",
            p::Request::Execute(p::ExecuteRequest::storage(
                p::Operation::SaveAllocations,
                4 * p::carrier::CHUNK_BYTES,
            )),
        ),
        (
            "export",
            p::Request::Export(p::ExportRequest {
                allocation: reference(0x11, 100),
                resource: p::ResourceKind::Unicast,
                capability: token(0xc5),
            }),
        ),
    ]
}

pub fn replies() -> Vec<(&'static str, p::Reply)> {
    let records: Vec<p::Record> = records().into_iter().map(|(_, record)| record).collect();
    vec![
        (
            "rolled_back",
            p::Reply::RolledBack(p::RolledBackReply {
                namespace_pid: pid(100),
                from: p::Phase::Saved,
            }),
        ),
        (
            "held",
            p::Reply::Held(p::HeldReply {
                namespace_pid: pid(100),
            }),
        ),
        (
            "stopped",
            p::Reply::Stopped(p::StoppedReply {
                namespace_pid: pid(100),
            }),
        ),
        (
            "inspection",
            p::Reply::Inspection(p::InspectionReply {
                namespace_pid: pid(100),
                phase: p::Phase::Active,
                raw_imports: 0,
                records: records.try_into().expect("few records"),
                devices: devices(),
            }),
        ),
        (
            "completed",
            p::Reply::Completed(p::CompletedReply {
                operation: p::Operation::SaveAllocations,
                bytes: 4 << 20,
                copy_ns: 2_500_000,
                peak_carrier_bytes: 4 << 20,
                checksums: vec![carrier_checksum()].try_into().expect("one checksum"),
            }),
        ),
        (
            "progress",
            p::Reply::Progress(p::ProgressReply {
                namespace_pid: pid(100),
                operation: Some(p::Operation::SaveAllocations),
                running: true,
                done: 1 << 30,
                total: 3 << 30,
                phase: p::Phase::MulticastPrepared,
                held: false,
            }),
        ),
        (
            "progress_idle",
            p::Reply::Progress(p::ProgressReply {
                namespace_pid: pid(100),
                operation: None,
                running: false,
                done: 0,
                total: 0,
                phase: p::Phase::Released,
                held: true,
            }),
        ),
        (
            "unicast_export",
            p::Reply::UnicastExport(p::UnicastExportReply { size: 4 << 20 }),
        ),
        (
            "multicast_export",
            p::Reply::MulticastExport(p::MulticastExportReply {
                properties: multicast_properties(),
            }),
        ),
        (
            "refused",
            p::Reply::Refused(p::RefusedReply {
                code: p::RefusalCode::OutOfOrder,
                message: "load_allocations needs phase released, found active"
                    .try_into()
                    .expect("short"),
            }),
        ),
    ]
}

/// Two devices: ordinal 0 and 1 of a process, GPUs 0x5a.. and 0x5b.. of 80 GiB.
pub fn devices() -> p::BoundedVec<p::Device, { p::MAX_DEVICES }> {
    (0..2u8)
        .map(|i| p::Device {
            ordinal: i32::from(i),
            uuid: gpu(i32::from(i)),
            name: "NVIDIA H200".try_into().expect("short"),
            memory: 80 << 30,
        })
        .collect::<Vec<_>>()
        .try_into()
        .expect("two devices")
}

pub fn device_inventory() -> p::DeviceInventory {
    let mut participants = p::BoundedMap::new();
    participants
        .insert(pid(100), devices())
        .expect("within MAX_PARTICIPANTS");
    p::DeviceInventory {
        machine: devices(),
        participants,
    }
}

pub fn state_file() -> p::StateFile {
    let mut participants = p::BoundedMap::new();
    let all: Vec<p::Record> = records().into_iter().map(|(_, record)| record).collect();
    participants
        .insert(pid(100), all.try_into().expect("few records"))
        .expect("within MAX_PARTICIPANTS");
    participants
        .insert(
            pid(101),
            vec![p::Record::Mapping(p::MappingRecord {
                allocation: reference(0x11, 100),
                address: 0x7f99_0000_0000,
                size: 4 << 20,
                offset: 0,
                access: access(&[(1, p::AccessFlags::ProtReadWrite)]),
            })]
            .try_into()
            .expect("one record"),
        )
        .expect("within MAX_PARTICIPANTS");
    let mut checksums = p::BoundedMap::new();
    checksums
        .insert(
            pid(100),
            vec![carrier_checksum()].try_into().expect("one checksum"),
        )
        .expect("within MAX_PARTICIPANTS");
    p::StateFile::seal(
        participants,
        device_inventory(),
        checksums,
        p::Carrier::Storage,
    )
}

/// The checksums of a 4 MiB allocation carried in 3 MiB chunks (the last one shorter).
pub fn carrier_checksum() -> p::CarrierChecksum {
    p::CarrierChecksum {
        allocation: p::AllocationId::new([0x11; 16]).expect("non-zero"),
        size: 4 << 20,
        chunk_bytes: 3 << 20,
        chunks: vec![0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]
            .try_into()
            .expect("two chunks"),
    }
}

pub fn ticket() -> p::Ticket {
    p::Ticket {
        handle: virtual_shareable_handle(),
        resource: p::ResourceKind::Unicast,
        capability: token(0xc5),
    }
}

pub fn virtual_shareable_handle() -> p::VirtualShareableHandle {
    p::VirtualShareableHandle {
        creator_pid: pid(0x1122_3344),
        allocation: id(0x22),
    }
}

pub fn ipc_mem_handle() -> p::IpcMemHandle {
    p::IpcMemHandle {
        creator_pid: pid(100),
        allocation: id(0x33),
        requested_size: core::num::NonZeroU64::new(1_000_000).expect("non-zero"),
        extent: core::num::NonZeroU64::new(2 << 20).expect("non-zero"),
    }
}

pub fn pool_pointer_handle() -> p::PoolPointerHandle {
    p::PoolPointerHandle {
        creator_pid: pid(100),
        allocation: id(0x33),
        pool: id(0x55),
        device: 1,
        requested_size: core::num::NonZeroU64::new(1_000_000).expect("non-zero"),
        extent: core::num::NonZeroU64::new(2 << 20).expect("non-zero"),
    }
}

/// A classic hex dump: offset, 16 bytes, ASCII.
pub fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (row, chunk) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|byte| format!("{byte:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|&byte| {
                if byte.is_ascii_graphic() || byte == b' ' {
                    byte as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  |{ascii}|\n",
            row * 16,
            hex.join(" ")
        ));
    }
    out
}
