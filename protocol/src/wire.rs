//! Serde plumbing shared by every generated type.
//!
//! Structs travel as maps keyed by field name; unions as maps whose first key is `kind`.
//! Decoding is strict: unknown, duplicate and missing keys are errors, and a union's variant
//! is chosen from its first key before any field is read, so bounded fields are checked as
//! they stream in instead of after buffering the whole map.

use core::fmt;
use core::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};

use crate::error::{EnumError, IdentityError};
use crate::layout::FixedLayout;

/// A generated struct (or union variant payload): its fields, serialized in order.
pub trait WireStruct: Sized {
    const NAME: &'static str;
    const FIELDS: &'static [&'static str];
    fn serialize_fields<M: SerializeStruct>(&self, out: &mut M) -> Result<(), M::Error>;
    fn deserialize_fields<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Self, A::Error>;
}

/// A generated union: the `kind` names select a variant.
pub trait WireUnion: Sized {
    const NAME: &'static str;
    const KINDS: &'static [&'static str];
    fn deserialize_variant<'de, A: MapAccess<'de>>(
        index: usize,
        map: &mut A,
    ) -> Result<Self, A::Error>;
}

/// A generated enum that travels by snake_case name.
pub trait WireName: Copy + PartialEq + 'static {
    const NAME: &'static str;
    const ALL: &'static [Self];
    const WIRE_NAMES: &'static [&'static str];
}

const TAG: &str = "kind";

pub fn serialize_struct<T: WireStruct, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut out = serializer.serialize_struct(T::NAME, T::FIELDS.len())?;
    value.serialize_fields(&mut out)?;
    out.end()
}

pub fn deserialize_struct<'de, T: WireStruct, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct StructVisitor<T>(PhantomData<T>);
    impl<'de, T: WireStruct> Visitor<'de> for StructVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a {} map", T::NAME)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            T::deserialize_fields(&mut map)
        }
    }
    deserializer.deserialize_struct(T::NAME, T::FIELDS, StructVisitor(PhantomData))
}

pub fn serialize_variant<T: WireStruct, S: Serializer>(
    serializer: S,
    union: &'static str,
    kind: &'static str,
    fields: &T,
) -> Result<S::Ok, S::Error> {
    let mut out = serializer.serialize_struct(union, 1 + T::FIELDS.len())?;
    out.serialize_field(TAG, kind)?;
    fields.serialize_fields(&mut out)?;
    out.end()
}

pub fn serialize_unit_variant<S: Serializer>(
    serializer: S,
    union: &'static str,
    kind: &'static str,
) -> Result<S::Ok, S::Error> {
    let mut out = serializer.serialize_struct(union, 1)?;
    out.serialize_field(TAG, kind)?;
    out.end()
}

pub fn deserialize_union<'de, T: WireUnion, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct UnionVisitor<T>(PhantomData<T>);
    impl<'de, T: WireUnion> Visitor<'de> for UnionVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a {} map whose first key is `kind`", T::NAME)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
            match map.next_key_seed(FieldSeed(&[TAG]))? {
                Some(_) => {}
                None => return Err(de::Error::missing_field(TAG)),
            }
            let index = map.next_value_seed(NameSeed {
                domain: T::NAME,
                names: T::KINDS,
            })?;
            T::deserialize_variant(index, &mut map)
        }
    }
    deserializer.deserialize_struct(T::NAME, &[TAG], UnionVisitor(PhantomData))
}

/// Reads a map key and returns its index in a field list; anything else is an error.
#[derive(Debug, Clone, Copy)]
pub struct FieldSeed(pub &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "one of the field names {:?}", self.0)
    }
    fn visit_str<E: de::Error>(self, name: &str) -> Result<usize, E> {
        self.0
            .iter()
            .position(|field| *field == name)
            .ok_or_else(|| de::Error::unknown_field(name, self.0))
    }
    fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<usize, E> {
        match core::str::from_utf8(name) {
            Ok(name) => self.visit_str(name),
            Err(_) => Err(de::Error::invalid_value(de::Unexpected::Bytes(name), &self)),
        }
    }
}

/// Reads a snake_case name and returns its index.
struct NameSeed {
    domain: &'static str,
    names: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} name, one of {:?}", self.domain, self.names)
    }
    fn visit_str<E: de::Error>(self, name: &str) -> Result<usize, E> {
        self.names
            .iter()
            .position(|known| *known == name)
            .ok_or_else(|| {
                E::custom(EnumError::UnknownName {
                    domain: self.domain,
                    name: name.chars().take(64).collect(),
                    expected: self.names.join(", "),
                })
            })
    }
    fn visit_bytes<E: de::Error>(self, name: &[u8]) -> Result<usize, E> {
        match core::str::from_utf8(name) {
            Ok(name) => self.visit_str(name),
            Err(_) => Err(de::Error::invalid_value(de::Unexpected::Bytes(name), &self)),
        }
    }
}

/// Stores a field's value, refusing a second occurrence of its key.
pub fn set_once<'de, T: de::Deserialize<'de>, A: MapAccess<'de>>(
    slot: &mut Option<T>,
    name: &'static str,
    map: &mut A,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

pub fn required<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

/// For payload-less variants: any further key is unknown.
pub fn expect_no_fields<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    match map.next_key_seed(FieldSeed(&[]))? {
        None => Ok(()),
        // FieldSeed over no names errors on any key before returning.
        Some(_) => Err(de::Error::custom("unexpected field")),
    }
}

/// Decodes an integer domain (CUDA enums, flags, integer identities) through `TryFrom<u32>`.
pub fn deserialize_u32_domain<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u32>,
    T::Error: fmt::Display,
{
    let raw = <u32 as de::Deserialize>::deserialize(deserializer)?;
    T::try_from(raw).map_err(de::Error::custom)
}

pub fn wire_name<T: WireName>(value: T) -> &'static str {
    T::ALL
        .iter()
        .position(|known| *known == value)
        .map(|index| T::WIRE_NAMES[index])
        .unwrap_or("")
}

pub fn from_wire_name<T: WireName>(text: &str) -> Result<T, EnumError> {
    T::WIRE_NAMES
        .iter()
        .position(|name| *name == text)
        .map(|index| T::ALL[index])
        .ok_or_else(|| EnumError::UnknownName {
            domain: T::NAME,
            name: text.chars().take(64).collect(),
            expected: T::WIRE_NAMES.join(", "),
        })
}

pub fn deserialize_wire_name<'de, T: WireName, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    let index = NameSeed {
        domain: T::NAME,
        names: T::WIRE_NAMES,
    }
    .deserialize(deserializer)?;
    Ok(T::ALL[index])
}

pub fn fmt_flags(
    f: &mut fmt::Formatter<'_>,
    domain: &str,
    bits: u32,
    names: &[(u32, &str)],
) -> fmt::Result {
    write!(f, "{domain}(")?;
    let mut first = true;
    for (bit, name) in names {
        if bits & bit != 0 {
            if !first {
                f.write_str(" | ")?;
            }
            f.write_str(name)?;
            first = false;
        }
    }
    if first {
        f.write_str("NONE")?;
    }
    f.write_str(")")
}

pub const fn all_zero<const N: usize>(bytes: &[u8; N]) -> bool {
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] != 0 {
            return false;
        }
        index += 1;
    }
    true
}

pub fn fmt_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for byte in bytes {
        write!(f, "{byte:02x}")?;
    }
    Ok(())
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn parse_hex(identity: &'static str, text: &str, out: &mut [u8]) -> Result<(), IdentityError> {
    let invalid = || IdentityError::Text {
        identity,
        text: text.chars().take(80).collect(),
        expected: "lowercase hexadecimal of the right length",
    };
    if text.len() != out.len() * 2 {
        return Err(invalid());
    }
    for (index, pair) in text.as_bytes().chunks(2).enumerate() {
        let digit = |byte: u8| match byte {
            b'0'..=b'9' => Some(byte - b'0'),
            b'a'..=b'f' => Some(byte - b'a' + 10),
            _ => None,
        };
        match (digit(pair[0]), digit(pair[1])) {
            (Some(high), Some(low)) => out[index] = high << 4 | low,
            _ => return Err(invalid()),
        }
    }
    Ok(())
}

/// `2 * N` lowercase hex digits → `N` bytes.
pub fn parse_hex_fixed<const N: usize>(
    identity: &'static str,
    text: &str,
) -> Result<[u8; N], IdentityError> {
    let mut bytes = [0u8; N];
    parse_hex(identity, text, &mut bytes)?;
    Ok(bytes)
}

/// Decimal text without sign or padding → u32.
pub fn parse_u32_identity(identity: &'static str, text: &str) -> Result<u32, IdentityError> {
    let canonical = !text.is_empty()
        && text.bytes().all(|byte| byte.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    match text.parse::<u32>() {
        Ok(value) if canonical => Ok(value),
        _ => Err(IdentityError::Text {
            identity,
            text: text.chars().take(80).collect(),
            expected: "a decimal integer",
        }),
    }
}

/// Fixed-size byte identities: MessagePack `bin`; hex text in human-readable formats (JSON,
/// YAML).
pub fn serialize_fixed_bytes<S: Serializer, const N: usize>(
    serializer: S,
    bytes: &[u8; N],
) -> Result<S::Ok, S::Error> {
    if serializer.is_human_readable() {
        serializer.serialize_str(&hex_string(bytes))
    } else {
        serializer.serialize_bytes(bytes)
    }
}

pub fn deserialize_fixed_identity<'de, T, D, const N: usize>(
    deserializer: D,
    what: &'static str,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<[u8; N], Error = IdentityError>,
{
    let bytes = deserialize_fixed_bytes::<D, N>(deserializer, what)?;
    T::try_from(bytes).map_err(de::Error::custom)
}

fn deserialize_fixed_bytes<'de, D: Deserializer<'de>, const N: usize>(
    deserializer: D,
    what: &'static str,
) -> Result<[u8; N], D::Error> {
    struct BytesVisitor<const N: usize>(&'static str);
    impl<'de, const N: usize> Visitor<'de> for BytesVisitor<N> {
        type Value = [u8; N];
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<[u8; N], E> {
            bytes
                .try_into()
                .map_err(|_| E::invalid_length(bytes.len(), &self))
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<[u8; N], E> {
            let mut out = [0u8; N];
            parse_hex(self.0, text, &mut out).map_err(E::custom)?;
            Ok(out)
        }
    }
    if deserializer.is_human_readable() {
        deserializer.deserialize_str(BytesVisitor::<N>(what))
    } else {
        deserializer.deserialize_bytes(BytesVisitor::<N>(what))
    }
}

pub fn serialize_layout<T: FixedLayout, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let bytes = value.encode_vec();
    if serializer.is_human_readable() {
        serializer.serialize_str(&hex_string(&bytes))
    } else {
        serializer.serialize_bytes(&bytes)
    }
}

pub fn deserialize_layout<'de, T: FixedLayout, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    struct LayoutVisitor<T>(PhantomData<T>);
    impl<'de, T: FixedLayout> Visitor<'de> for LayoutVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "the {} bytes of a {}", T::SIZE, T::NAME)
        }
        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<T, E> {
            T::decode_bytes(bytes).map_err(E::custom)
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            let mut bytes = vec![0u8; T::SIZE];
            parse_hex(T::NAME, text, &mut bytes).map_err(E::custom)?;
            T::decode_bytes(&bytes).map_err(E::custom)
        }
    }
    if deserializer.is_human_readable() {
        deserializer.deserialize_str(LayoutVisitor(PhantomData))
    } else {
        deserializer.deserialize_bytes(LayoutVisitor(PhantomData))
    }
}
