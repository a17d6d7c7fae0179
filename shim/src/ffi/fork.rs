//! Fork handlers are installed when the library is loaded, before any thread of the shim or
//! any record exists, so that no fork can copy a half-changed record into a child.

extern "C" fn install() {
    crate::runtime::fork::install();
}

/// Run by the dynamic loader once the library is mapped (an ELF constructor).
#[used]
#[unsafe(link_section = ".init_array")]
static INSTALL_AT_LOAD: extern "C" fn() = install;
