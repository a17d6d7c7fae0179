//! The checked schema: every name resolved, every bound a number. Emitters read only this.

/// A resolved field type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I32,
    I64,
    /// UTF-8 text of at most `limit` bytes.
    String {
        limit: Bound,
    },
    List {
        element: Box<Type>,
        limit: Bound,
    },
    Map {
        key: Box<Type>,
        value: Box<Type>,
        limit: Bound,
    },
    Option(Box<Type>),
    Named {
        name: String,
        kind: NamedKind,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedKind {
    Enum,
    Identity,
    Struct,
    Union,
    Layout,
}

/// A collection bound: the limit's name and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub limit: String,
    pub value: u64,
}

impl Type {
    /// How the type is written in the schema (`list<Record, MAX_RECORDS>`).
    pub fn schema_text(&self) -> String {
        match self {
            Type::Bool => "bool".into(),
            Type::U8 => "u8".into(),
            Type::U16 => "u16".into(),
            Type::U32 => "u32".into(),
            Type::U64 => "u64".into(),
            Type::I32 => "i32".into(),
            Type::I64 => "i64".into(),
            Type::String { limit } => format!("string<{}>", limit.limit),
            Type::List { element, limit } => {
                format!("list<{}, {}>", element.schema_text(), limit.limit)
            }
            Type::Map { key, value, limit } => format!(
                "map<{}, {}, {}>",
                key.schema_text(),
                value.schema_text(),
                limit.limit
            ),
            Type::Option(inner) => format!("option<{}>", inner.schema_text()),
            Type::Named { name, .. } => name.clone(),
        }
    }

    /// Size in bytes when the type appears in a fixed layout.
    pub fn fixed_size(&self, identities: &[Identity]) -> Option<u64> {
        match self {
            Type::Bool | Type::U8 => Some(1),
            Type::U16 => Some(2),
            Type::U32 | Type::I32 => Some(4),
            Type::U64 | Type::I64 => Some(8),
            Type::Named {
                name,
                kind: NamedKind::Identity,
            } => identities
                .iter()
                .find(|identity| &identity.name == name)
                .map(|identity| identity.repr.size() as u64),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ir {
    /// Path the schema was read from, for generated headers.
    pub source: String,
    pub version: u8,
    pub limits: Vec<Limit>,
    pub enums: Vec<Enum>,
    pub identities: Vec<Identity>,
    pub structs: Vec<Struct>,
    pub unions: Vec<Union>,
    pub layouts: Vec<Layout>,
    pub messages: Vec<Message>,
    pub lifecycle: Option<Lifecycle>,
}

/// The validated phase chain: every operation once, contiguous from its first `from` to its
/// last `to`, capture before restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    pub phases: String,
    pub operations: String,
    pub doc: String,
    pub chain: Vec<Transition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub operation: String,
    pub from: String,
    pub to: String,
    pub stage: crate::ast::Stage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub name: String,
    pub value: u64,
    pub doc: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnumKind {
    Cuda { cudarc: String },
    CudaFlags { cudarc: String },
    Name,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enum {
    pub name: String,
    pub doc: String,
    pub kind: EnumKind,
    pub values: Vec<EnumValue>,
    pub rejected: Vec<Rejected>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnumValue {
    /// PascalCase name of the variant.
    pub name: String,
    /// snake_case wire name (name enums) and documentation key.
    pub wire_name: String,
    /// Integer value (CUDA enums and flags).
    pub value: Option<u32>,
    pub cuda: Option<String>,
    pub doc: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub value: u32,
    pub cuda: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityRepr {
    U32,
    Bytes16,
    Bytes32,
}

impl IdentityRepr {
    /// Bytes of the value (in layouts, and of the `bin` on the wire for byte identities).
    pub fn size(self) -> usize {
        match self {
            Self::U32 => 4,
            Self::Bytes16 => 16,
            Self::Bytes32 => 32,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub doc: String,
    pub repr: IdentityRepr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: Type,
    pub doc: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Struct {
    pub name: String,
    pub doc: String,
    pub fields: Vec<Field>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Union {
    pub name: String,
    pub doc: String,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub name: String,
    pub wire_name: String,
    pub doc: String,
    pub fields: Vec<Field>,
}

impl Variant {
    /// Name of the generated struct holding a variant's fields (`AllocationRecord`).
    pub fn struct_name(&self, union: &str) -> String {
        format!("{}{}", self.name, union)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub name: String,
    pub doc: String,
    pub size: u64,
    /// Sorted by offset; they tile `0..size` exactly.
    pub fields: Vec<LayoutField>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutField {
    pub name: String,
    pub offset: u64,
    pub size: u64,
    pub kind: LayoutFieldKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutFieldKind {
    Magic(String),
    Version,
    VersionDigit,
    Reserved,
    Value { ty: Type, nonzero: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub body: String,
    pub body_kind: NamedKind,
    pub limit: Bound,
    pub doc: String,
    /// MessagePack nesting of the body at its deepest.
    pub depth: u64,
}

impl Ir {
    pub fn limit(&self, name: &str) -> Option<u64> {
        self.limits
            .iter()
            .find(|limit| limit.name == name)
            .map(|limit| limit.value)
    }
}
