//! Unit tests of the device identity rule: the UUID a record carries beside each ordinal is
//! the one its process lists for that ordinal.

use std::collections::BTreeMap;

use cuinterpose_protocol::{InspectionReply, NamespacePid, Phase};

use super::tests::{check_inspections, valid};
use super::*;
use cuinterpose_testkit::fixtures::*;

/// GPU `n` as device `ordinal` of a process.
fn gpu(ordinal: i32, n: u8) -> cuinterpose_protocol::Device {
    cuinterpose_protocol::Device {
        ordinal,
        uuid: cuinterpose_protocol::DeviceUuid::new([n; 16]).expect("nonzero"),
        name: "H200".try_into().expect("short"),
        memory: 80 << 30,
    }
}

#[test]
fn device_identity_rules() {
    // Every participant sees GPU 0xa1 as its device 0, and its records say so.
    let listed = |replies: &mut BTreeMap<NamespacePid, InspectionReply>, devices: &[_]| {
        for reply in replies.values_mut() {
            reply.devices = devices.to_vec().try_into().expect("few");
            let mut records = reply.records.to_vec();
            records
                .iter_mut()
                .for_each(|r| r.name_devices(&reply.devices));
            reply.records = records.try_into().expect("as many");
        }
    };
    let mut replies = inspections(&valid(), Phase::Active);
    listed(&mut replies, &[gpu(0, 0xa1)]);
    validate(&replies).expect("records and device lists agree");
    let gpu_a1 = "GPU-a1a1a1a1-a1a1-a1a1-a1a1-a1a1a1a1a1a1";

    // A record that names another GPU than the list does.
    let mut wrong = replies.clone();
    let reply = wrong.get_mut(&pid(102)).expect("102");
    let mut records = reply.records.to_vec();
    records
        .iter_mut()
        .for_each(|r| r.name_devices(&[gpu(0, 0xb2)]));
    reply.records = records.try_into().expect("as many");
    check_inspections(
        &wrong,
        Some(102),
        None,
        &format!(
            "names device 0 as GPU-b2b2b2b2-b2b2-b2b2-b2b2-b2b2b2b2b2b2, but the process's \
             device list gives it {gpu_a1}"
        ),
    );

    // A record that names no GPU, and an ordinal the list lacks.
    let mut unnamed = replies.clone();
    let reply = unnamed.get_mut(&pid(101)).expect("101");
    let mut records = reply.records.to_vec();
    records.iter_mut().for_each(|r| r.name_devices(&[]));
    reply.records = records.try_into().expect("as many");
    check_inspections(&unnamed, Some(101), None, "names device 0 as no GPU");
    let mut absent = replies.clone();
    listed(&mut absent, &[gpu(1, 0xa1)]);
    check_inspections(&absent, Some(101), None, "has no such ordinal");

    // A process that listed no devices names none and is not checked.
    let plain = inspections(&valid(), Phase::Active);
    validate(&plain).expect("no device lists, nothing to check");

    // A state file is checked against the devices it recorded.
    let mut state = state_file(&valid());
    state.devices.participants = wrong
        .iter()
        .map(|(pid, reply)| (*pid, reply.devices.clone()))
        .collect::<BTreeMap<_, _>>()
        .try_into()
        .expect("few participants");
    state.participants = wrong
        .iter()
        .map(|(pid, reply)| (*pid, reply.records.clone()))
        .collect::<BTreeMap<_, _>>()
        .try_into()
        .expect("few participants");
    let errors = validate_state(&state).expect_err("a record disagrees with its device list");
    assert!(
        errors.iter().any(|e| e.participant() == Some(pid(102))
            && e.to_string().contains("names device 0 as GPU-b2b2b2b2")),
        "{errors:?}"
    );
}

/// Every device ordinal `records` name, renumbered by `ordinal`.
fn renumber(records: &mut [cuinterpose_protocol::Record], ordinal: impl Fn(i32) -> i32) {
    use cuinterpose_protocol::Record;
    for record in records {
        match record {
            Record::Allocation(a) => a.properties.location.id = ordinal(a.properties.location.id),
            Record::Mapping(m) => m
                .access
                .iter_mut()
                .for_each(|g| g.location.id = ordinal(g.location.id)),
            Record::MulticastMapping(m) => m
                .access
                .iter_mut()
                .for_each(|g| g.location.id = ordinal(g.location.id)),
            Record::MulticastDevice(d) => d.device = ordinal(d.device),
            Record::MulticastBinding(b) => b.device = ordinal(b.device),
            _ => {}
        }
    }
}

/// Inspections of the shared topology where participant 102 numbers the two GPUs the other
/// way round (its `CUDA_VISIBLE_DEVICES` is `1,0`), and GPU `importer_gpu` is what 102's
/// records call the creator's GPU.
fn numbered_apart(importer_gpu: u8) -> BTreeMap<NamespacePid, InspectionReply> {
    let mut replies = inspections(&valid(), Phase::Active);
    for (pid, reply) in replies.iter_mut() {
        let mut records = reply.records.to_vec();
        let devices = if pid.get() == 102 {
            renumber(&mut records, |o| 1 - o);
            vec![gpu(0, 0xb2), gpu(1, importer_gpu)]
        } else {
            vec![gpu(0, 0xa1), gpu(1, 0xb2)]
        };
        records.iter_mut().for_each(|r| r.name_devices(&devices));
        records.sort();
        reply.devices = devices.try_into().expect("two");
        reply.records = records.try_into().expect("as many");
    }
    replies
}

#[test]
fn an_importer_may_number_the_creators_gpu_its_own_way() {
    // 102 calls GPU 0xa1 its device 1: the same memory, the topology is valid.
    validate(&numbered_apart(0xa1)).expect("the same GPU under another ordinal");
    // 102's device 1 is another GPU: its import is not the creator's memory.
    check_inspections(
        &numbered_apart(0xc3),
        Some(102),
        Some(1),
        "importer properties (pinned on device 1 (GPU-c3c3c3c3-c3c3-c3c3-c3c3-c3c3c3c3c3c3)",
    );
}
