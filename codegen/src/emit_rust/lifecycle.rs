//! The lifecycle's phase chain: each operation's phases and the capture and restore sequences.

use super::*;

/// The phase chain: each operation's phases, and the capture and restore sequences.
pub(super) fn emit_lifecycle(lifecycle: &crate::ir::Lifecycle) -> TokenStream {
    let operations = ident(&lifecycle.operations);
    let phases = ident(&lifecycle.phases);
    let doc = docs(&lifecycle.doc);
    let arms = |phase: fn(&crate::ir::Transition) -> &str| {
        lifecycle
            .chain
            .iter()
            .map(|t| {
                let operation = ident(&t.operation);
                let phase = ident(phase(t));
                quote!(#operations::#operation => #phases::#phase,)
            })
            .collect::<Vec<_>>()
    };
    let from = arms(|t| &t.from);
    let to = arms(|t| &t.to);
    let stage = |stage: crate::ast::Stage| {
        let list: Vec<TokenStream> = lifecycle
            .chain
            .iter()
            .filter(|t| t.stage == stage)
            .map(|t| {
                let operation = ident(&t.operation);
                quote!(#operations::#operation)
            })
            .collect();
        let count = Literal::usize_unsuffixed(list.len());
        (count, list)
    };
    let (capture_count, capture) = stage(crate::ast::Stage::Capture);
    let (restore_count, restore) = stage(crate::ast::Stage::Restore);
    quote! {
        #doc
        impl #operations {
            /// The phase a participant must be in to execute this operation.
            pub const fn from_phase(self) -> #phases {
                match self {
                    #(#from)*
                }
            }

            /// The phase the operation leads to.
            pub const fn to_phase(self) -> #phases {
                match self {
                    #(#to)*
                }
            }
        }

        /// The operations before the native checkpoint, in order.
        pub const CAPTURE_OPERATIONS: [#operations; #capture_count] = [#(#capture),*];

        /// The operations after the native restore, in order.
        pub const RESTORE_OPERATIONS: [#operations; #restore_count] = [#(#restore),*];
    }
}
