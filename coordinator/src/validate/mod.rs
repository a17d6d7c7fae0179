//! Topology validation: every participant's records checked against each other before anything
//! is destroyed.
//!
//! [`validate`] collects every problem it finds (not just the first), and record or participant
//! order never matters: definitions are indexed in a first pass and references checked in later
//! ones. Nothing is sent to any participant when validation fails.
//!
//! Layout: `errors` (the rules, as messages), `topology` (what a valid topology holds),
//! `checker` (the index pass, the shared checks, the summary), then the `allocations`,
//! `multicast` and `pools` passes; [`device_identity`] checks each record's UUIDs against its
//! process's device list.

use std::collections::BTreeMap;

use cuinterpose_protocol::{Device, InspectionReply, NamespacePid, Phase, Record, StateFile};

mod allocations;
mod checker;
#[cfg(test)]
mod device_tests;
mod errors;
mod multicast;
#[cfg(test)]
mod pool_tests;
mod pools;
#[cfg(test)]
mod tests;
mod topology;

use checker::Checker;
pub use errors::{Object, TopologyError};
pub use topology::{MulticastGroup, SharedAllocation, Topology};

/// Validates a live inspection for prepare: every participant in phase `active`.
pub fn validate(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
) -> Result<Topology, Vec<TopologyError>> {
    validate_in_phase(inspections, Phase::Active)
}

/// Validates inspections whose participants must all be in `expected` (and hold no raw
/// imports, and answer under their own PID).
pub fn validate_in_phase(
    inspections: &BTreeMap<NamespacePid, InspectionReply>,
    expected: Phase,
) -> Result<Topology, Vec<TopologyError>> {
    let mut errors = Vec::new();
    for (&pid, inspection) in inspections {
        if inspection.namespace_pid != pid {
            errors.push(TopologyError::PidMismatch {
                pid,
                answered: inspection.namespace_pid,
            });
        }
        if inspection.phase != expected {
            errors.push(TopologyError::WrongPhase {
                pid,
                found: inspection.phase,
                expected,
            });
        }
        if inspection.raw_imports > 0 {
            errors.push(TopologyError::RawImports {
                pid,
                count: inspection.raw_imports,
            });
        }
        errors.extend(device_identity(
            pid,
            &inspection.records,
            &inspection.devices,
        ));
    }
    let records = inspections
        .iter()
        .map(|(&pid, inspection)| (pid, &inspection.records[..]))
        .collect();
    after(errors, &records)
}

/// Validates a state file: its records, and each participant's devices against the list it
/// recorded.
pub fn validate_state(state: &StateFile) -> Result<Topology, Vec<TopologyError>> {
    let mut errors = Vec::new();
    for (pid, records) in state.participants.iter() {
        if let Some(devices) = state.devices.participants.get(pid) {
            errors.extend(device_identity(*pid, records, devices));
        }
    }
    let records = state
        .participants
        .iter()
        .map(|(pid, records)| (*pid, &records[..]))
        .collect();
    after(errors, &records)
}

/// [`validate_records`] after the checks that found `errors`: every error of both, or the
/// topology when there are none.
fn after(
    mut errors: Vec<TopologyError>,
    records: &BTreeMap<NamespacePid, &[Record]>,
) -> Result<Topology, Vec<TopologyError>> {
    match validate_records(records) {
        Ok(topology) if errors.is_empty() => Ok(topology),
        Ok(_) => Err(errors),
        Err(more) => {
            errors.extend(more);
            Err(errors)
        }
    }
}

/// Every device `records` name against `devices`, the list their process reported: the
/// UUID beside each ordinal must be the one the list gives it. A process that listed no
/// devices (it never initialised the driver) names none, so it is not checked.
pub fn device_identity(
    pid: NamespacePid,
    records: &[Record],
    devices: &[Device],
) -> Vec<TopologyError> {
    if devices.is_empty() {
        return Vec::new();
    }
    let text = |uuid: Option<_>| {
        uuid.map_or_else(|| "no GPU".to_string(), |u| crate::remap::uuid_text(&u))
    };
    let mut errors = Vec::new();
    for record in records {
        for (ordinal, recorded) in record.devices() {
            let listed = devices
                .iter()
                .find(|d| d.ordinal == ordinal)
                .map(|d| d.uuid);
            if recorded.is_none() || recorded != listed {
                errors.push(TopologyError::DeviceIdentity {
                    pid,
                    record: crate::render::record(record),
                    ordinal,
                    recorded: text(recorded),
                    listed: listed.map_or_else(
                        || "has no such ordinal".to_string(),
                        |u| format!("gives it {}", crate::remap::uuid_text(&u)),
                    ),
                });
            }
        }
    }
    errors
}

/// Validates records alone (a state file, or inspections already checked for phase).
pub fn validate_records(
    participants: &BTreeMap<NamespacePid, &[Record]>,
) -> Result<Topology, Vec<TopologyError>> {
    let mut checker = Checker::index(participants);
    checker.allocations();
    checker.mappings();
    checker.multicast();
    checker.pools();
    let topology = checker.summary();
    if checker.errors.is_empty() {
        Ok(topology)
    } else {
        Err(checker.errors)
    }
}
