//! Unit tests of the pool pass: a valid shared pool, then each pool rule broken on its own.

use cuinterpose_protocol::Record;

use super::tests::{Participants, check, of, valid};
use super::*;
use cuinterpose_testkit::fixtures::*;

/// The shared topology with pool 20 of participant 101 imported by 102; allocation 1 (created
/// by 101) is its member in both.
fn pooled() -> Participants {
    let mut participants = valid();
    for p in [101, 102] {
        let records = of(&mut participants, p);
        records.push(pool(20, 101, Vec::new()).into());
        records.push(pool_member(20, 101, 1, 101).into());
        records.sort();
    }
    participants
}

fn validates(participants: &Participants) -> Topology {
    let records = participants
        .iter()
        .map(|(&pid, records)| (pid, &records[..]))
        .collect();
    validate_records(&records).expect("valid")
}

fn edit(participants: &mut Participants, p: u32, change: impl FnOnce(&mut Vec<Record>)) {
    let records = of(participants, p);
    change(records);
    records.sort();
}

/// [`pooled`] with `added` in participant 102: validation reports `rule` there, naming
/// `object`.
fn check_added(added: Vec<Record>, object: u8, rule: &str) {
    let mut participants = pooled();
    edit(&mut participants, 102, |r| r.extend(added));
    check(&participants, Some(102), Some(object), rule);
}

#[test]
fn a_shared_pool_is_valid() {
    let topology = validates(&pooled());
    assert_eq!(topology.shared_allocations.len(), 1);
}

#[test]
fn an_imported_pool_needs_its_creator() {
    // The creator holds no record of the pool.
    let mut participants = pooled();
    edit(&mut participants, 101, |r| {
        r.retain(|r| !matches!(r, Record::Pool(_) | Record::PoolMember(_)))
    });
    check(&participants, Some(102), Some(20), "has no creator record");
    // The creator is not part of the checkpoint.
    check_added(
        vec![pool(21, 150, Vec::new()).into()],
        21,
        "which is not a participant",
    );
}

#[test]
fn a_member_needs_its_pool_and_its_allocation() {
    check_added(
        vec![pool_member(22, 101, 1, 101).into()],
        22,
        "holds no record of the pool",
    );
    check_added(
        vec![pool_member(20, 101, 7, 101).into()],
        7,
        "has no allocation record here",
    );
}

#[test]
fn a_pool_holds_only_its_creators_allocations() {
    let own = allocation(3, 102, SIZE, false, 1).into();
    let added = vec![own, pool_member(20, 101, 3, 102).into()];
    check_added(added, 3, "a pool's allocations are its creator's");
}

#[test]
fn the_creators_mappings_carry_the_pools_access() {
    let mut participants = pooled();
    edit(&mut participants, 101, |r| {
        r.retain(|r| !matches!(r, Record::Pool(_)));
        r.push(pool(20, 101, vec![read_write(1)]).into());
    });
    check(
        &participants,
        Some(101),
        Some(1),
        "grants device 1=read_write, but the mapping of its allocation",
    );
}
