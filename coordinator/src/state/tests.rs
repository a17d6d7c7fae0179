//! Unit tests of the state file: publication is atomic and never replaces, loading names each
//! way a file can be wrong, and comparison ignores order.

use super::*;
use cuinterpose_protocol::{Carrier, Phase};
use cuinterpose_testkit::fixtures::*;
use std::os::unix::fs::PermissionsExt;

fn sample() -> StateFile {
    state_file(&shared_topology(101))
}

/// Names in `dir` other than the final state file (temp files left behind).
fn leftovers(dir: &Path) -> Vec<String> {
    let mut names = cuinterpose_testkit::file_names(dir);
    names.retain(|name| name != crate::checkpoint_dir::STATE_FILE_NAME);
    names
}

#[test]
fn publish_then_load_round_trips() {
    let dir = TempDir::new("state").expect("temp dir");
    let state = sample();
    let path = publish(dir.path(), &state).expect("publish");
    assert_eq!(path, crate::checkpoint_dir::state(dir.path()));
    assert_eq!(load(dir.path()).expect("load"), state);
    let mode = fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(leftovers(dir.path()).is_empty());
}

#[test]
fn state_from_inspections_sorts_records() {
    let participants = shared_topology(101);
    let mut replies = inspections(&participants, Phase::Frozen);
    for reply in replies.values_mut() {
        let mut records = reply.records.clone().into_vec();
        records.reverse();
        reply.records = records.try_into().expect("bounded");
    }
    // As frozen: the checksums come with the save.
    let frozen = sample();
    assert_eq!(
        state_from_inspections(&replies, BoundedVec::default()).expect("state"),
        StateFile::seal(
            frozen.participants,
            frozen.devices,
            Default::default(),
            Carrier::Host,
        )
    );
}

#[test]
fn publish_never_replaces_a_state() {
    let dir = TempDir::new("state").expect("temp dir");
    let first = sample();
    publish(dir.path(), &first).expect("publish");
    let second = state_file(&shared_topology(201));
    let error = publish(dir.path(), &second).expect_err("second publish");
    assert!(matches!(error, StateError::AlreadyExists { .. }), "{error}");
    assert!(error.to_string().contains("use a new checkpoint directory"));
    assert!(matches!(
        check_absent(dir.path()),
        Err(StateError::AlreadyExists { .. })
    ));
    assert_eq!(load(dir.path()).expect("load"), first);
    assert!(leftovers(dir.path()).is_empty());

    // A dangling symlink at the final name is not replaced either.
    let dir = TempDir::new("state").expect("temp dir");
    std::os::unix::fs::symlink("/nonexistent", crate::checkpoint_dir::state(dir.path()))
        .expect("symlink");
    let error = publish(dir.path(), &first).expect_err("publish over a symlink");
    assert!(matches!(error, StateError::AlreadyExists { .. }), "{error}");
}

/// Observes the final file after every step, optionally failing at one of them.
struct Observer {
    dir: PathBuf,
    expected: StateFile,
    fail_at: Option<PublishStep>,
    seen: Vec<(PublishStep, bool)>,
}

impl PublishHook for Observer {
    fn after(&mut self, step: PublishStep) -> io::Result<()> {
        let present = match load(&self.dir) {
            Ok(state) => {
                assert_eq!(state, self.expected, "complete after {step:?}");
                true
            }
            Err(StateError::Missing { .. }) => false,
            Err(error) => panic!("partial state after {step:?}: {error}"),
        };
        self.seen.push((step, present));
        if self.fail_at == Some(step) {
            return Err(io::Error::other("injected"));
        }
        Ok(())
    }
}

fn check_interrupted(fail_at: Option<PublishStep>) {
    let dir = TempDir::new("state").expect("temp dir");
    let state = sample();
    let mut observer = Observer {
        dir: dir.path().to_path_buf(),
        expected: state.clone(),
        fail_at,
        seen: Vec::new(),
    };
    let result = publish_with(dir.path(), &state, &mut observer);
    let expected_steps: Vec<(PublishStep, bool)> = PublishStep::ALL
        .iter()
        .take_while(|step| Some(**step) <= fail_at || fail_at.is_none())
        .map(|step| (*step, *step >= PublishStep::Published))
        .collect();
    assert_eq!(observer.seen, expected_steps, "steps until {fail_at:?}");
    match fail_at {
        None => {
            result.expect("publish");
        }
        Some(step) => {
            let error = result.expect_err("injected failure");
            assert!(
                matches!(error, StateError::Interrupted { step: s, .. } if s == step),
                "{error}"
            );
        }
    }
    // Complete or absent, never partial, and no temp file left behind.
    match load(dir.path()) {
        Ok(loaded) => {
            assert_eq!(loaded, state);
            assert!(fail_at.is_none_or(|step| step >= PublishStep::Published));
        }
        Err(StateError::Missing { .. }) => {
            assert!(fail_at.is_some_and(|step| step < PublishStep::Published));
        }
        Err(error) => panic!("after {fail_at:?}: {error}"),
    }
    assert!(
        leftovers(dir.path()).is_empty(),
        "{:?}",
        leftovers(dir.path())
    );
}

#[test]
fn publication_is_complete_or_absent_after_every_step() {
    check_interrupted(None);
    for step in PublishStep::ALL {
        check_interrupted(Some(step));
    }
}

fn check_load_error(content: impl FnOnce(&Path), expected: &str) -> StateError {
    let dir = TempDir::new("state").expect("temp dir");
    content(&crate::checkpoint_dir::state(dir.path()));
    let error = load(dir.path()).expect_err("load must fail");
    let text = error.to_string();
    assert!(text.contains(expected), "{text}");
    assert!(
        text.contains(
            &crate::checkpoint_dir::state(dir.path())
                .display()
                .to_string()
        ),
        "{text}"
    );
    error
}

#[test]
fn load_errors_are_distinct() {
    let error = check_load_error(|_| {}, "no checkpoint state here");
    assert!(matches!(error, StateError::Missing { .. }));

    let error = check_load_error(
        |path| fs::create_dir(path).expect("dir"),
        "cannot read the checkpoint state",
    );
    assert!(matches!(error, StateError::Unreadable { .. }));

    let error = check_load_error(
        |path| {
            let file = File::create(path).expect("create");
            file.set_len(MAX_MESSAGE_BYTES as u64 + 1).expect("sparse");
        },
        "more than the limit of 50331648",
    );
    assert!(
        matches!(error, StateError::Oversized { size, .. } if size == MAX_MESSAGE_BYTES as u64 + 1)
    );

    let error = check_load_error(
        |path| fs::write(path, b"not a state file at all").expect("write"),
        "corrupt checkpoint state: StateFile: not an envelope",
    );
    assert!(matches!(error, StateError::Corrupt { .. }));

    let bytes = cuinterpose_protocol::encode(&sample()).expect("encode");
    let truncated = bytes[..bytes.len() - 1].to_vec();
    let error = check_load_error(
        move |path| fs::write(path, truncated).expect("write"),
        "corrupt checkpoint state: StateFile: malformed body",
    );
    assert!(matches!(error, StateError::Corrupt { .. }));

    let mut trailing = bytes.clone();
    trailing.push(0);
    check_load_error(
        move |path| fs::write(path, trailing).expect("write"),
        "trailing bytes",
    );

    let mut other_version = bytes;
    other_version[9] = 99;
    check_load_error(
        move |path| fs::write(path, other_version).expect("write"),
        "unsupported protocol version 99",
    );

    // Sealed, but with the devices of a process that is not a participant.
    let state = sample();
    let device = cuinterpose_protocol::Device {
        ordinal: 0,
        uuid: cuinterpose_protocol::DeviceUuid::new([7; 16]).expect("nonzero"),
        name: "H200".try_into().expect("short"),
        memory: 1 << 30,
    };
    let mut devices = cuinterpose_protocol::DeviceInventory::empty();
    devices
        .participants
        .insert(pid(999), vec![device].try_into().expect("one"))
        .expect("bounded");
    let stray = StateFile::seal(
        state.participants.clone(),
        devices,
        state.checksums.clone(),
        state.carrier,
    );
    let bytes = cuinterpose_protocol::encode(&stray).expect("encode");
    let error = check_load_error(
        move |path| fs::write(path, bytes).expect("write"),
        "inconsistent checkpoint state: it lists devices of process 999, which is not a participant",
    );
    assert!(matches!(error, StateError::Inconsistent { .. }));
}

#[test]
fn compare_ignores_order_and_names_differences() {
    let records: Vec<Record> = shared_topology(101).remove(&pid(101)).expect("101");
    let mut shuffled = records.clone();
    shuffled.reverse();
    assert!(compare(&records, &shuffled).is_empty());

    let mut fresh = records.clone();
    let removed = fresh.remove(1);
    let added: Record = mapping(1, 101, 0x1000, SIZE, 0).into();
    fresh.push(added.clone());
    fresh.push(records[0].clone());
    let differences = compare(&records, &fresh);
    // Missing first, then unexpected; each group sorted (allocations before mappings).
    assert_eq!(
        differences,
        [
            RecordDifference::Missing(removed),
            RecordDifference::Unexpected(records[0].clone()),
            RecordDifference::Unexpected(added),
        ]
    );
    let text: Vec<String> = differences.iter().map(ToString::to_string).collect();
    assert!(text.iter().any(|line| line.starts_with("missing ")));
    assert!(
        text.iter()
            .any(|line| line.starts_with("unexpected mapping of allocation")
                && line.contains("at 0x1000")),
        "{text:?}"
    );
}

fn sums(id: u8, size: u64, chunks: &[u64]) -> cuinterpose_protocol::CarrierChecksum {
    cuinterpose_protocol::CarrierChecksum {
        allocation: cuinterpose_protocol::AllocationId::new([id; 16]).expect("non-zero"),
        size,
        chunk_bytes: 4,
        chunks: chunks.to_vec().try_into().expect("bounded"),
    }
}

#[test]
fn checksums_are_compared_chunk_by_chunk() {
    use super::{ChecksumDifference as D, compare_checksums};
    let id = |n: u8| cuinterpose_protocol::AllocationId::new([n; 16]).expect("non-zero");
    let saved = [sums(1, 10, &[1, 2, 3]), sums(2, 4, &[9])];
    for (loaded, expected) in [
        (vec![sums(1, 10, &[1, 2, 3]), sums(2, 4, &[9])], None),
        (
            vec![sums(1, 10, &[1, 2, 7]), sums(2, 4, &[9])],
            // The last chunk is the shorter one.
            Some(D::Chunk {
                allocation: id(1),
                offset: 8,
                len: 2,
                saved: 3,
                found: 7,
            }),
        ),
        (
            vec![sums(1, 10, &[1, 2, 3])],
            Some(D::Missing { allocation: id(2) }),
        ),
        (
            vec![sums(1, 10, &[1, 2, 3]), sums(2, 4, &[9]), sums(3, 4, &[1])],
            Some(D::Unexpected { allocation: id(3) }),
        ),
        (
            vec![sums(1, 10, &[1, 2]), sums(2, 4, &[9])],
            Some(D::Shape { allocation: id(1) }),
        ),
    ] {
        assert_eq!(compare_checksums(&saved, &loaded), expected, "{loaded:?}");
    }
    let text = compare_checksums(&saved, &[sums(1, 10, &[1, 5, 3]), sums(2, 4, &[9])])
        .expect("differs")
        .to_string();
    assert_eq!(
        text,
        format!(
            "allocation {}: the 4 bytes loaded at offset 4 hash to 0x0000000000000005, but the \
             checkpoint recorded 0x0000000000000002",
            id(1)
        )
    );
    assert!(compare_checksums(&[], &[]).is_none());
}
