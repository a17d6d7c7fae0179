//! Human-readable and JSON views of records: hex ids, enum names, one line per record.
//!
//! The wire encoding carries CUDA enums as integers; everything a person reads (error messages,
//! `inspect`, `state show`) goes through these functions instead, so the names are the same
//! everywhere.

use std::fmt::Write as _;

use cuinterpose_protocol::{
    AccessDescriptor, AccessFlags, AllocationProperties, AllocationReference, AllocationType,
    BindingSource, Device, DeviceUuid, HandleTypes, InspectionReply, Location, LocationType,
    MemberRange, MulticastProperties, NamespacePid, Record, StateFile,
};
use serde_json::{Map, Value, json};

/// `<hex id> (creator <pid>)`.
pub fn reference(reference: &AllocationReference) -> String {
    format!("{} (creator {})", reference.id, reference.creator_pid)
}

pub fn allocation_type_name(value: AllocationType) -> &'static str {
    match value {
        AllocationType::Pinned => "pinned",
    }
}

pub fn location_type_name(value: LocationType) -> &'static str {
    match value {
        LocationType::Device => "device",
        LocationType::Host => "host",
        LocationType::HostNuma => "host_numa",
        LocationType::HostNumaCurrent => "host_numa_current",
    }
}

pub fn access_flags_name(value: AccessFlags) -> &'static str {
    match value {
        AccessFlags::ProtNone => "none",
        AccessFlags::ProtRead => "read",
        AccessFlags::ProtReadWrite => "read_write",
    }
}

/// The names of the bits set, e.g. `["posix_file_descriptor"]`; an empty set is `["none"]`.
pub fn handle_type_names(value: HandleTypes) -> Vec<&'static str> {
    const BITS: [(HandleTypes, &str); 4] = [
        (HandleTypes::POSIX_FILE_DESCRIPTOR, "posix_file_descriptor"),
        (HandleTypes::WIN32, "win32"),
        (HandleTypes::WIN32_KMT, "win32_kmt"),
        (HandleTypes::FABRIC, "fabric"),
    ];
    if value == HandleTypes::NONE {
        return vec!["none"];
    }
    BITS.iter()
        .filter(|(bit, _)| value.contains(*bit))
        .map(|(_, name)| *name)
        .collect()
}

/// `0 (GPU-…)`: an ordinal with the UUID a record carries beside it (`0` alone without one).
pub fn ordinal(ordinal: i32, uuid: Option<&DeviceUuid>) -> String {
    match uuid {
        Some(uuid) => format!("{ordinal} ({})", crate::remap::uuid_text(uuid)),
        None => ordinal.to_string(),
    }
}

/// `device 0 (GPU-…)`, `host`, `host_numa 1`.
pub fn location(location: &Location) -> String {
    match location.location_type {
        LocationType::Host | LocationType::HostNumaCurrent => {
            location_type_name(location.location_type).to_string()
        }
        LocationType::Device => format!("device {}", ordinal(location.id, location.uuid.as_ref())),
        LocationType::HostNuma => {
            format!(
                "{} {}",
                location_type_name(location.location_type),
                location.id
            )
        }
    }
}

/// `pinned on device 0, handle types posix_file_descriptor`.
pub fn allocation_properties(properties: &AllocationProperties) -> String {
    format!(
        "{} on {}, handle types {}",
        allocation_type_name(properties.allocation_type),
        location(&properties.location),
        handle_type_names(properties.handle_types).join("|")
    )
}

/// `3 devices, size 0x200000, handle types posix_file_descriptor, flags 0x0`.
pub fn multicast_properties(properties: &MulticastProperties) -> String {
    format!(
        "{} devices, size {:#x}, handle types {}, flags {:#x}",
        properties.device_count,
        properties.size,
        handle_type_names(properties.handle_types).join("|"),
        properties.flags
    )
}

pub fn access(list: &[AccessDescriptor]) -> String {
    if list.is_empty() {
        return "no access".to_string();
    }
    list.iter()
        .map(|descriptor| {
            format!(
                "{}={}",
                location(&descriptor.location),
                access_flags_name(descriptor.flags)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn member(member: &MemberRange) -> String {
    format!(
        "allocation {} at offset {:#x}",
        reference(&member.allocation),
        member.offset
    )
}

/// Where a mapping lies and who may reach it, alike for both kinds of mapping:
/// `at 0x…: size 0x…, offset 0x…[, flags 0x…], access [...]`.
fn span(
    address: u64,
    size: u64,
    offset: u64,
    flags: Option<u64>,
    list: &[AccessDescriptor],
) -> String {
    let flags = flags.map_or(String::new(), |flags| format!(", flags {flags:#x}"));
    format!(
        "at {address:#x}: size {size:#x}, offset {offset:#x}{flags}, access [{}]",
        access(list)
    )
}

/// One line describing a record, naming its allocation or multicast object by hex id.
pub fn record(record: &Record) -> String {
    match record {
        Record::Allocation(r) => format!(
            "allocation {}: size {:#x}, {}, host carrier {}, {} handles",
            reference(&r.allocation),
            r.size,
            allocation_properties(&r.properties),
            if r.host_carrier { "yes" } else { "no" },
            r.handle_count
        ),
        Record::Mapping(r) => format!(
            "mapping of allocation {} {}",
            reference(&r.allocation),
            span(r.address, r.size, r.offset, None, &r.access)
        ),
        Record::Multicast(r) => format!(
            "multicast object {}: {}, {} handles",
            reference(&r.object),
            multicast_properties(&r.properties),
            r.handle_count
        ),
        Record::MulticastDevice(r) => format!(
            "multicast device {} of object {}",
            ordinal(r.device, r.uuid.as_ref()),
            reference(&r.object)
        ),
        Record::MulticastBinding(r) => {
            let source = match &r.source {
                BindingSource::Memory(source) => format!("memory: {}", member(&source.member)),
                BindingSource::Address(source) => match &source.member {
                    Some(tracked) => {
                        format!("address {:#x} ({})", source.address, member(tracked))
                    }
                    None => format!("address {:#x} (untracked)", source.address),
                },
            };
            format!(
                "multicast binding of object {} on device {}: {}, multicast offset {:#x}, size {:#x}, flags {:#x}, {}",
                reference(&r.object),
                ordinal(r.device, r.device_uuid.as_ref()),
                source,
                r.multicast_offset,
                r.size,
                r.flags,
                r.version
            )
        }
        Record::MulticastMapping(r) => format!(
            "multicast mapping of object {} {}",
            reference(&r.object),
            span(r.address, r.size, r.offset, Some(r.flags), &r.access)
        ),
        Record::Pool(r) => format!(
            "memory pool {} on device {}: max size {:#x}, release threshold {:#x}, access [{}]",
            reference(&r.pool),
            ordinal(r.device, r.device_uuid.as_ref()),
            r.max_size,
            r.release_threshold,
            access(&r.access)
        ),
        Record::PoolMember(r) => format!(
            "allocation {} of memory pool {}: {} bytes requested",
            reference(&r.allocation),
            reference(&r.pool),
            r.requested_size
        ),
    }
}

/// Text block for one participant's inspection.
pub fn inspection_text(pid: NamespacePid, inspection: &InspectionReply) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "participant {pid}: phase {}, {} raw imports, {} records",
        inspection.phase,
        inspection.raw_imports,
        inspection.records.len()
    );
    for device in inspection.devices.iter() {
        let _ = writeln!(out, "  {}", self::device(device));
    }
    for record in inspection.records.iter() {
        let _ = writeln!(out, "  {}", self::record(record));
    }
    out
}

/// `device 0: GPU-… (NVIDIA H200, 80.0 GiB)`.
pub fn device(device: &Device) -> String {
    format!(
        "device {}: {} ({}, {:.1} GiB)",
        device.ordinal,
        crate::remap::uuid_text(&device.uuid),
        device.name,
        device.memory as f64 / f64::from(1u32 << 30)
    )
}

pub fn device_json(device: &Device) -> Value {
    json!({
        "ordinal": device.ordinal,
        "uuid": crate::remap::uuid_text(&device.uuid),
        "name": device.name.as_str(),
        "memory": device.memory,
    })
}

fn reference_json(reference: &AllocationReference) -> Value {
    json!({"id": reference.id.to_string(), "creator_pid": reference.creator_pid.get()})
}

fn location_json(location: &Location) -> Value {
    json!({
        "type": location_type_name(location.location_type),
        "id": location.id,
        "uuid": uuid_json(location.uuid.as_ref()),
    })
}

/// A UUID beside an ordinal: `GPU-…`, or null where the record carries none.
fn uuid_json(uuid: Option<&DeviceUuid>) -> Value {
    uuid.map_or(Value::Null, |uuid| {
        Value::from(crate::remap::uuid_text(uuid))
    })
}

fn access_json(list: &[AccessDescriptor]) -> Value {
    Value::Array(
        list.iter()
            .map(|descriptor| {
                json!({
                    "location": location_json(&descriptor.location),
                    "flags": access_flags_name(descriptor.flags),
                })
            })
            .collect(),
    )
}

fn member_json(member: &MemberRange) -> Value {
    json!({"allocation": reference_json(&member.allocation), "offset": member.offset})
}

/// Addresses read as `inspect` prints them: hex.
fn hex(address: u64) -> String {
    format!("{address:#x}")
}

/// A record as JSON with hex ids and addresses and enum names (not the wire's integers), for
/// `inspect --json` and `state show`.
pub fn record_json(record: &Record) -> Value {
    let mut object = Map::new();
    object.insert("kind".into(), Value::from(record.kind()));
    let fields = match record {
        Record::Allocation(r) => json!({
            "allocation": reference_json(&r.allocation),
            "size": r.size,
            "properties": {
                "allocation_type": allocation_type_name(r.properties.allocation_type),
                "location": location_json(&r.properties.location),
                "handle_types": handle_type_names(r.properties.handle_types),
            },
            "host_carrier": r.host_carrier,
            "handle_count": r.handle_count,
        }),
        Record::Mapping(r) => json!({
            "allocation": reference_json(&r.allocation),
            "address": hex(r.address),
            "size": r.size,
            "offset": r.offset,
            "access": access_json(&r.access),
        }),
        Record::Multicast(r) => json!({
            "object": reference_json(&r.object),
            "properties": {
                "device_count": r.properties.device_count,
                "size": r.properties.size,
                "handle_types": handle_type_names(r.properties.handle_types),
                "flags": r.properties.flags,
            },
            "handle_count": r.handle_count,
        }),
        Record::MulticastDevice(r) => json!({
            "object": reference_json(&r.object),
            "device": r.device,
            "uuid": uuid_json(r.uuid.as_ref()),
        }),
        Record::MulticastBinding(r) => {
            let source = match &r.source {
                BindingSource::Memory(source) => json!({
                    "kind": "memory",
                    "member": member_json(&source.member),
                }),
                BindingSource::Address(source) => json!({
                    "kind": "address",
                    "address": hex(source.address),
                    "member": source.member.as_ref().map(member_json),
                }),
            };
            json!({
                "object": reference_json(&r.object),
                "source": source,
                "multicast_offset": r.multicast_offset,
                "size": r.size,
                "flags": r.flags,
                "version": r.version.wire_name(),
                "device": r.device,
                "device_uuid": uuid_json(r.device_uuid.as_ref()),
            })
        }
        Record::MulticastMapping(r) => json!({
            "object": reference_json(&r.object),
            "address": hex(r.address),
            "size": r.size,
            "offset": r.offset,
            "flags": r.flags,
            "access": access_json(&r.access),
        }),
        Record::Pool(r) => json!({
            "pool": reference_json(&r.pool),
            "device": r.device,
            "device_uuid": uuid_json(r.device_uuid.as_ref()),
            "max_size": r.max_size,
            "release_threshold": r.release_threshold,
            "access": access_json(&r.access),
        }),
        Record::PoolMember(r) => json!({
            "pool": reference_json(&r.pool),
            "allocation": reference_json(&r.allocation),
            "requested_size": r.requested_size,
        }),
    };
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    Value::Object(object)
}

/// The state file as JSON: participants keyed by namespace PID (as strings, JSON keys are).
pub fn state_json(state: &StateFile) -> Value {
    let participants: Map<String, Value> = state
        .participants
        .iter()
        .map(|(pid, records)| {
            (
                pid.to_string(),
                Value::Array(records.iter().map(record_json).collect()),
            )
        })
        .collect();
    let devices = |list: &[Device]| Value::Array(list.iter().map(device_json).collect());
    let seen: Map<String, Value> = state
        .devices
        .participants
        .iter()
        .map(|(pid, list)| (pid.to_string(), devices(list)))
        .collect();
    let checksums: Map<String, Value> = state
        .checksums
        .iter()
        .map(|(pid, list)| {
            let list = list.iter().map(|c| {
                json!({
                    "allocation": c.allocation.to_string(),
                    "size": c.size,
                    "chunk_bytes": c.chunk_bytes,
                    "xxh3_64": c.chunks.iter().map(|h| format!("{h:016x}")).collect::<Vec<_>>(),
                })
            });
            (pid.to_string(), Value::Array(list.collect()))
        })
        .collect();
    json!({
        "participants": participants,
        "devices": { "machine": devices(&state.devices.machine), "participants": seen },
        "checksums": checksums,
        "carrier": cuinterpose_protocol::wire::wire_name(state.carrier),
    })
}

/// A small YAML emitter for JSON values (block style, strings quoted when needed).
pub fn yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => yaml_map(map, 0, &mut out),
        Value::Array(list) if !list.is_empty() => yaml_list(list, 0, &mut out),
        scalar => {
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
    out
}

fn indent(level: usize, out: &mut String) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn yaml_map(map: &Map<String, Value>, level: usize, out: &mut String) {
    for (key, value) in map {
        indent(level, out);
        out.push_str(&yaml_string(key));
        out.push(':');
        yaml_child(value, level, out);
    }
}

fn yaml_list(list: &[Value], level: usize, out: &mut String) {
    for value in list {
        indent(level, out);
        out.push('-');
        match value {
            // A map item starts on the dash's line: "- key: value", the rest aligned under it.
            Value::Object(map) if !map.is_empty() => {
                let mut item = String::new();
                yaml_map(map, level + 1, &mut item);
                out.push(' ');
                out.push_str(item.trim_start());
            }
            _ => yaml_child(value, level, out),
        }
    }
}

/// The value after `key:` or `-`: a scalar on the same line, a collection on the next lines.
fn yaml_child(value: &Value, level: usize, out: &mut String) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            yaml_map(map, level + 1, out);
        }
        Value::Array(list) if !list.is_empty() => {
            out.push('\n');
            yaml_list(list, level + 1, out);
        }
        scalar => {
            out.push(' ');
            out.push_str(&yaml_scalar(scalar));
            out.push('\n');
        }
    }
}

fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        Value::String(text) => yaml_string(text),
        Value::Array(_) => "[]".to_string(),
        Value::Object(_) => "{}".to_string(),
    }
}

/// Plain when unambiguous (starts with a letter or `_`, then letters, digits, `_`, `-`, `.`, and
/// is not a YAML keyword), else a JSON string, which is valid YAML. A leading digit is always
/// quoted: hex ids such as `12e4...` would otherwise read as numbers.
fn yaml_string(text: &str) -> String {
    let plain = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n" | "~"
        );
    if plain {
        text.to_string()
    } else {
        Value::String(text.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_of_nested_values() {
        let value = json!({
            "participants": {
                "12": [
                    {"kind": "allocation", "id": "00ff", "size": 4096, "names": ["a", "b"]},
                    {"kind": "mapping", "empty": [], "nested": {"x": null}},
                ],
            },
            "flag": true,
            "text": "two words",
        });
        // serde_json's map (no preserve_order feature) keeps keys sorted.
        let expected = "\
flag: true
participants:
  \"12\":
    - id: \"00ff\"
      kind: allocation
      names:
        - a
        - b
      size: 4096
    - empty: []
      kind: mapping
      nested:
        x: null
text: \"two words\"
";
        assert_eq!(yaml(&value), expected);
    }

    #[test]
    fn yaml_quotes_ambiguous_strings() {
        for (text, expected) in [
            ("plain", "plain"),
            ("yes", "\"yes\""),
            ("123", "\"123\""),
            ("1e5", "\"1e5\""),
            ("Null", "\"Null\""),
            ("", "\"\""),
            ("a: b", "\"a: b\""),
            ("-x", "\"-x\""),
        ] {
            assert_eq!(yaml_string(text), expected, "{text:?}");
        }
    }

    #[test]
    fn handle_type_names_cover_bits() {
        assert_eq!(handle_type_names(HandleTypes::NONE), ["none"]);
        assert_eq!(
            handle_type_names(HandleTypes::POSIX_FILE_DESCRIPTOR.union(HandleTypes::FABRIC)),
            ["posix_file_descriptor", "fabric"]
        );
    }
}
