//! Handle identity, handle types and locations (clients.md §6, scenarios 9, 10, 12, 19, 20):
//! NCCL's retain/release/unmap/release free, FABRIC probing with its POSIX fallback (PyTorch,
//! NCCL, mscclpp), HOST_NUMA memory shared like device memory (NCCL SHM), importers on
//! another GPU and on the same one (every P2P import, vLLM's probe), and an 8-process
//! all-to-all fan-out torn down in random order (symmetric memory, custom all-reduce, NCCL
//! windows). Each runs plain and across a toggle.

use cuinterpose_clients::steps::{
    crosses, exportable, exported, map_granule, share, unmap_free, unmap_release,
};
use cuinterpose_clients::{
    ANY, CUDA_11, Ctx, FABRIC, GRAN, HOST_NUMA, MIB, Mode, POSIX, outcome, scenario,
};
use cuinterpose_workload::cuda::{
    DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
    DEVICE_ATTRIBUTE_POSIX_FD_SUPPORTED, DEVICE_ATTRIBUTE_VMM_SUPPORTED, HANDLE_TYPE_FABRIC,
};
use cuinterpose_workload::{Command, Grant, Worker};
use std::os::fd::AsFd;

// 9. NCCL: cuMemRetainAllocationHandle on a mapped VA gives the value cuMemCreate returned
//    (user-buffer registration retains, exports, releases); ncclCuMemFree retains, releases,
//    unmaps and releases again, which frees the memory; retain on cuMemAlloc memory fails
//    with the driver's code (NCCL then falls back to legacy IPC).
fn nccl_retain_release_unmap_release(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 91);
    let r = a.retain(va + GRAN / 2).expect("retain inside the mapping");
    ctx.note(format!("retain gives the creation value: {}", r == h));
    // ipcRegisterBuffer: export the retained handle, send, release the retained reference.
    let fd = a.export(r).unwrap();
    a.release(r).unwrap();
    let hb = b.import(fd.as_fd()).unwrap();
    drop(fd);
    let vb = map_granule(&mut b, hb, 0);
    b.verify(vb, GRAN, 91).unwrap();
    // An extra reference held across the checkpoint.
    let held = a.retain(va).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b]);
    let again = a.retain(va).unwrap();
    ctx.note(format!(
        "after: retain gives the creation value: {}",
        again == h && held == h
    ));
    a.release(again).unwrap();
    a.release(held).unwrap();
    crosses(&mut b, vb, &mut a, va, 92);
    // ncclCuMemFree.
    let r = a.retain(va).unwrap();
    a.release(r).unwrap();
    a.unmap(va, GRAN).unwrap();
    a.release(r).expect("the last reference");
    let freed = a.properties(h).map(drop);
    ctx.expect("properties after ncclCuMemFree", freed).ok();
    let unmapped = a.retain(va).map(drop);
    ctx.expect("retain of an unmapped address", unmapped).ok();
    a.free_address(va, GRAN).unwrap();
    b.verify(vb, GRAN, 92)
        .expect("the importer keeps its memory");
    unmap_release(&mut b, vb, hb);
    // cudaMalloc memory has no generic allocation handle.
    let p = a.mem_alloc(GRAN).unwrap();
    let legacy = a.retain(p).map(drop);
    ctx.expect("retain of cuMemAlloc memory", legacy).ok();
    a.mem_free(p).unwrap();
    ctx.assert_clean(&mut a);
    ctx.assert_clean(&mut b);
}
scenario!(nccl_retain_release_unmap_release, CUDA_11);

/// Fabric export of `h`: the outcome.
fn export_fabric(w: &mut Worker, h: u64) -> String {
    outcome(&w.export_with(h, HANDLE_TYPE_FABRIC, false).map(drop))
}

// 10. FABRIC probing without IMEX: cuDeviceGetAttribute says no fabric handles; cuMemCreate with
//     FABRIC and with POSIX_FD|FABRIC, fabric export and import answer as the bare driver does;
//     PyTorch's fallback (any non-OOM create error → POSIX) and NCCL's (ncclMemAlloc retries
//     POSIX alone) then share POSIX memory.
fn pytorch_nccl_fabric_probe_then_posix(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    for (name, attribute) in [
        ("vmm", DEVICE_ATTRIBUTE_VMM_SUPPORTED),
        ("posix fd", DEVICE_ATTRIBUTE_POSIX_FD_SUPPORTED),
        ("fabric", DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED),
        ("multicast", DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED),
    ] {
        let value = a.device_attribute(attribute, 0).map(|v| v.to_string());
        let text = value
            .as_ref()
            .map_or_else(|_| outcome(&value), Clone::clone);
        ctx.note(format!("attribute {name}: {text}"));
    }
    let fabric_supported = a
        .device_attribute(DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)
        .unwrap();
    assert_eq!(fabric_supported, 0, "no IMEX here");
    // PyTorch (expandable segments, UNSPECIFIED handle type): FABRIC first.
    let mut handle = None;
    for types in [FABRIC, POSIX | FABRIC] {
        let created = a.create(GRAN, 0, types);
        ctx.note(format!("create types {types}: {}", outcome(&created)));
        if let Ok(h) = created {
            ctx.note(format!("  fabric export: {}", export_fabric(&mut a, h)));
            let posix = a.export(h).map(drop);
            ctx.note(format!("  posix export: {}", outcome(&posix)));
            let props = a.properties(h).unwrap();
            ctx.note(format!("  handle types: {}", props.requested_handle_types));
            if types & POSIX != 0 && handle.is_none() {
                handle = Some(h);
                continue;
            }
            a.release(h).unwrap();
        }
    }
    // A fabric blob never imports without IMEX.
    let blob = b.import_fabric(vec![0x5a; 64]).map(drop);
    ctx.note(format!("fabric import: {}", outcome(&blob)));
    // The fallback: POSIX alone, shared the usual way. A POSIX|FABRIC allocation the driver
    // accepted is shared too, over its POSIX handle.
    let (h, va, fd) = exported(&mut a, 0, 101);
    let hb = b.import(fd.as_fd()).unwrap();
    let vb = map_granule(&mut b, hb, 0);
    let mixed = handle.map(|hm| {
        let vm = a.map_rw(hm, GRAN, 0).unwrap();
        a.fill(vm, GRAN, 102).unwrap();
        let fd = a.export(hm).unwrap();
        let hmb = b.import(fd.as_fd()).unwrap();
        let vmb = b.map_rw(hmb, GRAN, 0).unwrap();
        (hm, vm, hmb, vmb)
    });
    ctx.note(format!(
        "posix|fabric allocation shared: {}",
        mixed.is_some()
    ));
    ctx.checkpoint(&mut [&mut a, &mut b]);
    b.verify(vb, GRAN, 101).unwrap();
    crosses(&mut b, vb, &mut a, va, 103);
    if let Some((hm, vm, hmb, vmb)) = mixed {
        b.verify(vmb, GRAN, 102).unwrap();
        let props = a.properties(hm).unwrap();
        assert_eq!(props.requested_handle_types, POSIX | FABRIC);
        assert_eq!(export_fabric(&mut a, hm), "cuda:CUDA_ERROR_NOT_SUPPORTED");
        unmap_release(&mut b, vmb, hmb);
        unmap_release(&mut a, vm, hm);
    }
    ctx.release_shared(&mut b, (vb, hb), &mut a, (va, h));
}
scenario!(pytorch_nccl_fabric_probe_then_posix, ANY);

/// Read-write access for host NUMA node `node`.
fn host_node(node: i32) -> Grant {
    Grant {
        location_type: HOST_NUMA,
        id: node,
        flags: 3,
    }
}

// 12. NCCL SHM/proxy buffers with cuMem host memory: cuMemCreate at HOST_NUMA node 0, mapped
//     with access for the GPU and the host node, exported and imported by a peer like device
//     memory.
fn nccl_host_numa_buffers(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    let mut b = ctx.worker_on(1);
    let granularity = a.call(&Command::Granularity {
        device: 0,
        handle_types: POSIX,
        option: 1,
    });
    ctx.note(format!("device granularity: {}", outcome(&granularity)));
    let h = a
        .create_at(GRAN, HOST_NUMA, 0, POSIX)
        .expect("HOST_NUMA cuMemCreate");
    let props = a.properties(h).unwrap();
    ctx.note(format!(
        "location {}/{} handle types {}",
        props.location_type, props.location_id, props.requested_handle_types
    ));
    let va = a.reserve(GRAN).unwrap();
    a.map(va, GRAN, 0, h).unwrap();
    a.set_access(va, GRAN, &[Grant::readwrite(0), host_node(0)])
        .unwrap();
    a.fill(va, GRAN, 121).unwrap();
    let host = a.call(&Command::GetAccess {
        address: va,
        device: 0,
        location_type: HOST_NUMA,
    });
    ctx.note(format!("host access: {host:?}"));
    let hb = share(&mut a, &mut b, h);
    let pb = b.properties(hb).unwrap();
    ctx.note(format!(
        "imported location {}/{}",
        pb.location_type, pb.location_id
    ));
    let vb = b.reserve(GRAN).unwrap();
    b.map(vb, GRAN, 0, hb).unwrap();
    b.set_access(vb, GRAN, &[Grant::readwrite(1), host_node(0)])
        .unwrap();
    b.verify(vb, GRAN, 121).unwrap();
    // A host node grant on device memory, and an unknown node, are refused.
    let (hd, vd) = exportable(&mut a, 0, 122);
    let on_device = a.set_access(vd, GRAN, &[host_node(0)]);
    ctx.note(format!(
        "host grant on device memory: {}",
        outcome(&on_device)
    ));
    let bad_node = a.create_at(GRAN, HOST_NUMA, 7, POSIX);
    ctx.note(format!("unknown NUMA node: {}", outcome(&bad_node)));
    ctx.checkpoint(&mut [&mut a, &mut b]);
    b.verify(vb, GRAN, 121).unwrap();
    crosses(&mut b, vb, &mut a, va, 123);
    a.verify(vd, GRAN, 122).unwrap();
    let after = a.properties(h).unwrap();
    assert_eq!((after.location_type, after.location_id), (HOST_NUMA, 0));
    let access = a
        .call(&Command::GetAccess {
            address: va,
            device: 0,
            location_type: HOST_NUMA,
        })
        .unwrap();
    assert_eq!(access, cuinterpose_workload::Reply::Access { flags: 3 });
    unmap_release(&mut b, vb, hb);
    unmap_release(&mut a, va, h);
    ctx.release_last(&mut a, vd, hd);
    ctx.assert_clean(&mut b);
}
scenario!(nccl_host_numa_buffers, ANY);

// 19. Importers on another GPU (every P2P import: owner device 0, importer device 1 with
//     access for its own device) and on the same GPU (vLLM's probe i→i).
fn p2p_importer_on_other_and_same_gpu(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    let mut other = ctx.worker_on(1);
    let mut same = ctx.worker();
    let (h, va, fd) = exported(&mut a, 0, 191);
    let ho = other.import(fd.as_fd()).unwrap();
    let hs = same.import(fd.as_fd()).unwrap();
    drop(fd);
    let vo = other.reserve(GRAN).unwrap();
    other.map(vo, GRAN, 0, ho).unwrap();
    other.set_access(vo, GRAN, &[Grant::readwrite(1)]).unwrap();
    let vs = map_granule(&mut same, hs, 0);
    other.verify(vo, GRAN, 191).unwrap();
    same.verify(vs, GRAN, 191).unwrap();
    for (name, w, v) in [("other", &mut other, vo), ("same", &mut same, vs)] {
        let access: Vec<String> = (0..2)
            .map(|d| outcome(&w.get_access(v, d)) + &format!("={:?}", w.get_access(v, d).ok()))
            .collect();
        ctx.note(format!("{name} gpu access: {access:?}"));
    }
    ctx.checkpoint(&mut [&mut a, &mut other, &mut same]);
    assert_eq!(other.get_access(vo, 1).unwrap(), 3);
    assert_eq!(other.get_access(vo, 0).unwrap(), 0);
    crosses(&mut other, vo, &mut same, vs, 192);
    a.verify(va, GRAN, 192).unwrap();
    for (w, v, hh) in [(&mut other, vo, ho), (&mut same, vs, hs), (&mut a, va, h)] {
        ctx.release_last(w, v, hh);
    }
}
scenario!(p2p_importer_on_other_and_same_gpu, ANY);

/// Bytes checked of each of the fan-out's 56 mappings (the whole granule after a restore).
const SPOT: u64 = MIB / 16;

/// One rank's import of a peer's allocation: the imported handle while it is kept (odd ranks
/// release it right after mapping), and the address it is mapped at.
type Import = (Option<u64>, u64);

/// A fixed permutation of `0..n` (xorshift), so teardown order is random but reproducible.
fn shuffled(n: usize, mut seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        order.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    order
}

// 20. Many-way fan-out: 8 processes each export one allocation and import the other 7
//     (symmetric memory and custom all-reduce keep the imported handles, NCCL windows release
//     them right after mapping: even ranks keep, odd ranks release), then all tear down in
//     random order — creators may go before their importers.
fn all_to_all_fan_out_of_eight(ctx: &mut Ctx) {
    const RANKS: usize = 8;
    let mut workers: Vec<Worker> = (0..RANKS).map(|_| ctx.worker()).collect();
    let owned: Vec<(u64, u64)> = workers
        .iter_mut()
        .enumerate()
        .map(|(rank, w)| exportable(w, 0, 200 + rank as u64))
        .collect();
    let tickets: Vec<_> = workers
        .iter_mut()
        .zip(&owned)
        .map(|(w, &(h, _))| w.export(h).unwrap())
        .collect();
    let mut peers: Vec<Vec<Option<Import>>> = vec![vec![None; RANKS]; RANKS];
    for (rank, w) in workers.iter_mut().enumerate() {
        for (peer, ticket) in tickets.iter().enumerate() {
            if peer == rank {
                continue;
            }
            let h = w.import(ticket.as_fd()).unwrap();
            let v = map_granule(w, h, 0);
            let kept = if rank % 2 == 0 {
                Some(h)
            } else {
                w.release(h).unwrap();
                None
            };
            peers[rank][peer] = Some((kept, v));
        }
    }
    drop(tickets);
    // 56 mappings: the first 64 KiB of each identify the allocation (seeds differ); the whole
    // granule is compared after the restore.
    let check = |workers: &mut [Worker], peers: &[Vec<Option<Import>>], base, size| {
        for (rank, w) in workers.iter_mut().enumerate() {
            for (peer, slot) in peers[rank].iter().enumerate() {
                if let Some((_, v)) = slot {
                    w.verify(*v, size, base + peer as u64).unwrap();
                }
            }
        }
    };
    check(&mut workers, &peers, 200, SPOT);
    {
        let mut all: Vec<&mut Worker> = workers.iter_mut().collect();
        ctx.checkpoint(&mut all);
    }
    let size = if ctx.mode() == Mode::Toggle {
        GRAN
    } else {
        SPOT
    };
    check(&mut workers, &peers, 200, size);
    // Each rank writes its own allocation anew; everyone sees it.
    for (rank, w) in workers.iter_mut().enumerate() {
        w.fill(owned[rank].1, GRAN, 300 + rank as u64).unwrap();
    }
    check(&mut workers, &peers, 300, SPOT);
    for rank in shuffled(RANKS, 0x5eed_2026) {
        let w = &mut workers[rank];
        for slot in peers[rank].iter_mut() {
            if let Some((kept, v)) = slot.take() {
                unmap_free(w, v, GRAN);
                if let Some(h) = kept {
                    w.release(h).unwrap();
                }
            }
        }
        let (h, v) = owned[rank];
        ctx.release_last(w, v, h);
        // Importers still holding this rank's memory keep it.
        for (other, row) in peers.iter().enumerate() {
            if let Some((_, v)) = row[rank] {
                workers[other]
                    .verify(v, SPOT, 300 + rank as u64)
                    .expect("an importer outlives the creator's teardown");
            }
        }
    }
}
scenario!(all_to_all_fan_out_of_eight, ANY);
