//! The storage carrier over the real shim and fakecuda: the creator's shared bytes go to a
//! file of the checkpoint directory's `carrier/` folder, a restore reads and verifies them,
//! and every fault is a clear error naming the file: a damaged or truncated file (refused
//! before any process resumes on it), a window smaller than one chunk (refused before anyone
//! is frozen), a full disk and a file system without `O_DIRECT` (the save is refused and the
//! workload put back, with no file left behind).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cuinterpose_coordinator::checkpoint_dir;
use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::Carriage;
use cuinterpose_coordinator::session::Session;
use cuinterpose_coordinator::state;
use cuinterpose_protocol::{Carrier, Phase, StateFile};

use crate::faults::workload::{A, MIB, SHARED, Workload};
use crate::support::sandbox::Sandbox;
use crate::support::tmpfs::{Tmpfs, unavailable};

const WINDOW: u64 = 64 * MIB;

fn storage(workload: &Workload, staging_bytes: u64) -> Session {
    workload
        .session(Duration::from_secs(5))
        .carrying(Carriage::Storage { staging_bytes })
}

/// A capture of `workload` into `dir` with the storage carrier: its state and the one file.
fn captured(workload: &Workload, dir: &Path) -> (StateFile, PathBuf) {
    let report = commands::prepare(&storage(workload, WINDOW), dir, &mut |_| {}).expect("prepare");
    assert_eq!(workload.phases(), [Phase::Released; 3]);
    let saved = state::load(dir).expect("the state");
    assert_eq!(saved.carrier, Carrier::Storage);
    let id = saved.checksums[&workload.pid(A)][0].allocation;
    let file = checkpoint_dir::carrier_file(dir, &id);
    let bytes = std::fs::read(&file).expect("the carrier file");
    assert_eq!(
        bytes,
        cuinterpose_workload::pattern(7, SHARED as usize),
        "the bytes as written"
    );
    let save = report
        .copies
        .iter()
        .find(|c| c.phase == "save_allocations" && c.participant == workload.pid(A))
        .expect("the creator's copy");
    // One slot of the window, no longer than the one chunk there is.
    assert_eq!(save.peak_carrier_bytes, SHARED, "{save:?}");
    (saved, file)
}

pub(crate) fn storage_carrier(sandbox: &Sandbox) {
    round_trip(sandbox);
    damaged_or_truncated(sandbox);
    window_too_small(sandbox);
    full_disk_and_no_direct_io(sandbox);
}

/// Saved to the file, restored from it: same bytes, still shared.
fn round_trip(sandbox: &Sandbox) {
    let mut workload = Workload::start(sandbox, "stored");
    let dir = sandbox.fresh("stored-checkpoint");
    let _ = captured(&workload, &dir);
    let report = commands::restore(&workload.session(Duration::from_secs(5)), &dir, &mut |_| {})
        .expect("restore");
    let load = report
        .copies
        .iter()
        .find(|c| c.phase == "load_allocations" && c.participant == workload.pid(A))
        .expect("the creator's load");
    assert_eq!(load.bytes, SHARED);
    assert_eq!(load.peak_carrier_bytes, SHARED, "{load:?}");
    assert_eq!(workload.phases(), [Phase::Active; 3]);
    workload.check_shared(7);
}

/// A flipped byte, then a file cut short: each restore refuses at load_allocations, naming
/// the file (and, for the flipped byte, the offset), before anyone resumes on the bytes.
fn damaged_or_truncated(sandbox: &Sandbox) {
    for (label, damage, expected) in [
        (
            "flipped",
            0usize,
            format!("the {SHARED} bytes at offset 0 hash to"),
        ),
        ("truncated", 1, "the allocation".to_owned()),
    ] {
        let workload = Workload::start(sandbox, label);
        let dir = sandbox.fresh(&format!("{label}-checkpoint"));
        let (_, file) = captured(&workload, &dir);
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        if damage == 0 {
            let mut byte = [0u8; 1];
            handle.read_exact_at(&mut byte, 1 << 20).unwrap();
            byte[0] ^= 0x20;
            handle.write_all_at(&byte, 1 << 20).unwrap();
        } else {
            handle.set_len(SHARED - 4096).unwrap();
        }
        drop(handle);
        let error = commands::restore(&workload.session(Duration::from_secs(5)), &dir, &mut |_| {})
            .expect_err("refused");
        let message = error.to_string();
        for part in [
            format!("participant {}", workload.pid(A)),
            "load_allocations".to_owned(),
            format!("carrier file {}", file.display()),
            expected.clone(),
        ] {
            assert!(
                message.contains(&part),
                "{label}: no {part:?} in: {message}"
            );
        }
        assert_eq!(error.exit_code(), 2, "{message}");
    }
}

/// A window smaller than one chunk is refused before anyone is frozen.
fn window_too_small(sandbox: &Sandbox) {
    let mut workload = Workload::start(sandbox, "window");
    let dir = sandbox.fresh("window-checkpoint");
    let error =
        commands::prepare(&storage(&workload, MIB), &dir, &mut |_| {}).expect_err("refused");
    assert!(matches!(error, CommandError::Window(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("staging window of 1048576 bytes is too small"),
        "{message}"
    );
    assert_eq!(error.exit_code(), 1);
    assert_eq!(workload.phases(), [Phase::Active; 3]);
    workload.check_shared(7);
}

/// A checkpoint directory on a full file system, then on one without `O_DIRECT`: the save
/// is refused naming the file, the capture rolled back, the workload runs on with its bytes
/// and sharing, and no carrier file is left.
fn full_disk_and_no_direct_io(sandbox: &Sandbox) {
    let test = "the_storage_carrier_refuses_damaged_files_and_full_disks (full disk, no O_DIRECT)";
    for (label, expected) in [
        ("full", "No space left on device"),
        ("ramfs", "the filesystem does not support O_DIRECT"),
    ] {
        let at = sandbox.fresh(label).join("mount");
        let mounted = match label {
            "full" => Tmpfs::mount(at.clone(), "2m"),
            _ => Tmpfs::mount_ramfs(at.clone()),
        };
        let mounted = match mounted {
            Ok(mounted) => mounted,
            Err(why) => return unavailable(test, &why),
        };
        let mut workload = Workload::start(sandbox, label);
        let dir = mounted.0.join("checkpoint");
        let error =
            commands::prepare(&storage(&workload, WINDOW), &dir, &mut |_| {}).expect_err("refused");
        let message = error.to_string();
        for part in [
            format!("participant {}", workload.pid(A)),
            "save_allocations".to_owned(),
            format!("carrier file {}", checkpoint_dir::carrier(&dir).display()),
            expected.to_owned(),
        ] {
            assert!(
                message.contains(&part),
                "{label}: no {part:?} in: {message}"
            );
        }
        assert_eq!(workload.phases(), [Phase::Active; 3], "{message}");
        workload.check_shared(7);
        let left: Vec<_> = std::fs::read_dir(checkpoint_dir::carrier(&dir))
            .map(|entries| entries.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{label}: left behind: {left:?}");
        drop(workload);
        mounted.unmount().expect("nothing holds the mount");
    }
}
