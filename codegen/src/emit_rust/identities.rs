//! Identities: never-zero pids and fixed-size byte ids (16 or 32 bytes) with their strict wire
//! forms.

use super::*;

pub(super) fn emit_identity(identity: &Identity) -> TokenStream {
    let name = ident(&identity.name);
    let name_str = &identity.name;
    let doc = docs(&identity.doc);
    match identity.repr {
        IdentityRepr::U32 => {
            let serde = serde_u32(&name, quote!(self.get()));
            quote! {
            #doc
            #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
            pub struct #name(core::num::NonZeroU32);
            impl #name {
                /// `None` for 0, which never names anything.
                pub const fn new(value: u32) -> Option<Self> {
                    match core::num::NonZeroU32::new(value) {
                        Some(value) => Some(Self(value)),
                        None => None,
                    }
                }
                pub const fn get(self) -> u32 {
                    self.0.get()
                }
            }
            impl TryFrom<u32> for #name {
                type Error = crate::error::IdentityError;
                fn try_from(value: u32) -> Result<Self, Self::Error> {
                    Self::new(value).ok_or(crate::error::IdentityError::Zero { identity: #name_str })
                }
            }
            impl From<#name> for u32 {
                fn from(value: #name) -> u32 {
                    value.get()
                }
            }
            impl core::fmt::Display for #name {
                fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                    core::fmt::Display::fmt(&self.get(), f)
                }
            }
            impl core::fmt::Debug for #name {
                fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                    write!(f, "{}({})", #name_str, self.get())
                }
            }
            impl core::str::FromStr for #name {
                type Err = crate::error::IdentityError;
                fn from_str(text: &str) -> Result<Self, Self::Err> {
                    crate::wire::parse_u32_identity(#name_str, text).and_then(Self::try_from)
                }
            }
            impl crate::layout::FixedField for #name {
                const SIZE: usize = 4;
                fn read(bytes: &[u8]) -> Result<Self, crate::error::IdentityError> {
                    Self::try_from(<u32 as crate::layout::FixedField>::read(bytes)?)
                }
                fn write(&self, out: &mut [u8]) {
                    self.get().write(out)
                }
            }
            #serde
            }
        }
        IdentityRepr::Bytes16 | IdentityRepr::Bytes32 => {
            let n = proc_macro2::Literal::usize_unsuffixed(identity.repr.size());
            let what = format!("{} bytes", identity.repr.size());
            let serde = serde_impls(
                &name,
                quote!(crate::wire::serialize_fixed_bytes(serializer, &self.0)),
                quote!(crate::wire::deserialize_fixed_identity::<Self, D, #n>(deserializer, #what)),
            );
            quote! {
                #doc
                #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
                pub struct #name([u8; #n]);
                impl #name {
                    /// `None` for all-zero bytes, which never name anything.
                    pub const fn new(bytes: [u8; #n]) -> Option<Self> {
                        if crate::wire::all_zero(&bytes) { None } else { Some(Self(bytes)) }
                    }
                    pub const fn as_bytes(&self) -> &[u8; #n] {
                        &self.0
                    }
                }
                impl TryFrom<[u8; #n]> for #name {
                    type Error = crate::error::IdentityError;
                    fn try_from(bytes: [u8; #n]) -> Result<Self, Self::Error> {
                        Self::new(bytes).ok_or(crate::error::IdentityError::Zero { identity: #name_str })
                    }
                }
                impl TryFrom<&[u8]> for #name {
                    type Error = crate::error::IdentityError;
                    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
                        let array: [u8; #n] = bytes.try_into().map_err(|_| crate::error::IdentityError::Length {
                            identity: #name_str,
                            expected: #n,
                            found: bytes.len(),
                        })?;
                        Self::try_from(array)
                    }
                }
                impl core::fmt::Display for #name {
                    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                        crate::wire::fmt_hex(f, &self.0)
                    }
                }
                impl core::fmt::Debug for #name {
                    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                        write!(f, "{}({})", #name_str, self)
                    }
                }
                impl core::str::FromStr for #name {
                    type Err = crate::error::IdentityError;
                    fn from_str(text: &str) -> Result<Self, Self::Err> {
                        crate::wire::parse_hex_fixed::<#n>(#name_str, text).and_then(Self::try_from)
                    }
                }
                impl crate::layout::FixedField for #name {
                    const SIZE: usize = #n;
                    fn read(bytes: &[u8]) -> Result<Self, crate::error::IdentityError> {
                        Self::try_from(bytes)
                    }
                    fn write(&self, out: &mut [u8]) {
                        out.copy_from_slice(&self.0)
                    }
                }
                #serde
            }
        }
    }
}
