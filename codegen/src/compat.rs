//! Wire compatibility: every change between two schemas that a peer could observe on the wire.
//!
//! Decoders are strict (unknown keys, values and kinds are errors), so additions are as
//! visible as removals: an old peer refuses what a new one sends. Field order inside a map is
//! not visible (decoders accept any order after a union's `kind`), and documentation is not.

use std::collections::BTreeMap;
use std::fmt;

use crate::ir::{Enum, Field, Identity, Ir, Layout, Limit, Message, Struct, Union, Variant};

/// One wire-visible difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// What changed, e.g. `struct Location field id`.
    pub subject: String,
    pub description: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.description)
    }
}

/// The result of comparing two schemas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub old_version: u8,
    pub new_version: u8,
    pub changes: Vec<Change>,
}

impl Report {
    /// Wire-visible changes without a version bump break deployed peers.
    pub fn is_compatible(&self) -> bool {
        self.changes.is_empty() || self.new_version > self.old_version
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "no wire-visible changes");
        }
        writeln!(f, "{} wire-visible change(s):", self.changes.len())?;
        for change in &self.changes {
            writeln!(f, "- {change}")?;
        }
        if self.new_version > self.old_version {
            writeln!(
                f,
                "version bumped from {} to {}: accepted",
                self.old_version, self.new_version
            )
        } else {
            writeln!(
                f,
                "version stays {} (was {}): these changes need a version bump",
                self.new_version, self.old_version
            )
        }
    }
}

struct Differ {
    changes: Vec<Change>,
}

impl Differ {
    fn change(&mut self, subject: impl Into<String>, description: impl Into<String>) {
        self.changes.push(Change {
            subject: subject.into(),
            description: description.into(),
        });
    }

    /// Records "`what` changed from `old` to `new`" under `subject` when they differ; says
    /// whether they did.
    fn differs<T: PartialEq + fmt::Debug>(
        &mut self,
        subject: &str,
        what: &str,
        old: T,
        new: T,
    ) -> bool {
        let differs = old != new;
        if differs {
            self.change(subject, format!("{what} changed from {old:?} to {new:?}"));
        }
        differs
    }

    /// Compares two lists item by item under their keys: `both` for an item in both, and a
    /// removal or addition for one in only one.
    fn keyed<'a, T: Keyed + 'a>(
        &mut self,
        kind: &str,
        old: &'a [T],
        new: &'a [T],
        mut both: impl FnMut(&mut Self, &str, &'a T, &'a T),
    ) {
        let old: BTreeMap<&str, &T> = old.iter().map(|item| (item.key(), item)).collect();
        let new: BTreeMap<&str, &T> = new.iter().map(|item| (item.key(), item)).collect();
        for (name, old_item) in &old {
            match new.get(name) {
                Some(new_item) => both(self, name, old_item, new_item),
                None => self.change(format!("{kind} {name}"), "removed"),
            }
        }
        for name in new.keys() {
            if !old.contains_key(name) {
                self.change(format!("{kind} {name}"), "added");
            }
        }
    }

    fn fields(&mut self, owner: &str, old: &[Field], new: &[Field]) {
        // Types compare as written: a changed bound is reported once, on its limit.
        // A field that disappears while another of the same type appears at the same
        // position is reported as a rename; the wire sees a different key either way.
        let mut renamed = Vec::new();
        for (index, old_field) in old.iter().enumerate() {
            if new.iter().any(|field| field.name == old_field.name) {
                continue;
            }
            if let Some(new_field) = new.get(index)
                && !old.iter().any(|field| field.name == new_field.name)
                && new_field.ty.schema_text() == old_field.ty.schema_text()
            {
                self.change(
                    format!("{owner} field {}", old_field.name),
                    format!("renamed to `{}`", new_field.name),
                );
                renamed.push(new_field.name.clone());
                continue;
            }
            self.change(format!("{owner} field {}", old_field.name), "removed");
        }
        for new_field in new {
            match old.iter().find(|field| field.name == new_field.name) {
                Some(old_field) if old_field.ty.schema_text() != new_field.ty.schema_text() => self
                    .change(
                        format!("{owner} field {}", new_field.name),
                        format!(
                            "type changed from `{}` to `{}`",
                            old_field.ty.schema_text(),
                            new_field.ty.schema_text()
                        ),
                    ),
                Some(_) => {}
                None if renamed.contains(&new_field.name) => {}
                None => self.change(format!("{owner} field {}", new_field.name), "added"),
            }
        }
    }

    fn enumeration(&mut self, name: &str, old: &Enum, new: &Enum) {
        let subject = format!("enum {name}");
        if self.differs(&subject, "encoding", &old.kind, &new.kind) {
            return;
        }
        let wire = |e: &Enum| -> BTreeMap<String, String> {
            e.values
                .iter()
                .map(|value| {
                    let wire = match value.value {
                        Some(number) => number.to_string(),
                        None => value.wire_name.clone(),
                    };
                    (value.name.clone(), wire)
                })
                .collect()
        };
        let (old_values, new_values) = (wire(old), wire(new));
        for (value, old_wire) in &old_values {
            match new_values.get(value) {
                None => self.change(format!("{subject} value {value}"), "removed"),
                Some(new_wire) if new_wire != old_wire => self.change(
                    format!("{subject} value {value}"),
                    format!("wire value changed from {old_wire} to {new_wire}"),
                ),
                Some(_) => {}
            }
        }
        for value in new_values.keys() {
            if !old_values.contains_key(value) {
                self.change(format!("{subject} value {value}"), "added");
            }
        }
        let rejected = |e: &Enum| -> Vec<u32> { e.rejected.iter().map(|r| r.value).collect() };
        self.differs(&subject, "rejected values", rejected(old), rejected(new));
    }

    fn layout(&mut self, name: &str, old: &Layout, new: &Layout) {
        let subject = format!("layout {name}");
        self.differs(&subject, "size", old.size, new.size);
        let describe = |layout: &Layout| -> Vec<String> {
            layout
                .fields
                .iter()
                .map(|field| {
                    format!(
                        "{}@{}+{} {:?}",
                        field.name, field.offset, field.size, field.kind
                    )
                })
                .collect()
        };
        let (old_fields, new_fields) = (describe(old), describe(new));
        for field in old_fields
            .iter()
            .filter(|field| !new_fields.contains(field))
        {
            self.change(&subject, format!("field `{field}` changed or removed"));
        }
        for field in new_fields
            .iter()
            .filter(|field| !old_fields.contains(field))
        {
            self.change(&subject, format!("field `{field}` changed or added"));
        }
    }
}

/// What an item of a schema list is compared under: its name (a message, its body).
trait Keyed {
    fn key(&self) -> &str;
}

macro_rules! keyed_by {
    ($($item:ty => $key:ident),* $(,)?) => {
        $(impl Keyed for $item {
            fn key(&self) -> &str {
                &self.$key
            }
        })*
    };
}

keyed_by!(
    Limit => name, Enum => name, Identity => name, Struct => name, Union => name,
    Variant => name, Layout => name, Message => body,
);

/// Lists every wire-visible change from `old` to `new`.
pub fn compat(old: &Ir, new: &Ir) -> Report {
    let mut differ = Differ {
        changes: Vec::new(),
    };
    let d = &mut differ;
    d.keyed("limit", &old.limits, &new.limits, |d, name, o, n| {
        if o.value != n.value {
            let direction = if n.value < o.value {
                "lowered"
            } else {
                "raised"
            };
            d.change(
                format!("limit {name}"),
                format!("{direction} from {} to {}", o.value, n.value),
            );
        }
    });
    d.keyed("enum", &old.enums, &new.enums, |d, name, o, n| {
        d.enumeration(name, o, n)
    });
    d.keyed(
        "identity",
        &old.identities,
        &new.identities,
        |d, name, o, n| {
            d.differs(
                &format!("identity {name}"),
                "representation",
                o.repr,
                n.repr,
            );
        },
    );
    d.keyed("struct", &old.structs, &new.structs, |d, name, o, n| {
        d.fields(&format!("struct {name}"), &o.fields, &n.fields)
    });
    d.keyed("union", &old.unions, &new.unions, |d, name, o, n| {
        d.keyed(
            &format!("union {name} variant"),
            &o.variants,
            &n.variants,
            |d, variant, ov, nv| {
                d.fields(
                    &format!("union {name} variant {variant}"),
                    &ov.fields,
                    &nv.fields,
                )
            },
        );
    });
    d.keyed("layout", &old.layouts, &new.layouts, |d, name, o, n| {
        d.layout(name, o, n)
    });
    d.keyed("message", &old.messages, &new.messages, |d, name, o, n| {
        // A new value of the same limit is reported once, under the limit.
        if o.limit.limit != n.limit.limit {
            d.change(
                format!("message {name}"),
                format!("limit changed from {} to {}", o.limit.limit, n.limit.limit),
            );
        }
    });
    Report {
        old_version: old.version,
        new_version: new.version,
        changes: differ.changes,
    }
}
