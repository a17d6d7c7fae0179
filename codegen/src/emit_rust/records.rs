//! Structs and unions: bounded serde maps keyed by field name, unions tagged by `kind` first.

use super::*;

/// A struct's declaration and its `WireStruct` implementation.
pub(super) fn emit_fields_struct(name_str: &str, doc_text: &str, fields: &[Field]) -> TokenStream {
    let name = ident(name_str);
    let doc = docs(doc_text);
    let declarations = fields.iter().map(|field| {
        let field_name = ident(&field.name);
        let ty = rust_type(&field.ty);
        let doc = docs(&format!(
            "{} Schema type `{}`.",
            field.doc,
            field.ty.schema_text()
        ));
        quote! {
            #doc
            pub #field_name: #ty,
        }
    });
    let names: Vec<&String> = fields.iter().map(|field| &field.name).collect();
    let serialize = fields.iter().map(|field| {
        let field_name = ident(&field.name);
        let key = &field.name;
        quote!(out.serialize_field(#key, &self.#field_name)?;)
    });
    let body = if fields.is_empty() {
        quote! {
            crate::wire::expect_no_fields(map)?;
            Ok(Self {})
        }
    } else {
        let slots = fields.iter().map(|field| {
            let slot = format_ident!("field_{}", field.name);
            let ty = rust_type(&field.ty);
            quote!(let mut #slot: Option<#ty> = None;)
        });
        let last = fields.len() - 1;
        let arms = fields.iter().enumerate().map(|(index, field)| {
            let slot = format_ident!("field_{}", field.name);
            let key = &field.name;
            let pattern = if index == last {
                quote!(_)
            } else {
                let index = Literal::usize_unsuffixed(index);
                quote!(#index)
            };
            quote!(#pattern => crate::wire::set_once(&mut #slot, #key, map)?,)
        });
        let build = fields.iter().map(|field| {
            let field_name = ident(&field.name);
            let slot = format_ident!("field_{}", field.name);
            let key = &field.name;
            quote!(#field_name: crate::wire::required(#slot, #key)?,)
        });
        quote! {
            #(#slots)*
            while let Some(index) = map.next_key_seed(crate::wire::FieldSeed(Self::FIELDS))? {
                match index {
                    #(#arms)*
                }
            }
            Ok(Self { #(#build)* })
        }
    };
    let out_param = if fields.is_empty() {
        quote!(_out)
    } else {
        quote!(out)
    };
    quote! {
        #doc
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct #name {
            #(#declarations)*
        }
        impl crate::wire::WireStruct for #name {
            const NAME: &'static str = #name_str;
            const FIELDS: &'static [&'static str] = &[#(#names),*];
            fn serialize_fields<M: serde::ser::SerializeStruct>(&self, #out_param: &mut M) -> Result<(), M::Error> {
                #(#serialize)*
                Ok(())
            }
            fn deserialize_fields<'de, A: serde::de::MapAccess<'de>>(map: &mut A) -> Result<Self, A::Error> {
                #body
            }
        }
    }
}

pub(super) fn emit_struct(s: &Struct) -> TokenStream {
    let name = ident(&s.name);
    let declaration = emit_fields_struct(&s.name, &s.doc, &s.fields);
    let serde = serde_wire(&name, "struct");
    quote! {
        #declaration
        #serde
    }
}

pub(super) fn emit_union(u: &Union) -> TokenStream {
    let name = ident(&u.name);
    let name_str = &u.name;
    let doc = docs(&u.doc);
    let payloads = u
        .variants
        .iter()
        .filter(|variant| !variant.fields.is_empty())
        .map(|variant| {
            let doc = format!(
                "Fields of [`{}::{}`] (wire kind `{}`).",
                u.name, variant.name, variant.wire_name
            );
            let struct_name = variant.struct_name(&u.name);
            let declaration = emit_fields_struct(&struct_name, &doc, &variant.fields);
            let struct_ident = ident(&struct_name);
            let variant_ident = ident(&variant.name);
            quote! {
                #declaration
                impl From<#struct_ident> for #name {
                    fn from(value: #struct_ident) -> Self {
                        Self::#variant_ident(value)
                    }
                }
            }
        });
    let variants = u.variants.iter().map(|variant| {
        let variant_ident = ident(&variant.name);
        let doc = docs(&format!(
            "{} Wire kind `{}`.",
            variant.doc, variant.wire_name
        ));
        if variant.fields.is_empty() {
            quote! {
                #doc
                #variant_ident,
            }
        } else {
            let struct_ident = ident(&variant.struct_name(&u.name));
            quote! {
                #doc
                #variant_ident(#struct_ident),
            }
        }
    });
    let kinds = u.variants.iter().map(|variant| &variant.wire_name);
    let kind_arms = u.variants.iter().map(|variant| {
        let variant_ident = ident(&variant.name);
        let wire = &variant.wire_name;
        if variant.fields.is_empty() {
            quote!(Self::#variant_ident => #wire,)
        } else {
            quote!(Self::#variant_ident(_) => #wire,)
        }
    });
    let serialize_arms = u.variants.iter().map(|variant| {
        let variant_ident = ident(&variant.name);
        let wire = &variant.wire_name;
        if variant.fields.is_empty() {
            quote!(Self::#variant_ident => crate::wire::serialize_unit_variant(serializer, #name_str, #wire),)
        } else {
            quote!(Self::#variant_ident(fields) => crate::wire::serialize_variant(serializer, #name_str, #wire, fields),)
        }
    });
    let last = u.variants.len().saturating_sub(1);
    let deserialize_arms = u.variants.iter().enumerate().map(|(index, variant)| {
        let variant_ident = ident(&variant.name);
        let pattern = if index == last {
            quote!(_)
        } else {
            let index = Literal::usize_unsuffixed(index);
            quote!(#index)
        };
        if variant.fields.is_empty() {
            quote! {
                #pattern => {
                    crate::wire::expect_no_fields(map)?;
                    Ok(Self::#variant_ident)
                }
            }
        } else {
            quote!(#pattern => Ok(Self::#variant_ident(crate::wire::WireStruct::deserialize_fields(map)?)),)
        }
    });
    let serde = serde_impls(
        &name,
        quote!(match self { #(#serialize_arms)* }),
        quote!(crate::wire::deserialize_union(deserializer)),
    );
    quote! {
        #(#payloads)*
        #doc
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum #name {
            #(#variants)*
        }
        impl #name {
            /// The wire kind of this value.
            pub fn kind(&self) -> &'static str {
                match self {
                    #(#kind_arms)*
                }
            }
        }
        impl crate::wire::WireUnion for #name {
            const NAME: &'static str = #name_str;
            const KINDS: &'static [&'static str] = &[#(#kinds),*];
            fn deserialize_variant<'de, A: serde::de::MapAccess<'de>>(index: usize, map: &mut A) -> Result<Self, A::Error> {
                match index {
                    #(#deserialize_arms)*
                }
            }
        }
        #serde
    }
}
