//! Fixed byte layouts: encoders and decoders that reject a wrong magic, version, size or a
//! non-zero reserved byte.

use super::*;

pub(super) fn emit_layout(layout: &Layout) -> TokenStream {
    let name = ident(&layout.name);
    let name_str = &layout.name;
    let size = Literal::usize_unsuffixed(layout.size as usize);
    let mut doc = format!(
        "{}\n\nFixed layout, {} bytes, little-endian:\n",
        layout.doc, layout.size
    );
    for field in &layout.fields {
        let what = match &field.kind {
            LayoutFieldKind::Magic(text) => format!("magic `{text}`"),
            LayoutFieldKind::Version => "protocol version byte".to_owned(),
            LayoutFieldKind::VersionDigit => {
                "protocol version as one ASCII digit (0-9, then A-Z)".to_owned()
            }
            LayoutFieldKind::Reserved => "reserved, zero".to_owned(),
            LayoutFieldKind::Value { ty, nonzero } => format!(
                "`{}`{}",
                ty.schema_text(),
                if *nonzero { ", never 0" } else { "" }
            ),
        };
        doc.push_str(&format!(
            "\n- bytes {}..{}: `{}`, {what}",
            field.offset,
            field.offset + field.size,
            field.name
        ));
    }
    let value_fields: Vec<_> = layout
        .fields
        .iter()
        .filter_map(|field| match &field.kind {
            LayoutFieldKind::Value { ty, nonzero } => Some((field, ty, *nonzero)),
            _ => None,
        })
        .collect();
    let declarations = value_fields.iter().map(|(field, ty, nonzero)| {
        let field_name = ident(&field.name);
        let ty = layout_type(ty, *nonzero);
        quote!(pub #field_name: #ty,)
    });
    let encode = layout.fields.iter().map(|field| {
        let start = Literal::usize_unsuffixed(field.offset as usize);
        let end = Literal::usize_unsuffixed((field.offset + field.size) as usize);
        match &field.kind {
            LayoutFieldKind::Magic(text) => {
                let bytes = Literal::byte_string(text.as_bytes());
                quote!(bytes[#start..#end].copy_from_slice(#bytes);)
            }
            LayoutFieldKind::Version => quote!(bytes[#start] = VERSION;),
            LayoutFieldKind::VersionDigit => quote!(bytes[#start] = crate::layout::version_digit(VERSION);),
            LayoutFieldKind::Reserved => quote!(),
            LayoutFieldKind::Value { .. } => {
                let field_name = ident(&field.name);
                quote!(crate::layout::FixedField::write(&self.#field_name, &mut bytes[#start..#end]);)
            }
        }
    });
    let decode = layout.fields.iter().map(|field| {
        let start = Literal::usize_unsuffixed(field.offset as usize);
        let end = Literal::usize_unsuffixed((field.offset + field.size) as usize);
        let field_str = &field.name;
        match &field.kind {
            LayoutFieldKind::Magic(text) => {
                let bytes_lit = Literal::byte_string(text.as_bytes());
                quote!(crate::layout::check_magic(#name_str, &bytes[#start..#end], #bytes_lit)?;)
            }
            LayoutFieldKind::Version => {
                quote!(crate::layout::check_version(#name_str, bytes[#start], VERSION)?;)
            }
            LayoutFieldKind::VersionDigit => {
                quote!(crate::layout::check_version(#name_str, crate::layout::digit_version(bytes[#start]), VERSION)?;)
            }
            LayoutFieldKind::Reserved => {
                quote!(crate::layout::check_reserved(#name_str, #field_str, #start, &bytes[#start..#end])?;)
            }
            LayoutFieldKind::Value { .. } => {
                let field_name = ident(&field.name);
                quote!(let #field_name = crate::layout::read_field(#name_str, #field_str, &bytes[#start..#end])?;)
            }
        }
    });
    let build = value_fields.iter().map(|(field, ..)| ident(&field.name));
    let doc = docs(&doc);
    let serde = serde_wire(&name, "layout");
    quote! {
        #doc
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct #name {
            #(#declarations)*
        }
        impl #name {
            /// Exact encoded size in bytes.
            pub const SIZE: usize = #size;
            /// The fixed bytes of this value.
            pub fn encode(&self) -> [u8; #size] {
                let mut bytes = [0u8; #size];
                #(#encode)*
                bytes
            }
            /// Decodes exactly `SIZE` bytes; a wrong length, magic or version, a non-zero
            /// reserved byte or an invalid field is an error.
            pub fn decode(bytes: &[u8]) -> Result<Self, crate::layout::LayoutError> {
                let bytes: &[u8; #size] = crate::layout::exact(#name_str, bytes)?;
                #(#decode)*
                Ok(Self { #(#build),* })
            }
        }
        impl crate::layout::FixedLayout for #name {
            const NAME: &'static str = #name_str;
            const SIZE: usize = #size;
            fn encode_vec(&self) -> Vec<u8> {
                self.encode().to_vec()
            }
            fn decode_bytes(bytes: &[u8]) -> Result<Self, crate::layout::LayoutError> {
                Self::decode(bytes)
            }
        }
        #serde
    }
}
