//! Record builders for tests and examples: small, readable topologies.
//!
//! Ids are `n` repeated in the first byte and `0xa1` elsewhere, so `id(1)` reads
//! `01a1a1…` in messages.

use std::collections::BTreeMap;

use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AddressBindingSource, AllocationId, AllocationProperties,
    AllocationRecord, AllocationReference, AllocationType, BindingSource, BindingVersion,
    BoundedVec, HandleTypes, InspectionReply, Location, MappingRecord, MemberRange,
    MemoryBindingSource, MulticastBindingRecord, MulticastDeviceRecord, MulticastMappingRecord,
    MulticastProperties, MulticastRecord, NamespacePid, Phase, PoolMemberRecord, PoolRecord,
    Record, StateFile,
};

/// 2 MiB, the usual granularity.
pub const SIZE: u64 = 2 << 20;

pub fn pid(value: u32) -> NamespacePid {
    NamespacePid::new(value).expect("non-zero pid")
}

pub fn id(n: u8) -> AllocationId {
    let mut bytes = [0xa1; 16];
    bytes[0] = n;
    AllocationId::new(bytes).expect("non-zero id")
}

pub fn reference(n: u8, creator: u32) -> AllocationReference {
    AllocationReference {
        id: id(n),
        creator_pid: pid(creator),
    }
}

pub fn device_location(device: i32) -> Location {
    Location::device(device)
}

pub fn properties() -> AllocationProperties {
    AllocationProperties {
        allocation_type: AllocationType::Pinned,
        location: device_location(0),
        handle_types: HandleTypes::POSIX_FILE_DESCRIPTOR,
    }
}

pub fn read_write(device: i32) -> AccessDescriptor {
    AccessDescriptor {
        location: device_location(device),
        flags: AccessFlags::ProtReadWrite,
    }
}

pub fn allocation(
    n: u8,
    creator: u32,
    size: u64,
    host_carrier: bool,
    handle_count: u64,
) -> AllocationRecord {
    AllocationRecord {
        allocation: reference(n, creator),
        size,
        properties: properties(),
        host_carrier,
        handle_count,
    }
}

pub fn mapping(n: u8, creator: u32, address: u64, size: u64, offset: u64) -> MappingRecord {
    MappingRecord {
        allocation: reference(n, creator),
        address,
        size,
        offset,
        access: BoundedVec::try_from(vec![read_write(0)]).expect("one descriptor"),
    }
}

pub fn multicast_properties(device_count: u32, size: u64) -> MulticastProperties {
    MulticastProperties {
        device_count,
        size,
        handle_types: HandleTypes::POSIX_FILE_DESCRIPTOR,
        flags: 0,
    }
}

pub fn multicast(n: u8, creator: u32, device_count: u32, size: u64) -> MulticastRecord {
    MulticastRecord {
        object: reference(n, creator),
        properties: multicast_properties(device_count, size),
        handle_count: 1,
    }
}

pub fn multicast_device(n: u8, creator: u32, device: i32) -> MulticastDeviceRecord {
    MulticastDeviceRecord {
        object: reference(n, creator),
        device,
        uuid: None,
    }
}

/// `cuMulticastBindMem_v2` of `member` (allocation `m` created by `member_creator`).
pub fn memory_binding(
    object: AllocationReference,
    member: AllocationReference,
    offset: u64,
    size: u64,
    device: i32,
) -> MulticastBindingRecord {
    MulticastBindingRecord {
        object,
        source: BindingSource::Memory(MemoryBindingSource {
            member: MemberRange {
                allocation: member,
                offset,
            },
        }),
        multicast_offset: 0,
        size,
        flags: 0,
        version: BindingVersion::V2,
        device,
        device_uuid: None,
    }
}

/// `cuMulticastBindAddr` of `address`, optionally a tracked member.
pub fn address_binding(
    object: AllocationReference,
    address: u64,
    member: Option<MemberRange>,
    size: u64,
    device: i32,
) -> MulticastBindingRecord {
    MulticastBindingRecord {
        object,
        source: BindingSource::Address(AddressBindingSource { address, member }),
        multicast_offset: 0,
        size,
        flags: 0,
        version: BindingVersion::V1,
        device,
        device_uuid: None,
    }
}

pub fn multicast_mapping(
    object: AllocationReference,
    address: u64,
    size: u64,
) -> MulticastMappingRecord {
    MulticastMappingRecord {
        object,
        address,
        size,
        offset: 0,
        flags: 0,
        access: BoundedVec::try_from(vec![read_write(0)]).expect("one descriptor"),
    }
}

pub fn inspection(pid_value: u32, phase: Phase, mut records: Vec<Record>) -> InspectionReply {
    records.sort();
    InspectionReply {
        namespace_pid: pid(pid_value),
        phase,
        raw_imports: 0,
        records: BoundedVec::try_from(records).expect("within MAX_RECORDS"),
        devices: BoundedVec::default(),
    }
}

/// Every participant of `participants` in `phase`.
pub fn inspections(
    participants: &BTreeMap<NamespacePid, Vec<Record>>,
    phase: Phase,
) -> BTreeMap<NamespacePid, InspectionReply> {
    participants
        .iter()
        .map(|(pid, records)| (*pid, inspection(pid.get(), phase, records.clone())))
        .collect()
}

/// The checksums a fake participant `pid` holding `records` reports for the allocations it
/// carries, as a shim does (64 MiB chunks; the values stand for bytes that never change
/// here), sorted by allocation.
pub fn checksums_of(
    pid: NamespacePid,
    records: &[Record],
) -> Vec<cuinterpose_protocol::CarrierChecksum> {
    const CHUNK: u64 = 64 << 20;
    let mut list: Vec<_> = records
        .iter()
        .filter_map(|record| match record {
            Record::Allocation(r) if r.host_carrier && r.allocation.creator_pid == pid => {
                let chunks: Vec<u64> = (0..r.size.div_ceil(CHUNK)).collect();
                Some(cuinterpose_protocol::CarrierChecksum {
                    allocation: r.allocation.id,
                    size: r.size,
                    chunk_bytes: CHUNK,
                    chunks: chunks.try_into().expect("within MAX_CHUNKS"),
                })
            }
            _ => None,
        })
        .collect();
    list.sort_by_key(|c| c.allocation);
    list
}

/// The state a capture of fake participants holding `participants` publishes.
pub fn state_file(participants: &BTreeMap<NamespacePid, Vec<Record>>) -> StateFile {
    let mut map = BTreeMap::new();
    let mut checksums = BTreeMap::new();
    for (pid, records) in participants {
        let carried = checksums_of(*pid, records);
        if !carried.is_empty() {
            checksums.insert(
                *pid,
                BoundedVec::try_from(carried).expect("within MAX_RECORDS"),
            );
        }
        let mut records = records.clone();
        records.sort();
        map.insert(
            *pid,
            BoundedVec::try_from(records).expect("within MAX_RECORDS"),
        );
    }
    StateFile::seal(
        map.try_into().expect("within MAX_PARTICIPANTS"),
        cuinterpose_protocol::DeviceInventory::empty(),
        checksums.try_into().expect("within MAX_PARTICIPANTS"),
        cuinterpose_protocol::Carrier::Host,
    )
}

/// Pool `n` of `creator` on device 0, as a participant holds it (`access`: grants to other
/// devices).
pub fn pool(n: u8, creator: u32, access: Vec<AccessDescriptor>) -> PoolRecord {
    PoolRecord {
        pool: reference(n, creator),
        device: 0,
        max_size: 0,
        release_threshold: 0,
        access: BoundedVec::try_from(access).expect("within MAX_ACCESS"),
        device_uuid: None,
    }
}

/// Allocation `allocation` (created by `allocation_creator`) as a member of pool `n` of
/// `creator`.
pub fn pool_member(
    n: u8,
    creator: u32,
    allocation: u8,
    allocation_creator: u32,
) -> PoolMemberRecord {
    PoolMemberRecord {
        pool: reference(n, creator),
        allocation: reference(allocation, allocation_creator),
        requested_size: SIZE - 4096,
    }
}

/// Address where participant `p` maps allocation `n`.
pub fn address(p: u32, n: u8) -> u64 {
    0x7f00_0000_0000 + (u64::from(p) << 32) + (u64::from(n) << 24)
}

/// Three participants (`first`, `first+1`, `first+2`) sharing one 2 MiB allocation (id 1,
/// created by `first`, mapped by everyone) and one multicast object (id 9, created by `first`,
/// three devices: device 0 of each participant, each binding its view of allocation 1). The
/// creator also holds a private, never-shared allocation (id 2).
pub fn shared_topology(first: u32) -> BTreeMap<NamespacePid, Vec<Record>> {
    let creator = first;
    let mut participants = BTreeMap::new();
    for p in first..first + 3 {
        let mut records: Vec<Record> = vec![
            allocation(1, creator, SIZE, p == creator, 1).into(),
            mapping(1, creator, address(p, 1), SIZE, 0).into(),
            multicast(9, creator, 3, SIZE).into(),
            multicast_device(9, creator, 0).into(),
            memory_binding(reference(9, creator), reference(1, creator), 0, SIZE, 0).into(),
            multicast_mapping(reference(9, creator), address(p, 9), SIZE).into(),
        ];
        if p == creator {
            records.push(allocation(2, creator, SIZE, false, 1).into());
        }
        records.sort();
        participants.insert(pid(p), records);
    }
    participants
}

/// A fresh directory (mode 0700) under the system temp dir, removed with its content on drop.
#[derive(Debug)]
pub struct TempDir {
    path: std::path::PathBuf,
}

/// How much of a label names a [`TempDir`]: tests put Unix sockets two levels below it
/// (`control/cuinterpose-<pid>.sock`, `fakecuda/fakecuda-<pid>.sock`), and a socket's path
/// must fit `sun_path`'s 108 bytes, so a test named in full would make `bind` fail.
const LABEL_CHARS: usize = 24;

impl TempDir {
    /// A directory named after `label` (its first [`LABEL_CHARS`] characters), unique by
    /// process, count and time.
    pub fn new(label: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let label: String = label.chars().take(LABEL_CHARS).collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "cui-{label}-{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A participant that follows the shim's phase machine, without sockets: what a correct shim
/// answers to each request (tests of the plan and fake shims behind real sockets use it).
#[derive(Debug, Clone)]
pub struct FakeParticipant {
    pub pid: NamespacePid,
    pub phase: Phase,
    pub raw_imports: u64,
    pub records: Vec<Record>,
    /// The last host-carrier copy it ran (reported, complete, to `progress`).
    pub last_copy: Option<cuinterpose_protocol::Operation>,
    /// A hold came in phase released (reported to `progress`).
    pub held: bool,
}

impl FakeParticipant {
    pub fn new(pid: NamespacePid, records: Vec<Record>) -> Self {
        Self {
            pid,
            phase: Phase::Active,
            raw_imports: 0,
            records,
            last_copy: None,
            held: false,
        }
    }

    /// Checksums of the allocations it created for the host carrier ([`checksums_of`]).
    pub fn checksums(&self) -> Vec<cuinterpose_protocol::CarrierChecksum> {
        checksums_of(self.pid, &self.records)
    }

    /// Bytes of the allocations it created for the host carrier.
    pub fn carried_bytes(&self) -> u64 {
        self.records
            .iter()
            .filter_map(|record| match record {
                Record::Allocation(r) if r.host_carrier && r.allocation.creator_pid == self.pid => {
                    Some(r.size)
                }
                _ => None,
            })
            .sum()
    }

    pub fn inspection(&self) -> InspectionReply {
        let mut reply = inspection(self.pid.get(), self.phase, self.records.clone());
        reply.raw_imports = self.raw_imports;
        reply
    }

    fn refuse(
        code: cuinterpose_protocol::RefusalCode,
        message: String,
    ) -> cuinterpose_protocol::Reply {
        cuinterpose_protocol::RefusedReply {
            code,
            message: cuinterpose_protocol::BoundedString::truncating(&message),
        }
        .into()
    }

    /// The reply to `request`, moving through the phases like a shim.
    pub fn handle(
        &mut self,
        request: &cuinterpose_protocol::Request,
    ) -> cuinterpose_protocol::Reply {
        use cuinterpose_protocol::{CompletedReply, Operation, RefusalCode, Request};
        match request {
            Request::Inspect => self.inspection().into(),
            Request::Progress => {
                let bytes = self.last_copy.map_or(0, |_| self.carried_bytes());
                cuinterpose_protocol::ProgressReply {
                    namespace_pid: self.pid,
                    operation: self.last_copy,
                    running: false,
                    done: bytes,
                    total: bytes,
                    phase: self.phase,
                    held: self.held,
                }
                .into()
            }
            Request::BeginCheckpoint if self.phase == Phase::Active => {
                self.phase = Phase::Frozen;
                self.inspection().into()
            }
            Request::BeginCheckpoint => Self::refuse(
                RefusalCode::OutOfOrder,
                format!("begin_checkpoint in phase {}", self.phase),
            ),
            Request::Execute(execute) => {
                let operation = execute.operation;
                if self.phase != operation.from_phase() {
                    return Self::refuse(
                        RefusalCode::OutOfOrder,
                        format!("{operation} in phase {}", self.phase),
                    );
                }
                self.phase = operation.to_phase();
                let (bytes, checksums) = match operation {
                    Operation::SaveAllocations | Operation::LoadAllocations => {
                        self.last_copy = Some(operation);
                        (self.carried_bytes(), self.checksums())
                    }
                    _ => (0, Vec::new()),
                };
                CompletedReply {
                    operation,
                    bytes,
                    copy_ns: 0,
                    peak_carrier_bytes: bytes,
                    checksums: checksums.try_into().expect("within MAX_RECORDS"),
                }
                .into()
            }
            Request::Export(_) => Self::refuse(
                RefusalCode::UnknownAllocation,
                "this fake participant exports nothing".to_string(),
            ),
            Request::RollBack => match self.phase {
                from
                @ (Phase::Active | Phase::Frozen | Phase::MulticastPrepared | Phase::Saved) => {
                    self.phase = Phase::Active;
                    cuinterpose_protocol::RolledBackReply {
                        namespace_pid: self.pid,
                        from,
                    }
                    .into()
                }
                other => Self::refuse(
                    RefusalCode::OutOfOrder,
                    format!("roll_back in phase {other}"),
                ),
            },
            Request::Hold if self.phase == Phase::Released => {
                self.held = true;
                cuinterpose_protocol::HeldReply {
                    namespace_pid: self.pid,
                }
                .into()
            }
            Request::Hold => Self::refuse(
                RefusalCode::OutOfOrder,
                format!("hold in phase {}", self.phase),
            ),
            Request::FailStop(_) => {
                self.phase = Phase::Failed;
                cuinterpose_protocol::StoppedReply {
                    namespace_pid: self.pid,
                }
                .into()
            }
        }
    }
}

/// Fake participants for every entry of `participants`.
pub fn fake_participants(
    participants: &BTreeMap<NamespacePid, Vec<Record>>,
) -> BTreeMap<NamespacePid, FakeParticipant> {
    participants
        .iter()
        .map(|(pid, records)| (*pid, FakeParticipant::new(*pid, records.clone())))
        .collect()
}

/// The phases a capture reports, in order: inspect and begin_checkpoint, the schema's
/// capture operations, then publishing the state and holding the participants.
pub fn capture_phases() -> Vec<&'static str> {
    let mut phases = vec!["inspect", "begin_checkpoint"];
    phases.extend(cuinterpose_protocol::CAPTURE_OPERATIONS.map(|o| o.wire_name()));
    phases.extend(["publish_state", "hold"]);
    phases
}
