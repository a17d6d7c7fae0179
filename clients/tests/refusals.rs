//! Client behaviours the shim refuses, each with the error the client sees, and proof that a
//! refusal changes nothing: the workload keeps running and checkpoints once the refused state
//! is gone (clients/SUPPORT.md lists them). Shim only: the bare driver has no checkpoint to
//! refuse.

use cuinterpose_clients::scenario::{Mode, run};
use cuinterpose_clients::steps::{exportable, exported, map_granule, share, unmap_release};
use cuinterpose_clients::{Ctx, GRAN, INVALID_HANDLE, NOT_SUPPORTED, POSIX};
use cuinterpose_workload::{EntryPath, Worker};
use std::os::fd::AsFd;

/// A test `$name::is_refused` running the scenario `$name` once, under the shim (through
/// `dlsym`).
macro_rules! shimmed {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn is_refused() {
                run(stringify!($name), Mode::Shim, vec![EntryPath::Dlsym], $name);
            }
        }
    };
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
fn creator_gone_while_importers_map_it(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va) = exportable(&mut a, 0, 1);
    let hb = share(&mut a, &mut b, h);
    let vb = map_granule(&mut b, hb, 0);
    unmap_release(&mut a, va, h);
    b.verify(vb, GRAN, 1)
        .expect("the importer keeps the memory");
    refused(ctx, &mut [&mut a, &mut b], "creator");
    // Nothing changed: still usable, and checkpointable once the importer is done.
    b.fill(vb, GRAN, 2).unwrap();
    unmap_release(&mut b, vb, hb);
    assert_eq!(ctx.try_toggle(&mut [&mut a, &mut b]), Some(Ok(())));
}

shimmed!(creator_gone_while_importers_map_it);

/// A POSIX FD exported by a process without the shim is no ticket: the shim imports it
/// natively and counts it, and a checkpoint is refused while it is held.
fn raw_import_from_an_unshimmed_exporter(ctx: &mut Ctx) {
    let mut b = ctx.worker();
    let mut plain = ctx.unshimmed_worker();
    let (h, va, fd) = exported(&mut plain, 0, 3);
    let raw = b.import(fd.as_fd()).expect("imported natively");
    let vb = map_granule(&mut b, raw, 0);
    b.verify(vb, GRAN, 3).unwrap();
    assert_eq!(ctx.inspect(&b).map(|i| i.raw_imports), Some(1));
    refused(ctx, &mut [&mut b], "not cuinterpose tickets");
    unmap_release(&mut b, vb, raw);
    assert_eq!(ctx.try_toggle(&mut [&mut b]), Some(Ok(())));
    unmap_release(&mut plain, va, h);
}

shimmed!(raw_import_from_an_unshimmed_exporter);

/// A ticket whose allocation its creator released entirely (no handle, no mapping) no longer
/// imports, even from an FD the importer still holds: the driver would import the memory the
/// FD keeps alive, which nobody could checkpoint.
fn ticket_of_a_released_allocation(ctx: &mut Ctx) {
    let [mut a, mut b] = ctx.workers();
    let (h, va, fd) = exported(&mut a, 0, 4);
    unmap_release(&mut a, va, h);
    let err = b.import(fd.as_fd()).expect_err("the allocation is gone");
    assert_eq!(err.cuda_code(), Some(INVALID_HANDLE), "{err}");
    assert_eq!(ctx.try_toggle(&mut [&mut a, &mut b]), Some(Ok(())));
}

shimmed!(ticket_of_a_released_allocation);

/// Handle types the shim cannot checkpoint (Win32 here) are refused at creation with
/// CUDA_ERROR_NOT_SUPPORTED, as this driver refuses them too.
fn unsupported_handle_types(ctx: &mut Ctx) {
    let mut a = ctx.worker();
    for types in [2, 4, POSIX | 2] {
        let err = a.create(GRAN, 0, types).expect_err("refused");
        assert_eq!(err.cuda_code(), Some(NOT_SUPPORTED), "types {types}: {err}");
    }
    assert_eq!(ctx.records(&a), Some(Vec::new()));
}

shimmed!(unsupported_handle_types);
