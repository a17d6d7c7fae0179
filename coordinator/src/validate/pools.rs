//! The pool pass: memory pools of the shim's pool adapter. An imported pool's creator must be
//! a participant holding the pool's creator record; every member allocation must be recorded
//! in its process, belong to the pool's creator and sit in a pool that process holds; and the
//! creator's mappings of its pool's allocations must grant what the pool grants.

use cuinterpose_protocol::{NamespacePid, Record};

use super::checker::Checker;
use super::errors::{Object, TopologyError};
use crate::render;

impl Checker<'_> {
    pub(super) fn pools(&mut self) {
        let creators = self.pool_creators.clone();
        let pools: Vec<_> = self
            .pools
            .iter()
            .map(|(&(pid, _), &record)| (pid, record))
            .collect();
        for &(pid, record) in &pools {
            if record.pool.creator_pid != pid {
                self.check_reference(pid, Object::Pool(record.pool.clone()), &creators);
            }
        }
        let participants = self.participants;
        for (&pid, records) in participants {
            for record in records.iter() {
                let Record::PoolMember(member) = record else {
                    continue;
                };
                let pool = Object::Pool(member.pool.clone());
                let held = self
                    .pools
                    .get(&(pid, member.pool.id))
                    .filter(|p| p.pool == member.pool);
                let Some(held) = held else {
                    self.errors.push(TopologyError::PoolMemberWithoutPool {
                        pid,
                        pool,
                        allocation: member.allocation.clone(),
                    });
                    continue;
                };
                if member.allocation.creator_pid != member.pool.creator_pid {
                    self.errors.push(TopologyError::PoolMemberForeign {
                        pid,
                        pool: pool.clone(),
                        allocation: member.allocation.clone(),
                    });
                }
                if self.held_allocation(pid, &member.allocation).is_none() {
                    self.errors
                        .push(TopologyError::PoolMemberWithoutAllocation {
                            pid,
                            pool,
                            allocation: member.allocation.clone(),
                        });
                    continue;
                }
                if held.pool.creator_pid == pid && !held.access.is_empty() {
                    let access = held.access.clone();
                    self.check_pool_access(pid, &pool, member, &access);
                }
            }
        }
    }

    /// The creator's mappings of `member` grant every access its pool grants.
    fn check_pool_access(
        &mut self,
        pid: NamespacePid,
        pool: &Object,
        member: &cuinterpose_protocol::PoolMemberRecord,
        granted: &[cuinterpose_protocol::AccessDescriptor],
    ) {
        let records = self.participants[&pid];
        for record in records.iter() {
            let Record::Mapping(mapping) = record else {
                continue;
            };
            if mapping.allocation != member.allocation {
                continue;
            }
            let missing: Vec<_> = granted
                .iter()
                .filter(|g| !mapping.access.contains(g))
                .cloned()
                .collect();
            if !missing.is_empty() {
                self.errors.push(TopologyError::PoolAccessNotApplied {
                    pid,
                    pool: pool.clone(),
                    allocation: member.allocation.clone(),
                    address: mapping.address,
                    granted: render::access(&missing),
                });
            }
        }
    }
}
