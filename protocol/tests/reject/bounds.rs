//! Bounds, depth and layouts.

use super::*;

#[test]
fn refusal_text_over_its_bound_is_rejected() {
    let long = "x".repeat(p::MAX_TEXT_BYTES + 1);
    assert!(p::BoundedString::<{ p::MAX_TEXT_BYTES }>::try_from(long.as_str()).is_err());
    let mut bytes = Mp::default()
        .map(3)
        .str("kind")
        .str("refused")
        .str("code")
        .str("busy")
        .str("message")
        .0;
    bytes.push(0xda);
    bytes.extend_from_slice(&(long.len() as u16).to_be_bytes());
    bytes.extend_from_slice(long.as_bytes());
    check_malformed::<p::Reply>(
        &Mp(bytes).wrap(),
        "string holds 4097, more than its bound of 4096",
    );
    let cut = p::BoundedString::<8>::truncating("héllo wörld");
    assert_eq!(cut.as_str(), "héllo w");
}

#[test]
fn list_over_its_bound_is_rejected() {
    let grants: Vec<(i32, p::AccessFlags)> = (0..=p::MAX_ACCESS as i32)
        .map(|device| (device, p::AccessFlags::ProtRead))
        .collect();
    let over: Result<p::BoundedVec<p::AccessDescriptor, { p::MAX_ACCESS }>, _> = grants
        .iter()
        .map(|&(ordinal, flags)| p::AccessDescriptor {
            location: examples::device(ordinal),
            flags,
        })
        .collect::<Vec<_>>()
        .try_into();
    assert_eq!(
        over.map(|list| list.len()),
        Err(p::BoundError {
            what: "list",
            bound: p::MAX_ACCESS,
            found: p::MAX_ACCESS + 1
        })
    );
    let mut list = p::BoundedVec::<u8, 2>::new();
    assert!(list.push(1).is_ok() && list.push(2).is_ok());
    assert!(list.push(3).is_err());
}

#[test]
fn declared_array_length_over_the_bound_is_rejected_before_elements() {
    // An inspection whose records array declares MAX_RECORDS + 1 elements and holds none.
    let mut bytes = inspection_until_records().0;
    bytes.push(0xdd);
    bytes.extend_from_slice(&((p::MAX_RECORDS + 1) as u32).to_be_bytes());
    check_malformed::<p::Reply>(
        &Mp(bytes).wrap(),
        "list holds 16385, more than its bound of 16384",
    );
}

#[test]
fn state_file_with_duplicate_participant_is_rejected() {
    let bytes = Mp::default()
        .map(1)
        .str("participants")
        .map(2)
        .uint(7)
        .array(0)
        .uint(7)
        .array(0)
        .wrap();
    check_malformed::<p::StateFile>(&bytes, "duplicate map key NamespacePid(7)");
}

#[test]
fn nesting_over_the_depth_limit_is_rejected() {
    // The deepest message decodes at MAX_DEPTH; below its own depth it fails as too deep.
    let state = examples::state_file();
    let bytes = p::encode(&state).expect("encodes");
    let limits = |max_depth| DecodeLimits {
        max_bytes: p::MAX_MESSAGE_BYTES,
        max_depth,
    };
    assert_eq!(
        decode_with_limits::<p::StateFile>(&bytes, limits(p::MAX_DEPTH)),
        Ok(state.clone())
    );
    let depth = <p::StateFile as p::Message>::DEPTH;
    assert_eq!(
        decode_with_limits::<p::StateFile>(&bytes, limits(depth)),
        Ok(state),
        "the computed depth is enough"
    );
    assert_eq!(
        decode_with_limits::<p::StateFile>(&bytes, limits(depth - 1)),
        Err(DecodeError::TooDeep {
            message: "StateFile",
            limit: depth - 1
        })
    );
}

#[test]
fn oversized_encoding_fails() {
    let reply = examples::replies()[0].1.clone();
    let size = p::encode(&reply).expect("encodes").len();
    assert!(matches!(
        p::envelope::encode_with_limit(&reply, size - 1),
        Err(p::EncodeError::Oversized {
            message: "Reply",
            ..
        })
    ));
    assert!(p::envelope::encode_with_limit(&reply, size).is_ok());
}

mod layouts {
    use super::*;

    fn vsh() -> [u8; 24] {
        examples::virtual_shareable_handle().encode()
    }

    fn ipc() -> [u8; 64] {
        examples::ipc_mem_handle().encode()
    }

    #[test]
    fn wrong_length() {
        let bytes = vsh();
        for length in [0, 23] {
            assert_eq!(
                p::VirtualShareableHandle::decode(&bytes[..length]),
                Err(p::LayoutError::Length {
                    layout: "VirtualShareableHandle",
                    expected: 24,
                    found: length
                })
            );
        }
        let mut long = bytes.to_vec();
        long.push(0);
        assert!(matches!(
            p::VirtualShareableHandle::decode(&long),
            Err(p::LayoutError::Length { found: 25, .. })
        ));
    }

    #[test]
    fn wrong_magic() {
        let mut bytes = vsh();
        bytes[0] = b'X';
        assert!(matches!(
            p::VirtualShareableHandle::decode(&bytes),
            Err(p::LayoutError::Magic { .. })
        ));
        let mut bytes = ipc();
        bytes[3] = b'x';
        assert!(matches!(
            p::IpcMemHandle::decode(&bytes),
            Err(p::LayoutError::Magic { .. })
        ));
    }

    #[test]
    fn wrong_version() {
        for version in [p::VERSION - 1, p::VERSION + 1] {
            let mut bytes = vsh();
            bytes[3] = version;
            assert_eq!(
                p::VirtualShareableHandle::decode(&bytes),
                Err(p::LayoutError::Version {
                    layout: "VirtualShareableHandle",
                    found: version,
                    expected: p::VERSION
                })
            );
            let mut bytes = ipc();
            bytes[7] = p::layout::version_digit(version);
            assert!(matches!(
                p::IpcMemHandle::decode(&bytes),
                Err(p::LayoutError::Version { found, .. }) if found == version
            ));
        }
    }

    #[test]
    fn non_zero_reserved_byte() {
        let mut bytes = ipc();
        bytes[40] = 1;
        assert_eq!(
            p::IpcMemHandle::decode(&bytes),
            Err(p::LayoutError::Reserved {
                layout: "IpcMemHandle",
                field: "reserved",
                offset: 40
            })
        );
    }

    #[test]
    fn zero_fields() {
        for (range, zeroed) in [(4..8, "creator_pid"), (8..24, "allocation")] {
            let mut bytes = vsh();
            bytes[range].fill(0);
            assert!(
                matches!(
                    p::VirtualShareableHandle::decode(&bytes),
                    Err(p::LayoutError::Field { field, .. }) if field == zeroed
                ),
                "{zeroed} zeroed"
            );
        }
        let mut bytes = ipc();
        bytes[48..56].fill(0);
        assert!(matches!(
            p::IpcMemHandle::decode(&bytes),
            Err(p::LayoutError::Field {
                field: "requested_size",
                ..
            })
        ));
    }

    #[test]
    fn layout_inside_a_ticket_is_validated() {
        let mut bytes = p::encode(&examples::ticket()).expect("encodes");
        let at = bytes
            .windows(3)
            .position(|window| window == b"CUI")
            .expect("handle bytes inside");
        bytes[at + 3] = p::VERSION + 1;
        check_malformed::<p::Ticket>(
            &bytes,
            "VirtualShareableHandle: unsupported protocol version",
        );
    }
}
