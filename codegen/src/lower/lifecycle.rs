//! The lifecycle section: the phase chain both sides are generated from. Every operation
//! appears once, names values of the declared enums, and starts from the phase the previous
//! one leads to; capture operations come before restore operations.

use super::Lowering;
use crate::ast::{self, Stage};
use crate::ir;
use std::collections::BTreeSet;

impl Lowering<'_> {
    /// Where the lifecycle section's literal `value` is written (after its `lifecycle:` key),
    /// the `nth` time.
    fn lifecycle_literal(&self, value: &str, nth: usize) -> usize {
        let start = self.source.key("lifecycle").unwrap_or(0);
        let mut at = start;
        for _ in 0..=nth {
            match self.source.literal_after(at, value) {
                Some(found) => at = found + 1,
                None => return start,
            }
        }
        at - 1
    }

    /// The values of the name-encoded enum `name`, or an error at `what` in the section.
    fn lifecycle_enum<'e>(
        &mut self,
        name: &str,
        what: &str,
        enums: &'e [ir::Enum],
    ) -> Option<&'e ir::Enum> {
        match enums.iter().find(|e| e.name == name) {
            Some(e) if e.kind == ir::EnumKind::Name => Some(e),
            Some(_) => {
                let at = self.lifecycle_literal(name, 0);
                self.error_at(
                    at,
                    format!("lifecycle {what} `{name}` must be a name-encoded enum"),
                );
                None
            }
            None => {
                let at = self.lifecycle_literal(name, 0);
                self.error_at(
                    at,
                    format!("lifecycle {what} `{name}` is not a declared enum"),
                );
                None
            }
        }
    }

    pub(super) fn lifecycle(
        &mut self,
        lifecycle: &ast::Lifecycle,
        enums: &[ir::Enum],
    ) -> Option<ir::Lifecycle> {
        let phases = self.lifecycle_enum(&lifecycle.phases, "phases", enums);
        let operations = self.lifecycle_enum(&lifecycle.operations, "operations", enums);
        let (phases, operations) = (phases?, operations?);
        let errors_before = self.diagnostics.len();
        let is_phase = |name: &str| phases.values.iter().any(|v| v.name == name);
        let mut seen = BTreeSet::new();
        let mut previous: Option<&ast::Transition> = None;
        for (index, step) in lifecycle.chain.iter().enumerate() {
            let occurrence = lifecycle.chain[..index]
                .iter()
                .filter(|s| s.operation == step.operation)
                .count();
            let at = self.lifecycle_literal(&step.operation, occurrence);
            if !operations.values.iter().any(|v| v.name == step.operation) {
                self.error_at(
                    at,
                    format!(
                        "lifecycle: `{}` is not a value of {}",
                        step.operation, operations.name
                    ),
                );
            } else if !seen.insert(step.operation.as_str()) {
                self.error_at(
                    at,
                    format!("lifecycle: `{}` appears twice in the chain", step.operation),
                );
            }
            for phase in [&step.from, &step.to] {
                if !is_phase(phase) {
                    self.error_at(
                        at,
                        format!(
                            "lifecycle: `{}` names `{phase}`, which is not a value of {}",
                            step.operation, phases.name
                        ),
                    );
                }
            }
            if let Some(previous) = previous {
                if previous.to != step.from {
                    self.error_at(
                        at,
                        format!(
                            "lifecycle: `{}` starts from `{}`, but `{}` before it leads to `{}`",
                            step.operation, step.from, previous.operation, previous.to
                        ),
                    );
                }
                if previous.stage == Stage::Restore && step.stage == Stage::Capture {
                    self.error_at(
                        at,
                        format!(
                            "lifecycle: capture operation `{}` comes after restore operation `{}`",
                            step.operation, previous.operation
                        ),
                    );
                }
            }
            previous = Some(step);
        }
        for value in &operations.values {
            if !seen.contains(value.name.as_str()) {
                let at = self.source.locate(&[&operations.name, &value.name]);
                self.error_at(
                    at,
                    format!(
                        "lifecycle: operation `{}` has no place in the chain",
                        value.name
                    ),
                );
            }
        }
        (self.diagnostics.len() == errors_before).then(|| ir::Lifecycle {
            phases: lifecycle.phases.clone(),
            operations: lifecycle.operations.clone(),
            doc: lifecycle.doc.clone(),
            chain: lifecycle
                .chain
                .iter()
                .map(|s| ir::Transition {
                    operation: s.operation.clone(),
                    from: s.from.clone(),
                    to: s.to.clone(),
                    stage: s.stage,
                })
                .collect(),
        })
    }
}
