//! Link flags that make the cdylib a drop-in `libcuda.so.1`.
fn main() {
    // Calls between fakecuda's own exported functions (e.g. the pointers cuGetProcAddress
    // hands out) must bind to fakecuda itself, not to an interposer that exports the same
    // names.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
