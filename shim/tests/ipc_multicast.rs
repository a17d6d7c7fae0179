//! The memory IPC adapter and multicast objects across processes, and both through a whole
//! checkpoint/restore cycle.

mod support;

use cuinterpose_workload::EntryPath;
use std::os::fd::AsFd;
use support::{Sandbox, inspect, toggle, worker};

const MIB: u64 = 1 << 20;
use cuinterpose_abi::results::{
    CUDA_ERROR_INVALID_CONTEXT as INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE as INVALID_VALUE,
};

#[test]
fn ipc_handles_share_cu_mem_alloc_memory_and_survive_a_toggle() {
    let sandbox = Sandbox::new("ipc");
    let mut producer = worker(&sandbox, EntryPath::ProcAddress(12030), true);
    let mut consumer = worker(&sandbox, EntryPath::Dlsym, true);
    let private = producer.mem_alloc(MIB).unwrap();
    let p = producer.mem_alloc(3 * MIB).unwrap();
    // The requested size, not the rounded-up extent, for the base and an interior pointer.
    assert_eq!(producer.address_range(p + 12345).unwrap(), (p, 3 * MIB));
    producer.fill(p, 3 * MIB, 31).unwrap();
    producer.fill(private, MIB, 32).unwrap();
    let handle = producer.ipc_get(p).unwrap();
    assert_eq!(
        producer.ipc_get(p).unwrap(),
        handle,
        "repeated gets give identical bytes"
    );
    assert_eq!(&handle[..7], b"CUIPC00");
    assert_eq!(
        producer.ipc_get(p + 4096).unwrap_err().cuda_code(),
        Some(INVALID_VALUE)
    );
    assert_eq!(
        producer.ipc_open(&handle).unwrap_err().cuda_code(),
        Some(INVALID_CONTEXT)
    );
    let c = consumer.ipc_open(&handle).unwrap();
    assert_eq!(
        consumer.ipc_open(&handle).unwrap(),
        c,
        "one pointer per context"
    );
    assert_eq!(consumer.ipc_open(&handle).unwrap(), c);
    consumer.verify(c, 3 * MIB, 31).unwrap();
    assert_eq!(consumer.address_range(c).unwrap(), (c, 3 * MIB));
    consumer.ipc_close(c).unwrap();
    consumer.ipc_close(c).unwrap();
    consumer.verify(c, 3 * MIB, 31).unwrap(); // one open left
    // A foreign handle is refused.
    let mut foreign = handle;
    foreign[0] = b'X';
    assert_eq!(
        consumer.ipc_open(&foreign).unwrap_err().cuda_code(),
        Some(INVALID_VALUE)
    );

    let (saved, loaded) = toggle(&sandbox, &[producer.worker_pid(), consumer.worker_pid()]);
    assert_eq!(
        (saved, loaded),
        (4 * MIB, 4 * MIB),
        "the shared extent, once, in the producer"
    );
    consumer.verify(c, 3 * MIB, 31).unwrap();
    producer.verify(private, MIB, 32).unwrap();
    consumer.fill(c, MIB, 33).unwrap();
    producer.verify(p, MIB, 33).unwrap();
    consumer.ipc_close(c).unwrap();
    assert_eq!(
        consumer.ipc_close(c).unwrap_err().cuda_code(),
        Some(INVALID_VALUE)
    );
    assert!(inspect(&sandbox, consumer.worker_pid()).records.is_empty());
    producer.mem_free(p).unwrap();
    producer.mem_free(private).unwrap();
    assert!(inspect(&sandbox, producer.worker_pid()).records.is_empty());
    // The native IPC functions were never called.
    assert_eq!(producer.native_ipc_calls().unwrap(), 0);
    assert_eq!(consumer.native_ipc_calls().unwrap(), 0);
}

#[test]
fn freeing_an_exported_allocation_leaves_the_importer_its_memory() {
    let sandbox = Sandbox::new("ipc-free");
    let mut producer = worker(&sandbox, EntryPath::Dlsym, true);
    let mut consumer = worker(&sandbox, EntryPath::Dlsym, true);
    let p = producer.mem_alloc(2 * MIB).unwrap();
    producer.fill(p, 2 * MIB, 41).unwrap();
    let handle = producer.ipc_get(p).unwrap();
    let c = consumer.ipc_open(&handle).unwrap();
    producer.mem_free(p).unwrap();
    // CUDA: the importer's mapping stays valid until it closes the handle.
    consumer.verify(c, 2 * MIB, 41).unwrap();
    consumer.ipc_close(c).unwrap();
    // A new open after the free finds nothing to import.
    assert!(consumer.ipc_open(&handle).is_err());
}

#[test]
fn a_multicast_team_across_processes_survives_a_toggle() {
    let sandbox = Sandbox::new("multicast");
    let gran = 2 * MIB;
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::Dlsym, true);
    b.set_device(1).unwrap();
    let mc = a.mc_create(2, 2 * gran, 1).unwrap();
    assert_eq!(mc >> 48, 0xC0DE);
    let ticket = a.export(mc).unwrap();
    let mc_b = b.import(ticket.as_fd()).unwrap();
    a.mc_add_device(mc, 0).unwrap();
    b.mc_add_device(mc_b, 1).unwrap();
    // A binds a whole allocation (v2) and an address range of another (v1); B binds by memory.
    let ha = a.create(gran, 0, 1).unwrap();
    let pa = a.map_rw(ha, gran, 0).unwrap();
    a.fill(pa, gran, 51).unwrap();
    a.mc_bind_mem(mc, 0, ha, 0, gran, Some(0)).unwrap();
    let ha2 = a.create(gran, 0, 1).unwrap();
    let pa2 = a.map_rw(ha2, gran, 0).unwrap();
    a.fill(pa2, gran, 52).unwrap();
    a.mc_bind_addr(mc, gran, pa2, gran, None).unwrap();
    let hb = b.create(gran, 1, 1).unwrap();
    let pb = b.map_rw(hb, gran, 1).unwrap();
    b.fill(pb, gran, 53).unwrap();
    b.mc_bind_mem(mc_b, 0, hb, 0, gran, None).unwrap();
    let view = a.map_rw(mc, 2 * gran, 0).unwrap();
    a.verify(view, gran, 51).unwrap();
    a.verify(view + gran, gran, 52).unwrap();

    toggle(&sandbox, &[a.worker_pid(), b.worker_pid()]);
    a.verify(pa, gran, 51).unwrap();
    a.verify(pa2, gran, 52).unwrap();
    b.verify(pb, gran, 53).unwrap();
    a.verify(view, gran, 51).unwrap();
    a.verify(view + gran, gran, 52).unwrap();
}
