//! The records against the model: what the coordinator reports equals what the case built,
//! and record sets compared participant by participant.

use std::collections::{BTreeMap, BTreeSet};

use cuinterpose_coordinator::{render, state};
use cuinterpose_protocol::{
    AccessFlags, AllocationReference, BindingSource, BindingVersion, NamespacePid, Record,
};

use crate::case::{Case, CaseResult, ensure};
use crate::topology::{Bind, GRAN, READ, READ_WRITE};

/// Of `records`, those of variant `kind` of the multicast object `object`, as `take` gives
/// each.
macro_rules! held {
    ($records:expr, $kind:ident, $object:expr, |$record:ident| $take:expr) => {
        $records
            .iter()
            .filter_map(|record| match record {
                Record::$kind($record) if $record.object == $object => Some($take),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
}

pub(crate) fn records_diff(
    what: &str,
    expected: &BTreeMap<NamespacePid, Vec<Record>>,
    found: &BTreeMap<NamespacePid, Vec<Record>>,
) -> CaseResult<()> {
    let pids: BTreeSet<&NamespacePid> = expected.keys().chain(found.keys()).collect();
    let mut problems = Vec::new();
    for pid in pids {
        let none = Vec::new();
        let differences = state::compare(
            expected.get(pid).unwrap_or(&none),
            found.get(pid).unwrap_or(&none),
        );
        problems.extend(
            differences
                .iter()
                .map(|difference| format!("participant {pid}: {difference}")),
        );
    }
    ensure!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
    Ok(())
}

pub(crate) fn render_records(records: &BTreeMap<NamespacePid, Vec<Record>>) -> String {
    let mut out = String::from("records:\n");
    for (pid, records) in records {
        for record in records {
            out.push_str(&format!("  {pid}: {}\n", render::record(record)));
        }
    }
    out
}

pub(crate) fn access_of(record: &[cuinterpose_protocol::AccessDescriptor]) -> Vec<(i32, u32)> {
    let mut access: Vec<(i32, u32)> = record
        .iter()
        .map(|descriptor| {
            let flags = match descriptor.flags {
                AccessFlags::ProtNone => 0,
                AccessFlags::ProtRead => READ,
                AccessFlags::ProtReadWrite => READ_WRITE,
            };
            (descriptor.location.id, flags)
        })
        .filter(|(_, flags)| *flags != 0)
        .collect();
    access.sort_unstable();
    access
}

/// The records say what the case built: each mapping at its address, with its range and
/// access; one allocation reference per allocation, created by its creator; host carriers on
/// the creators of shared allocations only; handle counts; each multicast team's records.
pub(crate) fn check_model(
    case: &Case<'_>,
    records: &BTreeMap<NamespacePid, Vec<Record>>,
) -> CaseResult<()> {
    let plan = case.plan;
    let pid = |p: usize| NamespacePid::new(case.workers[p].worker_pid() as u32).expect("pid");
    let mapping_at = |p: usize, address: u64| {
        records[&pid(p)].iter().find_map(|record| match record {
            Record::Mapping(mapping) if mapping.address == address => Some(mapping),
            _ => None,
        })
    };
    let mut references: Vec<Option<AllocationReference>> = vec![None; plan.allocations.len()];
    for held in &case.held {
        let name = case.name(held.process);
        if plan.allocations[held.alloc].handle_types == 0 {
            // Without a shareable handle type it can never be shared: not tracked, left to the
            // native checkpoint.
            ensure!(
                mapping_at(held.process, held.address).is_none(),
                "{name}: a mapping record at {:#x} of untracked allocation {}",
                held.address,
                held.alloc
            );
            continue;
        }
        let Some(mapping) = mapping_at(held.process, held.address) else {
            return Err(format!(
                "{name}: no mapping record at {:#x} (allocation {})",
                held.address, held.alloc
            ));
        };
        ensure!(
            mapping.size == held.map.len * GRAN && mapping.offset == held.map.offset * GRAN,
            "{name}: mapping at {:#x}: size {:#x} offset {:#x}, expected {:#x} at {:#x}",
            held.address,
            mapping.size,
            mapping.offset,
            held.map.len * GRAN,
            held.map.offset * GRAN
        );
        let access = access_of(&mapping.access);
        ensure!(
            access == held.map.grants,
            "{name}: mapping at {:#x}: access {access:?}, expected {:?}",
            held.address,
            held.map.grants
        );
        match &references[held.alloc] {
            None => references[held.alloc] = Some(mapping.allocation.clone()),
            Some(reference) => ensure!(
                *reference == mapping.allocation,
                "{name}: mapping at {:#x} names {:?}, other mappings of allocation {} name {:?}",
                held.address,
                mapping.allocation,
                held.alloc,
                reference
            ),
        }
    }
    let distinct: BTreeSet<_> = references.iter().flatten().map(|r| r.id).collect();
    let tracked = references.iter().flatten().count();
    ensure!(
        distinct.len() == tracked,
        "{tracked} allocations share {} ids",
        distinct.len()
    );
    for (a, alloc) in plan.allocations.iter().enumerate() {
        let Some(reference) = references[a].clone() else {
            continue;
        };
        ensure!(
            reference.creator_pid == pid(alloc.creator),
            "allocation {a}: records name creator {}, expected {}",
            reference.creator_pid,
            pid(alloc.creator)
        );
        let mut holders: BTreeSet<usize> = alloc.imports.iter().map(|i| i.process).collect();
        holders.insert(alloc.creator);
        for p in 0..plan.processes {
            let name = case.name(p);
            let found: Vec<_> = records[&pid(p)]
                .iter()
                .filter_map(|record| match record {
                    Record::Allocation(record) if record.allocation == reference => Some(record),
                    _ => None,
                })
                .collect();
            if !holders.contains(&p) {
                ensure!(
                    found.is_empty(),
                    "{name}: holds an allocation record of allocation {a} it never imported"
                );
                continue;
            }
            let [record] = found[..] else {
                return Err(format!(
                    "{name}: {} allocation records of allocation {a}",
                    found.len()
                ));
            };
            ensure!(
                record.size == alloc.granules * GRAN,
                "{name}: allocation {a} record size {:#x}",
                record.size
            );
            let handles = if p == alloc.creator {
                u64::from(!alloc.creator_release)
            } else {
                case.import_handles[a].get(&p).copied().unwrap_or(0)
            };
            ensure!(
                record.handle_count == handles,
                "{name}: allocation {a}: handle count {}, expected {handles}",
                record.handle_count
            );
            if p != alloc.creator || !alloc.export {
                ensure!(
                    !record.host_carrier,
                    "{name}: allocation {a}: host carrier on a record that must not carry"
                );
            } else if alloc.shared() {
                ensure!(
                    record.host_carrier,
                    "{name}: allocation {a}: shared, but its creator record carries nothing"
                );
            }
            let mappings = records[&pid(p)]
                .iter()
                .filter(|record| matches!(record, Record::Mapping(m) if m.allocation == reference))
                .count();
            let expected = case
                .held
                .iter()
                .filter(|held| held.alloc == a && held.process == p)
                .count();
            ensure!(
                mappings == expected,
                "{name}: {mappings} mapping records of allocation {a}, expected {expected}"
            );
        }
    }
    for (g, group) in plan.groups.iter().enumerate() {
        let mut object: Option<AllocationReference> = None;
        for (m, member) in case.groups[g].iter().enumerate() {
            let p = member.process;
            let name = case.name(p);
            let device = plan.devices[p];
            let Some(memory) = mapping_at(p, member.memory_va) else {
                return Err(format!("{name}: group {g}: no record of the member memory"));
            };
            let memory = memory.allocation.clone();
            let bindings: Vec<_> = records[&pid(p)]
                .iter()
                .filter_map(|record| match record {
                    Record::MulticastBinding(binding) => Some(binding),
                    _ => None,
                })
                .filter(|binding| match &binding.source {
                    BindingSource::Memory(source) => source.member.allocation == memory,
                    BindingSource::Address(source) => (member.memory_va
                        ..member.memory_va + group.granules * GRAN)
                        .contains(&source.address),
                })
                .collect();
            let expected: Vec<_> = (0..group.granules)
                .filter_map(|i| group.binds[m][i as usize].map(|bind| (i, bind)))
                .collect();
            ensure!(
                bindings.len() == expected.len(),
                "{name}: group {g}: {} binding records, expected {}",
                bindings.len(),
                expected.len()
            );
            for (i, bind) in expected {
                let j = (i + group.rotation) % group.granules;
                let Some(binding) = bindings
                    .iter()
                    .find(|binding| binding.multicast_offset == i * GRAN)
                else {
                    return Err(format!(
                        "{name}: group {g}: no binding record at multicast offset {:#x}",
                        i * GRAN
                    ));
                };
                let (kind_ok, v2) = match (bind, &binding.source) {
                    (Bind::Mem(v2), BindingSource::Memory(source)) => {
                        (source.member.offset == j * GRAN, v2)
                    }
                    (Bind::Addr(v2), BindingSource::Address(source)) => {
                        (source.address == member.memory_va + j * GRAN, v2)
                    }
                    _ => (false, false),
                };
                let version = if v2 {
                    BindingVersion::V2
                } else {
                    BindingVersion::V1
                };
                ensure!(
                    kind_ok
                        && binding.size == GRAN
                        && binding.version == version
                        && binding.device == device,
                    "{name}: group {g}: binding at {:#x} is {binding:?}, expected {bind:?} of \
                     member granule {j} on device {device}",
                    i * GRAN
                );
                match &object {
                    None => object = Some(binding.object.clone()),
                    Some(reference) => ensure!(
                        *reference == binding.object,
                        "{name}: group {g}: bindings name {:?} and {reference:?}",
                        binding.object
                    ),
                }
            }
        }
        let object = object.expect("every member binds");
        ensure!(
            object.creator_pid == pid(group.members[0]),
            "group {g}: created by {}, records say {}",
            pid(group.members[0]),
            object.creator_pid
        );
        for member in &case.groups[g] {
            let p = member.process;
            let name = case.name(p);
            let mine = &records[&pid(p)];
            let multicast = held!(mine, Multicast, object, |record| record);
            ensure!(
                multicast.len() == 1
                    && multicast[0].properties.device_count == group.members.len() as u32
                    && multicast[0].properties.size == group.granules * GRAN
                    && multicast[0].handle_count == 1,
                "{name}: group {g}: multicast records {multicast:?}"
            );
            let devices: Vec<i32> = held!(mine, MulticastDevice, object, |record| record.device);
            ensure!(
                devices == [plan.devices[p]],
                "{name}: group {g}: devices {devices:?}, expected [{}]",
                plan.devices[p]
            );
            let views = held!(mine, MulticastMapping, object, |record| record);
            match member.view {
                None => ensure!(views.is_empty(), "{name}: group {g}: views {views:?}"),
                Some(view) => ensure!(
                    views.len() == 1
                        && views[0].address == view
                        && views[0].size == group.granules * GRAN
                        && access_of(&views[0].access) == [(plan.devices[p], READ_WRITE)],
                    "{name}: group {g}: views {views:?}, expected one at {view:#x}"
                ),
            }
        }
    }
    Ok(())
}
