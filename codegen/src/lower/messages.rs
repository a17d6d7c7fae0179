//! Messages: which bodies travel under which limit, and their nesting depth (no cycles).

use super::*;

impl Lowering<'_> {
    pub(super) fn check_cycles(&mut self, structs: &[ir::Struct], unions: &[ir::Union]) {
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

    pub(super) fn messages(
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
            let depth = Nesting { structs, unions }.of_named(&message.body, 0);
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

    pub(super) fn message_offset(&self, body: &str) -> usize {
        // Message entries follow the `messages` key; the body is named there again.
        let start = self.source.key("messages").unwrap_or(0);
        self.source.literal_after(start, body).unwrap_or(start)
    }
}

pub(super) fn named(ty: &Type) -> Vec<&str> {
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

/// MessagePack nesting (each map or array is one level) of the schema's types.
pub(super) struct Nesting<'a> {
    pub structs: &'a [ir::Struct],
    pub unions: &'a [ir::Union],
}

impl Nesting<'_> {
    /// The nesting of a named struct or union.
    pub(super) fn of_named(&self, name: &str, guard: u64) -> u64 {
        if guard > 64 {
            return guard; // a cycle, reported separately
        }
        let fields: Vec<&ir::Field> = if let Some(s) = self.structs.iter().find(|s| s.name == name)
        {
            s.fields.iter().collect()
        } else if let Some(u) = self.unions.iter().find(|u| u.name == name) {
            u.variants.iter().flat_map(|v| v.fields.iter()).collect()
        } else {
            return 0;
        };
        1 + fields
            .iter()
            .map(|f| self.of_type(&f.ty, guard + 1))
            .max()
            .unwrap_or(0)
    }

    fn of_type(&self, ty: &Type, guard: u64) -> u64 {
        match ty {
            Type::List { element, .. } => 1 + self.of_type(element, guard),
            Type::Map { key, value, .. } => {
                1 + self.of_type(key, guard).max(self.of_type(value, guard))
            }
            Type::Option(inner) => self.of_type(inner, guard),
            Type::Named {
                name,
                kind: NamedKind::Struct | NamedKind::Union,
            } => self.of_named(name, guard),
            _ => 0,
        }
    }
}
