//! Reads cudarc's bindgen output for the driver (`src/driver/sys/mod.rs`) with syn: every
//! `pub unsafe fn NAME(..) -> CUresult`, with each argument reduced to its C ABI class, so the
//! generated pass-throughs never name a cudarc enum (an unknown value from the application
//! would be undefined behaviour in a Rust enum) and need no cudarc type but by-value structs.

use crate::diag::{Diagnostic, Diagnostics, Position};
use std::collections::BTreeMap;

/// One argument's C ABI type, as the pass-through declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abi {
    /// A Rust primitive (`u32`, `i32`, `u64`, `usize`, `f32`, …).
    Primitive(String),
    /// Any data pointer or function pointer.
    MutPtr,
    ConstPtr,
    /// A struct or union passed by value: cudarc's `#[repr(C)]` definition.
    Struct(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    pub args: Vec<Abi>,
    /// The newest CUDA feature this definition is compiled for (`None`: every version).
    pub newest: Option<u32>,
}

#[derive(Debug)]
pub struct Bindings {
    pub source: String,
    pub functions: BTreeMap<String, Function>,
    /// Every `CUresult` value (`cudaError_enum`) in any CUDA version: value → name (the
    /// newest definition's name where two versions disagree).
    pub results: BTreeMap<u32, String>,
}

/// The variants of one `cudaError_enum` definition: `(name, value)`.
type Variants = Vec<(String, u32)>;

fn result_variants(e: &syn::ItemEnum) -> Variants {
    e.variants
        .iter()
        .filter_map(|v| {
            let (_, syn::Expr::Lit(lit)) = v.discriminant.as_ref()? else {
                return None;
            };
            let syn::Lit::Int(int) = &lit.lit else {
                return None;
            };
            Some((v.ident.to_string(), int.base10_parse::<u32>().ok()?))
        })
        .collect()
}

#[derive(Default)]
struct Items {
    enums: BTreeMap<String, String>,
    aliases: BTreeMap<String, Vec<syn::Type>>,
    records: BTreeMap<String, ()>,
}

fn error(source: &str, message: String) -> Diagnostics {
    Diagnostics(vec![Diagnostic {
        path: source.to_owned(),
        position: Position { line: 1, column: 1 },
        message,
    }])
}

/// The CUDA versions a `#[cfg(any(feature = "cuda-NNNNN", ...))]` names, newest first.
fn cfg_newest(attrs: &[syn::Attribute]) -> Option<u32> {
    let mut newest = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("cfg")) {
        let text = quote::ToTokens::to_token_stream(&attr.meta).to_string();
        for part in text.split("\"cuda-").skip(1) {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(v) = digits.parse::<u32>() {
                newest = Some(newest.map_or(v, |n: u32| n.max(v)));
            }
        }
    }
    newest
}

fn repr_of(attrs: &[syn::Attribute]) -> Option<String> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("repr"))
        .find_map(|a| {
            let text = quote::ToTokens::to_token_stream(&a.meta).to_string();
            ["u32", "i32", "u64", "i64", "u16", "i16", "u8", "i8"]
                .into_iter()
                .find(|r| text.contains(r))
                .map(str::to_owned)
        })
}

fn primitive(ident: &str) -> Option<&'static str> {
    Some(match ident {
        "u8" | "c_uchar" => "u8",
        "i8" | "c_char" | "c_schar" => "i8",
        "u16" | "c_ushort" => "u16",
        "i16" | "c_short" => "i16",
        "u32" | "c_uint" => "u32",
        "i32" | "c_int" => "i32",
        "u64" | "c_ulong" | "c_ulonglong" => "u64",
        "i64" | "c_long" | "c_longlong" => "i64",
        "usize" | "size_t" => "usize",
        "isize" => "isize",
        "f32" | "c_float" => "f32",
        "f64" | "c_double" => "f64",
        _ => return None,
    })
}

impl Items {
    fn abi(&self, ty: &syn::Type, depth: usize) -> Result<Abi, String> {
        if depth > 16 {
            return Err("type aliases nest more than 16 deep".into());
        }
        match ty {
            syn::Type::Ptr(p) => Ok(match p.mutability {
                syn::PointerMutability::Mut(_) => Abi::MutPtr,
                syn::PointerMutability::Const(_) => Abi::ConstPtr,
            }),
            syn::Type::FnPtr(_) => Ok(Abi::MutPtr),
            syn::Type::Paren(p) => self.abi(&p.elem, depth + 1),
            syn::Type::Path(p) => {
                let last = p.path.segments.last().ok_or("an empty type path")?;
                let ident = last.ident.to_string();
                if ident == "Option" {
                    // bindgen's nullable function pointer: pointer-sized.
                    return Ok(Abi::MutPtr);
                }
                if let Some(prim) = primitive(&ident) {
                    return Ok(Abi::Primitive(prim.to_owned()));
                }
                if let Some(repr) = self.enums.get(&ident) {
                    return Ok(Abi::Primitive(repr.clone()));
                }
                if let Some(targets) = self.aliases.get(&ident) {
                    let mut last_error = String::new();
                    for target in targets {
                        match self.abi(target, depth + 1) {
                            Ok(abi) => return Ok(abi),
                            Err(e) => last_error = e,
                        }
                    }
                    return Err(last_error);
                }
                if self.records.contains_key(&ident) {
                    return Ok(Abi::Struct(ident));
                }
                Err(format!("unknown type `{ident}`"))
            }
            other => Err(format!(
                "unsupported argument type `{}`",
                quote::ToTokens::to_token_stream(other)
            )),
        }
    }
}

/// Reads the bindings; `source` names them in messages and in the generated header.
pub fn read_bindings(source: &str, text: &str) -> Result<Bindings, Diagnostics> {
    let file = syn::parse_file(text).map_err(|e| {
        Diagnostics(vec![Diagnostic {
            path: source.to_owned(),
            position: Position { line: 1, column: 1 },
            message: format!("cannot parse the driver bindings: {e}"),
        }])
    })?;
    let mut items = Items::default();
    let mut functions: Vec<(String, Vec<syn::Type>, Option<u32>)> = Vec::new();
    let mut results: Vec<(Option<u32>, Variants)> = Vec::new();
    for item in &file.items {
        match item {
            syn::Item::Enum(e) => {
                let repr = repr_of(&e.attrs).unwrap_or_else(|| "u32".to_owned());
                items.enums.insert(e.ident.to_string(), repr);
                if e.ident == "cudaError_enum" {
                    results.push((cfg_newest(&e.attrs), result_variants(e)));
                }
            }
            syn::Item::Struct(s) => {
                items.records.insert(s.ident.to_string(), ());
            }
            syn::Item::Union(u) => {
                items.records.insert(u.ident.to_string(), ());
            }
            syn::Item::Type(t) => {
                items
                    .aliases
                    .entry(t.ident.to_string())
                    .or_default()
                    .push((*t.ty).clone());
            }
            syn::Item::Use(u) => {
                // `pub use self::X_enum as X;`
                if let syn::UseTree::Path(p) = &u.tree
                    && let syn::UseTree::Rename(r) = &*p.tree
                {
                    let target: syn::Type = syn::parse_str(&r.ident.to_string())
                        .map_err(|e| error(source, format!("use alias: {e}")))?;
                    items
                        .aliases
                        .entry(r.rename.to_string())
                        .or_default()
                        .push(target);
                }
            }
            syn::Item::Fn(f) if f.sig.ident.to_string().starts_with("cu") => {
                let returns_result = matches!(&f.sig.output, syn::ReturnType::Type(_, t)
                    if quote::ToTokens::to_token_stream(t).to_string() == "CUresult");
                if !returns_result {
                    continue;
                }
                let args = f
                    .sig
                    .inputs
                    .iter()
                    .map(|input| match input {
                        syn::FnArg::Typed(t) => Ok((*t.ty).clone()),
                        syn::FnArg::Receiver(_) => {
                            Err(error(source, format!("{}: a receiver", f.sig.ident)))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                functions.push((f.sig.ident.to_string(), args, cfg_newest(&f.attrs)));
            }
            _ => {}
        }
    }
    let mut out: BTreeMap<String, Function> = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, args, newest) in functions {
        let abi: Result<Vec<Abi>, String> = args.iter().map(|t| items.abi(t, 0)).collect();
        let abi = match abi {
            Ok(abi) => abi,
            Err(e) => {
                problems.push(Diagnostic {
                    path: source.to_owned(),
                    position: Position { line: 1, column: 1 },
                    message: format!("{name}: {e}"),
                });
                continue;
            }
        };
        let candidate = Function { args: abi, newest };
        // The newest definition of a name wins (`None` = every version = newest).
        let replace = match out.get(&name) {
            None => true,
            Some(old) => match (old.newest, newest) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(a), Some(b)) => b > a,
            },
        };
        if replace {
            out.insert(name, candidate);
        }
    }
    if !problems.is_empty() {
        return Err(Diagnostics(problems));
    }
    if out.is_empty() {
        return Err(error(
            source,
            "no driver function found (is this cudarc's driver/sys/mod.rs?)".into(),
        ));
    }
    // Oldest definitions first, so a newer one's name wins for a value both define
    // (`None` = every version = newest).
    results.sort_by_key(|(newest, _)| newest.map_or(u32::MAX, |v| v));
    let mut by_value = BTreeMap::new();
    for (_, variants) in results {
        for (name, value) in variants {
            by_value.insert(value, name);
        }
    }
    Ok(Bindings {
        source: source.to_owned(),
        functions: out,
        results: by_value,
    })
}
