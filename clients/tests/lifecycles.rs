//! Legacy IPC, device reset, sleep/wake and multicast (clients.md §6, scenarios 11, 13, 14,
//! 15): PyTorch's caching-allocator IPC and vLLM/SGLang custom all-reduce (identical handle
//! bytes, one pointer per open, a sub-block by base and offset), vLLM's P2P probe
//! (cudaDeviceReset without close or free), vLLM sleep mode / torch_memory_saver / NCCL
//! suspend-resume (everything released and re-created at the same addresses, 100 times), and
//! NCCL NVLS / torch symmetric memory multicast teams. Each runs plain and across a toggle.

use cuinterpose_clients::steps::{
    exportable, import_own_export, map_granule, quiet_fd_count, settled_fd_count, unmap_free,
    unmap_release,
};
use cuinterpose_clients::{ANY, CUDA_12_1, Ctx, GRAN, MIB, NONE, POSIX, co_preloaded, scenario};
use cuinterpose_workload::{Grant, Worker};
use std::os::fd::AsFd;

// 13. Legacy IPC (PyTorch's default caching allocator, vLLM/SGLang custom all-reduce): the
//     handle of one cudaMalloc segment requested three times is the same bytes; the consumer
//     opens it three times (one pointer) and closes it three times; a tensor inside the
//     segment travels as the segment base's handle plus an offset; cuIpcGetMemHandle on VMM
//     memory and on an interior pointer fails as the driver fails.
fn pytorch_vllm_legacy_ipc(ctx: &mut Ctx) {
    let mut producer = ctx.worker();
    let mut consumer = ctx.worker_on(1);
    let segment = producer.mem_alloc(3 * MIB).unwrap();
    producer.fill(segment, 3 * MIB, 131).unwrap();
    // A tensor at 1 MiB into the segment.
    let tensor = segment + MIB;
    producer.fill(tensor, MIB, 132).unwrap();
    let (base, size) = producer.address_range(tensor + 77).unwrap();
    ctx.note(format!(
        "segment of the tensor: base {} size {size}",
        base == segment
    ));
    let handles: Vec<[u8; 64]> = (0..3).map(|_| producer.ipc_get(base).unwrap()).collect();
    ctx.note(format!(
        "three gets, identical bytes: {}",
        handles.iter().all(|h| *h == handles[0])
    ));
    let interior = producer.ipc_get(tensor).map(drop);
    ctx.expect("cuIpcGetMemHandle of an interior pointer", interior)
        .ok();
    let (hv, vv) = exportable(&mut producer, 0, 133);
    let on_vmm = producer.ipc_get(vv).map(drop);
    ctx.expect("cuIpcGetMemHandle of VMM memory", on_vmm).ok();
    let own = producer.ipc_open(&handles[0]).map(drop);
    ctx.expect("opening one's own handle", own).ok();
    let opened: Vec<u64> = handles
        .iter()
        .map(|h| consumer.ipc_open(h).unwrap())
        .collect();
    ctx.note(format!(
        "three opens, one pointer: {}",
        opened.iter().all(|p| *p == opened[0])
    ));
    let c = opened[0];
    consumer
        .verify(c + MIB, MIB, 132)
        .expect("base + offset is the tensor");
    let (cbase, csize) = consumer.address_range(c + MIB).unwrap();
    ctx.note(format!("consumer range: base {} size {csize}", cbase == c));
    ctx.checkpoint(&mut [&mut producer, &mut consumer]);
    consumer.verify(c + MIB, MIB, 132).unwrap();
    consumer.fill(c, MIB, 134).unwrap();
    producer.verify(segment, MIB, 134).expect("still shared");
    // Three closes; the mapping lasts until the last.
    for close in 0..3 {
        consumer.verify(c, MIB, 134).unwrap();
        consumer
            .ipc_close(c)
            .unwrap_or_else(|e| panic!("close {close}: {e}"));
    }
    let fourth = consumer.ipc_close(c);
    ctx.expect("a fourth close", fourth).ok();
    let gone = consumer.verify(c, MIB, 134);
    ctx.expect("reading after the last close", gone).ok();
    ctx.assert_clean(&mut consumer);
    producer.mem_free(segment).unwrap();
    ctx.release_last(&mut producer, vv, hv);
}
scenario!(
    pytorch_vllm_legacy_ipc,
    // The pre-11.0 name (the v1 ABI, the same as _v2) resolves from CUDA 4.1 on.
    cuinterpose_clients::Needs {
        version: 4010,
        probe: "cuIpcOpenMemHandle",
    }
);

/// One pair of vLLM's P2P probe: the producer cudaMallocs and exports, the consumer opens and
/// both touch the memory, then both call cudaDeviceReset without closing or freeing.
fn probe_pair(ctx: &mut Ctx, producer: &mut Worker, consumer: &mut Worker, seed: u64) {
    let p = producer.mem_alloc(GRAN).unwrap();
    producer.fill(p, GRAN, seed).unwrap();
    let handle = producer.ipc_get(p).unwrap();
    let c = consumer.ipc_open(&handle).unwrap();
    consumer.verify(c, GRAN, seed).unwrap();
    consumer.fill(c, MIB, seed + 1).unwrap();
    producer.verify(p, MIB, seed + 1).unwrap();
    consumer
        .primary_ctx_reset(0)
        .expect("consumer: cudaDeviceReset");
    producer
        .primary_ctx_reset(0)
        .expect("producer: cudaDeviceReset");
    // Everything the contexts held is gone: memory, opens and the handle.
    for (name, w, address) in [
        ("producer", &mut *producer, p),
        ("consumer", &mut *consumer, c),
    ] {
        w.set_device(0).expect("cudaSetDevice after the reset");
        let range = w.address_range(address).map(drop);
        ctx.expect(&format!("{name}: the old pointer after the reset"), range)
            .ok();
    }
    let reopen = consumer.ipc_open(&handle).map(drop);
    ctx.expect("opening the handle after both resets", reopen)
        .ok();
}

// 14. vLLM's P2P probe: cudaDeviceReset in the opener without closing and in the exporter
//     without freeing; both processes end up holding nothing, and the next pair works (here
//     also in the same processes, after cudaSetDevice).
fn vllm_p2p_probe_device_reset(ctx: &mut Ctx) {
    let mut producer = ctx.worker();
    let mut consumer = ctx.worker_on(1);
    consumer.set_device(0).unwrap();
    probe_pair(ctx, &mut producer, &mut consumer, 141);
    ctx.assert_clean(&mut producer);
    ctx.assert_clean(&mut consumer);
    let [mut next_producer, mut next_consumer] = ctx.workers();
    ctx.checkpoint(&mut [
        &mut producer,
        &mut consumer,
        &mut next_producer,
        &mut next_consumer,
    ]);
    probe_pair(ctx, &mut next_producer, &mut next_consumer, 143);
    probe_pair(ctx, &mut producer, &mut consumer, 145);
    for w in [
        &mut producer,
        &mut consumer,
        &mut next_producer,
        &mut next_consumer,
    ] {
        ctx.assert_clean(w);
    }
}
scenario!(
    vllm_p2p_probe_device_reset,
    // The pre-11.0 name (the v1 ABI, the same as _v2) resolves from CUDA 7.0 on.
    cuinterpose_clients::Needs {
        version: 7000,
        probe: "cuDevicePrimaryCtxReset",
    }
);

/// Writes a small tag at `address` and returns it (sleep mode backs up "weights" and restores
/// them; a tag stands for them).
fn tag(cycle: u64, which: u8) -> Vec<u8> {
    let mut t = cycle.to_le_bytes().to_vec();
    t.push(which);
    t
}

// 15. Sleep/wake at the same VA, 100 cycles (vLLM's CuMemAllocator and torch_memory_saver:
//     cuMemCreate without handle types; NCCL suspend/resume: a POSIX buffer shared with a peer,
//     which re-imports it at its old address): sleep copies the data out, unmaps and releases
//     everything keeping the VA; wake creates new handles, maps them at the old addresses, sets
//     access, copies the data back. No handle, mapping or FD leaks.
fn vllm_sleep_wake_same_addresses(ctx: &mut Ctx) {
    const CYCLES: u64 = 100;
    let [mut a, mut peer] = ctx.workers();
    let local = a.reserve(GRAN).unwrap();
    let shared = a.reserve(GRAN).unwrap();
    let remote = peer.reserve(GRAN).unwrap();
    let wake = |a: &mut Worker, peer: &mut Worker, weights: &[u8], buffer: &[u8]| {
        let hl = a.create(GRAN, 0, NONE).unwrap();
        a.map(local, GRAN, 0, hl).unwrap();
        a.grant_rw(local, GRAN, 0).unwrap();
        a.write(local, weights).unwrap();
        let hs = a.create(GRAN, 0, POSIX).unwrap();
        a.map(shared, GRAN, 0, hs).unwrap();
        a.grant_rw(shared, GRAN, 0).unwrap();
        a.write(shared, buffer).unwrap();
        // The peer pulls a fresh FD through the owner's proxy and maps it at its old VA.
        let fd = a.proxy_export(hs, true).unwrap();
        let hp = peer.import(fd.as_fd()).unwrap();
        peer.map(remote, GRAN, 0, hp).unwrap();
        peer.grant_rw(remote, GRAN, 0).unwrap();
        (hl, hs, hp)
    };
    let sleep = |a: &mut Worker, peer: &mut Worker, (hl, hs, hp): (u64, u64, u64)| {
        let weights = a.read(local, 9).unwrap();
        let buffer = a.read(shared, 9).unwrap();
        peer.unmap(remote, GRAN).unwrap();
        peer.release(hp).unwrap();
        a.unmap(local, GRAN).unwrap();
        a.release(hl).unwrap();
        a.unmap(shared, GRAN).unwrap();
        a.release(hs).unwrap();
        (weights, buffer)
    };
    let mut handles = wake(&mut a, &mut peer, &tag(0, 1), &tag(0, 2));
    let baseline = (
        quiet_fd_count(&mut a),
        a.driver_objects().unwrap(),
        peer.driver_objects().unwrap(),
        ctx.records(&a).map(|r| r.len()),
        ctx.records(&peer).map(|r| r.len()),
    );
    for cycle in 1..=CYCLES {
        let (weights, buffer) = sleep(&mut a, &mut peer, handles);
        assert_eq!(weights, tag(cycle - 1, 1), "cycle {cycle}: weights kept");
        assert_eq!(buffer, tag(cycle - 1, 2), "cycle {cycle}: buffer kept");
        if cycle == CYCLES / 2 {
            // Asleep: the VA is reserved, nothing is mapped.
            ctx.checkpoint(&mut [&mut a, &mut peer]);
        }
        handles = wake(&mut a, &mut peer, &tag(cycle, 1), &tag(cycle, 2));
        assert_eq!(
            peer.read(remote, 9).unwrap(),
            tag(cycle, 2),
            "cycle {cycle}: the peer sees the new buffer at its old address"
        );
        if cycle == CYCLES / 2 + 1 {
            // Awake with fresh handles at the old addresses.
            ctx.checkpoint(&mut [&mut a, &mut peer]);
            peer.write(remote, &tag(cycle, 2)).unwrap();
        }
    }
    let now = (
        settled_fd_count(&mut a, baseline.0),
        a.driver_objects().unwrap(),
        peer.driver_objects().unwrap(),
        ctx.records(&a).map(|r| r.len()),
        ctx.records(&peer).map(|r| r.len()),
    );
    assert_eq!(now, baseline, "after {CYCLES} cycles: nothing leaked");
    sleep(&mut a, &mut peer, handles);
    a.free_address(local, GRAN).unwrap();
    a.free_address(shared, GRAN).unwrap();
    peer.free_address(remote, GRAN).unwrap();
    ctx.assert_clean(&mut a);
    ctx.assert_clean(&mut peer);
}
scenario!(vllm_sleep_wake_same_addresses, ANY);

// 17. The same sleep/wake pattern with the shim co-preloaded behind another interposer linked
//     against libcuda (torch_memory_saver's preload mode), whose driver calls the dynamic
//     linker binds to the shim.
#[test]
fn torch_memory_saver_co_preloaded_sleep_wake() {
    co_preloaded(
        "torch_memory_saver_co_preloaded_sleep_wake",
        vllm_sleep_wake_same_addresses,
    );
}

// 11. Multicast (NCCL NVLS, torch symmetric memory): rank 0 creates the object (POSIX FD),
//     exports it, and every rank including rank 0 imports it; each adds its device, binds its
//     own buffer (BindMem on one rank, BindAddr on the other), maps the multicast VA before
//     (NCCL registration) or after (NVLS) binding; rank 0 then releases its creation
//     reference. Teardown unbinds, unmaps and releases, in either order.
fn nccl_nvls_multicast_team(ctx: &mut Ctx) {
    let mut r0 = ctx.worker();
    let mut r1 = ctx.worker_on(1);
    let mc = r0.mc_create(2, GRAN, u64::from(POSIX)).unwrap();
    let (m0, m1) = import_own_export(&mut r0, &mut r1, mc);
    ctx.note(format!("rank 0's import is a new handle: {}", m0 != mc));
    // Rank 1 maps the multicast VA before binding (registration path).
    let view1 = r1.reserve(GRAN).unwrap();
    r1.map(view1, GRAN, 0, m1).unwrap();
    r1.set_access(view1, GRAN, &[Grant::readwrite(1)]).unwrap();
    r0.mc_add_device(m0, 0).unwrap();
    r1.mc_add_device(m1, 1).unwrap();
    let (h0, p0) = exportable(&mut r0, 0, 111);
    let (h1, p1) = exportable(&mut r1, 1, 112);
    r0.mc_bind_mem(m0, 0, h0, 0, GRAN, None).expect("BindMem");
    r1.mc_bind_addr(m1, 0, p1, GRAN, None).expect("BindAddr");
    r0.release(mc).expect("rank 0 drops its creation reference");
    let view0 = map_granule(&mut r0, m0, 0);
    r0.verify(view0, GRAN, 111)
        .expect("rank 0's view shows its member");
    r1.verify(view1, GRAN, 112)
        .expect("rank 1's view shows its member");
    ctx.checkpoint(&mut [&mut r0, &mut r1]);
    r0.verify(view0, GRAN, 111).unwrap();
    r1.verify(view1, GRAN, 112).unwrap();
    r0.fill(p0, GRAN, 113).unwrap();
    r0.verify(view0, GRAN, 113).expect("the binding is live");
    // Teardown: rank 0 unbinds before unmapping, rank 1 unmaps before unbinding.
    r0.mc_unbind(m0, 0, 0, GRAN).unwrap();
    unmap_release(&mut r0, view0, m0);
    unmap_free(&mut r1, view1, GRAN);
    r1.mc_unbind(m1, 1, 0, GRAN).unwrap();
    r1.release(m1).unwrap();
    for (w, p, h) in [(&mut r0, p0, h0), (&mut r1, p1, h1)] {
        ctx.release_last(w, p, h);
    }
}
scenario!(nccl_nvls_multicast_team, CUDA_12_1);
