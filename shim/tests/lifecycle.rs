//! The shim's lifecycle driven operation by operation (no coordinator): capture, native
//! checkpoint and restore through fakecuda, restore, then the same records, addresses, bytes
//! and live sharing; refusals of out-of-order operations; application calls (tracked or not)
//! wait at the gate from begin_checkpoint until the restore completes.

mod support;

use cuinterpose_protocol::{ExecuteRequest, Operation, Phase, Record, RefusalCode, Reply, Request};
use cuinterpose_workload::proto::{Command, Reply as WorkerReply};
use cuinterpose_workload::{EntryPath, Worker};
use std::os::fd::AsFd;
use support::{Sandbox, ask, completed, inspect, native, worker};

const MIB: u64 = 1 << 20;
/// Long enough for a call that is not blocked to answer on a loaded machine.
const ANSWER: std::time::Duration = std::time::Duration::from_millis(500);

fn execute(sandbox: &Sandbox, pid: i32, operation: Operation) -> Reply {
    ask(
        sandbox,
        pid,
        &Request::Execute(ExecuteRequest::host(operation)),
    )
}

fn records(sandbox: &Sandbox, w: &Worker) -> Vec<Record> {
    inspect(sandbox, w.worker_pid()).records.to_vec()
}

#[test]
fn checkpoint_and_restore_keep_addresses_bytes_and_sharing() {
    let sandbox = Sandbox::new("lifecycle");
    let mut a = worker(&sandbox, EntryPath::Dlsym, true);
    let mut b = worker(&sandbox, EntryPath::ProcAddress(12030), true);
    let shared = a.create(4 * MIB, 0, 1).unwrap();
    let private = a.create(2 * MIB, 0, 1).unwrap();
    let va = a.map_rw(shared, 4 * MIB, 0).unwrap();
    let vp = a.map_rw(private, 2 * MIB, 0).unwrap();
    a.fill(va, 4 * MIB, 21).unwrap();
    a.fill(vp, 2 * MIB, 22).unwrap();
    let ticket = a.export(shared).unwrap();
    let hb = b.import(ticket.as_fd()).unwrap();
    drop(ticket);
    let vb = b.map_rw(hb, 4 * MIB, 0).unwrap();
    b.release(hb).unwrap(); // a mapping alone keeps it
    let bp = b.create(2 * MIB, 0, 0).unwrap(); // untracked, native only
    let vbp = b.map_rw(bp, 2 * MIB, 0).unwrap();
    b.fill(vbp, 2 * MIB, 23).unwrap();

    let pids = [a.worker_pid(), b.worker_pid()];
    let before: Vec<_> = [&a, &b].iter().map(|w| records(&sandbox, w)).collect();

    // An operation out of order is refused without mutation.
    match execute(&sandbox, pids[0], Operation::SaveAllocations) {
        Reply::Refused(r) => assert_eq!(r.code, RefusalCode::OutOfOrder, "{r:?}"),
        other => panic!("{other:?}"),
    }
    for &pid in &pids {
        match ask(&sandbox, pid, &Request::BeginCheckpoint) {
            Reply::Inspection(i) => assert_eq!(i.phase, Phase::Frozen),
            other => panic!("{other:?}"),
        }
    }
    // Application calls wait at the gate for the restore: a tracked one (cuMemAlloc) and a
    // pass-through (cuMemcpyDtoH of private memory).
    a.send(&Command::MemAlloc { size: 2 * MIB }, None).unwrap();
    b.send(
        &Command::Read {
            address: vbp,
            size: 4096,
        },
        None,
    )
    .unwrap();
    assert!(
        !a.reply_ready(ANSWER),
        "a tracked call passed the closed gate"
    );
    assert!(
        !b.reply_ready(ANSWER),
        "a pass-through passed the closed gate"
    );
    match ask(&sandbox, pids[0], &Request::BeginCheckpoint) {
        Reply::Refused(r) => assert_eq!(r.code, RefusalCode::OutOfOrder),
        other => panic!("{other:?}"),
    }
    for &pid in &pids {
        completed(&sandbox, pid, Operation::PrepareMulticast);
    }
    assert_eq!(
        completed(&sandbox, pids[0], Operation::SaveAllocations),
        4 * MIB,
        "one copy, in the creator"
    );
    assert_eq!(
        completed(&sandbox, pids[1], Operation::SaveAllocations),
        0,
        "importers save nothing"
    );
    for &pid in &pids {
        completed(&sandbox, pid, Operation::PrepareUnicast);
    }
    for &pid in &pids {
        native(&sandbox, pid, "lock");
        native(&sandbox, pid, "checkpoint");
    }
    for &pid in &pids {
        native(&sandbox, pid, "restore");
        native(&sandbox, pid, "unlock");
    }
    for (i, w) in [&a, &b].iter().enumerate() {
        let now = records(&sandbox, w);
        assert_eq!(
            now,
            before[i],
            "records of {} while released",
            w.worker_pid()
        );
    }
    assert_eq!(
        completed(&sandbox, pids[0], Operation::LoadAllocations),
        4 * MIB
    );
    assert_eq!(completed(&sandbox, pids[1], Operation::LoadAllocations), 0);
    for op in [
        Operation::RestoreUnicast,
        Operation::RestoreMulticastCreators,
        Operation::RestoreMulticastImporters,
        Operation::RestoreMulticastDevices,
        Operation::RestoreMulticastBindings,
    ] {
        for &pid in &pids {
            completed(&sandbox, pid, op);
        }
    }
    // The gate stays closed until the verifying inspection has read the records.
    assert!(
        !a.reply_ready(ANSWER),
        "the gate opened before the verification"
    );
    for (i, w) in [&a, &b].iter().enumerate() {
        let i_now = inspect(&sandbox, w.worker_pid());
        assert_eq!(i_now.phase, Phase::Active);
        assert_eq!(i_now.records.to_vec(), before[i]);
    }
    // Verified: the gate is open again: the blocked calls complete.
    let allocated = match a.receive().unwrap().0 {
        WorkerReply::Address { address } => address,
        other => panic!("cuMemAlloc after the restore: {other:?}"),
    };
    assert!(matches!(b.receive().unwrap().0, WorkerReply::Bytes { .. }));
    a.mem_free(allocated).unwrap();
    a.verify(va, 4 * MIB, 21).unwrap();
    a.verify(vp, 2 * MIB, 22).unwrap();
    b.verify(vb, 4 * MIB, 21).unwrap();
    b.verify(vbp, 2 * MIB, 23).unwrap();
    // Still shared, not two copies.
    b.fill(vb, MIB, 24).unwrap();
    a.verify(va, MIB, 24).unwrap();
    // And tracked calls work again.
    let more = a.create(2 * MIB, 0, 1).unwrap();
    a.release(more).unwrap();
}
