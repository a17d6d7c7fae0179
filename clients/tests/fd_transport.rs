//! How an exported POSIX FD reaches its importers (clients.md §6, scenarios 1–8): pulled by
//! number with `pidfd_getfd` (PyTorch expandable segments, mscclpp, UCX), relayed through
//! another process (torch symmetric memory), closed by the exporter right after sending and
//! exported afresh per request from a proxy thread (NCCL), released right after mapping (NCCL
//! windows, SGLang), duplicated and imported twice (SGLang), imported by its own exporter
//! (torch symmetric memory rank 0). Each runs plain and across a toggle.

use cuinterpose_clients::steps::{
    crosses, exportable, exported, hand_over, import_own_export, map_granule, settled_fd_count,
    unmap_free, unmap_release,
};
use cuinterpose_clients::{ANY, CUDA_11, Ctx, GRAN, INVALID_HANDLE, scenario};
use cuinterpose_protocol::Record;
use std::os::fd::AsFd;

/// Descriptors the creator's shim holds for an exported allocation besides what the
/// application holds: one driver export FD per shared allocation, served to its importers
/// (none on the bare driver).
fn hidden(ctx: &Ctx) -> u64 {
    u64::from(ctx.shimmed())
}

/// The one allocation `records` holds, with its handle count.
fn handle_count(records: &[Record]) -> Option<u64> {
    let counts: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Allocation(a) => Some(a.handle_count),
            _ => None,
        })
        .collect();
    match counts.as_slice() {
        [n] => Some(*n),
        _ => None,
    }
}

// 1. PyTorch expandable segments / mscclpp: the exporter keeps its FD at a fixed number; the
//    importer copies it out of the exporter's table with pidfd_getfd, imports, closes the dup.
fn pytorch_expandable_segments_pidfd_getfd(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 11);
    let (_ours, n) = a.export_kept(h).expect("export, kept at a number");
    let fds_a = a.open_fd_count().unwrap();
    let hb = b
        .import_from_pid(a.worker_host_pid(), n)
        .expect("pidfd_getfd + import");
    let props = b.properties(hb).expect("properties of the import");
    ctx.note(format!(
        "import: type {} handle types {} location {}/{}",
        props.allocation_type, props.requested_handle_types, props.location_type, props.location_id
    ));
    let vb = map_granule(&mut b, hb, 0);
    b.verify(vb, GRAN, 11)
        .expect("importer reads the exporter's bytes");
    assert_eq!(
        settled_fd_count(&mut a, fds_a),
        fds_a,
        "the exporter's FD table is unchanged"
    );
    ctx.checkpoint(&mut [&mut a, &mut b]);
    b.verify(vb, GRAN, 11)
        .expect("same bytes at the same address");
    b.fill(vb, GRAN, 12).unwrap();
    a.verify(va, GRAN, 12).expect("still shared");
    // The number still holds a valid ticket: a late consumer imports the same memory.
    let hc = b
        .import_from_pid(a.worker_host_pid(), n)
        .expect("pull again");
    let vc = map_granule(&mut b, hc, 0);
    b.verify(vc, GRAN, 12).unwrap();
    // Teardown as the consumer segment's destructor, then the producer (closes the FD right
    // before cuMemRelease).
    for (v, hh) in [(vc, hc), (vb, hb)] {
        unmap_release(&mut b, v, hh);
    }
    unmap_free(&mut a, va, GRAN);
    a.close_fd(n).unwrap();
    a.release(h).unwrap();
    ctx.assert_clean(&mut a);
    ctx.assert_clean(&mut b);
}
scenario!(pytorch_expandable_segments_pidfd_getfd, ANY);

// 2. As 1, with two consumers pulling the same exporter FD in turn (every pidfd_getfd copy
//    shares one file offset).
fn pytorch_expandable_segments_two_consumers(ctx: &mut Ctx) {
    let [mut a, mut b, mut c] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 21);
    let (_ours, n) = a.export_kept(h).unwrap();
    let pid = a.worker_host_pid();
    let hb = b.import_from_pid(pid, n).expect("first consumer");
    let hc = c.import_from_pid(pid, n).expect("second consumer");
    let vb = map_granule(&mut b, hb, 0);
    let vc = map_granule(&mut c, hc, 0);
    b.verify(vb, GRAN, 21).unwrap();
    c.verify(vc, GRAN, 21).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b, &mut c]);
    c.verify(vc, GRAN, 21).unwrap();
    b.fill(vb, GRAN, 22).unwrap();
    c.verify(vc, GRAN, 22)
        .expect("both consumers see one allocation");
    a.verify(va, GRAN, 22).unwrap();
    for (w, v, hh) in [(&mut b, vb, hb), (&mut c, vc, hc)] {
        ctx.release_last(w, v, hh);
    }
    unmap_free(&mut a, va, GRAN);
    a.close_fd(n).unwrap();
    a.release(h).unwrap();
    ctx.assert_clean(&mut a);
}
scenario!(pytorch_expandable_segments_two_consumers, ANY);

// 3. NCCL's proxy: the FD goes out by SCM_RIGHTS and the exporter closes its copy at once; the
//    importer imports later from its own copy (here after a checkpoint in between).
fn nccl_proxy_exporter_closes_after_sending(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 31);
    let fds_a = a.open_fd_count().unwrap();
    let fd = a.export(h).expect("export; the exporter closes its copy");
    assert_eq!(
        settled_fd_count(&mut a, fds_a + hidden(ctx)),
        fds_a + hidden(ctx),
        "the exporter kept nothing open"
    );
    ctx.checkpoint(&mut [&mut a, &mut b]);
    let hb = b
        .import(fd.as_fd())
        .expect("import later, from the importer's copy");
    drop(fd);
    let vb = map_granule(&mut b, hb, 0);
    b.verify(vb, GRAN, 31).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b]);
    crosses(&mut b, vb, &mut a, va, 32);
    ctx.release_shared(&mut b, (vb, hb), &mut a, (va, h));
}
scenario!(nccl_proxy_exporter_closes_after_sending, ANY);

// 4. torch symmetric memory's ring: A's FD is forwarded by B (which never imports it) to C.
fn torch_symm_mem_ring_relay(ctx: &mut Ctx) {
    let [mut a, mut b, mut c] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 41);
    let held = hand_over(&mut a, h, &mut b);
    let relayed = b
        .send_fd(held, true)
        .expect("B forwards it and closes its copy");
    let hc = c.import(relayed.as_fd()).expect("C imports A's allocation");
    drop(relayed);
    let vc = map_granule(&mut c, hc, 0);
    c.verify(vc, GRAN, 41).unwrap();
    if let Some(records) = ctx.records(&b) {
        assert!(
            records.is_empty(),
            "the relay imported nothing: {records:?}"
        );
    }
    ctx.assert_clean(&mut b);
    ctx.checkpoint(&mut [&mut a, &mut b, &mut c]);
    ctx.assert_clean(&mut b);
    c.verify(vc, GRAN, 41).unwrap();
    crosses(&mut c, vc, &mut a, va, 42);
    ctx.release_shared(&mut c, (vc, hc), &mut a, (va, h));
}
scenario!(torch_symm_mem_ring_relay, ANY);

// 5. NCCL symmetric windows / SGLang: import, map, set access, release the imported handle at
//    once. The mapping alone keeps the memory (tracked, checkpointed, restored); the ticket
//    keeps resolving; unmapping frees it.
fn nccl_window_release_after_map(ctx: &mut Ctx) {
    let [mut a, mut b, mut c] = ctx.workers();
    let (h, va, ticket) = exported(&mut a, 0, 51);
    let hb = b.import(ticket.as_fd()).unwrap();
    let vb = map_granule(&mut b, hb, 0);
    b.release(hb).expect("release the imported handle at once");
    let after = b.properties(hb).map(|_| ());
    ctx.expect("properties of the released handle", after).ok();
    b.verify(vb, GRAN, 51)
        .expect("the mapping keeps the memory");
    if let Some(records) = ctx.records(&b) {
        assert_eq!(handle_count(&records), Some(0), "{records:?}");
        assert_eq!(
            records.len(),
            2,
            "the allocation and its mapping: {records:?}"
        );
    }
    ctx.checkpoint(&mut [&mut a, &mut b, &mut c]);
    b.verify(vb, GRAN, 51).unwrap();
    crosses(&mut b, vb, &mut a, va, 52);
    // An earlier ticket still resolves for a new importer.
    let hc = c.import(ticket.as_fd()).expect("the ticket still resolves");
    let vc = map_granule(&mut c, hc, 0);
    c.release(hc).unwrap();
    c.verify(vc, GRAN, 52).unwrap();
    drop(ticket);
    // Unmapping frees it where only a mapping held it.
    for (w, v) in [(&mut b, vb), (&mut c, vc)] {
        unmap_free(w, v, GRAN);
        ctx.assert_clean(w);
    }
    ctx.release_last(&mut a, va, h);
}
scenario!(nccl_window_release_after_map, ANY);

// 6. SGLang VMM graph inputs: the importer dups the received FD before every import and
//    imports it twice: two handles, one allocation, two VAs (one inside a span reservation);
//    both imported handles are released right after mapping.
fn sglang_dup_and_import_twice(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 61);
    let received = hand_over(&mut a, h, &mut b);
    let d1 = b.dup_fd(received).unwrap();
    let h1 = b.import_number(d1).expect("import of the first dup");
    let d2 = b.dup_fd(received).unwrap();
    let h2 = b.import_number(d2).expect("import of the second dup");
    ctx.note(format!("two handles: {}", h1 != h2));
    for fd in [d1, d2, received] {
        b.close_fd(fd).unwrap();
    }
    let v1 = map_granule(&mut b, h1, 0);
    let span = b.reserve(2 * GRAN).unwrap();
    let v2 = span + GRAN;
    b.map(v2, GRAN, 0, h2).unwrap();
    b.grant_rw(v2, GRAN, 0).unwrap();
    b.release(h1).unwrap();
    b.release(h2).unwrap();
    b.verify(v2, GRAN, 61).unwrap();
    b.fill(v1, GRAN, 62).unwrap();
    b.verify(v2, GRAN, 62).expect("one allocation behind both");
    ctx.checkpoint(&mut [&mut a, &mut b]);
    b.verify(v1, GRAN, 62).unwrap();
    b.fill(v2, GRAN, 63).unwrap();
    b.verify(v1, GRAN, 63).unwrap();
    a.verify(va, GRAN, 63).unwrap();
    unmap_free(&mut b, v1, GRAN);
    b.verify(v2, GRAN, 63)
        .expect("the second mapping outlives the first");
    b.unmap(v2, GRAN).unwrap();
    b.free_address(span, 2 * GRAN).unwrap();
    ctx.assert_clean(&mut b);
    ctx.release_last(&mut a, va, h);
}
scenario!(sglang_dup_and_import_twice, ANY);

// 7. torch symmetric memory's multicast rank 0 pattern on unicast memory: the exporter imports
//    its own export (as every rank does), maps it a second time, and releases its creation
//    reference once everyone imported.
fn torch_symm_mem_exporter_imports_own_export(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 71);
    let (own, hb) = import_own_export(&mut a, &mut b, h);
    ctx.note(format!("own import is a new handle: {}", own != h));
    let va2 = map_granule(&mut a, own, 0);
    let vb = map_granule(&mut b, hb, 0);
    a.verify(va2, GRAN, 71).unwrap();
    a.release(h)
        .expect("rank 0 releases its creation reference");
    // cuMemRetainAllocationHandle gives the value each range was mapped with.
    let r1 = a.retain(va).unwrap();
    let r2 = a.retain(va2).unwrap();
    ctx.note(format!(
        "retain: first mapping {}, second mapping {}",
        r1 == h,
        r2 == own
    ));
    a.release(r1).unwrap();
    a.release(r2).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b]);
    crosses(&mut b, vb, &mut a, va, 72);
    a.verify(va2, GRAN, 72).unwrap();
    ctx.release_last(&mut b, vb, hb);
    unmap_free(&mut a, va, GRAN);
    a.verify(va2, GRAN, 72)
        .expect("the own import keeps the memory");
    ctx.release_last(&mut a, va2, own);
}
scenario!(torch_symm_mem_exporter_imports_own_export, CUDA_11);

// 8. NCCL's proxy thread: the importer sends the owner's raw handle value (an integer learned
//    over bootstrap); the owner's proxy thread exports it afresh for every request, sends the
//    FD and closes it. The value stays valid across a checkpoint.
fn nccl_proxy_thread_exports_on_demand(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 81);
    // What crosses the bootstrap: the handle value as an integer.
    let value: u64 = h;
    let fds_a = a.open_fd_count().unwrap() + hidden(ctx);
    let mut imported = Vec::new();
    for request in 0..3 {
        if request == 2 {
            ctx.checkpoint(&mut [&mut a, &mut b]);
        }
        let fd = a
            .proxy_export(value, true)
            .expect("export on the proxy thread");
        assert_eq!(
            settled_fd_count(&mut a, fds_a),
            fds_a,
            "the proxy closed its FD"
        );
        let hb = b.import(fd.as_fd()).unwrap();
        drop(fd);
        let vb = map_granule(&mut b, hb, 0);
        b.verify(vb, GRAN, 81 + request).unwrap();
        b.fill(vb, GRAN, 82 + request).unwrap();
        imported.push((hb, vb));
    }
    a.verify(va, GRAN, 84).unwrap();
    let bogus = a.proxy_export(value ^ 0x40, true).map(drop);
    ctx.expect("export of a value never handed out", bogus).ok();
    let err = a.proxy_export(value ^ 0x40, false).unwrap_err();
    assert_eq!(err.cuda_code(), Some(INVALID_HANDLE), "{err}");
    for (hb, vb) in imported {
        unmap_release(&mut b, vb, hb);
    }
    ctx.assert_clean(&mut b);
    ctx.release_last(&mut a, va, h);
}
scenario!(nccl_proxy_thread_exports_on_demand, ANY);

// 16. PyTorch expandable-segment churn: pages come and go inside one big reservation while
//     others are exported and pulled; the number of an unmapped page's FD is reused, so a late
//     pidfd_getfd of that number never imports the wrong allocation: it fails (EBADF, not a
//     ticket) or imports what the number holds now.
fn pytorch_expandable_segments_churn(ctx: &mut Ctx) {
    const PAGES: u64 = 4;
    let [mut a, mut b, mut c] = ctx.workers();
    let pid = a.worker_host_pid();
    let segment = a.reserve(PAGES * GRAN).unwrap();
    let consumer = b.reserve(PAGES * GRAN).unwrap();
    // (handle, kept FD number) per page, each page filled with seed 160 + page.
    let mut pages: Vec<(u64, i32)> = Vec::new();
    let map_page = |a: &mut cuinterpose_workload::Worker, page: u64, seed: u64| {
        let h = a.create(GRAN, 0, cuinterpose_clients::POSIX).unwrap();
        let at = segment + page * GRAN;
        a.map(at, GRAN, 0, h).unwrap();
        a.set_access(
            at,
            GRAN,
            &[
                cuinterpose_workload::Grant::readwrite(0),
                cuinterpose_workload::Grant::readwrite(1),
            ],
        )
        .unwrap();
        a.fill(at, GRAN, seed).unwrap();
        let (_ours, n) = a.export_kept(h).unwrap();
        (h, n)
    };
    for page in 0..PAGES {
        pages.push(map_page(&mut a, page, 160 + page));
    }
    // The consumer maps every page into its own segment, closing each dup at once.
    let mut imported = Vec::new();
    for (page, &(_, n)) in pages.iter().enumerate() {
        let h = b.import_from_pid(pid, n).unwrap();
        let at = consumer + page as u64 * GRAN;
        b.map(at, GRAN, 0, h).unwrap();
        b.grant_rw(at, GRAN, 0).unwrap();
        b.verify(at, GRAN, 160 + page as u64).unwrap();
        imported.push(h);
    }
    // A late consumer already holds a copy of page 2's FD (pidfd_getfd done, import pending).
    let stale = c.pid_get_fd(pid, pages[2].1).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b, &mut c]);
    for page in 0..PAGES {
        b.verify(consumer + page * GRAN, GRAN, 160 + page).unwrap();
    }
    // The consumer is done with pages 1 and 2 (its destructor unmaps and releases).
    for page in [1u64, 2] {
        b.unmap(consumer + page * GRAN, GRAN).unwrap();
        b.release(imported[page as usize]).unwrap();
    }
    // empty_cache: pages 1 and 2 go; each FD is closed right before cuMemRelease.
    for page in [1u64, 2] {
        let (h, n) = pages[page as usize];
        a.unmap(segment + page * GRAN, GRAN).unwrap();
        a.close_fd(n).unwrap();
        a.release(h).unwrap();
    }
    let old1 = pages[1].1;
    // Nothing at page 1's number: the late pull fails.
    let gone = c.import_from_pid(pid, old1).map(drop);
    ctx.expect("pidfd_getfd of a closed number", gone).ok();
    // Page 1 comes back as a new allocation; its FD may take the old number.
    pages[1] = map_page(&mut a, 1, 170);
    let late = c
        .import_from_pid(pid, pages[1].1)
        .expect("pull the new page");
    let vc = c.map_rw(late, GRAN, 0).unwrap();
    c.verify(vc, GRAN, 170)
        .expect("the page the number holds now, not the old one");
    // A number reused by a file that is no ticket imports nothing.
    let other = std::fs::File::open("/dev/null").unwrap();
    let foreign = a.hold_fd(other.as_fd()).unwrap();
    let not_a_ticket = c.import_from_pid(pid, foreign).map(drop);
    ctx.expect("pidfd_getfd of a number holding another file", not_a_ticket)
        .ok();
    a.close_fd(foreign).unwrap();
    // The copy pulled before page 2 went: on the bare driver the FD keeps the old memory
    // alive; under the shim a ticket whose allocation is gone no longer imports (documented).
    let stale_import = c.import_number(stale);
    if ctx.shimmed() {
        let err = stale_import.expect_err("a ticket of a released allocation");
        assert_eq!(err.cuda_code(), Some(INVALID_HANDLE), "{err}");
    } else {
        let h = stale_import.expect("the driver imports the memory the FD keeps alive");
        let v = c.map_rw(h, GRAN, 0).unwrap();
        c.verify(v, GRAN, 162).unwrap();
        unmap_release(&mut c, v, h);
    }
    c.close_fd(stale).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b, &mut c]);
    c.verify(vc, GRAN, 170).unwrap();
    crosses(&mut c, vc, &mut a, segment + GRAN, 171);
    b.verify(consumer + 3 * GRAN, GRAN, 163).unwrap();
    // Teardown: consumers first, then every page, then the segments.
    ctx.release_last(&mut c, vc, late);
    for page in [0u64, 3] {
        b.unmap(consumer + page * GRAN, GRAN).unwrap();
        b.release(imported[page as usize]).unwrap();
    }
    b.free_address(consumer, PAGES * GRAN).unwrap();
    ctx.assert_clean(&mut b);
    for (page, &(h, n)) in pages.iter().enumerate() {
        if page == 2 {
            continue;
        }
        a.unmap(segment + page as u64 * GRAN, GRAN).unwrap();
        a.close_fd(n).unwrap();
        a.release(h).unwrap();
    }
    a.free_address(segment, PAGES * GRAN).unwrap();
    ctx.assert_clean(&mut a);
}
scenario!(pytorch_expandable_segments_churn, ANY);

// 18. A checkpoint between the export and the consumer's pidfd_getfd: after the restore the
//     number still holds a ticket, which imports the restored allocation.
fn pytorch_expandable_segments_checkpoint_before_pull(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 181);
    let (_ours, n) = a.export_kept(h).unwrap();
    ctx.checkpoint(&mut [&mut a, &mut b]);
    let hb = b
        .import_from_pid(a.worker_host_pid(), n)
        .expect("pull after the restore");
    let vb = map_granule(&mut b, hb, 0);
    b.verify(vb, GRAN, 181).expect("the restored bytes");
    b.fill(vb, GRAN, 182).unwrap();
    a.verify(va, GRAN, 182)
        .expect("the restored allocation itself");
    ctx.release_last(&mut b, vb, hb);
    unmap_free(&mut a, va, GRAN);
    a.close_fd(n).unwrap();
    a.release(h).unwrap();
    ctx.assert_clean(&mut a);
}
scenario!(pytorch_expandable_segments_checkpoint_before_pull, ANY);
