//! Building a case's topology in its workers: VMM allocations (exported, imported, relayed,
//! released), legacy IPC allocations, and multicast teams with their bindings and views.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

use crate::case::{Case, CaseResult, Context, Held, McMember, ensure};
use crate::topology::{Bind, GRAN, POSIX};

impl Case<'_> {
    pub(crate) fn build_vmm(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (a, alloc) in plan.allocations.iter().enumerate() {
            let c = alloc.creator;
            let size = alloc.granules * GRAN;
            let name = self.name(c);
            let handle = self.workers[c]
                .create(size, alloc.device, alloc.handle_types)
                .ctx(|| format!("{name}: create allocation {a} ({size:#x})"))?;
            self.creator_handles[a] = Some(handle);
            let seeds: Vec<u64> = (0..alloc.granules).map(|g| self.seed(1, a, g)).collect();
            self.seeds[a] = seeds;
            for map in &alloc.creator_maps {
                let address = self.map(c, handle, map)?;
                self.held.push(Held {
                    process: c,
                    alloc: a,
                    address,
                    map: map.clone(),
                });
            }
            let whole = self.held[self.held.len() - alloc.creator_maps.len()].address;
            for g in 0..alloc.granules {
                let seed = self.seeds[a][g as usize];
                self.fill(c, whole + g * GRAN, GRAN, seed)?;
            }
            if !alloc.export {
                if alloc.creator_release {
                    self.release(c, a)?;
                }
                continue;
            }
            let ticket: OwnedFd = self.workers[c]
                .export(handle)
                .ctx(|| format!("{name}: export allocation {a}"))?;
            let mut import_handles: Vec<u64> = Vec::new();
            for (i, import) in alloc.imports.iter().enumerate() {
                let p = import.process;
                let relayed: Option<OwnedFd> = match import.relay_from {
                    Some(j) => {
                        let from = alloc.imports[j].process;
                        let from_name = self.name(from);
                        Some(self.workers[from].export(import_handles[j]).ctx(|| {
                            format!("{from_name}: re-export allocation {a} (import {j})")
                        })?)
                    }
                    None => None,
                };
                let fd = relayed.as_ref().unwrap_or(&ticket);
                let name = self.name(p);
                let h = self.workers[p]
                    .import(fd.as_fd())
                    .ctx(|| format!("{name}: import allocation {a} (import {i})"))?;
                import_handles.push(h);
                let address = self.map(p, h, &import.map)?;
                let held = Held {
                    process: p,
                    alloc: a,
                    address,
                    map: import.map.clone(),
                };
                self.held.push(held);
                if import.release {
                    self.workers[p]
                        .release(h)
                        .ctx(|| format!("{name}: release import {i} of allocation {a}"))?;
                } else {
                    *self.import_handles[a].entry(p).or_insert(0) += 1;
                }
            }
            drop(ticket);
            if alloc.creator_release {
                self.release(c, a)?;
            }
        }
        Ok(())
    }

    pub(crate) fn build_ipc(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (i, ipc) in plan.ipc.iter().enumerate() {
            let c = ipc.creator;
            let name = self.name(c);
            let pointer = self.workers[c]
                .mem_alloc(ipc.size)
                .ctx(|| format!("{name}: cuMemAlloc IPC allocation {i}"))?;
            let seeds: Vec<u64> = Self::chunks(ipc.size)
                .map(|(offset, _)| self.seed(2, i, offset / GRAN))
                .collect();
            for ((offset, len), seed) in Self::chunks(ipc.size).zip(seeds.clone()) {
                self.fill(c, pointer + offset, len, seed)?;
            }
            self.ipc.push((pointer, seeds, BTreeMap::new()));
            if !ipc.get {
                continue;
            }
            let handle = self.workers[c]
                .ipc_get(pointer)
                .ctx(|| format!("{name}: cuIpcGetMemHandle IPC allocation {i}"))?;
            for &p in &ipc.opens {
                let name = self.name(p);
                let opened = self.workers[p]
                    .ipc_open(&handle)
                    .ctx(|| format!("{name}: cuIpcOpenMemHandle IPC allocation {i}"))?;
                if let Some(&first) = self.ipc[i].2.get(&p) {
                    ensure!(
                        first == opened,
                        "{name}: IPC allocation {i} opened twice: {first:#x}, then {opened:#x}"
                    );
                }
                self.ipc[i].2.insert(p, opened);
                self.verify_ipc(i, p, opened)?;
            }
        }
        Ok(())
    }

    pub(crate) fn build_groups(&mut self) -> CaseResult<()> {
        let plan = self.plan;
        for (g, group) in plan.groups.iter().enumerate() {
            let size = group.granules * GRAN;
            let creator = group.members[0];
            let name = self.name(creator);
            let mc = self.workers[creator]
                .mc_create(group.members.len() as u32, size, u64::from(POSIX))
                .ctx(|| format!("{name}: cuMulticastCreate group {g}"))?;
            let ticket = self.workers[creator]
                .export(mc)
                .ctx(|| format!("{name}: export multicast group {g}"))?;
            let mut handles = vec![mc];
            for &p in &group.members[1..] {
                let name = self.name(p);
                handles.push(
                    self.workers[p]
                        .import(ticket.as_fd())
                        .ctx(|| format!("{name}: import multicast group {g}"))?,
                );
            }
            drop(ticket);
            // Every device first: a bind waits for the whole team.
            for (m, &p) in group.members.iter().enumerate() {
                let name = self.name(p);
                let device = plan.devices[p];
                self.workers[p]
                    .mc_add_device(handles[m], device)
                    .ctx(|| format!("{name}: add device {device} to group {g}"))?;
            }
            let mut members = Vec::new();
            let mut seeds = Vec::new();
            for (m, &p) in group.members.iter().enumerate() {
                let name = self.name(p);
                let device = plan.devices[p];
                let memory = self.workers[p]
                    .create(size, device, POSIX)
                    .ctx(|| format!("{name}: create member memory of group {g}"))?;
                let va = self.workers[p]
                    .map_rw(memory, size, device)
                    .ctx(|| format!("{name}: map member memory of group {g}"))?;
                let member_seeds: Vec<u64> = (0..group.granules)
                    .map(|j| self.seed(3, g * 8 + m, j))
                    .collect();
                for (j, &seed) in (0..).zip(&member_seeds) {
                    self.fill(p, va + j * GRAN, GRAN, seed)?;
                }
                seeds.push(member_seeds);
                for i in 0..group.granules {
                    let j = (i + group.rotation) % group.granules;
                    let (mc_offset, mem_offset) = (i * GRAN, j * GRAN);
                    let bound = match group.binds[m][i as usize] {
                        None => continue,
                        Some(Bind::Mem(v2)) => self.workers[p].mc_bind_mem(
                            handles[m],
                            mc_offset,
                            memory,
                            mem_offset,
                            GRAN,
                            v2.then_some(device),
                        ),
                        Some(Bind::Addr(v2)) => self.workers[p].mc_bind_addr(
                            handles[m],
                            mc_offset,
                            va + mem_offset,
                            GRAN,
                            v2.then_some(device),
                        ),
                    };
                    bound.ctx(|| {
                        format!(
                            "{name}: bind {:?} at multicast offset {mc_offset:#x} of group {g}",
                            group.binds[m][i as usize]
                        )
                    })?;
                }
                members.push(McMember {
                    process: p,
                    handle: handles[m],
                    memory_va: va,
                    view: None,
                });
            }
            for (m, member) in members.iter_mut().enumerate() {
                if group.views[m] {
                    let p = member.process;
                    let name = format!("p{p} (pid {})", self.workers[p].worker_pid());
                    member.view = Some(
                        self.workers[p]
                            .map_rw(member.handle, size, plan.devices[p])
                            .ctx(|| format!("{name}: map multicast group {g}"))?,
                    );
                }
            }
            self.groups.push(members);
            self.group_seeds.push(seeds);
        }
        Ok(())
    }
}
