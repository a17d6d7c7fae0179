//! Fixed binary layouts: offsets, sizes, magic, version bytes and reserved-zero fields.

use super::*;

impl Lowering<'_> {
    pub(super) fn layout(
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
                    if version > 35 {
                        self.error(
                            &path,
                            format!(
                                "version {version} cannot be written as one ASCII digit (0-9, then A-Z) in `{}`",
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
}
