pub fn markdown(_: &crate::ir::Ir) -> String { String::new() }
