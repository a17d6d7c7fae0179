use super::*;
use cuinterpose_protocol::{BoundedMap, NamespacePid};

fn uuid(n: u8) -> DeviceUuid {
    DeviceUuid::new([n; 16]).expect("nonzero")
}

fn device(ordinal: i32, n: u8, name: &str) -> Device {
    Device {
        ordinal,
        uuid: uuid(n),
        name: name.try_into().expect("short"),
        memory: 80 << 30,
    }
}

fn gpu(ordinal: i32, n: u8, name: &str, free: u64) -> TargetGpu {
    TargetGpu {
        ordinal,
        uuid: uuid(n),
        name: name.to_owned(),
        memory: 80 << 30,
        free,
    }
}

/// A checkpoint on machine [1, 2] (two H200s) whose participant 7 saw both and participant 8
/// saw only GPU 2 (as its ordinal 0).
fn inventory() -> DeviceInventory {
    let mut participants = BoundedMap::default();
    let both = vec![device(0, 1, "H200"), device(1, 2, "H200")];
    participants
        .insert(
            NamespacePid::new(7).unwrap(),
            both.clone().try_into().unwrap(),
        )
        .unwrap();
    participants
        .insert(
            NamespacePid::new(8).unwrap(),
            vec![device(0, 2, "H200")].try_into().unwrap(),
        )
        .unwrap();
    DeviceInventory {
        machine: both.try_into().unwrap(),
        participants,
    }
}

const GIB: u64 = 1 << 30;

/// Resolves `map` onto `target` (with 10 GiB shared on old GPU 1) and compares the moves.
fn check(map: &str, target: &[TargetGpu], expect: Result<&[(u8, u8)], &str>) {
    let spec: DeviceMapSpec = map.parse().expect(map);
    let needs = BTreeMap::from([(uuid(1), 10 * GIB)]);
    let got = resolve(&spec, &inventory(), target, &needs);
    match expect {
        Ok(pairs) => {
            let remap = got.unwrap_or_else(|e| panic!("{map}: {e}"));
            let want: Vec<(DeviceUuid, DeviceUuid)> =
                pairs.iter().map(|(o, n)| (uuid(*o), uuid(*n))).collect();
            assert_eq!(remap.pairs().collect::<Vec<_>>(), want, "{map}");
        }
        Err(message) => {
            let error = got.expect_err(map).to_string();
            assert!(error.contains(message), "{map}: {error}");
        }
    }
}

fn same_machine() -> Vec<TargetGpu> {
    vec![gpu(0, 1, "H200", 80 * GIB), gpu(1, 2, "H200", 80 * GIB)]
}

#[test]
fn maps_parse_and_bad_ones_say_why() {
    assert_eq!("auto".parse(), Ok(DeviceMapSpec::Auto));
    let text = format!("0=1,{}=GPU-{}", uuid_text(&uuid(3)), "04".repeat(16));
    assert_eq!(
        text.parse(),
        Ok(DeviceMapSpec::Pairs(vec![
            (DeviceRef::Ordinal(0), DeviceRef::Ordinal(1)),
            (DeviceRef::Uuid(uuid(3)), DeviceRef::Uuid(uuid(4))),
        ]))
    );
    for (bad, why) in [
        ("0", "is not OLD=NEW"),
        ("0=x", "neither an ordinal nor a GPU UUID"),
        ("0=GPU-12", "32 hex digits"),
        (&format!("0=GPU-{}", "0".repeat(32)), "all-zero"),
    ] {
        let error = bad.parse::<DeviceMapSpec>().expect_err(bad);
        assert!(error.contains(why), "{bad}: {error}");
    }
}

#[test]
fn pairs_by_ordinal_or_uuid_permute_the_gpus() {
    check("0=1,1=0", &same_machine(), Ok(&[(1, 2), (2, 1)]));
    let by_uuid = format!("{}={},1=0", uuid_text(&uuid(1)), uuid_text(&uuid(2)));
    check(&by_uuid, &same_machine(), Ok(&[(1, 2), (2, 1)]));
}

#[test]
fn bad_maps_are_refused_naming_the_device() {
    let gpus = same_machine();
    check(
        "0=0",
        &gpus,
        Err("(old GPU 1), a H200 seen by participant(s) 7, 8, has no pair"),
    );
    check(
        "0=1,1=1",
        &gpus,
        Err("are both paired onto GPU-02020202-0202-0202-0202-020202020202 (GPU 1)"),
    );
    check("0=0,0=1", &gpus, Err("(old GPU 0) is paired twice"));
    check("0=0,1=5", &gpus, Err("GPU 5 is not a GPU of this machine"));
    check(
        "4=0",
        &gpus,
        Err("old GPU 4 is not a GPU of the checkpointed machine"),
    );
    let other = [gpu(0, 1, "H200", 80 * GIB), gpu(1, 3, "A100", 80 * GIB)];
    check(
        "0=0,1=1",
        &other,
        Err("(old GPU 1) is a H200 but GPU-03030303-0303-0303-0303-030303030303 (GPU 1) is a A100"),
    );
    let small = [gpu(0, 1, "H200", GIB), gpu(1, 2, "H200", 80 * GIB)];
    check(
        "0=0,1=1",
        &small,
        Err("has 1073741824 bytes free, too little for the 10737418240"),
    );
    // Without the old machine's list, only UUIDs name old GPUs.
    let mut bare = inventory();
    bare.machine = Default::default();
    let error = resolve(&"0=0".parse().unwrap(), &bare, &gpus, &BTreeMap::new()).unwrap_err();
    assert_eq!(error, RemapError::OrdinalsUnknown { ordinal: 0 });
}

#[test]
fn auto_keeps_gpus_still_here_and_pairs_the_rest_by_model_in_order() {
    check("auto", &same_machine(), Ok(&[(1, 1), (2, 2)]));
    // Another machine: the new H200s in their order, whatever else is there.
    let other = [
        gpu(0, 9, "A100", 80 * GIB),
        gpu(1, 6, "H200", 80 * GIB),
        gpu(2, 5, "H200", 80 * GIB),
    ];
    check("auto", &other, Ok(&[(1, 6), (2, 5)]));
    // One of the old GPUs is still here: it stays; the other takes a free H200.
    let mixed = [gpu(0, 5, "H200", 80 * GIB), gpu(1, 2, "H200", 80 * GIB)];
    check("auto", &mixed, Ok(&[(1, 5), (2, 2)]));
    let wrong = [gpu(0, 9, "A100", 80 * GIB), gpu(1, 8, "H200", 80 * GIB)];
    check(
        "auto",
        &wrong,
        Err("auto: no GPU of model H200 with 85899345920 bytes is left"),
    );
}

/// `0=1,1=0` on the same machine: the two GPUs swap.
fn swapped() -> Remap {
    resolve(
        &"0=1,1=0".parse().unwrap(),
        &inventory(),
        &same_machine(),
        &BTreeMap::new(),
    )
    .unwrap()
}

#[test]
fn each_process_gets_the_pairs_of_its_own_devices() {
    let remap = swapped();
    let inventory = inventory();
    let eight = inventory
        .participants
        .get(&NamespacePid::new(8).unwrap())
        .unwrap();
    let pairs = remap.pairs_for(eight);
    assert_eq!(pairs.len(), 1);
    assert_eq!((pairs[0].old, pairs[0].new), ([2; 16], [1; 16]));
    assert_eq!(remap.expected(eight), [(0, uuid(1))]);
    assert_eq!(remap.all_pairs().len(), 2);
    // No move: no pairs at all (the plain native restore).
    assert!(Remap::identity().pairs_for(eight).is_empty());
    assert!(!Remap::identity().moves());
}

#[test]
fn restored_records_name_the_paired_gpus_at_the_same_ordinals() {
    use cuinterpose_protocol::{
        AccessDescriptor, AccessFlags, Location, MappingRecord, MulticastDeviceRecord,
    };
    let remap = swapped();
    let reference = cuinterpose_protocol::AllocationReference {
        id: cuinterpose_protocol::AllocationId::new([9; 16]).unwrap(),
        creator_pid: NamespacePid::new(7).unwrap(),
    };
    let at = |id: i32, location_type, uuid| AccessDescriptor {
        location: Location {
            location_type,
            id,
            uuid,
        },
        flags: AccessFlags::ProtReadWrite,
    };
    let saved = vec![
        Record::Mapping(MappingRecord {
            allocation: reference.clone(),
            address: 1 << 40,
            size: 2 << 20,
            offset: 0,
            access: vec![
                at(0, LocationType::Device, Some(uuid(1))),
                at(1, LocationType::Device, Some(uuid(2))),
                at(0, LocationType::HostNuma, None),
            ]
            .try_into()
            .unwrap(),
        }),
        Record::MulticastDevice(MulticastDeviceRecord {
            object: reference,
            device: 1,
            uuid: Some(uuid(2)),
        }),
    ];
    let restored = remap.records(&saved);
    assert_eq!(
        restored[0].devices(),
        [(0, Some(uuid(2))), (1, Some(uuid(1)))]
    );
    assert_eq!(restored[1].devices(), [(1, Some(uuid(1)))]);
    // The host location names no GPU and stays as it was; nothing else changes.
    let Record::Mapping(mapping) = &restored[0] else {
        panic!("a mapping first");
    };
    assert_eq!(mapping.access[2], at(0, LocationType::HostNuma, None));
    assert_eq!(Remap::identity().records(&saved), saved);
}
