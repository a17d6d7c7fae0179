//! Every rejection of the decoders: envelope, strict maps, unions, enums, identities, bounds
//! and layouts. Bad bytes are written by hand with a tiny MessagePack builder.

mod examples;

use cuinterpose_protocol as p;
use p::envelope::{DecodeError, DecodeLimits, decode_with_limits};

/// Hand-written MessagePack.
#[derive(Default)]
struct Mp(Vec<u8>);

impl Mp {
    fn map(mut self, entries: u8) -> Self {
        assert!(entries < 16);
        self.0.push(0x80 | entries);
        self
    }
    fn array(mut self, len: u8) -> Self {
        assert!(len < 16);
        self.0.push(0x90 | len);
        self
    }
    fn str(mut self, text: &str) -> Self {
        assert!(text.len() < 32);
        self.0.push(0xa0 | text.len() as u8);
        self.0.extend_from_slice(text.as_bytes());
        self
    }
    fn uint(mut self, value: u64) -> Self {
        match value {
            0..=0x7f => self.0.push(value as u8),
            _ => {
                self.0.push(0xcf);
                self.0.extend_from_slice(&value.to_be_bytes());
            }
        }
        self
    }
    fn bin(mut self, bytes: &[u8]) -> Self {
        self.0.push(0xc4);
        self.0.push(bytes.len() as u8);
        self.0.extend_from_slice(bytes);
        self
    }
    fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// Wraps the body built so far in an envelope of `version`.
    fn envelope(self, version: u8) -> Vec<u8> {
        let mut out = vec![0x82, 0xa7];
        out.extend_from_slice(b"version");
        out.push(version);
        out.push(0xa4);
        out.extend_from_slice(b"body");
        out.extend_from_slice(&self.0);
        out
    }
    fn wrap(self) -> Vec<u8> {
        self.envelope(p::VERSION)
    }
}

fn reference() -> Mp {
    Mp::default()
        .map(2)
        .str("id")
        .bin(&[0x11; 16])
        .str("creator_pid")
        .uint(100)
}

/// Decodes `bytes` as `M` and asserts a malformed-body error whose text contains `needle`.
fn check_malformed<M: p::Message + std::fmt::Debug>(bytes: &[u8], needle: &str) {
    match p::decode::<M>(bytes) {
        Err(DecodeError::Malformed { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "`{reason}` should mention `{needle}`"
            )
        }
        other => panic!("expected a malformed-body error mentioning `{needle}`, got {other:?}"),
    }
}

#[test]
fn valid_hand_built_request_decodes() {
    let bytes = Mp::default().map(1).str("kind").str("inspect").wrap();
    assert_eq!(p::decode::<p::Request>(&bytes), Ok(p::Request::Inspect));
}

#[test]
fn older_and_newer_versions_are_rejected() {
    for version in [p::VERSION - 1, p::VERSION + 1] {
        let bytes = Mp::default()
            .map(1)
            .str("kind")
            .str("inspect")
            .envelope(version);
        assert_eq!(
            p::decode::<p::Request>(&bytes),
            Err(DecodeError::Version {
                message: "Request",
                found: version,
                expected: p::VERSION
            })
        );
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut bytes = p::encode(&p::Request::Inspect).expect("encodes");
    bytes.push(0);
    assert_eq!(
        p::decode::<p::Request>(&bytes),
        Err(DecodeError::Trailing {
            message: "Request",
            count: 1
        })
    );
}

#[test]
fn non_envelopes_are_rejected() {
    for bytes in [
        &[][..],
        &[0xc1],
        &[0x81, 0xa4, b'b', b'o', b'd', b'y', 0x80],
    ] {
        assert_eq!(
            p::decode::<p::Request>(bytes),
            Err(DecodeError::NotEnvelope { message: "Request" })
        );
    }
}

#[test]
fn oversized_input_is_rejected_before_parsing() {
    let bytes = vec![0u8; p::MAX_TICKET_BYTES + 1];
    assert_eq!(
        p::decode::<p::Ticket>(&bytes),
        Err(DecodeError::Oversized {
            message: "Ticket",
            size: p::MAX_TICKET_BYTES + 1,
            limit: p::MAX_TICKET_BYTES
        })
    );
}

#[test]
fn truncated_body_is_rejected() {
    let bytes = p::encode(&examples::replies()[0].1).expect("encodes");
    for cut in [16, bytes.len() / 2, bytes.len() - 1] {
        assert!(matches!(
            p::decode::<p::Reply>(&bytes[..cut]),
            Err(DecodeError::Malformed { .. })
        ));
    }
}

#[test]
fn union_kind_must_come_first() {
    let bytes = Mp::default()
        .map(2)
        .str("operation")
        .str("save_allocations")
        .str("kind")
        .str("execute")
        .wrap();
    check_malformed::<p::Request>(&bytes, "unknown field `operation`, expected `kind`");
}

#[test]
fn unknown_union_kind() {
    let bytes = Mp::default().map(1).str("kind").str("shutdown").wrap();
    check_malformed::<p::Request>(&bytes, "Request: unknown name `shutdown`");
}

#[test]
fn missing_kind() {
    let bytes = Mp::default().map(0).wrap();
    check_malformed::<p::Request>(&bytes, "missing field `kind`");
}

#[test]
fn unknown_field() {
    let bytes = Mp::default()
        .map(2)
        .str("kind")
        .str("inspect")
        .str("verbose")
        .uint(1)
        .wrap();
    check_malformed::<p::Request>(&bytes, "unknown field `verbose`");
}

#[test]
fn duplicate_field() {
    let bytes = Mp::default()
        .map(3)
        .str("kind")
        .str("execute")
        .str("operation")
        .str("save_allocations")
        .str("operation")
        .str("load_allocations")
        .wrap();
    check_malformed::<p::Request>(&bytes, "duplicate field `operation`");
}

#[test]
fn missing_field() {
    let bytes = Mp::default().map(1).str("kind").str("execute").wrap();
    check_malformed::<p::Request>(&bytes, "missing field `operation`");
}

#[test]
fn unknown_operation_name() {
    let bytes = Mp::default()
        .map(2)
        .str("kind")
        .str("execute")
        .str("operation")
        .str("format_disk")
        .wrap();
    check_malformed::<p::Request>(&bytes, "Operation: unknown name `format_disk`");
}

#[test]
fn struct_as_array_is_rejected() {
    let bytes = Mp::default()
        .map(4)
        .str("kind")
        .str("export")
        .str("allocation")
        .array(2)
        .bin(&[0x11; 16])
        .uint(100)
        .str("resource")
        .str("unicast")
        .str("capability")
        .bin(&[1; 16])
        .wrap();
    check_malformed::<p::Request>(&bytes, "invalid type");
}

fn export_with(allocation: Mp, capability: &[u8]) -> Vec<u8> {
    Mp::default()
        .map(4)
        .str("kind")
        .str("export")
        .str("allocation")
        .raw(&allocation.0)
        .str("resource")
        .str("unicast")
        .str("capability")
        .bin(capability)
        .wrap()
}

#[test]
fn zero_identities_are_rejected() {
    check_malformed::<p::Request>(
        &export_with(reference(), &[0; 16]),
        "CapabilityToken must not be zero",
    );
    let zero_pid = Mp::default()
        .map(2)
        .str("id")
        .bin(&[0x11; 16])
        .str("creator_pid")
        .uint(0);
    check_malformed::<p::Request>(
        &export_with(zero_pid, &[1; 16]),
        "NamespacePid must not be zero",
    );
    let zero_id = Mp::default()
        .map(2)
        .str("id")
        .bin(&[0; 16])
        .str("creator_pid")
        .uint(1);
    check_malformed::<p::Request>(
        &export_with(zero_id, &[1; 16]),
        "AllocationId must not be zero",
    );
}

#[test]
fn identity_of_the_wrong_length_is_rejected() {
    check_malformed::<p::Request>(&export_with(reference(), &[1; 15]), "invalid length 15");
    // An identity as an array of integers instead of `bin` is refused as well.
    let array_id = Mp::default()
        .map(2)
        .str("id")
        .array(1)
        .uint(1)
        .str("creator_pid")
        .uint(1);
    check_malformed::<p::Request>(&export_with(array_id, &[1; 16]), "invalid type");
}

/// A mapping record whose single access descriptor has location type `location_type` and
/// flags `flags`.
fn mapping_with(location_type: u64, flags: u64) -> Vec<u8> {
    Mp::default()
        .map(6)
        .str("kind")
        .str("inspection")
        .str("namespace_pid")
        .uint(1)
        .str("phase")
        .str("active")
        .str("raw_imports")
        .uint(0)
        .str("records")
        .array(1)
        .map(6)
        .str("kind")
        .str("mapping")
        .str("allocation")
        .raw(&reference().0)
        .str("address")
        .uint(4096)
        .str("size")
        .uint(4096)
        .str("offset")
        .uint(0)
        .str("access")
        .array(1)
        .map(2)
        .str("location")
        .map(2)
        .str("location_type")
        .uint(location_type)
        .str("id")
        .uint(0)
        .str("flags")
        .uint(flags)
        .str("devices")
        .array(0)
        .wrap()
}

#[test]
fn cuda_enum_values() {
    assert!(p::decode::<p::Reply>(&mapping_with(1, 3)).is_ok());
    check_malformed::<p::Reply>(&mapping_with(9, 3), "LocationType: unknown value 9");
    check_malformed::<p::Reply>(
        &mapping_with(0, 3),
        "LocationType: value 0 is rejected (CU_MEM_LOCATION_TYPE_INVALID)",
    );
    check_malformed::<p::Reply>(
        &mapping_with(0x7fff_ffff, 3),
        "LocationType: value 2147483647 is rejected (CU_MEM_LOCATION_TYPE_MAX)",
    );
    check_malformed::<p::Reply>(&mapping_with(1, 2), "AccessFlags: unknown value 2");
    check_malformed::<p::Reply>(&mapping_with(1, 1 << 40), "invalid value");
}

#[test]
fn enum_decoders_directly() {
    assert_eq!(
        p::AllocationType::try_from(1),
        Ok(p::AllocationType::Pinned)
    );
    assert!(matches!(
        p::AllocationType::try_from(2),
        Err(p::EnumError::Rejected {
            cuda: "CU_MEM_ALLOCATION_TYPE_MANAGED",
            ..
        })
    ));
    assert_eq!(
        p::HandleTypes::try_from(9).map(u32::from),
        Ok(9),
        "POSIX | FABRIC is a valid set"
    );
    assert_eq!(
        p::HandleTypes::try_from(0x30),
        Err(p::EnumError::UnknownBits {
            domain: "HandleTypes",
            value: 0x30,
            unknown: 0x30
        })
    );
    assert!(matches!(
        p::HandleTypes::try_from(0x7fff_ffff),
        Err(p::EnumError::Rejected {
            cuda: "CU_MEM_HANDLE_TYPE_MAX",
            ..
        })
    ));
    assert_eq!(
        format!(
            "{:?}",
            p::HandleTypes::POSIX_FILE_DESCRIPTOR.union(p::HandleTypes::FABRIC)
        ),
        "HandleTypes(POSIX_FILE_DESCRIPTOR | FABRIC)"
    );
    assert_eq!(
        "save_allocations".parse(),
        Ok(p::Operation::SaveAllocations)
    );
    assert!("SaveAllocations".parse::<p::Operation>().is_err());
    assert_eq!(
        p::MulticastGranularity::try_from(1),
        Ok(p::MulticastGranularity::Recommended)
    );
    assert!(p::AllocationGranularity::try_from(2).is_err());
}

#[test]
fn identity_text_forms() {
    assert_eq!("42".parse::<p::NamespacePid>().map(|pid| pid.get()), Ok(42));
    for bad in ["0", "-1", "+1", "042", "", "4294967296", " 1"] {
        assert!(
            bad.parse::<p::NamespacePid>().is_err(),
            "`{bad}` must be refused"
        );
    }
    let id: p::AllocationId = "00112233445566778899aabbccddeeff".parse().expect("hex");
    assert_eq!(id.to_string(), "00112233445566778899aabbccddeeff");
    for bad in [
        "00112233445566778899AABBCCDDEEFF",
        "0011",
        "00000000000000000000000000000000",
        "zz112233445566778899aabbccddeeff",
    ] {
        assert!(
            bad.parse::<p::AllocationId>().is_err(),
            "`{bad}` must be refused"
        );
    }
}

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
    let mut bytes = Mp::default()
        .map(6)
        .str("kind")
        .str("inspection")
        .str("namespace_pid")
        .uint(1)
        .str("phase")
        .str("active")
        .str("raw_imports")
        .uint(0)
        .str("records")
        .0;
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
            bytes[7] = b'0' + version;
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
        let mut bytes = vsh();
        bytes[4..8].fill(0);
        assert!(matches!(
            p::VirtualShareableHandle::decode(&bytes),
            Err(p::LayoutError::Field {
                field: "creator_pid",
                ..
            })
        ));
        let mut bytes = vsh();
        bytes[8..24].fill(0);
        assert!(matches!(
            p::VirtualShareableHandle::decode(&bytes),
            Err(p::LayoutError::Field {
                field: "allocation",
                ..
            })
        ));
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
