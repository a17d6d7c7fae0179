//! Finds where schema elements are written, so semantic errors can point at them.
//!
//! serde drops source positions, so the validator names an element by the string literals on
//! the way to it (an enum's name, then a value's name); the locator walks the source's string
//! literals in order to find that path. Names are the identity of every schema element, which
//! makes this exact for well-formed paths; when a path cannot be followed the position of the
//! last element found is used.

use crate::diag::{Diagnostic, Position};

#[derive(Debug)]
struct Literal {
    /// Byte offset of the opening quote.
    offset: usize,
    value: String,
}

/// The schema text with an index of its string literals.
#[derive(Debug)]
pub struct SourceMap {
    path: String,
    text: String,
    line_starts: Vec<usize>,
    literals: Vec<Literal>,
    /// Field keys (`name:` outside strings and comments) and their offsets.
    keys: Vec<(String, usize)>,
}

impl SourceMap {
    pub fn new(path: &str, text: &str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(index, _)| index + 1));
        let (literals, keys) = scan(text);
        Self {
            path: path.to_owned(),
            text: text.to_owned(),
            line_starts,
            literals,
            keys,
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// Line and column (1-based, columns in characters) of a byte offset.
    pub fn position(&self, offset: usize) -> Position {
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let start = self.line_starts[line - 1];
        let column = self.text[start..offset.min(self.text.len())]
            .chars()
            .count()
            + 1;
        Position { line, column }
    }

    /// Offset of the `nth` (0-based) literal equal to `path`'s last element, found by
    /// following `path` literal by literal.
    pub fn locate_nth(&self, path: &[&str], nth: usize) -> usize {
        let mut from = 0;
        let mut found = 0;
        for (depth, element) in path.iter().enumerate() {
            let skip = if depth + 1 == path.len() { nth } else { 0 };
            let mut matches = self.literals[from..]
                .iter()
                .enumerate()
                .filter(|(_, literal)| literal.value == *element);
            match matches.nth(skip) {
                Some((index, literal)) => {
                    from += index + 1;
                    found = literal.offset;
                }
                None => break,
            }
        }
        found
    }

    /// Offset of the first `key:` written outside strings and comments.
    pub fn key(&self, key: &str) -> Option<usize> {
        self.keys
            .iter()
            .find(|(name, _)| name == key)
            .map(|&(_, offset)| offset)
    }

    /// Offset of the first literal equal to `value` at or after `from`.
    pub fn literal_after(&self, from: usize, value: &str) -> Option<usize> {
        self.literals
            .iter()
            .find(|literal| literal.offset >= from && literal.value == value)
            .map(|literal| literal.offset)
    }

    pub fn locate(&self, path: &[&str]) -> usize {
        self.locate_nth(path, 0)
    }

    pub fn diagnostic(&self, offset: usize, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            path: self.path.clone(),
            position: self.position(offset),
            message: message.into(),
        }
    }
}

/// Collects string literals and field keys, skipping comments. Malformed text is the parser's
/// business; this scan only has to agree with it on well-formed input.
fn scan(text: &str) -> (Vec<Literal>, Vec<(String, usize)>) {
    let bytes = text.as_bytes();
    let mut literals = Vec::new();
    let mut keys = Vec::new();
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'/' if bytes.get(index + 1) == Some(&b'/') => {
                while index < bytes.len() && bytes[index] != b'\n' {
                    index += 1;
                }
            }
            b'/' if bytes.get(index + 1) == Some(&b'*') => {
                index += 2;
                while index + 1 < bytes.len() && !(bytes[index] == b'*' && bytes[index + 1] == b'/')
                {
                    index += 1;
                }
                index += 2;
            }
            b'"' => {
                let offset = index;
                let mut value = String::new();
                index += 1;
                let mut chars = text[index..].char_indices();
                let mut end = text.len();
                while let Some((at, character)) = chars.next() {
                    match character {
                        '"' => {
                            end = index + at + 1;
                            break;
                        }
                        '\\' => {
                            if let Some((_, escaped)) = chars.next() {
                                value.push(match escaped {
                                    'n' => '\n',
                                    't' => '\t',
                                    other => other,
                                });
                            }
                        }
                        other => value.push(other),
                    }
                }
                literals.push(Literal { offset, value });
                index = end;
            }
            byte if byte.is_ascii_alphabetic() || byte == b'_' => {
                let start = index;
                while index < bytes.len()
                    && (bytes[index].is_ascii_alphanumeric() || bytes[index] == b'_')
                {
                    index += 1;
                }
                let mut after = index;
                while after < bytes.len() && bytes[after].is_ascii_whitespace() {
                    after += 1;
                }
                if bytes.get(after) == Some(&b':') && bytes.get(after + 1) != Some(&b':') {
                    keys.push((text[start..index].to_owned(), start));
                }
            }
            _ => index += 1,
        }
    }
    (literals, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_follow_paths() {
        let map = SourceMap::new(
            "s.ron",
            "// \"A\" in a comment\n(name: \"A\", x: [\"B\", \"A\"],\n  y: \"B\")",
        );
        let offset = map.locate(&["A", "B"]);
        assert_eq!(
            map.position(offset),
            Position {
                line: 2,
                column: 17
            }
        );
        let second = map.locate_nth(&["A"], 1);
        assert_eq!(
            map.position(second),
            Position {
                line: 2,
                column: 22
            }
        );
        let missing = map.locate(&["A", "Z"]);
        assert_eq!(map.position(missing), Position { line: 2, column: 8 });
        let key = map.key("x").expect("a key outside the comment");
        assert_eq!(
            map.position(key),
            Position {
                line: 2,
                column: 13
            }
        );
        assert_eq!(
            map.key("name"),
            Some(map.text().find("name").expect("present"))
        );
        assert_eq!(map.key("A"), None, "a string is not a key");
    }
}
