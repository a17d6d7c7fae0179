//! Enums: CUDA-mirroring values (with their cudarc constant and rejected values), bit sets
//! and name-encoded domains.

use super::*;

impl Lowering<'_> {
    pub(super) fn enumeration(&mut self, e: &ast::Enum) -> ir::Enum {
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

    pub(super) fn u32_value(&mut self, path: &[&str], value: u64) -> Option<u32> {
        match u32::try_from(value) {
            Ok(number) => Some(number),
            Err(_) => {
                self.error(path, format!("value {value} does not fit in u32"));
                None
            }
        }
    }
}
