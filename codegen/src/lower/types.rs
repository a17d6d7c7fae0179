//! Field type expressions (`list<T, LIMIT>`, `map<K, V, LIMIT>`, `string<LIMIT>`, names):
//! tokenized, parsed and resolved against the declared types and limits.

use super::*;

impl Lowering<'_> {
    /// Parses a type expression; `offset` is where its text starts in the source.
    pub(super) fn parse_type(&mut self, text: &str, offset: usize) -> Option<Type> {
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

    pub(super) fn resolve(&mut self, expr: &TypeExpr, offset: usize) -> Option<Type> {
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

    pub(super) fn bound(&mut self, expr: &TypeExpr, offset: usize) -> Option<Bound> {
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

#[derive(Debug)]
pub(super) struct Token<'a> {
    at: usize,
    text: &'a str,
}

pub(super) fn tokenize(text: &str) -> Result<Vec<Token<'_>>, (usize, String)> {
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
pub(super) struct TypeExpr {
    at: usize,
    name: String,
    args: Vec<TypeExpr>,
}

pub(super) struct TypeParser<'a> {
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

pub(super) fn is_builtin(name: &str) -> bool {
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
