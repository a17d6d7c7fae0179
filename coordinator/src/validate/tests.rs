//! Unit tests of validation: a valid shared topology, then each rule broken on its own.

use std::collections::{BTreeMap, BTreeSet};

use cuinterpose_protocol::{
    AccessDescriptor, AllocationRecord, InspectionReply, MemberRange, MulticastRecord,
    NamespacePid, Phase, Record,
};

use super::*;
use cuinterpose_testkit::fixtures::*;

pub(super) type Participants = BTreeMap<NamespacePid, Vec<Record>>;

pub(super) fn valid() -> Participants {
    shared_topology(101)
}

pub(super) fn of(participants: &mut Participants, p: u32) -> &mut Vec<Record> {
    participants.get_mut(&pid(p)).expect("participant")
}

/// Validation of `inspections` fails, and one error is at `participant` (None: global),
/// names `object` by hex id and contains `rule`. Every error is one line starting with its
/// scope. Returns all errors.
pub(super) fn check_inspections(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
    participant: Option<u32>,
    object: Option<u8>,
    rule: &str,
) -> Vec<TopologyError> {
    let errors = validate(inspections).expect_err("validation must fail");
    for error in &errors {
        let text = error.to_string();
        assert!(!text.contains('\n'), "one line: {text}");
        let prefix = match error.participant() {
            Some(pid) => format!("participant {pid}: "),
            None => "topology: ".to_string(),
        };
        assert!(text.starts_with(&prefix), "{text}");
    }
    let found = errors.iter().any(|error| {
        let text = error.to_string();
        error.participant().map(NamespacePid::get) == participant
            && object.is_none_or(|n| text.contains(&id(n).to_string()))
            && text.contains(rule)
    });
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        found,
        "expected an error at {participant:?} naming {object:?} with `{rule}`, got:\n{}",
        lines.join("\n")
    );
    errors
}

pub(super) fn check(
    participants: &Participants,
    participant: Option<u32>,
    object: Option<u8>,
    rule: &str,
) -> Vec<TopologyError> {
    check_inspections(
        &inspections(participants, Phase::Active),
        participant,
        object,
        rule,
    )
}

#[test]
fn shared_topology_is_valid_and_summarised() {
    let topology = validate(&inspections(&valid(), Phase::Active)).expect("valid");
    assert_eq!(topology.participants, [pid(101), pid(102), pid(103)]);
    assert_eq!(topology.shared_allocations.len(), 1);
    let shared = &topology.shared_allocations[0];
    assert_eq!(shared.allocation, reference(1, 101));
    assert_eq!(shared.size, SIZE);
    assert_eq!(shared.importers, [pid(102), pid(103)]);
    assert_eq!(topology.importer_records, 2);
    assert_eq!(topology.bytes_to_save, SIZE);
    assert_eq!(topology.bytes_of(pid(101)), SIZE);
    assert_eq!(topology.bytes_of(pid(102)), 0);
    assert_eq!(topology.multicast_groups.len(), 1);
    let group = &topology.multicast_groups[0];
    assert_eq!(group.members, [pid(101), pid(102), pid(103)]);
    assert_eq!(group.devices, [(pid(101), 0), (pid(102), 0), (pid(103), 0)]);
    assert_eq!(topology.records, 19);
}

#[test]
fn record_and_participant_order_do_not_matter() {
    let expected = validate(&inspections(&valid(), Phase::Active)).expect("valid");
    for rotation in 0..19 {
        let mut participants = valid();
        for records in participants.values_mut() {
            let len = records.len();
            records.rotate_left(rotation % len);
            records.reverse();
        }
        // `inspection` sorts; build unsorted replies directly.
        let replies = participants
            .iter()
            .map(|(p, records)| {
                let mut reply = inspection(p.get(), Phase::Active, Vec::new());
                reply.records = records.clone().try_into().expect("bounded");
                (*p, reply)
            })
            .collect();
        assert_eq!(
            validate(&replies).expect("valid"),
            expected,
            "rotation {rotation}"
        );
    }
}

#[test]
fn participant_rules() {
    check(&BTreeMap::new(), None, None, "no participants");

    let mut replies = inspections(&valid(), Phase::Active);
    replies.get_mut(&pid(102)).expect("102").namespace_pid = pid(7);
    check_inspections(&replies, Some(102), None, "answered as namespace pid 7");

    let mut replies = inspections(&valid(), Phase::Active);
    replies.get_mut(&pid(102)).expect("102").phase = Phase::Frozen;
    check_inspections(
        &replies,
        Some(102),
        None,
        "in phase frozen, expected phase active",
    );
    assert!(validate_in_phase(&replies, Phase::Frozen).is_err());
    let frozen = inspections(&valid(), Phase::Frozen);
    assert!(validate_in_phase(&frozen, Phase::Frozen).is_ok());

    let mut replies = inspections(&valid(), Phase::Active);
    replies.get_mut(&pid(103)).expect("103").raw_imports = 2;
    check_inspections(&replies, Some(103), None, "2 live imports");
}

#[test]
fn creator_rules() {
    // Each: the participant that gains a record (first dropping its own allocation records when
    // `alone`), the record, and where validation reports which rule.
    let cases = [
        (
            101,
            false,
            allocation(1, 101, SIZE, true, 3),
            Some(101),
            1,
            "reported twice",
        ),
        (
            102,
            true,
            allocation(1, 102, SIZE, true, 1),
            None,
            1,
            "claimed as creator by participants 101, 102",
        ),
        (
            103,
            true,
            allocation(1, 102, SIZE, false, 1),
            Some(103),
            1,
            "names creator 102, but participant 101 holds the creator record",
        ),
        (
            101,
            false,
            allocation(6, 101, 0, false, 1),
            Some(101),
            6,
            "created with size 0",
        ),
    ];
    for (holder, alone, record, participant, object, rule) in cases {
        let mut p = valid();
        if alone {
            of(&mut p, holder).retain(|r| !matches!(r, Record::Allocation(_)));
        }
        of(&mut p, holder).push(record.into());
        check(&p, participant, Some(object), rule);
    }
    // Participant 103 imports allocation 5 from a creator that holds no record of it.
    for (creator, rule) in [
        (
            999,
            "imported from participant 999, which is not a participant",
        ),
        (102, "its creator (participant 102) has no creator record"),
    ] {
        let mut p = valid();
        of(&mut p, 103).push(allocation(5, creator, SIZE, false, 1).into());
        check(&p, Some(103), Some(5), rule);
    }
}

#[test]
fn importer_rules() {
    // Each: the participant whose allocation record is edited, the edit, the rule.
    type Case = (u32, fn(&mut AllocationRecord), &'static str);
    let cases: [Case; 3] = [
        (
            102,
            |r| r.size = 2 * SIZE,
            "importer record has size 0x400000, the creator's has 0x200000",
        ),
        (
            102,
            |r| r.properties.location.id = 1,
            "importer properties (pinned on device 1",
        ),
        (
            103,
            |r| r.host_carrier = true,
            "host carrier set on an importer record",
        ),
    ];
    for (holder, edit, rule) in cases {
        let mut p = valid();
        edit_allocations(&mut p, holder, edit);
        check(&p, Some(holder), Some(1), rule);
    }
}

/// Applies `edit` to each allocation record of participant `holder`.
fn edit_allocations(p: &mut Participants, holder: u32, edit: impl Fn(&mut AllocationRecord)) {
    for record in of(p, holder).iter_mut() {
        if let Record::Allocation(r) = record {
            edit(r);
        }
    }
}

#[test]
fn shared_allocations_need_the_carrier_and_an_anchor() {
    let mut p = valid();
    edit_allocations(&mut p, 101, |r| r.host_carrier = false);
    check(
        &p,
        Some(101),
        Some(1),
        "imported by participants 102, 103 but not marked for the host carrier",
    );

    // A mapping alone anchors.
    let mut p = valid();
    edit_allocations(&mut p, 101, |r| r.handle_count = 0);
    validate(&inspections(&p, Phase::Active)).expect("a mapping anchors");
    of(&mut p, 101).retain(|r| !matches!(r, Record::Mapping(_)));
    check(&p, Some(101), Some(1), "has no anchor");
}

#[test]
fn mapping_rules() {
    let mut p = valid();
    of(&mut p, 102).push(mapping(7, 101, address(102, 7), SIZE, 0).into());
    check(&p, Some(102), Some(7), "mapping at 0x7f66");
    check(
        &p,
        Some(102),
        Some(7),
        "refers to no allocation record of this participant",
    );

    for (size, address, rule) in [
        (0, address(102, 1), "size is 0"),
        (SIZE, 0, "address is null"),
        (SIZE, u64::MAX - 10, "wraps around the address space"),
    ] {
        let mut p = valid();
        of(&mut p, 102).push(mapping(1, 101, address, size, 0).into());
        check(&p, Some(102), Some(1), rule);
    }

    for offset in [SIZE / 2, u64::MAX] {
        let mut p = valid();
        of(&mut p, 102).push(mapping(1, 101, address(102, 3), SIZE, offset).into());
        check(
            &p,
            Some(102),
            Some(1),
            "exceeds the allocation size 0x200000",
        );
    }
}

#[test]
fn access_rules() {
    use cuinterpose_protocol::{AccessFlags, Location, LocationType};
    let with_access = |access: Vec<AccessDescriptor>| {
        let mut p = valid();
        for record in of(&mut p, 102).iter_mut() {
            if let Record::Mapping(r) = record {
                r.access = access.clone().try_into().expect("bounded");
            }
        }
        p
    };
    let host = |id, flags| AccessDescriptor {
        location: Location {
            location_type: LocationType::Host,
            id,
            uuid: None,
        },
        flags,
    };
    let p = with_access(vec![read_write(0), read_write(1), read_write(0)]);
    check(
        &p,
        Some(102),
        Some(1),
        "access list names device 0 more than once",
    );
    // The host location's id is ignored: two entries are still the same location.
    let p = with_access(vec![
        host(0, AccessFlags::ProtRead),
        host(5, AccessFlags::ProtReadWrite),
    ]);
    check(
        &p,
        Some(102),
        Some(1),
        "access list names host more than once",
    );
    let p = with_access(vec![read_write(-1)]);
    check(
        &p,
        Some(102),
        Some(1),
        "access location device -1 has an invalid id",
    );
    let p = with_access(vec![
        read_write(0),
        read_write(1),
        host(0, AccessFlags::ProtNone),
    ]);
    validate(&inspections(&p, Phase::Active)).expect("distinct locations");
}

#[test]
fn multicast_object_rules() {
    let mut p = valid();
    of(&mut p, 102).retain(|r| !matches!(r, Record::Multicast(_)));
    of(&mut p, 102).push(multicast(9, 102, 3, SIZE).into());
    check(&p, None, Some(9), "multicast object");
    check(
        &p,
        None,
        Some(9),
        "claimed as creator by participants 101, 102",
    );

    let mut p = valid();
    of(&mut p, 103).push(multicast(9, 101, 3, SIZE).into());
    check(&p, Some(103), Some(9), "reported twice");

    let mut p = valid();
    for record in of(&mut p, 102).iter_mut() {
        if let Record::Multicast(r) = record {
            r.properties.device_count = 2;
        }
    }
    check(&p, Some(102), Some(9), "importer properties (2 devices");

    for (edit, rule) in [
        (
            (|r: &mut MulticastRecord| r.properties.device_count = 0) as fn(&mut _),
            "device count is 0",
        ),
        (|r| r.properties.size = 0, "size is 0"),
        (|r| r.properties.flags = 1, "creation flags must be 0"),
    ] {
        let mut p = valid();
        for records in p.values_mut() {
            for record in records.iter_mut() {
                if let Record::Multicast(r) = record {
                    edit(r);
                }
            }
        }
        check(&p, Some(101), Some(9), rule);
    }

    let mut p = valid();
    of(&mut p, 103).push(multicast(8, 555, 1, SIZE).into());
    check(
        &p,
        Some(103),
        Some(8),
        "imported from participant 555, which is not a participant",
    );
}

#[test]
fn multicast_device_rules() {
    let mut p = valid();
    of(&mut p, 103)
        .retain(|r| !matches!(r, Record::MulticastDevice(_) | Record::MulticastBinding(_)));
    check(
        &p,
        None,
        Some(9),
        "2 (participant, device) pairs attached across participants, the object was created for 3",
    );

    let mut p = valid();
    of(&mut p, 101).push(multicast_device(9, 101, 1).into());
    of(&mut p, 101).push(memory_binding(reference(9, 101), reference(1, 101), 0, SIZE, 1).into());
    check(&p, None, Some(9), "4 (participant, device) pairs");

    let mut p = valid();
    of(&mut p, 102).retain(|r| !matches!(r, Record::MulticastBinding(_)));
    check(
        &p,
        Some(102),
        Some(9),
        "device 0 is attached but has no binding in this participant",
    );

    // Each: a record participant 102 gains, the object named, the rule.
    let added: [(Record, u8, &str); 3] = [
        (
            multicast_device(9, 101, 0).into(),
            9,
            "device 0 added more than once",
        ),
        (
            memory_binding(reference(9, 101), reference(1, 101), 0, SIZE, 1).into(),
            9,
            "binding on device 1, which this participant did not attach",
        ),
        (
            multicast_device(8, 101, 0).into(),
            8,
            "device for a multicast object this participant holds no record of",
        ),
    ];
    for (record, object, rule) in added {
        check_added(102, record, object, rule);
    }
}

/// The valid topology with `record` added to participant `holder`: validation reports `rule`
/// there, naming `object` ([`check`]).
fn check_added(holder: u32, record: Record, object: u8, rule: &str) -> Vec<TopologyError> {
    let mut p = valid();
    of(&mut p, holder).push(record);
    check(&p, Some(holder), Some(object), rule)
}

#[test]
fn multicast_binding_rules() {
    let mut p = valid();
    of(&mut p, 102).push(memory_binding(reference(9, 101), reference(7, 101), 0, SIZE, 0).into());
    let errors = check(&p, Some(102), Some(9), "member allocation");
    assert!(errors.iter().any(|e| e.to_string().contains(&format!(
        "{} (creator 101) is not an allocation record",
        id(7)
    ))));

    // Each: a binding participant 102 gains, the rule it breaks.
    let member =
        |offset, size| memory_binding(reference(9, 101), reference(1, 101), offset, size, 0);
    let added: [(Record, &str); 3] = [
        (
            member(SIZE / 2, SIZE).into(),
            "offset 0x100000 + size 0x200000 exceeds its size 0x200000",
        ),
        (member(0, 0).into(), "binding on device 0: size is 0"),
        (
            address_binding(reference(9, 101), 0, None, SIZE, 0).into(),
            "bound address is null",
        ),
    ];
    for (record, rule) in added {
        check_added(102, record, 9, rule);
    }

    // Address bindings, tracked or not, are valid when in bounds.
    let mut p = valid();
    of(&mut p, 102).retain(|r| !matches!(r, Record::MulticastBinding(_)));
    let tracked = MemberRange {
        allocation: reference(1, 101),
        offset: 0,
    };
    of(&mut p, 102)
        .push(address_binding(reference(9, 101), address(102, 1), Some(tracked), SIZE, 0).into());
    of(&mut p, 103).retain(|r| !matches!(r, Record::MulticastBinding(_)));
    of(&mut p, 103).push(address_binding(reference(9, 101), 0x1000, None, SIZE, 0).into());
    validate(&inspections(&p, Phase::Active)).expect("address bindings");
    let tracked = MemberRange {
        allocation: reference(1, 101),
        offset: 1,
    };
    of(&mut p, 102)
        .push(address_binding(reference(9, 101), address(102, 1), Some(tracked), SIZE, 0).into());
    check(&p, Some(102), Some(9), "offset 0x1 + size 0x200000 exceeds");

    check_added(
        102,
        memory_binding(reference(8, 101), reference(1, 101), 0, SIZE, 0).into(),
        8,
        "binding for a multicast object this participant holds no record of",
    );
}

#[test]
fn multicast_mapping_rules() {
    let mut p = valid();
    of(&mut p, 102).push(multicast_mapping(reference(8, 101), address(102, 8), SIZE).into());
    check(&p, Some(102), Some(8), "multicast mapping at");
    check(
        &p,
        Some(102),
        Some(8),
        "refers to no multicast record of this participant",
    );

    let mut p = valid();
    for record in of(&mut p, 102).iter_mut() {
        if let Record::MulticastMapping(r) = record {
            r.flags = 4;
        }
    }
    check(&p, Some(102), Some(9), "cuMemMap flags 0x4 (must be 0)");

    let mut p = valid();
    for record in of(&mut p, 102).iter_mut() {
        if let Record::MulticastMapping(r) = record {
            r.size = 0;
            r.access = vec![read_write(2), read_write(2)]
                .try_into()
                .expect("bounded");
        }
    }
    let errors = check(&p, Some(102), Some(9), "multicast mapping at");
    assert!(errors.iter().any(|e| e.to_string().contains("size is 0")));
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("names device 2 more than once"))
    );
}

#[test]
fn byte_counts_are_overflow_checked() {
    let mut p = valid();
    of(&mut p, 101).push(allocation(3, 101, u64::MAX - 1, true, 1).into());
    check(&p, Some(101), None, "overflow 64 bits");
}

#[test]
fn every_problem_is_reported() {
    let mut p = valid();
    of(&mut p, 101).push(allocation(6, 101, 0, false, 1).into());
    of(&mut p, 102).push(mapping(7, 101, address(102, 7), SIZE, 0).into());
    of(&mut p, 103).push(allocation(5, 999, SIZE, false, 1).into());
    let errors = validate(&inspections(&p, Phase::Active)).expect_err("invalid");
    let scopes: BTreeSet<_> = errors
        .iter()
        .filter_map(TopologyError::participant)
        .collect();
    assert_eq!(
        scopes,
        BTreeSet::from([pid(101), pid(102), pid(103)]),
        "{errors:?}"
    );
}
