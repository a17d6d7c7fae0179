//! Client behaviours the shim refuses, each with the error the client sees, and proof that a
//! refusal changes nothing: the workload keeps running and checkpoints once the refused state
//! is gone (clients/SUPPORT.md lists them). Shim only: the bare driver has no checkpoint to
//! refuse.

use cuinterpose_clients::scenario::{Mode, run};
use cuinterpose_clients::steps::{exportable, map_granule, unmap_free};
use cuinterpose_clients::{Ctx, GRAN, INVALID_HANDLE, NOT_SUPPORTED, POSIX};
use cuinterpose_workload::{EntryPath, Worker, WorkerConfig, build_worker, fakecuda_lib_dir};
use std::os::fd::AsFd;

fn shimmed(name: &str, scenario: fn(&mut Ctx)) {
    run(name, Mode::Shim, vec![EntryPath::Dlsym], scenario);
}

/// The refusal `try_toggle` gives, which must name `what`.
fn refused(ctx: &mut Ctx, workers: &mut [&mut Worker], what: &str) -> String {
    match ctx.try_toggle(workers) {
        Some(Err(refusal)) => {
            assert!(
                refusal.contains(what),
                "refusal without {what:?}: {refusal}"
            );
            refusal
        }
        other => panic!("expected a refusal naming {what:?}, got {other:?}"),
    }
}

/// The creator unmaps and releases an allocation while importers still map it (possible in
/// NCCL/symmetric-memory teardown in random order): its bytes have no carrier any more, so a
/// checkpoint is refused at inspection until the importers let go too.
fn check_creator_gone_while_importers_map_it(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    let mut b = ctx.worker();
    let (h, va) = exportable(&mut a, 0, 1);
    let fd = a.export(h).unwrap();
    let hb = b.import(fd.as_fd()).unwrap();
    drop(fd);
    let vb = map_granule(&mut b, hb, 0);
    unmap_free(&mut a, va, GRAN);
    a.release(h).unwrap();
    b.verify(vb, GRAN, 1)
        .expect("the importer keeps the memory");
    refused(ctx, &mut [&mut a, &mut b], "creator");
    // Nothing changed: still usable, and checkpointable once the importer is done.
    b.fill(vb, GRAN, 2).unwrap();
    unmap_free(&mut b, vb, GRAN);
    b.release(hb).unwrap();
    assert_eq!(ctx.try_toggle(&mut [&mut a, &mut b]), Some(Ok(())));
}

#[test]
fn creator_gone_while_importers_map_it_is_refused() {
    shimmed(
        "creator_gone_while_importers_map_it",
        check_creator_gone_while_importers_map_it,
    );
}

/// A POSIX FD exported by a process without the shim is no ticket: the shim imports it
/// natively and counts it, and a checkpoint is refused while it is held.
fn check_raw_import_from_an_unshimmed_exporter(ctx: &mut Ctx) {
    let mut b = ctx.worker();
    let config = WorkerConfig::new(build_worker())
        .env("LD_LIBRARY_PATH", fakecuda_lib_dir())
        .env_remove("LD_PRELOAD")
        .env("FAKECUDA_CONTROL_DIR", ctx.fakecuda_dir());
    let mut plain = Worker::spawn(&config).unwrap();
    plain.init(0).unwrap();
    let (h, va) = exportable(&mut plain, 0, 3);
    let fd = plain.export(h).unwrap();
    let raw = b.import(fd.as_fd()).expect("imported natively");
    let vb = map_granule(&mut b, raw, 0);
    b.verify(vb, GRAN, 3).unwrap();
    assert_eq!(ctx.inspect(&b).map(|i| i.raw_imports), Some(1));
    refused(ctx, &mut [&mut b], "not cuinterpose tickets");
    unmap_free(&mut b, vb, GRAN);
    b.release(raw).unwrap();
    assert_eq!(ctx.try_toggle(&mut [&mut b]), Some(Ok(())));
    unmap_free(&mut plain, va, GRAN);
    plain.release(h).unwrap();
}

#[test]
fn raw_import_from_an_unshimmed_exporter_is_refused() {
    shimmed(
        "raw_import_from_an_unshimmed_exporter",
        check_raw_import_from_an_unshimmed_exporter,
    );
}

/// A ticket whose allocation its creator released entirely (no handle, no mapping) no longer
/// imports, even from an FD the importer still holds: the driver would import the memory the
/// FD keeps alive, which nobody could checkpoint.
fn check_ticket_of_a_released_allocation(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    let mut b = ctx.worker();
    let (h, va) = exportable(&mut a, 0, 4);
    let fd = a.export(h).unwrap();
    unmap_free(&mut a, va, GRAN);
    a.release(h).unwrap();
    let err = b.import(fd.as_fd()).expect_err("the allocation is gone");
    assert_eq!(err.cuda_code(), Some(INVALID_HANDLE), "{err}");
    assert_eq!(ctx.try_toggle(&mut [&mut a, &mut b]), Some(Ok(())));
}

#[test]
fn ticket_of_a_released_allocation_is_refused() {
    shimmed(
        "ticket_of_a_released_allocation",
        check_ticket_of_a_released_allocation,
    );
}

/// Handle types the shim cannot checkpoint (Win32 here) are refused at creation with
/// CUDA_ERROR_NOT_SUPPORTED, as this driver refuses them too.
fn check_unsupported_handle_types(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    for types in [2, 4, POSIX | 2] {
        let err = a.create(GRAN, 0, types).expect_err("refused");
        assert_eq!(err.cuda_code(), Some(NOT_SUPPORTED), "types {types}: {err}");
    }
    assert_eq!(ctx.records(&a), Some(Vec::new()));
}

#[test]
fn unsupported_handle_types_are_refused() {
    shimmed("unsupported_handle_types", check_unsupported_handle_types);
}
