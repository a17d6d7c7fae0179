//! Markdown reference emission (askama). The template sees only preformatted strings.

use askama::Template;

use crate::ir::{EnumKind, IdentityRepr, Ir, LayoutFieldKind};

#[derive(Template)]
#[template(path = "reference.md", escape = "none")]
struct Reference {
    source: String,
    version: u8,
    version_hex: String,
    messages: Vec<MessageView>,
    limits: Vec<LimitView>,
    enums: Vec<EnumView>,
    identities: Vec<IdentityView>,
    structs: Vec<StructView>,
    unions: Vec<UnionView>,
    layouts: Vec<LayoutView>,
    lifecycle: Option<LifecycleView>,
}

struct LifecycleView {
    doc: String,
    steps: Vec<StepView>,
}

struct StepView {
    operation: String,
    stage: String,
    from: String,
    to: String,
}

struct MessageView {
    body: String,
    limit: String,
    limit_value: u64,
    depth: u64,
    doc: String,
}

struct LimitView {
    name: String,
    value: u64,
    doc: String,
}

struct EnumView {
    name: String,
    doc: String,
    encoding: String,
    values: Vec<ValueView>,
    rejected: Vec<RejectedView>,
}

struct ValueView {
    name: String,
    wire: String,
    cuda: String,
    doc: String,
}

struct RejectedView {
    value: u32,
    cuda: String,
    reason: String,
}

struct IdentityView {
    name: String,
    doc: String,
    wire: String,
}

struct FieldView {
    name: String,
    ty: String,
    doc: String,
}

struct StructView {
    name: String,
    doc: String,
    fields: Vec<FieldView>,
}

struct VariantView {
    name: String,
    wire: String,
    doc: String,
    fields: Vec<FieldView>,
}

struct UnionView {
    name: String,
    doc: String,
    variants: Vec<VariantView>,
}

struct LayoutFieldView {
    range: String,
    name: String,
    content: String,
}

struct LayoutView {
    name: String,
    doc: String,
    size: u64,
    fields: Vec<LayoutFieldView>,
}

/// The view of each item of a schema list.
fn views<T, V>(items: &[T], view: impl Fn(&T) -> V) -> Vec<V> {
    items.iter().map(view).collect()
}

/// Table cells cannot hold a raw `|`.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn fields(fields: &[crate::ir::Field]) -> Vec<FieldView> {
    fields
        .iter()
        .map(|field| FieldView {
            name: field.name.clone(),
            ty: field.ty.schema_text(),
            doc: cell(&field.doc),
        })
        .collect()
}

/// Renders the protocol reference.
pub fn markdown(ir: &Ir) -> Result<String, askama::Error> {
    let reference = Reference {
        source: ir.source.clone(),
        version: ir.version,
        version_hex: format!("{:02x}", ir.version),
        messages: views(&ir.messages, |message| MessageView {
            body: message.body.clone(),
            limit: message.limit.limit.clone(),
            limit_value: message.limit.value,
            depth: message.depth,
            doc: cell(&message.doc),
        }),
        limits: views(&ir.limits, |limit| LimitView {
            name: limit.name.clone(),
            value: limit.value,
            doc: cell(&limit.doc),
        }),
        enums: views(&ir.enums, |e| EnumView {
            name: e.name.clone(),
            doc: e.doc.clone(),
            encoding: match &e.kind {
                EnumKind::Cuda { cudarc } => {
                    format!("CUDA enum `{cudarc}`, as its `u32` value")
                }
                EnumKind::CudaFlags { cudarc } => {
                    format!("CUDA bit set `{cudarc}`, as a `u32` whose bits must all be listed")
                }
                EnumKind::Name => "snake_case name".to_owned(),
            },
            values: e
                .values
                .iter()
                .map(|value| ValueView {
                    name: value.name.clone(),
                    wire: match value.value {
                        Some(number) => number.to_string(),
                        None => value.wire_name.clone(),
                    },
                    cuda: value
                        .cuda
                        .as_ref()
                        .map(|cuda| format!("`{cuda}`"))
                        .unwrap_or_else(|| "—".to_owned()),
                    doc: cell(&value.doc),
                })
                .collect(),
            rejected: e
                .rejected
                .iter()
                .map(|rejected| RejectedView {
                    value: rejected.value,
                    cuda: rejected
                        .cuda
                        .as_ref()
                        .map(|cuda| format!("(`{cuda}`)"))
                        .unwrap_or_default(),
                    reason: rejected.reason.clone(),
                })
                .collect(),
        }),
        identities: views(&ir.identities, |identity| IdentityView {
            name: identity.name.clone(),
            doc: identity.doc.clone(),
            wire: match identity.repr {
                IdentityRepr::U32 => "an unsigned integer, never 0".to_owned(),
                IdentityRepr::Bytes16 | IdentityRepr::Bytes32 => format!(
                    "`bin 8` of {} bytes, never all zero ({} lowercase hex digits in text)",
                    identity.repr.size(),
                    2 * identity.repr.size()
                ),
            },
        }),
        structs: views(&ir.structs, |s| StructView {
            name: s.name.clone(),
            doc: s.doc.clone(),
            fields: fields(&s.fields),
        }),
        unions: views(&ir.unions, |u| UnionView {
            name: u.name.clone(),
            doc: u.doc.clone(),
            variants: u
                .variants
                .iter()
                .map(|variant| VariantView {
                    name: variant.name.clone(),
                    wire: variant.wire_name.clone(),
                    doc: variant.doc.clone(),
                    fields: fields(&variant.fields),
                })
                .collect(),
        }),
        layouts: views(&ir.layouts, |layout| LayoutView {
            name: layout.name.clone(),
            doc: layout.doc.clone(),
            size: layout.size,
            fields: layout
                .fields
                .iter()
                .map(|field| LayoutFieldView {
                    range: format!("{}..{}", field.offset, field.offset + field.size),
                    name: field.name.clone(),
                    content: match &field.kind {
                        LayoutFieldKind::Magic(text) => format!("ASCII `{text}`"),
                        LayoutFieldKind::Version => "protocol version byte".to_owned(),
                        LayoutFieldKind::VersionDigit => {
                            "protocol version as one ASCII digit (0-9, then A-Z)".to_owned()
                        }
                        LayoutFieldKind::Reserved => "reserved, must be zero".to_owned(),
                        LayoutFieldKind::Value { ty, nonzero } => format!(
                            "`{}` little-endian{}",
                            ty.schema_text(),
                            if *nonzero { ", never 0" } else { "" }
                        ),
                    },
                })
                .collect(),
        }),
        lifecycle: ir.lifecycle.as_ref().map(|l| LifecycleView {
            doc: cell(&l.doc),
            steps: views(&l.chain, |t| StepView {
                operation: t.operation.clone(),
                stage: match t.stage {
                    crate::ast::Stage::Capture => "capture".to_owned(),
                    crate::ast::Stage::Restore => "restore".to_owned(),
                },
                from: t.from.clone(),
                to: t.to.clone(),
            }),
        }),
    };
    reference.render()
}
