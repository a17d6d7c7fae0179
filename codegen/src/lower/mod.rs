//! Semantic validation: turns the parsed schema into the IR or explains, with positions, every
//! reason it cannot.

use std::collections::{BTreeMap, HashMap};

use crate::ast;
use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{self, Bound, NamedKind, Type};
use crate::source::SourceMap;

mod lifecycle;

/// Limits the generated runtime reads by name.
const REQUIRED_LIMITS: [&str; 3] = ["MAX_MESSAGE_BYTES", "MAX_TICKET_BYTES", "MAX_DEPTH"];

const RUST_KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
    "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut",
    "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "macro",
    "override", "priv", "try", "typeof", "unsized", "virtual", "yield",
];

struct Lowering<'a> {
    source: &'a SourceMap,
    diagnostics: Vec<Diagnostic>,
    /// Type name → kind, for resolution.
    types: HashMap<String, NamedKind>,
    limits: HashMap<String, u64>,
}

pub fn lower(schema: &ast::Schema, source: &SourceMap) -> Result<ir::Ir, Diagnostics> {
    let mut lowering = Lowering {
        source,
        diagnostics: Vec::new(),
        types: HashMap::new(),
        limits: HashMap::new(),
    };
    let ir = lowering.run(schema);
    if lowering.diagnostics.is_empty() {
        Ok(ir)
    } else {
        let mut diagnostics = lowering.diagnostics;
        diagnostics.sort_by_key(|diagnostic| diagnostic.position);
        diagnostics.dedup();
        Err(Diagnostics(diagnostics))
    }
}

impl Lowering<'_> {
    fn error(&mut self, path: &[&str], message: impl Into<String>) {
        let offset = self.source.locate(path);
        self.diagnostics
            .push(self.source.diagnostic(offset, message));
    }

    fn error_at(&mut self, offset: usize, message: impl Into<String>) {
        self.diagnostics
            .push(self.source.diagnostic(offset, message));
    }

    fn run(&mut self, schema: &ast::Schema) -> ir::Ir {
        let version = self.version(schema.version);
        let limits = self.limits(&schema.limits);
        self.register_types(schema);
        let enums: Vec<ir::Enum> = schema.enums.iter().map(|e| self.enumeration(e)).collect();
        let identities = schema
            .identities
            .iter()
            .map(|identity| {
                self.check_type_name(&identity.name);
                ir::Identity {
                    name: identity.name.clone(),
                    doc: identity.doc.clone(),
                    repr: match identity.repr {
                        ast::IdentityRepr::U32 => ir::IdentityRepr::U32,
                        ast::IdentityRepr::Bytes16 => ir::IdentityRepr::Bytes16,
                    },
                }
            })
            .collect::<Vec<_>>();
        let structs: Vec<ir::Struct> = schema
            .structs
            .iter()
            .map(|s| {
                self.check_type_name(&s.name);
                ir::Struct {
                    name: s.name.clone(),
                    doc: s.doc.clone(),
                    fields: self.fields(&[&s.name], &s.fields),
                }
            })
            .collect();
        let unions: Vec<ir::Union> = schema.unions.iter().map(|u| self.union(u)).collect();
        let layouts = schema
            .layouts
            .iter()
            .map(|layout| self.layout(layout, version, &identities))
            .collect();
        self.check_cycles(&structs, &unions);
        let messages = self.messages(&schema.messages, &structs, &unions);
        let lifecycle = schema
            .lifecycle
            .as_ref()
            .and_then(|l| self.lifecycle(l, &enums));
        ir::Ir {
            source: self.source.path().to_owned(),
            version,
            limits,
            enums,
            identities,
            structs,
            unions,
            layouts,
            messages,
            lifecycle,
        }
    }

    fn version(&mut self, version: u64) -> u8 {
        // The envelope writes the version as a positive fixint, so 1..=127.
        if version == 0 || version > 127 {
            self.error_at(
                self.source.key("version").unwrap_or(0),
                format!("version {version} is out of range: it must be 1..=127"),
            );
            return 1;
        }
        version as u8
    }

    fn limits(&mut self, limits: &[ast::Limit]) -> Vec<ir::Limit> {
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for limit in limits {
            let count = seen.entry(limit.name.clone()).or_insert(0usize);
            *count += 1;
            if *count > 1 {
                let offset = self.source.locate_nth(&[&limit.name], *count - 1);
                self.error_at(offset, format!("duplicate limit `{}`", limit.name));
                continue;
            }
            if !is_screaming_snake(&limit.name) {
                self.error(
                    &[&limit.name],
                    format!("limit name `{}` must be SCREAMING_SNAKE_CASE", limit.name),
                );
            }
            if limit.value == 0 {
                self.error(
                    &[&limit.name],
                    format!("limit `{}` must not be 0", limit.name),
                );
            }
            if limit.value > u32::MAX as u64 {
                self.error(
                    &[&limit.name],
                    format!(
                        "limit `{}` = {} does not fit in u32",
                        limit.name, limit.value
                    ),
                );
            }
            self.limits.insert(limit.name.clone(), limit.value);
            out.push(ir::Limit {
                name: limit.name.clone(),
                value: limit.value,
                doc: limit.doc.clone(),
            });
        }
        for required in REQUIRED_LIMITS {
            if !self.limits.contains_key(required) {
                self.error_at(
                    self.source.key("limits").unwrap_or(0),
                    format!("required limit `{required}` is missing"),
                );
            }
        }
        out
    }

    fn register_types(&mut self, schema: &ast::Schema) {
        let declared = schema
            .enums
            .iter()
            .map(|e| (&e.name, NamedKind::Enum))
            .chain(
                schema
                    .identities
                    .iter()
                    .map(|i| (&i.name, NamedKind::Identity)),
            )
            .chain(schema.structs.iter().map(|s| (&s.name, NamedKind::Struct)))
            .chain(schema.unions.iter().map(|u| (&u.name, NamedKind::Union)))
            .chain(schema.layouts.iter().map(|l| (&l.name, NamedKind::Layout)));
        let mut counts: HashMap<String, usize> = HashMap::new();
        let mut generated: Vec<String> = Vec::new();
        for (name, kind) in declared {
            let count = counts.entry(name.clone()).or_insert(0);
            *count += 1;
            if *count > 1 {
                let offset = self.source.locate_nth(&[name], *count - 1);
                self.error_at(offset, format!("duplicate type name `{name}`"));
                continue;
            }
            if is_builtin(name) {
                self.error(
                    &[name],
                    format!("type name `{name}` shadows a built-in type"),
                );
            }
            self.types.insert(name.clone(), kind);
        }
        // Variant structs are generated as `<Variant><Union>`; they must not collide.
        for union in &schema.unions {
            for variant in &union.variants {
                let name = format!("{}{}", variant.name, union.name);
                if self.types.contains_key(&name) || generated.contains(&name) {
                    self.error(
                        &[&union.name, &variant.name],
                        format!(
                            "variant `{}` of `{}` generates struct `{name}`, which is already defined",
                            variant.name, union.name
                        ),
                    );
                }
                generated.push(name);
            }
        }
    }

    fn check_type_name(&mut self, name: &str) {
        if !is_pascal(name) {
            self.error(&[name], format!("type name `{name}` must be PascalCase"));
        }
    }

    fn enumeration(&mut self, e: &ast::Enum) -> ir::Enum {
        self.check_type_name(&e.name);
        if let ast::EnumEncoding::Cuda { cudarc } | ast::EnumEncoding::CudaFlags { cudarc } =
            &e.encoding
            && !is_identifier(cudarc)
        {
            self.error(
                &[&e.name, cudarc],
                format!(
                    "cudarc type `{cudarc}` of enum `{}` must be a Rust identifier",
                    e.name
                ),
            );
        }
        // Each constant is located after its value's name (a rejected entry's comes first in
        // its tuple, so after the enum's name).
        let constants = e
            .values
            .iter()
            .filter_map(|v| Some((vec![e.name.as_str(), v.name.as_str()], v.cuda.as_deref()?)))
            .chain(
                e.rejected
                    .iter()
                    .filter_map(|r| Some((vec![e.name.as_str()], r.cuda.as_deref()?))),
            );
        for (mut path, cuda) in constants {
            if !is_screaming_snake(cuda) {
                path.push(cuda);
                self.error(
                    &path,
                    format!(
                        "CUDA constant `{cuda}` in enum `{}` must be SCREAMING_SNAKE_CASE",
                        e.name
                    ),
                );
            }
        }
        let kind = match &e.encoding {
            ast::EnumEncoding::Cuda { cudarc } => ir::EnumKind::Cuda {
                cudarc: cudarc.clone(),
            },
            ast::EnumEncoding::CudaFlags { cudarc } => ir::EnumKind::CudaFlags {
                cudarc: cudarc.clone(),
            },
            ast::EnumEncoding::Name => ir::EnumKind::Name,
        };
        let integer = !matches!(kind, ir::EnumKind::Name);
        if e.values.is_empty() {
            self.error(&[&e.name], format!("enum `{}` has no values", e.name));
        }
        if !integer && !e.rejected.is_empty() {
            self.error(
                &[&e.name],
                format!(
                    "enum `{}` travels by name: rejected integer values make no sense",
                    e.name
                ),
            );
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut by_value: BTreeMap<u32, String> = BTreeMap::new();
        let mut values = Vec::new();
        for value in &e.values {
            let count = names.entry(&value.name).or_insert(0);
            *count += 1;
            if *count > 1 {
                let offset = self.source.locate_nth(&[&e.name, &value.name], *count - 1);
                self.error_at(
                    offset,
                    format!("duplicate value name `{}` in enum `{}`", value.name, e.name),
                );
                continue;
            }
            if !is_pascal(&value.name) {
                self.error(
                    &[&e.name, &value.name],
                    format!("value name `{}` must be PascalCase", value.name),
                );
            }
            let number = if integer {
                match (value.value, &value.cuda) {
                    (None, _) => {
                        self.error(
                            &[&e.name, &value.name],
                            format!(
                                "value `{}` of CUDA enum `{}` needs an integer `value`",
                                value.name, e.name
                            ),
                        );
                        None
                    }
                    (Some(_), None) => {
                        self.error(
                            &[&e.name, &value.name],
                            format!(
                                "value `{}` of CUDA enum `{}` must name the CUDA constant it mirrors (`cuda`)",
                                value.name, e.name
                            ),
                        );
                        None
                    }
                    (Some(number), Some(_)) => self.u32_value(&[&e.name, &value.name], number),
                }
            } else {
                if value.value.is_some() || value.cuda.is_some() {
                    self.error(
                        &[&e.name, &value.name],
                        format!(
                            "value `{}` of name enum `{}` cannot have an integer value or a CUDA constant",
                            value.name, e.name
                        ),
                    );
                }
                None
            };
            if let Some(number) = number {
                if matches!(kind, ir::EnumKind::CudaFlags { .. })
                    && number != 0
                    && !number.is_power_of_two()
                {
                    self.error(
                        &[&e.name, &value.name],
                        format!(
                            "flag `{}` = {number} of `{}` is not a single bit",
                            value.name, e.name
                        ),
                    );
                }
                if let Some(previous) = by_value.insert(number, value.name.clone()) {
                    self.error(
                        &[&e.name, &value.name],
                        format!(
                            "value {number} of `{}` collides with `{previous}` in enum `{}`",
                            value.name, e.name
                        ),
                    );
                }
            }
            values.push(ir::EnumValue {
                name: value.name.clone(),
                wire_name: snake_case(&value.name),
                value: number,
                cuda: value.cuda.clone(),
                doc: value.doc.clone(),
            });
        }
        let mut rejected = Vec::new();
        for reject in &e.rejected {
            let Some(number) = self.u32_value(&[&e.name, &reject.reason], reject.value) else {
                continue;
            };
            if let Some(previous) = by_value.get(&number) {
                self.error(
                    &[&e.name, &reject.reason],
                    format!(
                        "rejected value {number} of enum `{}` collides with `{previous}`",
                        e.name
                    ),
                );
                continue;
            }
            by_value.insert(number, format!("rejected {number}"));
            rejected.push(ir::Rejected {
                value: number,
                cuda: reject.cuda.clone(),
                reason: reject.reason.clone(),
            });
        }
        ir::Enum {
            name: e.name.clone(),
            doc: e.doc.clone(),
            kind,
            values,
            rejected,
        }
    }

    fn u32_value(&mut self, path: &[&str], value: u64) -> Option<u32> {
        match u32::try_from(value) {
            Ok(number) => Some(number),
            Err(_) => {
                self.error(path, format!("value {value} does not fit in u32"));
                None
            }
        }
    }

    fn fields(&mut self, owner: &[&str], fields: &[ast::Field]) -> Vec<ir::Field> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::new();
        for field in fields {
            let mut path = owner.to_vec();
            path.push(&field.name);
            let count = seen.entry(&field.name).or_insert(0);
            *count += 1;
            if *count > 1 {
                let offset = self.source.locate_nth(&path, *count - 1);
                self.error_at(
                    offset,
                    format!("duplicate field `{}` in `{}`", field.name, owner.join(".")),
                );
                continue;
            }
            if !is_snake(&field.name) || RUST_KEYWORDS.contains(&field.name.as_str()) {
                self.error(
                    &path,
                    format!(
                        "field name `{}` must be snake_case and not a Rust keyword",
                        field.name
                    ),
                );
            }
            // The type literal follows the field's name.
            let mut type_path = path.clone();
            type_path.push(&field.ty);
            let literal = self.source.locate(&type_path);
            if let Some(ty) = self.parse_type(&field.ty, literal + 1) {
                out.push(ir::Field {
                    name: field.name.clone(),
                    ty,
                    doc: field.doc.clone(),
                });
            }
        }
        out
    }

    fn union(&mut self, union: &ast::Union) -> ir::Union {
        self.check_type_name(&union.name);
        if union.variants.is_empty() {
            self.error(
                &[&union.name],
                format!("union `{}` has no variants", union.name),
            );
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut variants = Vec::new();
        for variant in &union.variants {
            let count = seen.entry(&variant.name).or_insert(0);
            *count += 1;
            if *count > 1 {
                let offset = self
                    .source
                    .locate_nth(&[&union.name, &variant.name], *count - 1);
                self.error_at(
                    offset,
                    format!(
                        "duplicate variant `{}` in union `{}`",
                        variant.name, union.name
                    ),
                );
                continue;
            }
            if !is_pascal(&variant.name) {
                self.error(
                    &[&union.name, &variant.name],
                    format!("variant name `{}` must be PascalCase", variant.name),
                );
            }
            if let Some(tag) = variant.fields.iter().find(|field| field.name == "kind") {
                self.error(
                    &[&union.name, &variant.name, &tag.name],
                    format!(
                        "field `kind` of variant `{}` collides with the union tag",
                        variant.name
                    ),
                );
            }
            variants.push(ir::Variant {
                name: variant.name.clone(),
                wire_name: snake_case(&variant.name),
                doc: variant.doc.clone(),
                fields: self.fields(&[&union.name, &variant.name], &variant.fields),
            });
        }
        ir::Union {
            name: union.name.clone(),
            doc: union.doc.clone(),
            variants,
        }
    }

    fn layout(
        &mut self,
        layout: &ast::Layout,
        version: u8,
        identities: &[ir::Identity],
    ) -> ir::Layout {
        self.check_type_name(&layout.name);
        let mut fields = Vec::new();
        for field in &layout.fields {
            let path = [layout.name.as_str(), field.name.as_str()];
            let (size, kind) = match &field.kind {
                ast::LayoutFieldKind::Magic(text) => {
                    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
                        self.error(
                            &path,
                            format!("magic of `{}` must be printable ASCII", layout.name),
                        );
                    }
                    (text.len() as u64, ir::LayoutFieldKind::Magic(text.clone()))
                }
                ast::LayoutFieldKind::Version => (1, ir::LayoutFieldKind::Version),
                ast::LayoutFieldKind::VersionDigit => {
                    if version > 9 {
                        self.error(
                            &path,
                            format!(
                                "version {version} cannot be written as one ASCII digit in `{}`",
                                layout.name
                            ),
                        );
                    }
                    (1, ir::LayoutFieldKind::VersionDigit)
                }
                ast::LayoutFieldKind::Reserved { size } => {
                    if *size == 0 {
                        self.error(&path, "reserved field of size 0");
                    }
                    (*size, ir::LayoutFieldKind::Reserved)
                }
                ast::LayoutFieldKind::Value { ty, nonzero } => {
                    let mut type_path = path.to_vec();
                    type_path.push(ty);
                    let literal = self.source.locate(&type_path);
                    let Some(resolved) = self.parse_type(ty, literal + 1) else {
                        continue;
                    };
                    let Some(size) = resolved.fixed_size(identities) else {
                        self.error(
                            &path,
                            format!(
                                "type `{ty}` of layout field `{}` has no fixed size",
                                field.name
                            ),
                        );
                        continue;
                    };
                    if *nonzero && !matches!(resolved, Type::U16 | Type::U32 | Type::U64) {
                        self.error(
                            &path,
                            format!(
                                "`nonzero` applies to unsigned integers, not `{ty}` (identities are never zero already)"
                            ),
                        );
                    }
                    (
                        size,
                        ir::LayoutFieldKind::Value {
                            ty: resolved,
                            nonzero: *nonzero,
                        },
                    )
                }
            };
            if !is_snake(&field.name) || RUST_KEYWORDS.contains(&field.name.as_str()) {
                self.error(
                    &path,
                    format!("layout field name `{}` must be snake_case", field.name),
                );
            }
            fields.push(ir::LayoutField {
                name: field.name.clone(),
                offset: field.offset,
                size,
                kind,
            });
        }
        fields.sort_by_key(|field| field.offset);
        let mut cursor = 0u64;
        for field in &fields {
            let path = [layout.name.as_str(), field.name.as_str()];
            if field.offset < cursor {
                self.error(
                    &path,
                    format!(
                        "field `{}` at offset {} overlaps the previous field (which ends at {cursor})",
                        field.name, field.offset
                    ),
                );
            } else if field.offset > cursor {
                self.error(
                    &path,
                    format!(
                        "gap of {} bytes before field `{}` at offset {} (declare it reserved)",
                        field.offset - cursor,
                        field.name,
                        field.offset
                    ),
                );
            }
            let end = field.offset.saturating_add(field.size);
            if end > layout.size {
                self.error(
                    &path,
                    format!(
                        "field `{}` ends at {end}, beyond the layout size {}",
                        field.name, layout.size
                    ),
                );
            }
            cursor = cursor.max(end);
        }
        if cursor < layout.size {
            self.error(
                &[&layout.name],
                format!(
                    "layout `{}` leaves bytes {cursor}..{} undeclared (declare them reserved)",
                    layout.name, layout.size
                ),
            );
        }
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        for (index, name) in names.iter().enumerate() {
            if names[..index].contains(name) {
                self.error(
                    &[&layout.name, name],
                    format!("duplicate field `{name}` in layout `{}`", layout.name),
                );
            }
        }
        if !fields
            .iter()
            .any(|f| matches!(f.kind, ir::LayoutFieldKind::Magic(_)))
        {
            self.error(
                &[&layout.name],
                format!(
                    "layout `{}` has no magic: a foreign buffer could not be told apart",
                    layout.name
                ),
            );
        }
        if !fields.iter().any(|f| {
            matches!(
                f.kind,
                ir::LayoutFieldKind::Version | ir::LayoutFieldKind::VersionDigit
            )
        }) {
            self.error(
                &[&layout.name],
                format!(
                    "layout `{}` does not carry the protocol version",
                    layout.name
                ),
            );
        }
        ir::Layout {
            name: layout.name.clone(),
            doc: layout.doc.clone(),
            size: layout.size,
            fields,
        }
    }

    fn check_cycles(&mut self, structs: &[ir::Struct], unions: &[ir::Union]) {
        // Types reachable without passing a list, map or option would make an infinite value;
        // those reachable through one would make unbounded nesting. Both are refused.
        let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
        for s in structs {
            edges.insert(
                &s.name,
                s.fields.iter().flat_map(|f| named(&f.ty)).collect(),
            );
        }
        for u in unions {
            edges.insert(
                &u.name,
                u.variants
                    .iter()
                    .flat_map(|v| v.fields.iter().flat_map(|f| named(&f.ty)))
                    .collect(),
            );
        }
        let mut reported = Vec::new();
        for start in edges.keys().copied().collect::<Vec<_>>() {
            let mut stack = vec![start];
            let mut seen = vec![];
            while let Some(node) = stack.pop() {
                for &next in edges.get(node).into_iter().flatten() {
                    if next == start && !reported.contains(&start) {
                        reported.push(start);
                    } else if !seen.contains(&next) {
                        seen.push(next);
                        stack.push(next);
                    }
                }
            }
        }
        reported.sort();
        for name in reported {
            self.error(&[name], format!("type `{name}` contains itself"));
        }
    }

    fn messages(
        &mut self,
        messages: &[ast::Message],
        structs: &[ir::Struct],
        unions: &[ir::Union],
    ) -> Vec<ir::Message> {
        let mut out = Vec::new();
        let max_depth = self.limits.get("MAX_DEPTH").copied();
        for message in messages {
            let body_offset = self.message_offset(&message.body);
            let kind = match self.types.get(&message.body) {
                Some(kind @ (NamedKind::Struct | NamedKind::Union)) => *kind,
                Some(_) => {
                    self.error_at(
                        body_offset,
                        format!(
                            "message body `{}` must be a struct or a union",
                            message.body
                        ),
                    );
                    continue;
                }
                None => {
                    self.error_at(
                        body_offset,
                        format!("unknown message body `{}`", message.body),
                    );
                    continue;
                }
            };
            let Some(&limit) = self.limits.get(&message.limit) else {
                let offset = self
                    .source
                    .locate(&["messages", &message.body, &message.limit]);
                self.error_at(offset, format!("undefined limit `{}`", message.limit));
                continue;
            };
            if out.iter().any(|m: &ir::Message| m.body == message.body) {
                self.error_at(
                    body_offset,
                    format!("message `{}` declared twice", message.body),
                );
                continue;
            }
            let depth = depth_of(&message.body, structs, unions, 0);
            if let Some(max) = max_depth
                && depth > max
            {
                self.error_at(
                    body_offset,
                    format!(
                        "message `{}` nests {depth} levels, more than MAX_DEPTH = {max}",
                        message.body
                    ),
                );
            }
            out.push(ir::Message {
                body: message.body.clone(),
                body_kind: kind,
                limit: Bound {
                    limit: message.limit.clone(),
                    value: limit,
                },
                doc: message.doc.clone(),
                depth,
            });
        }
        out
    }

    fn message_offset(&self, body: &str) -> usize {
        // Message entries follow the `messages` key; the body is named there again.
        let start = self.source.key("messages").unwrap_or(0);
        self.source.literal_after(start, body).unwrap_or(start)
    }

    /// Parses a type expression; `offset` is where its text starts in the source.
    fn parse_type(&mut self, text: &str, offset: usize) -> Option<Type> {
        let tokens = match tokenize(text) {
            Ok(tokens) => tokens,
            Err((at, message)) => {
                self.error_at(offset + at, message);
                return None;
            }
        };
        let mut parser = TypeParser {
            tokens: &tokens,
            index: 0,
            text_len: text.len(),
        };
        let expr = match parser.expr() {
            Ok(expr) => expr,
            Err((at, message)) => {
                self.error_at(offset + at, message);
                return None;
            }
        };
        if let Some(token) = tokens.get(parser.index) {
            self.error_at(
                offset + token.at,
                format!("unexpected `{}` after the type", token.text),
            );
            return None;
        }
        self.resolve(&expr, offset)
    }

    fn resolve(&mut self, expr: &TypeExpr, offset: usize) -> Option<Type> {
        let arity = |this: &mut Self, expected: usize, usage: &str| {
            if expr.args.len() != expected {
                this.error_at(
                    offset + expr.at,
                    format!(
                        "`{}` takes {expected} argument{}: {usage}",
                        expr.name,
                        if expected == 1 { "" } else { "s" }
                    ),
                );
                false
            } else {
                true
            }
        };
        let scalar = match expr.name.as_str() {
            "bool" => Some(Type::Bool),
            "u8" => Some(Type::U8),
            "u16" => Some(Type::U16),
            "u32" => Some(Type::U32),
            "u64" => Some(Type::U64),
            "i32" => Some(Type::I32),
            "i64" => Some(Type::I64),
            _ => None,
        };
        if let Some(scalar) = scalar {
            return arity(self, 0, "none").then_some(scalar);
        }
        match expr.name.as_str() {
            "string" => {
                if !arity(self, 1, "string<LIMIT>") {
                    return None;
                }
                let limit = self.bound(&expr.args[0], offset)?;
                Some(Type::String { limit })
            }
            "list" => {
                if !arity(self, 2, "list<TYPE, LIMIT>") {
                    return None;
                }
                let element = self.resolve(&expr.args[0], offset);
                let limit = self.bound(&expr.args[1], offset);
                Some(Type::List {
                    element: Box::new(element?),
                    limit: limit?,
                })
            }
            "map" => {
                if !arity(self, 3, "map<KEY, VALUE, LIMIT>") {
                    return None;
                }
                let key = self.resolve(&expr.args[0], offset);
                let value = self.resolve(&expr.args[1], offset);
                let limit = self.bound(&expr.args[2], offset);
                let key = key?;
                let key_ok = matches!(key, Type::U32 | Type::U64)
                    || matches!(
                        &key,
                        Type::Named {
                            kind: NamedKind::Identity,
                            ..
                        }
                    );
                if !key_ok {
                    self.error_at(
                        offset + expr.args[0].at,
                        format!(
                            "map key `{}` must be an integer or an identity",
                            key.schema_text()
                        ),
                    );
                    return None;
                }
                Some(Type::Map {
                    key: Box::new(key),
                    value: Box::new(value?),
                    limit: limit?,
                })
            }
            "option" => {
                if !arity(self, 1, "option<TYPE>") {
                    return None;
                }
                let inner = self.resolve(&expr.args[0], offset)?;
                if matches!(inner, Type::Option(_)) {
                    self.error_at(
                        offset + expr.at,
                        "nested options cannot be told apart on the wire",
                    );
                    return None;
                }
                Some(Type::Option(Box::new(inner)))
            }
            name => {
                let Some(&kind) = self.types.get(name) else {
                    self.error_at(offset + expr.at, format!("unknown type `{name}`"));
                    return None;
                };
                arity(self, 0, "none").then(|| Type::Named {
                    name: name.to_owned(),
                    kind,
                })
            }
        }
    }

    fn bound(&mut self, expr: &TypeExpr, offset: usize) -> Option<Bound> {
        if !expr.args.is_empty() {
            self.error_at(offset + expr.at, format!("`{}` is not a limit", expr.name));
            return None;
        }
        match self.limits.get(&expr.name) {
            Some(&value) => Some(Bound {
                limit: expr.name.clone(),
                value,
            }),
            None => {
                self.error_at(offset + expr.at, format!("undefined limit `{}`", expr.name));
                None
            }
        }
    }
}

fn named(ty: &Type) -> Vec<&str> {
    match ty {
        Type::Named {
            name,
            kind: NamedKind::Struct | NamedKind::Union,
        } => {
            vec![name.as_str()]
        }
        Type::List { element, .. } => named(element),
        Type::Map { key, value, .. } => {
            let mut out = named(key);
            out.extend(named(value));
            out
        }
        Type::Option(inner) => named(inner),
        _ => Vec::new(),
    }
}

/// MessagePack nesting of a named struct or union (each map or array is one level).
fn depth_of(name: &str, structs: &[ir::Struct], unions: &[ir::Union], guard: u64) -> u64 {
    if guard > 64 {
        return guard; // a cycle, reported separately
    }
    let fields: Vec<&ir::Field> = if let Some(s) = structs.iter().find(|s| s.name == name) {
        s.fields.iter().collect()
    } else if let Some(u) = unions.iter().find(|u| u.name == name) {
        u.variants.iter().flat_map(|v| v.fields.iter()).collect()
    } else {
        return 0;
    };
    1 + fields
        .iter()
        .map(|f| type_depth(&f.ty, structs, unions, guard + 1))
        .max()
        .unwrap_or(0)
}

fn type_depth(ty: &Type, structs: &[ir::Struct], unions: &[ir::Union], guard: u64) -> u64 {
    match ty {
        Type::List { element, .. } => 1 + type_depth(element, structs, unions, guard),
        Type::Map { key, value, .. } => {
            1 + type_depth(key, structs, unions, guard)
                .max(type_depth(value, structs, unions, guard))
        }
        Type::Option(inner) => type_depth(inner, structs, unions, guard),
        Type::Named {
            name,
            kind: NamedKind::Struct | NamedKind::Union,
        } => depth_of(name, structs, unions, guard),
        _ => 0,
    }
}

#[derive(Debug)]
struct Token<'a> {
    at: usize,
    text: &'a str,
}

fn tokenize(text: &str) -> Result<Vec<Token<'_>>, (usize, String)> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if matches!(c, '<' | '>' | ',') {
            chars.next();
            tokens.push(Token {
                at,
                text: &text[at..at + 1],
            });
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let mut end = at;
            while let Some(&(index, c)) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    end = index + c.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            tokens.push(Token {
                at,
                text: &text[at..end],
            });
        } else {
            return Err((at, format!("unexpected character `{c}` in type")));
        }
    }
    Ok(tokens)
}

#[derive(Debug)]
struct TypeExpr {
    at: usize,
    name: String,
    args: Vec<TypeExpr>,
}

struct TypeParser<'a> {
    tokens: &'a [Token<'a>],
    index: usize,
    text_len: usize,
}

impl TypeParser<'_> {
    fn expr(&mut self) -> Result<TypeExpr, (usize, String)> {
        let token = self
            .tokens
            .get(self.index)
            .ok_or((self.text_len, "expected a type".to_owned()))?;
        if !token
            .text
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        {
            return Err((
                token.at,
                format!("expected a type name, found `{}`", token.text),
            ));
        }
        self.index += 1;
        let mut expr = TypeExpr {
            at: token.at,
            name: token.text.to_owned(),
            args: Vec::new(),
        };
        if self.tokens.get(self.index).map(|t| t.text) == Some("<") {
            self.index += 1;
            loop {
                expr.args.push(self.expr()?);
                match self.tokens.get(self.index) {
                    Some(t) if t.text == "," => self.index += 1,
                    Some(t) if t.text == ">" => {
                        self.index += 1;
                        break;
                    }
                    Some(t) => {
                        return Err((t.at, format!("expected `,` or `>`, found `{}`", t.text)));
                    }
                    None => return Err((self.text_len, "unclosed `<`".to_owned())),
                }
            }
        }
        Ok(expr)
    }
}

fn is_builtin(name: &str) -> bool {
    matches!(
        name,
        "bool"
            | "u8"
            | "u16"
            | "u32"
            | "u64"
            | "i32"
            | "i64"
            | "string"
            | "list"
            | "map"
            | "option"
    )
}

fn is_pascal(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_alphanumeric())
}

fn is_snake(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A name the generated Rust can use as an identifier (ASCII, not a keyword).
fn is_identifier(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RUST_KEYWORDS.contains(&name)
        && name != "_"
}

fn is_screaming_snake(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// `HostNumaCurrent` → `host_numa_current`, `V2` → `v2`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (index, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if index > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `HostNumaCurrent` → `HOST_NUMA_CURRENT`.
pub fn screaming_snake_case(name: &str) -> String {
    snake_case(name).to_ascii_uppercase()
}
