//! Restore refuses a corrupt, truncated or mismatched state before changing anyone, and the
//! genuine state still restores.

use std::time::Duration;

use cuinterpose_coordinator::checkpoint_dir;
use cuinterpose_coordinator::commands::{self, CommandError};
use cuinterpose_coordinator::plan::Stage;
use cuinterpose_coordinator::state::{self, StateError};
use cuinterpose_protocol::{NamespacePid, Phase, StateFile};

use crate::faults::workload::{A, B, C, Workload, prepare};
use crate::support::cli::path;
use crate::support::sandbox::Sandbox;

pub(crate) fn corrupt_state(sandbox: &Sandbox) {
    let mut workload = Workload::start(sandbox, "corrupt");
    let good_dir = prepare(sandbox, &workload);
    let good = std::fs::read(checkpoint_dir::state(&good_dir)).expect("state bytes");
    let session = workload.session(Duration::from_secs(5));
    let saved = state::load(&good_dir).unwrap();

    // Bytes that are not a state: each refused at loading, before any participant is asked.
    let mut corruptions: Vec<(String, Vec<u8>, &str)> = vec![
        ("an empty file".into(), Vec::new(), "not an envelope"),
        (
            "another version".into(),
            {
                let mut bytes = good.clone();
                bytes[9] = 99;
                bytes
            },
            "unsupported protocol version 99",
        ),
        (
            "trailing garbage".into(),
            {
                let mut bytes = good.clone();
                bytes.extend_from_slice(b"garbage");
                bytes
            },
            "trailing bytes",
        ),
    ];
    for cut in [1, 15, 16, good.len() / 2, good.len() - 1] {
        corruptions.push((
            format!("truncated to {cut} bytes"),
            good[..cut].to_vec(),
            "corrupt checkpoint state",
        ));
    }
    for (what, bytes, text) in &corruptions {
        let dir = sandbox.fresh("corrupt");
        std::fs::write(checkpoint_dir::state(&dir), bytes).unwrap();
        let error = commands::restore(&session, &dir, &mut |_| {}).expect_err(what);
        assert!(
            matches!(error, CommandError::State(StateError::Corrupt { .. })),
            "{what}: {error}"
        );
        let message = error.to_string();
        assert!(
            message.contains(text) && message.contains(path(&dir)),
            "{what}: {message}"
        );
        assert_eq!(error.exit_code(), 1);
        assert_eq!(workload.phases(), [Phase::Released; 3], "{what}");
    }
    // One byte replaced, at every 5th position of the body: refused every time at loading,
    // as corrupt (it no longer decodes) or as failing the integrity check (it decodes, but
    // the digest does not match), and never with anyone asked or changed.
    let (mut corrupt, mut tampered) = (0, 0);
    for at in (15..good.len()).step_by(5) {
        let mut bytes = good.clone();
        // 0xc1 is never used in MessagePack; inside a random 16-byte id it may already be
        // there, and then any other value changes the id.
        bytes[at] = if good[at] == 0xc1 { 0x00 } else { 0xc1 };
        let dir = sandbox.fresh("corrupt");
        std::fs::write(checkpoint_dir::state(&dir), &bytes).unwrap();
        match commands::restore(&session, &dir, &mut |_| {}) {
            Err(CommandError::State(StateError::Corrupt { .. })) => corrupt += 1,
            Err(CommandError::State(StateError::Tampered { .. })) => tampered += 1,
            other => panic!("byte {at} replaced: {other:?}"),
        }
    }
    assert!(tampered > 0, "some replaced bytes still decode");
    assert_eq!(workload.phases(), [Phase::Released; 3]);
    println!("  one byte replaced: {corrupt} refused as corrupt, {tampered} by the digest");

    // Through the binary: exit 1, the file named.
    let dir = sandbox.fresh("corrupt");
    std::fs::write(checkpoint_dir::state(&dir), &good[..good.len() / 2]).unwrap();
    let stderr = workload.refused_by_binary("restore", &dir, &[]);
    assert!(
        stderr.contains("corrupt checkpoint state: StateFile: malformed body"),
        "{stderr}"
    );

    // Well-formed, sealed states that do not match: another set of participants (refused
    // before any request), records that differ (refused at the read-only inspect).
    // Sealed as a checkpoint would: the device tables follow the participants.
    let seal = |map: std::collections::BTreeMap<NamespacePid, _>, rename: Option<NamespacePid>| {
        let mut devices = saved.devices.clone();
        let mut seen = devices.participants.clone().into_inner();
        if let Some(to) = rename
            && let Some(list) = seen.remove(&workload.pid(A))
        {
            seen.insert(to, list);
        }
        seen.retain(|pid, _| map.contains_key(pid));
        devices.participants = seen.try_into().unwrap();
        let mut checksums = saved.checksums.clone().into_inner();
        if let Some(to) = rename
            && let Some(list) = checksums.remove(&workload.pid(A))
        {
            checksums.insert(to, list);
        }
        checksums.retain(|pid, _| map.contains_key(pid));
        StateFile::seal(
            map.try_into().unwrap(),
            devices,
            checksums.try_into().unwrap(),
            saved.carrier,
        )
    };
    let mut map = saved.participants.clone().into_inner();
    map.remove(&workload.pid(C));
    let fewer = seal(map, None);
    let mut map = saved.participants.clone().into_inner();
    let records = map.remove(&workload.pid(A)).unwrap();
    let new_a = NamespacePid::new(workload.pid(A).get() + 100_000).unwrap();
    map.insert(new_a, records);
    let renamed = seal(map, Some(new_a));
    let mut map = saved.participants.clone().into_inner();
    let b_records = map.get_mut(&workload.pid(B)).unwrap();
    let mut records = b_records.clone().into_vec();
    records.pop();
    *b_records = records.try_into().unwrap();
    let changed = seal(map, None);
    let live_only = format!(
        "the live participants are not the checkpointed ones (checkpointed but not live: []; \
         live but not checkpointed: [{}])",
        workload.pid(C)
    );
    for (what, state, stage, text) in [
        (
            "a participant fewer",
            fewer,
            Stage::CheckState,
            live_only.as_str(),
        ),
        (
            "the creator renamed",
            renamed,
            Stage::CheckState,
            "which is not a participant of this checkpoint",
        ),
        (
            "a record missing",
            changed,
            Stage::Inspect,
            "records differ from the checkpoint (1 differences): unexpected ",
        ),
    ] {
        let dir = sandbox.fresh("mismatch");
        state::publish(&dir, &state).unwrap();
        let error = commands::restore(&session, &dir, &mut |_| {}).expect_err(what);
        let CommandError::Run(run) = &error else {
            panic!("{what}: {error}");
        };
        assert_eq!(run.stage, stage, "{what}: {error}");
        assert!(!run.mutated, "{what}");
        assert!(error.to_string().contains(text), "{what}: {error}");
        assert_eq!(workload.phases(), [Phase::Released; 3], "{what}");
    }

    // The genuine state still restores, with the bytes and the sharing.
    commands::restore(&session, &good_dir, &mut |_| {}).expect("restore");
    workload.check_shared(7);
}
