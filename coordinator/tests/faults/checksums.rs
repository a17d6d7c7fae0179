//! Checked bytes: the save records a checksum per carrier chunk in the state, `state show`
//! lists them, and a restore whose bytes do not match refuses before any process resumes on
//! them, naming the participant, the allocation and the offset: bytes damaged in the
//! creator's host carrier (the shim's own check as it loads), and a state whose checksums are
//! not those of the saved bytes (the coordinator's check of the load's reply).

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::Stage;
use cuinterpose_coordinator::state;
use cuinterpose_protocol::{Operation, Phase, StateFile};

use crate::faults::workload::{A, SHARED, Workload, prepare};
use crate::support::cli::{cuinterpose, path, text};
use crate::support::sandbox::Sandbox;

/// The state of a fresh capture of `workload`, with its checksums checked: one allocation of
/// A's, one chunk, the XXH3-64 of the bytes the workload wrote.
fn captured(sandbox: &Sandbox, workload: &Workload) -> (std::path::PathBuf, StateFile) {
    let dir = prepare(sandbox, workload);
    let saved = state::load(&dir).expect("the state");
    let pid = workload.pid(A);
    assert_eq!(
        saved.checksums.keys().copied().collect::<Vec<_>>(),
        [pid],
        "only the creator carries bytes"
    );
    let list = &saved.checksums[&pid];
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].size, SHARED);
    let expected =
        twox_hash::XxHash3_64::oneshot(&cuinterpose_workload::pattern(7, SHARED as usize));
    assert_eq!(list[0].chunks.to_vec(), [expected], "the bytes as written");
    (dir, saved)
}

pub(crate) fn checksums(sandbox: &Sandbox) {
    shown_and_changed_in_the_state(sandbox);
    damaged_in_the_carrier(sandbox);
}

/// `state show` lists the checksums; a state resealed with another checksum (as if the saved
/// bytes were not these) is refused at load_allocations, after the native restore put the
/// bytes back but before any process resumes on them: fail-stop, naming participant,
/// allocation and offset.
fn shown_and_changed_in_the_state(sandbox: &Sandbox) {
    let workload = Workload::start(sandbox, "sums");
    let (dir, saved) = captured(sandbox, &workload);
    let pid = workload.pid(A);
    let hash = saved.checksums[&pid][0].chunks[0];
    let shown = cuinterpose(&["state", "show", path(&dir)], &[]);
    let yaml = text(&shown.stdout);
    assert!(shown.status.success(), "{yaml}");
    assert!(
        yaml.contains("checksums:") && yaml.contains(&format!("{hash:016x}")),
        "{yaml}"
    );

    let mut checksums = saved.checksums.clone().into_inner();
    let mut list = checksums[&pid].clone().into_vec();
    let mut chunks = list[0].chunks.clone().into_vec();
    chunks[0] ^= 1;
    list[0].chunks = chunks.try_into().unwrap();
    checksums.insert(pid, list.try_into().unwrap());
    let edited = StateFile::seal(
        saved.participants.clone(),
        saved.devices.clone(),
        checksums.try_into().unwrap(),
        saved.carrier,
    );
    let edited_dir = sandbox.fresh("sums-edited");
    state::publish(&edited_dir, &edited).unwrap();
    let session = workload.session(Duration::from_secs(5));
    let error = commands::restore(&session, &edited_dir, &mut |_| {}).expect_err("refused");
    let CommandError::Run(run) = &error else {
        panic!("{error}");
    };
    assert_eq!(
        run.stage,
        Stage::Execute(Operation::LoadAllocations),
        "{error}"
    );
    let message = error.to_string();
    let id = saved.checksums[&pid][0].allocation;
    for part in [
        format!("participant {pid}"),
        format!(
            "the loaded bytes do not match the checkpoint: allocation {id}: the {SHARED} bytes \
             loaded at offset 0 hash to {hash:#018x}, but the checkpoint recorded {:#018x}",
            hash ^ 1
        ),
    ] {
        assert!(message.contains(&part), "no {part:?} in: {message}");
    }
    assert_eq!(error.exit_code(), 2, "{message}");
    // Told of the fail-stop: nobody resumes on the memory.
    assert_eq!(workload.phases(), [Phase::Failed; 3]);
}

/// A byte of the creator's host carrier flipped in its memory while it is released (as a bad
/// page or a damaged image would): the shim's load finds the chunk that differs and
/// fail-stops, naming it; the coordinator reports it.
fn damaged_in_the_carrier(sandbox: &Sandbox) {
    let workload = Workload::start(sandbox, "damage");
    let (dir, saved) = captured(sandbox, &workload);
    let pid = workload.pid(A);
    flip_a_carrier_byte(workload.host_pid(A), 3 << 20);
    let session = workload.session(Duration::from_secs(5));
    let error = commands::restore(&session, &dir, &mut |_| {}).expect_err("refused");
    let message = error.to_string();
    let id = saved.checksums[&pid][0].allocation;
    for part in [
        format!("participant {pid}"),
        "load_allocations".to_owned(),
        format!("allocation {id}: the host carrier's {SHARED} bytes at offset 0 hash to"),
        format!(
            "but save_allocations recorded {:#018x}",
            saved.checksums[&pid][0].chunks[0]
        ),
    ] {
        assert!(message.contains(&part), "no {part:?} in: {message}");
    }
    assert_eq!(error.exit_code(), 2, "{message}");
    assert_eq!(workload.phases(), [Phase::Failed; 3]);
}

/// Flips the byte at `offset` of the creator's host carrier: the one private anonymous
/// mapping of process `pid` that begins with the pattern the workload wrote.
fn flip_a_carrier_byte(pid: u32, offset: u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let head = cuinterpose_workload::pattern(7, 4096);
    let mut memory = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .expect("open the process's memory");
    let mut found = Vec::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Private, writable, anonymous (no path): where the shim's arena lives.
        if fields.len() != 5 || fields[1] != "rw-p" {
            continue;
        }
        let (start, end) = fields[0].split_once('-').expect("a range");
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let mut page = vec![0u8; 4096];
        let mut at = start;
        while at + SHARED <= end {
            memory.seek(SeekFrom::Start(at)).unwrap();
            if memory.read_exact(&mut page).is_ok() && page == head {
                found.push(at);
            }
            at += 4096;
        }
    }
    assert_eq!(
        found.len(),
        1,
        "one carrier holds the pattern: {found:x?}\n{maps}"
    );
    let mut byte = [0u8; 1];
    memory.seek(SeekFrom::Start(found[0] + offset)).unwrap();
    memory.read_exact(&mut byte).unwrap();
    byte[0] ^= 0x40;
    memory.seek(SeekFrom::Start(found[0] + offset)).unwrap();
    memory.write_all(&byte).expect("write the process's memory");
}
