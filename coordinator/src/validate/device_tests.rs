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
