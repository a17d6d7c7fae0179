//! What one source file says, as the rules need it, read from its `syn` syntax tree.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// A path the file names (`crate::a::b`, `super::c`, `self::d`), as written, on `line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub line: usize,
    pub segments: Vec<String>,
}

/// A function with a body, outside tests: its name (`Type::name` in an impl), the line it
/// starts on and its length in lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

#[derive(Debug, Default)]
pub struct Facts {
    pub imports: Vec<Import>,
    pub functions: Vec<Function>,
    /// Lines of `unsafe` blocks, functions, impls and traits, and of `call!` macros (the
    /// shim's driver macro, which hides an unsafe block).
    pub unsafe_lines: Vec<usize>,
    /// Lines that read or change the process environment (`env::var`, `set_var`, …).
    pub env_lines: Vec<usize>,
    /// Whether the file starts with `#![forbid(unsafe_code)]`.
    pub forbids_unsafe: bool,
    /// `mod` declarations at the top of the file, in order (not `#[cfg(test)]` ones).
    pub modules: Vec<String>,
    /// Lines of glob imports (`use x::*`, `pub use x::*`) outside test modules.
    pub globs: Vec<usize>,
}

/// The facts of `text`, or the parse error with its line and column.
pub fn facts(text: &str) -> Result<Facts, String> {
    let file = syn::parse_file(text).map_err(|error| {
        let start = error.span().start();
        format!("{}:{}: {error}", start.line, start.column + 1)
    })?;
    let mut facts = Facts {
        forbids_unsafe: file.attrs.iter().any(forbids_unsafe),
        modules: file
            .items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Mod(m) if !is_test(&m.attrs) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect(),
        ..Facts::default()
    };
    Visitor {
        facts: &mut facts,
        owner: None,
        inline: 0,
    }
    .visit_file(&file);
    Ok(facts)
}

fn line(span: Span) -> usize {
    span.start().line
}

fn forbids_unsafe(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("forbid")
        && attr
            .meta
            .require_list()
            .is_ok_and(|list| list.tokens.to_string().contains("unsafe_code"))
}

/// `#[cfg(test)]` or `#[test]`: not product code.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("test")
            || (attr.path().is_ident("cfg")
                && attr
                    .meta
                    .require_list()
                    .is_ok_and(|list| list.tokens.to_string() == "test"))
    })
}

const ENV_CALLS: [&str; 6] = ["var", "var_os", "vars", "vars_os", "set_var", "remove_var"];

struct Visitor<'f> {
    facts: &'f mut Facts,
    /// The type of the impl being visited, for method names.
    owner: Option<String>,
    /// How many inline `mod x { … }` the visitor is inside: their `super` is the file's own
    /// module, not its parent.
    inline: usize,
}

impl Visitor<'_> {
    fn function(&mut self, name: String, sig: &syn::Signature, block: &syn::Block) {
        let start = line(sig.fn_token.span);
        let end = block.brace_token.span.close().end().line;
        self.facts.functions.push(Function {
            name,
            line: start,
            lines: end + 1 - start,
        });
    }

    /// A path in code: an import when it leads somewhere (`pub(super)`, `self` and a lone
    /// `super` name no item).
    fn path(&mut self, segments: Vec<String>, at: usize) {
        if segments.len() > 1 {
            self.import(segments.clone(), at);
        }
        let reads_env = segments
            .windows(2)
            .any(|pair| pair[0] == "env" && ENV_CALLS.contains(&pair[1].as_str()));
        if reads_env {
            self.facts.env_lines.push(at);
        }
    }

    fn import(&mut self, segments: Vec<String>, at: usize) {
        let mut segments = segments;
        let climbs = segments.iter().take_while(|s| *s == "super").count();
        let within = climbs.min(self.inline);
        if within > 0 {
            // Those `super`s climb inline modules of this file: what is left starts here.
            segments.splice(..within, ["self".to_owned()]);
            if segments.get(1).is_some_and(|s| s == "super") {
                segments.remove(0);
            }
        }
        let named = |i: usize| segments.get(i).map(String::as_str);
        if matches!(named(0), Some("crate" | "super" | "self" | "$crate")) {
            self.facts.imports.push(Import { line: at, segments });
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, n.ident.to_string(), n.ident.span()),
            syn::UseTree::Rename(r) => self.use_leaf(prefix, r.ident.to_string(), r.ident.span()),
            syn::UseTree::Glob(g) => {
                let at = g.star_token.span;
                self.facts.globs.push(line(at));
                self.use_leaf(prefix, "*".into(), at)
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], leaf: String, span: Span) {
        let mut segments = prefix.to_vec();
        // `use super::{self, x}` names `super` itself.
        if leaf != "self" {
            segments.push(leaf);
        }
        self.import(segments, line(span));
    }
}

impl<'ast> Visit<'ast> for Visitor<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            self.inline += 1;
            visit::visit_item_mod(self, m);
            self.inline -= 1;
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.function(f.sig.ident.to_string(), &f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        if let Some(unsafety) = i.unsafety {
            self.facts.unsafe_lines.push(line(unsafety.span));
        }
        let owner = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        visit::visit_item_impl(self, i);
        self.owner = outer;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let name = match &self.owner {
            Some(owner) => format!("{owner}::{}", f.sig.ident),
            None => f.sig.ident.to_string(),
        };
        self.function(name, &f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        if let Some(unsafety) = t.unsafety {
            self.facts.unsafe_lines.push(line(unsafety.span));
        }
        visit::visit_item_trait(self, t);
    }

    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if let syn::Safety::Unsafe(token) = &sig.safety {
            self.facts.unsafe_lines.push(line(token.span));
        }
        visit::visit_signature(self, sig);
    }

    fn visit_expr_unsafe(&mut self, e: &'ast syn::ExprUnsafe) {
        self.facts.unsafe_lines.push(line(e.unsafe_token.span));
        visit::visit_expr_unsafe(self, e);
    }

    fn visit_item_foreign_mod(&mut self, f: &'ast syn::ItemForeignMod) {
        self.facts.unsafe_lines.push(line(f.abi.extern_token.span));
        visit::visit_item_foreign_mod(self, f);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        if m.path.segments.last().is_some_and(|s| s.ident == "call") {
            self.facts
                .unsafe_lines
                .push(line(m.path.segments[0].ident.span()));
        }
        visit::visit_macro(self, m);
        // `quote!` writes code for another crate (the schema compiler's output): its paths
        // are not this crate's imports.
        if m.path
            .segments
            .last()
            .is_some_and(|s| QUOTING.iter().any(|q| s.ident == q))
        {
            return;
        }
        // A macro's arguments are tokens, not syntax: their paths are read from the tokens.
        let tokens: Vec<TokenTree> = flatten(m.tokens.clone());
        for (at, segments) in token_paths(&tokens) {
            self.path(segments, at);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = p.segments.first() {
            self.path(segments, line(first.ident.span()));
        }
        visit::visit_path(self, p);
    }
}

/// Macros whose tokens are code for another crate.
const QUOTING: [&str; 2] = ["quote", "quote_spanned"];

/// Every token of `stream`, groups opened (their delimiters dropped).
fn flatten(stream: TokenStream) -> Vec<TokenTree> {
    let mut out = Vec::new();
    for token in stream {
        match token {
            TokenTree::Group(group) => out.extend(flatten(group.stream())),
            other => out.push(other),
        }
    }
    out
}

/// The paths in `tokens`: identifiers joined by `::`, with their lines.
fn token_paths(tokens: &[TokenTree]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let TokenTree::Ident(first) = &tokens[i] else {
            i += 1;
            continue;
        };
        let mut segments = vec![first.to_string()];
        let mut j = i + 1;
        while let (
            Some(TokenTree::Punct(a)),
            Some(TokenTree::Punct(b)),
            Some(TokenTree::Ident(next)),
        ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
        {
            if a.as_char() != ':' || b.as_char() != ':' {
                break;
            }
            segments.push(next.to_string());
            j += 3;
        }
        if segments.len() > 1 {
            out.push((line(first.span()), segments));
        }
        i = j;
    }
    out
}
