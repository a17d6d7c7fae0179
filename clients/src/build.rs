//! The artifacts the scenarios need, built for the running test's target directory and
//! profile: the shim, fakecuda, the worker (through `cuinterpose-workload`), fakecuda's
//! native checkpoint tool, the test kit's two stand-in CUDA runtimes and the direct-symbol
//! library (C, in `clients/c/`).

use cuinterpose_testkit::{fakecuda_lib_dir, target_profile_dir};
use cuinterpose_workload::EntryPath;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn compile(source: &str, output: &Path, args: &[&str]) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("c").join(source);
    cuinterpose_testkit::cc(&source, output, &[&["-shared", "-fPIC"], args].concat());
}

/// A directory private to this test process (concurrent test binaries do not share outputs).
fn output_dir(what: &str) -> PathBuf {
    let dir = target_profile_dir()
        .join("clients-c")
        .join(format!("{what}.{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the C output directory");
    dir
}

/// The test kit's stand-in CUDA runtime as `libcudart.so.13` (see
/// [`cuinterpose_testkit::stand_in_runtime`]).
pub fn fake_runtime(legacy: bool) -> &'static Path {
    cuinterpose_testkit::stand_in_runtime(legacy)
}

/// The direct-symbol library (`c/direct.c`): linked against `libcuda.so.1`, it hands out the
/// addresses the dynamic linker bound its driver calls to.
pub fn direct_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let out = output_dir("direct").join("libclients-direct.so");
        let lib = format!("-L{}", fakecuda_lib_dir().display());
        compile("direct.c", &out, &[&lib, "-l:libcuda.so.1"]);
        out
    })
}

/// fakecuda's native checkpoint tool (`fakecuda-checkpoint`), built once per test process.
pub fn checkpoint_tool() -> &'static Path {
    cuinterpose_testkit::build_fakecuda_checkpoint()
}

/// Every way a client reaches the driver (clients.md §5.13), as worker entry paths:
///
/// - `dlsym` on a `dlopen("libcuda.so.1")` handle (PyTorch 2.1–2.7, NCCL ≤ 2.20);
/// - `dlsym(RTLD_DEFAULT)` and `dlsym(RTLD_NEXT)` (a preloaded library such as
///   torch_memory_saver);
/// - `cuGetProcAddress_v2` at CUDA 10.2, 12.0 and 12.3 (cuda-python, NCCL ≤ 2.20's versions),
///   and the legacy four-argument `cuGetProcAddress`;
/// - `cudaGetDriverEntryPointByVersion` and `cudaGetDriverEntryPoint` of a runtime that loads
///   the driver privately (PyTorch's c10 DriverAPI, NCCL ≥ 2.21);
/// - direct symbols bound by the dynamic linker (vLLM's cumem allocator, mscclpp).
pub fn entry_paths() -> Vec<EntryPath> {
    vec![
        EntryPath::Dlsym,
        EntryPath::Default,
        EntryPath::Next,
        EntryPath::ProcAddress(10020),
        EntryPath::ProcAddress(12000),
        EntryPath::ProcAddress(12030),
        EntryPath::ProcAddressV1(12000),
        EntryPath::Runtime(fake_runtime(false).to_path_buf()),
        EntryPath::Runtime(fake_runtime(true).to_path_buf()),
        EntryPath::Runtime(direct_library().to_path_buf()),
    ]
}

/// A short name of an entry path for messages.
pub fn entry_name(entry: &EntryPath) -> String {
    match entry {
        EntryPath::Runtime(p) if p == direct_library() => "direct-symbols".to_owned(),
        EntryPath::Runtime(p) if p == fake_runtime(true) => "cudaGetDriverEntryPoint".to_owned(),
        EntryPath::Runtime(_) => "cudaGetDriverEntryPointByVersion".to_owned(),
        other => other.to_string(),
    }
}
