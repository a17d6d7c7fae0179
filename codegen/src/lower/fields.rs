//! Struct fields and union variants: names, types, bounds.

use super::*;

impl Lowering<'_> {
    pub(super) fn fields(&mut self, owner: &[&str], fields: &[ast::Field]) -> Vec<ir::Field> {
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

    pub(super) fn union(&mut self, union: &ast::Union) -> ir::Union {
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
}
