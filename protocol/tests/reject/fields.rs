//! Strict maps, unions, enums and identities.

use super::*;

/// A case of [`strict_request_maps`]: its name, the map's entries, what the refusal says.
type MapCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Requests of string keys and values, each with what the refusal says.
#[test]
fn strict_request_maps() {
    let cases: [MapCase; 6] = [
        (
            "union kind must come first",
            &[("operation", "save_allocations"), ("kind", "execute")],
            "unknown field `operation`, expected `kind`",
        ),
        (
            "unknown union kind",
            &[("kind", "shutdown")],
            "Request: unknown name `shutdown`",
        ),
        ("missing kind", &[], "missing field `kind`"),
        (
            "duplicate field",
            &[
                ("kind", "execute"),
                ("operation", "save_allocations"),
                ("operation", "load_allocations"),
            ],
            "duplicate field `operation`",
        ),
        (
            "missing field",
            &[("kind", "execute")],
            "missing field `operation`",
        ),
        (
            "unknown operation name",
            &[("kind", "execute"), ("operation", "format_disk")],
            "Operation: unknown name `format_disk`",
        ),
    ];
    for (case, entries, needle) in cases {
        check_malformed_case::<p::Request>(&format!("{case}: "), &str_map(entries), needle);
    }
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
    for (allocation, capability, needle) in [
        (reference(), [0; 16], "CapabilityToken must not be zero"),
        (
            reference_with(&[0x11; 16], 0),
            [1; 16],
            "NamespacePid must not be zero",
        ),
        (
            reference_with(&[0; 16], 1),
            [1; 16],
            "AllocationId must not be zero",
        ),
    ] {
        check_malformed::<p::Request>(&export_with(allocation, &capability), needle);
    }
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
/// flags `flags`, and no UUID.
fn mapping_with(location_type: u64, flags: u64) -> Vec<u8> {
    mapping_with_uuid(location_type, flags, |mp| mp.str("uuid").nil())
}

/// [`mapping_with`], the location's fields after its id written by `uuid`.
fn mapping_with_uuid(location_type: u64, flags: u64, uuid: impl Fn(Mp) -> Mp) -> Vec<u8> {
    let location = inspection_until_records()
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
        .str("location");
    let fields = if uuid(Mp::default()).0.is_empty() {
        2
    } else {
        3
    };
    uuid(
        location
            .map(fields)
            .str("location_type")
            .uint(location_type)
            .str("id")
            .uint(0),
    )
    .str("flags")
    .uint(flags)
    .str("devices")
    .array(0)
    .wrap()
}

#[test]
fn a_device_uuid_beside_an_ordinal() {
    let named = mapping_with_uuid(1, 3, |mp| mp.str("uuid").bin(&[0x5a; 16]));
    let Ok(p::Reply::Inspection(inspection)) = p::decode::<p::Reply>(&named) else {
        panic!("a location with a UUID decodes");
    };
    assert_eq!(
        inspection.records[0].devices(),
        [(0, p::DeviceUuid::new([0x5a; 16]))]
    );
    check_malformed::<p::Reply>(
        &mapping_with_uuid(1, 3, |mp| mp.str("uuid").bin(&[0; 16])),
        "DeviceUuid must not be zero",
    );
    check_malformed::<p::Reply>(
        &mapping_with_uuid(1, 3, |mp| mp.str("uuid").bin(&[1; 15])),
        "invalid length 15",
    );
    // Version 8 requires the key, nil or not.
    check_malformed::<p::Reply>(&mapping_with_uuid(1, 3, |mp| mp), "uuid");
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
