//! Enums: CUDA enums decoded explicitly from their integer (unknown values are errors), bit
//! sets with every bit known, name enums as snake_case strings, and the compile-time checks
//! that tie each CUDA value to cudarc's constant.

use super::*;

/// An enum of any encoding: its documentation, the items of its kind, and its serde impls.
pub(super) fn emit_enum(e: &Enum) -> TokenStream {
    let name = ident(&e.name);
    let (items, serde) = match &e.kind {
        EnumKind::Cuda { .. } => (
            emit_cuda_enum(e, &name),
            serde_u32(&name, quote!(self.as_u32())),
        ),
        EnumKind::CudaFlags { .. } => (emit_flags(e, &name), serde_u32(&name, quote!(self.0))),
        EnumKind::Name => (
            emit_name_enum(e, &name),
            serde_impls(
                &name,
                quote!(serializer.serialize_str(self.wire_name())),
                quote!(crate::wire::deserialize_wire_name(deserializer)),
            ),
        ),
    };
    let doc = docs(&e.doc);
    quote! {
        #doc
        #items
        #serde
    }
}

pub(super) fn value_doc(doc: &str, cuda: Option<&String>) -> String {
    match cuda {
        Some(cuda) => format!("{doc} Mirrors `{cuda}`."),
        None => doc.to_owned(),
    }
}

pub(super) fn rejection_arms(e: &Enum) -> Vec<TokenStream> {
    let name = &e.name;
    e.rejected
        .iter()
        .map(|rejected| {
            let value = Literal::u32_unsuffixed(rejected.value);
            let cuda = rejected.cuda.clone().unwrap_or_default();
            let reason = &rejected.reason;
            quote! {
                #value => Err(crate::error::EnumError::Rejected {
                    domain: #name,
                    value,
                    cuda: #cuda,
                    reason: #reason,
                }),
            }
        })
        .collect()
}

fn emit_cuda_enum(e: &Enum, name: &proc_macro2::Ident) -> TokenStream {
    let name_str = &e.name;
    let variants = e.values.iter().map(|value| {
        let variant = ident(&value.name);
        let number = Literal::u32_unsuffixed(value.value.unwrap_or_default());
        let doc = docs(&value_doc(&value.doc, value.cuda.as_ref()));
        quote! {
            #doc
            #variant = #number,
        }
    });
    let all = e.values.iter().map(|value| ident(&value.name));
    let accept = e.values.iter().map(|value| {
        let variant = ident(&value.name);
        let number = Literal::u32_unsuffixed(value.value.unwrap_or_default());
        quote!(#number => Ok(Self::#variant),)
    });
    let cuda_names = e.values.iter().map(|value| {
        let variant = ident(&value.name);
        let cuda = value.cuda.clone().unwrap_or_default();
        quote!(Self::#variant => #cuda,)
    });
    let reject = rejection_arms(e);
    quote! {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(u32)]
        pub enum #name {
            #(#variants)*
        }
        impl #name {
            /// Every accepted value, in schema order.
            pub const ALL: &'static [Self] = &[#(Self::#all),*];
            /// The CUDA integer value.
            pub const fn as_u32(self) -> u32 {
                self as u32
            }
            /// The CUDA constant this value mirrors.
            pub const fn cuda_name(self) -> &'static str {
                match self {
                    #(#cuda_names)*
                }
            }
        }
        impl TryFrom<u32> for #name {
            type Error = crate::error::EnumError;
            fn try_from(value: u32) -> Result<Self, Self::Error> {
                match value {
                    #(#accept)*
                    #(#reject)*
                    _ => Err(crate::error::EnumError::Unknown { domain: #name_str, value }),
                }
            }
        }
        impl From<#name> for u32 {
            fn from(value: #name) -> u32 {
                value.as_u32()
            }
        }
    }
}

fn emit_flags(e: &Enum, name: &proc_macro2::Ident) -> TokenStream {
    let name_str = &e.name;
    let consts = e.values.iter().map(|value| {
        let constant = format_ident!("{}", screaming_snake_case(&value.name));
        let number = Literal::u32_unsuffixed(value.value.unwrap_or_default());
        let doc = docs(&value_doc(&value.doc, value.cuda.as_ref()));
        quote! {
            #doc
            pub const #constant: Self = Self(#number);
        }
    });
    let known: u32 = e
        .values
        .iter()
        .filter_map(|value| value.value)
        .fold(0, |a, b| a | b);
    let known = Literal::u32_unsuffixed(known);
    let names = e
        .values
        .iter()
        .filter(|value| value.value != Some(0))
        .map(|value| {
            let number = Literal::u32_unsuffixed(value.value.unwrap_or_default());
            let label = screaming_snake_case(&value.name);
            quote!((#number, #label))
        });
    let reject = rejection_arms(e);
    quote! {
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct #name(u32);
        impl #name {
            #(#consts)*
            /// Every bit this domain knows.
            pub const KNOWN_BITS: u32 = #known;
            const NAMES: &'static [(u32, &'static str)] = &[#(#names),*];
            /// The raw bit set.
            pub const fn bits(self) -> u32 {
                self.0
            }
            /// Whether every bit of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }
            /// The union of two sets.
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }
        }
        impl TryFrom<u32> for #name {
            type Error = crate::error::EnumError;
            fn try_from(value: u32) -> Result<Self, Self::Error> {
                match value {
                    #(#reject)*
                    _ if value & !Self::KNOWN_BITS != 0 => Err(crate::error::EnumError::UnknownBits {
                        domain: #name_str,
                        value,
                        unknown: value & !Self::KNOWN_BITS,
                    }),
                    _ => Ok(Self(value)),
                }
            }
        }
        impl From<#name> for u32 {
            fn from(value: #name) -> u32 {
                value.0
            }
        }
        impl core::fmt::Debug for #name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                crate::wire::fmt_flags(f, #name_str, self.0, Self::NAMES)
            }
        }
    }
}

fn emit_name_enum(e: &Enum, name: &proc_macro2::Ident) -> TokenStream {
    let name_str = &e.name;
    let variants = e.values.iter().map(|value| {
        let variant = ident(&value.name);
        let doc = docs(&format!("{} Wire name `{}`.", value.doc, value.wire_name));
        quote! {
            #doc
            #variant,
        }
    });
    let all = e.values.iter().map(|value| ident(&value.name));
    let wire_names = e.values.iter().map(|value| &value.wire_name);
    quote! {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum #name {
            #(#variants)*
        }
        impl crate::wire::WireName for #name {
            const NAME: &'static str = #name_str;
            const ALL: &'static [Self] = &[#(Self::#all),*];
            const WIRE_NAMES: &'static [&'static str] = &[#(#wire_names),*];
        }
        impl #name {
            /// The snake_case name this value travels as.
            pub fn wire_name(self) -> &'static str {
                crate::wire::wire_name(self)
            }
        }
        impl core::fmt::Display for #name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.wire_name())
            }
        }
        impl core::str::FromStr for #name {
            type Err = crate::error::EnumError;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                crate::wire::from_wire_name(text)
            }
        }
    }
}

pub(super) fn emit_cuda_checks(e: &Enum) -> Option<TokenStream> {
    let (cudarc, flags) = match &e.kind {
        EnumKind::Cuda { cudarc } => (cudarc, false),
        EnumKind::CudaFlags { cudarc } => (cudarc, true),
        EnumKind::Name => return None,
    };
    let ty = ident(cudarc);
    let pairs = e
        .values
        .iter()
        .filter_map(|value| Some((value.cuda.as_ref()?, value.value?)))
        .chain(
            e.rejected
                .iter()
                .filter_map(|rejected| Some((rejected.cuda.as_ref()?, rejected.value))),
        );
    let asserts = pairs.map(|(cuda, value)| {
        let constant = ident(cuda);
        let number = Literal::u32_unsuffixed(value);
        let message = format!("schema value of {cuda} differs from CUDA's");
        let read = if flags {
            quote!(cudarc::driver::sys::#ty::#constant.0)
        } else {
            quote!(cudarc::driver::sys::#ty::#constant as u32)
        };
        quote!(assert!(#read == #number, #message);)
    });
    Some(quote! {
        const _: () = {
            #(#asserts)*
        };
    })
}
