//! The table as two Rust modules of the shim: at its bottom floor the names, their gate class
//! and a name lookup; at its FFI edge the wrapper of each and one exported pass-through per
//! generated entry point.

use super::{Abi, Table, Wrapper};
use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;

fn abi_type(abi: &Abi) -> TokenStream {
    match abi {
        Abi::Primitive(p) => {
            let p = Ident::new(p, Span::call_site());
            quote!(#p)
        }
        Abi::MutPtr => quote!(*mut c_void),
        Abi::ConstPtr => quote!(*const c_void),
        Abi::Struct(s) => {
            let s = Ident::new(s, Span::call_site());
            quote!(cudarc::driver::sys::#s)
        }
    }
}

/// The two generated modules, formatted, each with a header naming its sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// `shim/src/sys/entries.rs`: names, gate classes, ids, the name lookup.
    pub names: String,
    /// `shim/src/ffi/generated.rs`: the exported pass-throughs and the wrapper table.
    pub exports: String,
}

/// Emits both modules of the table.
pub fn emit(table: &Table, policy: &str) -> Result<Emitted, syn::Error> {
    let count = table.entries.len();
    let names = table.entries.iter().map(|e| format!("{}\0", e.name));
    let open = table.entries.iter().map(|e| e.open);
    let hand = table
        .entries
        .iter()
        .map(|e| e.wrapper == Wrapper::HandWritten);
    let lookup = table.entries.iter().enumerate().map(|(i, e)| {
        let i = proc_macro2::Literal::usize_unsuffixed(i);
        let name = proc_macro2::Literal::byte_string(e.name.as_bytes());
        quote!(#name => Some(#i),)
    });
    let wrappers = table.entries.iter().enumerate().map(|(i, e)| {
        let i = proc_macro2::Literal::usize_unsuffixed(i);
        let ident = Ident::new(&e.name, Span::call_site());
        quote!(#i => #ident as *mut c_void,)
    });
    let ids = table
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.wrapper == Wrapper::HandWritten)
        .map(|(i, e)| {
            let ident = Ident::new(&e.name, Span::call_site());
            let i = proc_macro2::Literal::usize_unsuffixed(i);
            quote!(pub const #ident: usize = #i;)
        });
    let functions = table.entries.iter().enumerate().filter_map(|(i, e)| {
        let Wrapper::PassThrough(args) = &e.wrapper else {
            return None;
        };
        let ident = Ident::new(&e.name, Span::call_site());
        let i = proc_macro2::Literal::usize_unsuffixed(i);
        let params: Vec<Ident> = (0..args.len()).map(|n| Ident::new(&format!("a{n}"), Span::call_site())).collect();
        let types: Vec<TokenStream> = args.iter().map(abi_type).collect();
        Some(quote! {
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn #ident(#(#params: #types),*) -> u32 {
                forward(#i, |f| unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(#(#types),*) -> u32>(f)(#(#params),*)
                })
            }
        })
    });
    let exports = quote! {
        use super::exports::*;
        use super::passthrough::forward;
        use super::pools::*;
        use super::proc_address::*;
        use std::ffi::c_void;

        /// The shim's function for entry point `index` (see `crate::sys::entries`).
        pub fn wrapper(index: usize) -> *mut c_void {
            match index {
                #(#wrappers)*
                _ => std::ptr::null_mut(),
            }
        }

        #(#functions)*
    };
    let names = quote! {
        /// How many entry points the shim answers.
        pub const COUNT: usize = #count;

        /// Every entry point the shim answers, sorted by name, each NUL-terminated.
        pub const NAMES: [&str; COUNT] = [#(#names),*];

        /// Whether the entry point of the same index stays open during a checkpoint.
        pub const OPEN: [bool; COUNT] = [#(#open),*];

        /// Whether the entry point of the same index is hand-written (tracked) rather than a
        /// generated pass-through.
        pub const HAND_WRITTEN: [bool; COUNT] = [#(#hand),*];

        /// The index of each hand-written entry point, so its wrapper names itself without a
        /// lookup by name on every call.
        #[allow(non_upper_case_globals)]
        pub mod id {
            #(#ids)*
        }

        /// The index of the entry point named `name` (without NUL).
        pub fn index(name: &[u8]) -> Option<usize> {
            match name {
                #(#lookup)*
                _ => None,
            }
        }

        /// The name of entry point `index` (without its NUL); `"?"` out of range.
        pub fn name(index: usize) -> &'static str {
            match NAMES.get(index) {
                Some(name) => name.trim_end_matches('\0'),
                None => "?",
            }
        }
    };
    let names_file: syn::File = syn::parse2(names)?;
    let exports_file: syn::File = syn::parse2(exports)?;
    let source = &table.source;
    let names_header = format!(
        "// @generated by `cuinterpose-codegen entry-points` from {source} and {policy}.\n\
         // Do not edit: change the policy (or the cudarc version) and regenerate.\n\
         //\n\
         // The names and gate classes of the shim's driver entry points, at the bottom floor so\n\
         // that the gate's and the lifecycle's reports can name a function; the exported\n\
         // functions themselves are in `shim/src/ffi/generated.rs`.\n\n"
    );
    let exports_header = format!(
        "// @generated by `cuinterpose-codegen entry-points` from {source} and {policy}.\n\
         // Do not edit: change the policy (or the cudarc version) and regenerate.\n\
         //\n\
         // SAFETY (every pass-through's one unsafe block, written once here because the\n\
         // formatter drops comments): `f` is the driver's own function of the entry's exact name,\n\
         // resolved by that name from the driver library; its C prototype is the one cudarc's\n\
         // bindings declare for the name, with each argument reduced to its ABI class; the\n\
         // caller's arguments are passed on unchanged, under the caller's cuda.h contract.\n\
         #![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]\n\
         #![allow(clippy::undocumented_unsafe_blocks)]\n\n"
    );
    Ok(Emitted {
        names: names_header + &prettyplease::unparse(&names_file),
        exports: exports_header + &prettyplease::unparse(&exports_file),
    })
}
