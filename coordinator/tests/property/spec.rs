//! Raw generated values. Every field is free; `Plan::new` turns them into a valid topology
//! (indices taken modulo the process count, ranges clamped), so shrinking any field keeps the
//! case valid.

use proptest::prelude::*;

#[derive(Debug, Clone)]
pub(crate) struct MapSpec {
    pub(crate) whole: bool,
    pub(crate) offset: u8,
    pub(crate) len: u8,
    pub(crate) writable: bool,
    /// Access of devices 0 and 1 besides the worker's own: 0 none, 1 read, 2 read-write.
    pub(crate) others: [u8; 2],
    pub(crate) release: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct ImportSpec {
    pub(crate) importer: u8,
    pub(crate) relay: bool,
    pub(crate) map: MapSpec,
}

#[derive(Debug, Clone)]
pub(crate) struct AllocSpec {
    pub(crate) creator: u8,
    pub(crate) device: u8,
    pub(crate) granules: u8,
    pub(crate) private: bool,
    pub(crate) private_posix: bool,
    pub(crate) creator_release: bool,
    pub(crate) creator_extra: Option<MapSpec>,
    pub(crate) imports: Vec<ImportSpec>,
    pub(crate) writer: u8,
}

#[derive(Debug, Clone)]
pub(crate) struct IpcSpec {
    pub(crate) creator: u8,
    pub(crate) quarter_mib: u8,
    pub(crate) shared: bool,
    pub(crate) opens: Vec<u8>,
}

#[derive(Debug, Clone)]
pub(crate) struct GroupSpec {
    pub(crate) members: Vec<u8>,
    pub(crate) granules: u8,
    /// Per (member, granule): 0 BindMem v1, 1 BindMem v2, 2 BindAddr v1, 3 BindAddr v2,
    /// 4 unbound.
    pub(crate) binds: Vec<u8>,
    pub(crate) rotation: u8,
    pub(crate) views: Vec<bool>,
}

#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) processes: u8,
    pub(crate) four_devices: bool,
    /// Process `p` on device `p % devices` (the most distinct devices, for multicast teams),
    /// else on `devices[p] % devices`.
    pub(crate) round_robin: bool,
    pub(crate) devices: Vec<u8>,
    pub(crate) allocations: Vec<AllocSpec>,
    /// How many of `allocations` the case uses (at least one).
    pub(crate) allocation_count: u8,
    pub(crate) ipc: Vec<IpcSpec>,
    pub(crate) groups: Vec<GroupSpec>,
}

pub(crate) fn map_spec() -> impl Strategy<Value = MapSpec> {
    (
        any::<bool>(),
        0u8..4,
        1u8..=4,
        prop::bool::weighted(0.75),
        prop::array::uniform2(0u8..3),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(whole, offset, len, writable, others, release)| MapSpec {
            whole,
            offset,
            len,
            writable,
            others,
            release,
        })
}

pub(crate) fn alloc_spec() -> impl Strategy<Value = AllocSpec> {
    let import =
        (0u8..6, prop::bool::weighted(0.25), map_spec()).prop_map(|(importer, relay, map)| {
            ImportSpec {
                importer,
                relay,
                map,
            }
        });
    (
        (0u8..6, 0u8..2, 1u8..=4),
        prop::bool::weighted(0.3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.2, map_spec()),
        prop::collection::vec(import, 0..=4),
        any::<u8>(),
    )
        .prop_map(
            |(
                (creator, device, granules),
                private,
                private_posix,
                creator_release,
                creator_extra,
                imports,
                writer,
            )| AllocSpec {
                creator,
                device,
                granules,
                private,
                private_posix,
                creator_release,
                creator_extra,
                imports,
                writer,
            },
        )
}

pub(crate) fn ipc_spec() -> impl Strategy<Value = IpcSpec> {
    (
        0u8..6,
        1u8..=24,
        prop::bool::weighted(0.8),
        prop::collection::vec(0u8..6, 0..=3),
    )
        .prop_map(|(creator, quarter_mib, shared, opens)| IpcSpec {
            creator,
            quarter_mib,
            shared,
            opens,
        })
}

pub(crate) fn group_spec() -> impl Strategy<Value = GroupSpec> {
    (
        prop::collection::vec(0u8..6, 2..=4),
        1u8..=3,
        prop::collection::vec(0u8..5, 12),
        0u8..3,
        prop::collection::vec(any::<bool>(), 4),
    )
        .prop_map(|(members, granules, binds, rotation, views)| GroupSpec {
            members,
            granules,
            binds,
            rotation,
            views,
        })
}

pub(crate) fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![1 => Just(1u8), 5 => 2u8..=6],
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.5),
        prop::collection::vec(0u8..4, 6),
        prop::collection::vec(alloc_spec(), 1..=20),
        // Mostly few: each allocation costs every later check a pass over its bytes.
        prop_oneof![3 => 1u8..=8, 1 => 9u8..=20],
        prop::collection::vec(ipc_spec(), 0..=3),
        prop::collection::vec(group_spec(), 0..=2),
    )
        .prop_map(
            |(
                processes,
                four_devices,
                round_robin,
                devices,
                allocations,
                allocation_count,
                ipc,
                groups,
            )| Spec {
                processes,
                four_devices,
                round_robin,
                devices,
                allocations,
                allocation_count,
                ipc,
                groups,
            },
        )
}
