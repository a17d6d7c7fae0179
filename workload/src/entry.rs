//! How the worker finds driver entry points (`--entry`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The CUDA version the runtime entry path asks `cudaGetDriverEntryPointByVersion` for.
pub const RUNTIME_ENTRY_VERSION: u32 = 12030;

/// One way of resolving driver functions. Its text form is the worker's `--entry` value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EntryPath {
    /// `dlsym(handle, "cuMemCreate")` on the `dlopen` handle of the driver (`dlsym`).
    #[default]
    Dlsym,
    /// `dlsym(RTLD_DEFAULT, name)` (`default`); the driver is opened `RTLD_GLOBAL`.
    Default,
    /// `dlsym(RTLD_NEXT, name)` (`next`); the driver is opened `RTLD_GLOBAL`.
    Next,
    /// `cuGetProcAddress_v2(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status)` with
    /// cuda.h's unsuffixed names (`proc-address:VERSION`).
    ProcAddress(u32),
    /// The legacy four-argument `cuGetProcAddress(name, &p, version, 0)`
    /// (`proc-address-v1:VERSION`).
    ProcAddressV1(u32),
    /// A CUDA runtime library's `cudaGetDriverEntryPointByVersion(name, &p, 12030, 0, &status)`,
    /// or `cudaGetDriverEntryPoint` where that is absent (`runtime:LIBPATH`).
    Runtime(PathBuf),
}

impl EntryPath {
    /// The CUDA version whose unsuffixed names this path resolves, if it resolves by version.
    pub fn api_version(&self) -> Option<u32> {
        match self {
            EntryPath::ProcAddress(v) | EntryPath::ProcAddressV1(v) => Some(*v),
            EntryPath::Runtime(_) => Some(RUNTIME_ENTRY_VERSION),
            EntryPath::Dlsym | EntryPath::Default | EntryPath::Next => None,
        }
    }
}

impl fmt::Display for EntryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryPath::Dlsym => f.write_str("dlsym"),
            EntryPath::Default => f.write_str("default"),
            EntryPath::Next => f.write_str("next"),
            EntryPath::ProcAddress(v) => write!(f, "proc-address:{v}"),
            EntryPath::ProcAddressV1(v) => write!(f, "proc-address-v1:{v}"),
            EntryPath::Runtime(p) => write!(f, "runtime:{}", p.display()),
        }
    }
}

/// A `--entry` value that is not one of the forms above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad entry path {0:?}: expected dlsym, default, next, proc-address:VERSION, \
     proc-address-v1:VERSION or runtime:LIBPATH"
)]
pub struct BadEntryPath(pub String);

impl FromStr for EntryPath {
    type Err = BadEntryPath;

    fn from_str(s: &str) -> Result<EntryPath, BadEntryPath> {
        let bad = || BadEntryPath(s.to_owned());
        let version = |v: &str| v.parse::<u32>().map_err(|_| bad());
        match s.split_once(':') {
            None => match s {
                "dlsym" => Ok(EntryPath::Dlsym),
                "default" => Ok(EntryPath::Default),
                "next" => Ok(EntryPath::Next),
                _ => Err(bad()),
            },
            Some(("proc-address", v)) => Ok(EntryPath::ProcAddress(version(v)?)),
            Some(("proc-address-v1", v)) => Ok(EntryPath::ProcAddressV1(version(v)?)),
            Some(("runtime", p)) if !p.is_empty() => Ok(EntryPath::Runtime(PathBuf::from(p))),
            Some(_) => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for e in [
            EntryPath::Dlsym,
            EntryPath::Default,
            EntryPath::Next,
            EntryPath::ProcAddress(12030),
            EntryPath::ProcAddressV1(12000),
            EntryPath::Runtime(PathBuf::from("/opt/cuda/lib64/libcudart.so.12")),
        ] {
            assert_eq!(e.to_string().parse::<EntryPath>(), Ok(e.clone()));
        }
        assert!("proc-address:x".parse::<EntryPath>().is_err());
        assert!("runtime:".parse::<EntryPath>().is_err());
        assert!("dlopen".parse::<EntryPath>().is_err());
    }
}
