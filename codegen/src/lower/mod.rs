//! Semantic validation: turns the parsed schema into the IR or explains, with positions, every
//! reason it cannot.

use std::collections::{BTreeMap, HashMap};

use crate::ast;
use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{self, Bound, NamedKind, Type};
use crate::source::SourceMap;

mod enums;
mod fields;
mod layouts;
mod lifecycle;
mod messages;
mod names;
mod types;

use names::*;
pub use names::{screaming_snake_case, snake_case};
use types::*;

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
                        ast::IdentityRepr::Bytes32 => ir::IdentityRepr::Bytes32,
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
}
