pub fn compat() {}
