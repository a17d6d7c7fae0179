//! The schema as written: serde mirrors of `protocol.ron`, before any checking.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    pub version: u64,
    pub limits: Vec<Limit>,
    pub enums: Vec<Enum>,
    pub identities: Vec<Identity>,
    pub structs: Vec<Struct>,
    pub unions: Vec<Union>,
    pub layouts: Vec<Layout>,
    pub messages: Vec<Message>,
    /// The lifecycle's phase chain (optional: older schemas have none).
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
}

/// Which operation moves a participant from which phase to which, declared once for the
/// shim's phase machine and the coordinator's plan.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// The name-encoded enum of phases.
    pub phases: String,
    /// The name-encoded enum of operations.
    pub operations: String,
    pub doc: String,
    /// Every operation once, in the order they run: capture first, then restore; each starts
    /// from the phase the previous one leads to.
    pub chain: Vec<Transition>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    pub operation: String,
    pub from: String,
    pub to: String,
    pub stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Stage {
    /// Before the native checkpoint.
    Capture,
    /// After the native restore.
    Restore,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub name: String,
    pub value: u64,
    pub doc: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enum {
    pub name: String,
    pub doc: String,
    pub encoding: EnumEncoding,
    pub values: Vec<EnumValue>,
    #[serde(default)]
    pub rejected: Vec<Rejected>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum EnumEncoding {
    /// A CUDA enum: travels as its integer value; `cudarc` names the mirrored sys type.
    Cuda { cudarc: String },
    /// A CUDA bit set: travels as an integer whose bits must all be known.
    CudaFlags { cudarc: String },
    /// A protocol-only enum: travels as the snake_case variant name.
    Name,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnumValue {
    pub name: String,
    #[serde(default)]
    pub value: Option<u64>,
    #[serde(default)]
    pub cuda: Option<String>,
    pub doc: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rejected {
    pub value: u64,
    #[serde(default)]
    pub cuda: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum IdentityRepr {
    U32,
    Bytes16,
    Bytes32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub name: String,
    pub doc: String,
    pub repr: IdentityRepr,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub doc: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Struct {
    pub name: String,
    pub doc: String,
    pub fields: Vec<Field>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Union {
    pub name: String,
    pub doc: String,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    pub doc: String,
    pub fields: Vec<Field>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub name: String,
    pub doc: String,
    pub size: u64,
    pub fields: Vec<LayoutField>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutField {
    pub name: String,
    pub offset: u64,
    pub kind: LayoutFieldKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum LayoutFieldKind {
    /// Fixed ASCII bytes.
    Magic(String),
    /// One byte holding the protocol version.
    Version,
    /// One ASCII digit holding the protocol version.
    VersionDigit,
    /// Bytes that must be zero.
    Reserved { size: u64 },
    /// A little-endian value of a fixed-size type.
    Value {
        #[serde(rename = "type")]
        ty: String,
        #[serde(default)]
        nonzero: bool,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub body: String,
    pub limit: String,
    pub doc: String,
}
