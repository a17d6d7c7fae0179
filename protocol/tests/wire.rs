//! Wire bytes of every message, record, the state file and each layout, pinned in
//! `snapshots/` (hex dump plus decoded view), and the round trip of each.

mod examples;

use cuinterpose_protocol as p;
use examples::hex_dump;
use p::layout::FixedLayout;

fn snapshot(name: &str, content: &str) {
    insta::with_settings!({
        snapshot_path => "../../snapshots",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, content);
    });
}

/// Encodes, snapshots bytes and decoded view, and checks the round trip.
fn check<M: p::Message + std::fmt::Debug + PartialEq>(name: &str, value: &M) {
    let bytes = p::encode(value).expect("example encodes");
    let decoded: M = p::decode(&bytes).expect("example decodes");
    assert_eq!(&decoded, value, "{name} round-trips");
    snapshot(
        name,
        &format!(
            "{} ({} bytes)\n{}\ndecoded:\n{decoded:#?}\n",
            M::NAME,
            bytes.len(),
            hex_dump(&bytes)
        ),
    );
}

#[test]
fn requests() {
    for (name, request) in examples::requests() {
        check(&format!("wire_request_{name}"), &request);
    }
}

#[test]
fn replies() {
    for (name, reply) in examples::replies() {
        check(&format!("wire_reply_{name}"), &reply);
    }
}

#[test]
fn records() {
    // Records travel inside an inspection; each is pinned alone in a one-record reply.
    for (name, record) in examples::records() {
        let reply = p::Reply::Inspection(p::InspectionReply {
            namespace_pid: examples::pid(100),
            phase: p::Phase::Frozen,
            raw_imports: 0,
            records: vec![record].try_into().expect("one record"),
            devices: p::BoundedVec::default(),
        });
        check(&format!("wire_record_{name}"), &reply);
    }
}

#[test]
fn state_file() {
    check("wire_state_file", &examples::state_file());
}

/// The digest covers every record: one changed address is caught, resealing accepts it, and
/// the mismatch names both digests.
#[test]
fn state_file_digest_covers_the_records() {
    let state = examples::state_file();
    assert_eq!(state.check_digest(), Ok(()));
    let mut shifted = state.clone();
    let mut map = shifted.participants.clone().into_inner();
    let records = map.get_mut(&examples::pid(101)).expect("participant 101");
    let mut list = records.clone().into_vec();
    let p::Record::Mapping(mapping) = &mut list[0] else {
        panic!("a mapping record");
    };
    mapping.address += 2 << 20;
    *records = list.try_into().expect("one record");
    shifted.participants = map.clone().try_into().expect("bounded");
    let error = shifted.check_digest().expect_err("shifted address");
    assert_eq!(error.recorded, state.digest);
    assert_ne!(error.computed, state.digest);
    let message = error.to_string();
    assert!(
        message.starts_with("integrity check failed: the file's digest is ")
            && message.contains(&state.digest.to_string())
            && message.contains(&error.computed.to_string()),
        "{message}"
    );
    // Decoding does not check the digest (the loader does): the edited file still decodes.
    let bytes = p::encode(&shifted).expect("encodes");
    let decoded: p::StateFile = p::decode(&bytes).expect("decodes");
    assert!(decoded.check_digest().is_err());
    let resealed = p::StateFile::seal(
        map.try_into().expect("bounded"),
        state.devices.clone(),
        state.checksums.clone(),
        state.carrier,
    );
    assert_eq!(resealed.check_digest(), Ok(()));
    assert_ne!(resealed.digest, state.digest);
    // The devices are covered too: a GPU swapped in the machine list is caught.
    let mut moved = state.clone();
    let mut machine = moved.devices.machine.clone().into_vec();
    machine.swap(0, 1);
    moved.devices.machine = machine.try_into().expect("two devices");
    assert!(moved.check_digest().is_err(), "an edited device list");
}

#[test]
fn ticket() {
    let ticket = examples::ticket();
    check("wire_ticket", &ticket);
    let bytes = p::encode(&ticket).expect("encodes");
    assert!(bytes.len() <= p::MAX_TICKET_BYTES);
}

/// Checks the round trip of a fixed layout and snapshots its bytes and decoded view: the
/// bytes.
fn check_layout<L: FixedLayout + std::fmt::Debug + PartialEq>(name: &str, handle: &L) -> Vec<u8> {
    let bytes = handle.encode_vec();
    assert_eq!(
        L::decode_bytes(&bytes).as_ref(),
        Ok(handle),
        "{name} round-trips"
    );
    snapshot(
        name,
        &format!(
            "{} bytes\n{}\ndecoded:\n{handle:#?}\n",
            bytes.len(),
            hex_dump(&bytes)
        ),
    );
    bytes
}

#[test]
fn virtual_shareable_handle_layout() {
    let handle = examples::virtual_shareable_handle();
    let bytes = check_layout("layout_virtual_shareable_handle", &handle);
    let mut expected = vec![b'C', b'U', b'I', p::VERSION, 0x44, 0x33, 0x22, 0x11];
    expected.extend([0x22; 16]);
    assert_eq!(bytes, expected);
}

#[test]
fn ipc_mem_handle_layout() {
    let bytes = check_layout("layout_ipc_mem_handle", &examples::ipc_mem_handle());
    assert_eq!(
        &bytes[..8],
        format!(
            "CUIPC00{}",
            char::from(p::layout::version_digit(p::VERSION))
        )
        .as_bytes()
    );
    assert!(bytes[28..48].iter().all(|&byte| byte == 0));
}

#[test]
fn pool_pointer_handle_layout() {
    let bytes = check_layout(
        "layout_pool_pointer_handle",
        &examples::pool_pointer_handle(),
    );
    assert_eq!(
        &bytes[..8],
        format!(
            "CUPOOL0{}",
            char::from(p::layout::version_digit(p::VERSION))
        )
        .as_bytes()
    );
    assert_eq!(&bytes[28..44], &[0x55; 16]);
    assert_eq!(&bytes[44..48], &1i32.to_le_bytes());
    // An IPC handle is not a pool pointer, nor the other way round.
    let ipc = examples::ipc_mem_handle().encode();
    assert!(p::PoolPointerHandle::decode(&ipc).is_err());
    assert!(p::IpcMemHandle::decode(&bytes).is_err());
}

#[test]
fn human_readable_forms_use_hex_identities() {
    let requests = examples::requests();
    let export = &requests
        .iter()
        .find(|(name, _)| *name == "export")
        .expect("an export example")
        .1;
    let text = serde_json::to_string(export).expect("json");
    assert_eq!(
        text,
        r#"{"kind":"export","allocation":{"id":"11111111111111111111111111111111","creator_pid":100},"resource":"unicast","capability":"c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5"}"#
    );
    let back: p::Request = serde_json::from_str(&text).expect("json decodes");
    assert_eq!(&back, export);
}
