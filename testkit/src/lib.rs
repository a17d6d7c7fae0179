//! cuinterpose's test kit (dev-only: no product crate depends on it).
//!
//! Tests of one package cannot rely on another package's binaries or cdylibs being built, so
//! these helpers run `cargo build` for the running test executable's own target directory and
//! profile (once per process) and return where the artifact is. They panic with cargo's output
//! when a build fails: they are for tests. [`fixtures`] builds records, topologies and fake
//! participants for the coordinator's tests.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub mod fixtures;
pub mod skip;

pub use skip::unavailable;

/// `target/<profile>/` of the running executable: the directory above `deps/` (or
/// `examples/`) for test and example executables, the executable's own directory otherwise.
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable has a directory");
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps" | "examples") => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// `$CUINTERPOSE_WORKER_PROGRAM` if set, else `target/<profile>/cuinterpose-worker`. The
/// binary exists there once `cuinterpose-workload`'s binaries were built for that profile
/// (see [`build_worker`]).
pub fn worker_program() -> PathBuf {
    std::env::var_os("CUINTERPOSE_WORKER_PROGRAM")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_profile_dir().join("cuinterpose-worker"))
}

/// Runs `cargo build -p <package> <what>` for the running executable's target directory and
/// profile (tests of one package cannot rely on another package's binaries or cdylibs being
/// built). Panics with cargo's output on failure: for tests.
pub fn cargo_build(package: &str, what: &[&str]) {
    let profile = target_profile_dir();
    let name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_owned();
    let target = profile.parent().expect("target dir").to_path_buf();
    let manifest = workspace().join("Cargo.toml");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", package])
        .args(what)
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target);
    match name.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p {package} {what:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `cuinterpose-worker` for the running executable's profile (once per process) and
/// returns its path. Honours `$CUINTERPOSE_WORKER_PROGRAM` without building.
pub fn build_worker() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        if let Some(p) = std::env::var_os("CUINTERPOSE_WORKER_PROGRAM") {
            return PathBuf::from(p);
        }
        cargo_build("cuinterpose-workload", &["--bin", "cuinterpose-worker"]);
        worker_program()
    })
}

/// Builds fakecuda's `libcuda.so` for the running executable's profile (once per process)
/// and returns `target/<profile>/fakecuda-lib/`, a directory holding a `libcuda.so.1`
/// symlink to it: use it as `LD_LIBRARY_PATH`.
pub fn fakecuda_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        cargo_build("fakecuda", &["--lib"]);
        let profile = target_profile_dir();
        let dir = profile.join("fakecuda-lib");
        std::fs::create_dir_all(&dir).expect("create fakecuda-lib");
        let tmp = dir.join(format!("libcuda.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(profile.join("libcuda.so"), &tmp).expect("symlink");
        std::fs::rename(&tmp, dir.join("libcuda.so.1")).expect("install symlink");
        dir
    })
}

/// Builds `libcuinterpose.so` (the shim) for the running executable's profile (once per
/// process) and returns its path, for `LD_PRELOAD`.
pub fn build_shim() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        cargo_build("cuinterpose-shim", &["--lib"]);
        target_profile_dir().join("libcuinterpose.so")
    })
}

/// The stand-in CUDA runtime (`testkit/c/fakecudart.c`, built with `cc` once per process
/// and variant) as `libcudart.so.13`: only the driver entry-point queries, answered through
/// the driver's `cuGetProcAddress_v2` reached with glibc's own `dlsym`, as libcudart loads
/// the driver. `legacy`: it exports only `cudaGetDriverEntryPoint` (CUDA 12.0–12.4),
/// otherwise `cudaGetDriverEntryPointByVersion` too, which callers prefer.
pub fn stand_in_runtime(legacy: bool) -> &'static Path {
    static FULL: OnceLock<PathBuf> = OnceLock::new();
    static LEGACY: OnceLock<PathBuf> = OnceLock::new();
    let (cell, what, define) = if legacy {
        (&LEGACY, "cudart-legacy", Some("-DLEGACY_ONLY"))
    } else {
        (&FULL, "cudart", None)
    };
    cell.get_or_init(|| {
        let dir = target_profile_dir()
            .join("testkit-c")
            .join(format!("{what}.{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the stand-in runtime's directory");
        let out = dir.join("libcudart.so.13");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/fakecudart.c");
        let mut args = vec!["-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-ldl"];
        args.extend(define);
        cc(&source, &out, &args);
        out
    })
}

/// The names of the entries of `dir`, sorted.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Runs `command` and returns its output; panics naming `what`, with its stderr, unless it
/// succeeded.
pub fn succeed(command: &mut Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `cc -Wall -Werror -O1 -o output source args…`: a C test program, or a library with
/// `-shared -fPIC` among `args`; panics with cc's errors.
pub fn cc(source: &Path, output: &Path, args: &[&str]) {
    succeed(
        Command::new("cc")
            .args(["-Wall", "-Werror", "-O1", "-o"])
            .arg(output)
            .arg(source)
            .args(args),
        &format!("cc {}", source.display()),
    );
}

/// The workspace root (for tests that read files of other packages).
pub fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Builds `fakecuda-checkpoint` (fakecuda's stand-in for `cuda-checkpoint`) for the running
/// executable's profile (once per process) and returns its path.
pub fn build_fakecuda_checkpoint() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        cargo_build("fakecuda", &["--bin", "fakecuda-checkpoint"]);
        target_profile_dir().join("fakecuda-checkpoint")
    })
}

/// Builds the `cuinterpose` binary (the coordinator's CLI) for the running executable's
/// profile (once per process) and returns its path, for tests outside its package.
pub fn build_cli() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        cargo_build("cuinterpose", &["--bin", "cuinterpose"]);
        target_profile_dir().join("cuinterpose")
    })
}

/// Environment variable scaling every upper time bound tests assert
/// ([`slack`]): a decimal factor, default 1. Set it above 1 on a slow or loaded machine (a
/// debugger, sanitizers, a busy CI runner); lower bounds (a timeout must not fire early) are
/// never scaled.
pub const TIME_FACTOR_VARIABLE: &str = "CUINTERPOSE_TEST_TIME_FACTOR";

/// The time factor of [`TIME_FACTOR_VARIABLE`]; panics on a value that is not a positive
/// number, naming it.
pub fn time_factor() -> f64 {
    static FACTOR: OnceLock<f64> = OnceLock::new();
    *FACTOR.get_or_init(|| match std::env::var(TIME_FACTOR_VARIABLE) {
        Err(_) => 1.0,
        Ok(text) => match text.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => f,
            _ => panic!("{TIME_FACTOR_VARIABLE}={text:?} is not a positive number"),
        },
    })
}

/// An upper time bound a test asserts, scaled by [`time_factor`].
pub fn slack(bound: std::time::Duration) -> std::time::Duration {
    bound.mul_f64(time_factor())
}

/// The UUID fakecuda gives device `index` of machine `machine` (`FAKECUDA_MACHINE`, empty
/// for the default), as `GPU-…`: the scheme of fakecuda/src/device.rs, whose unit test pins
/// one value of it.
pub fn fakecuda_gpu(machine: &str, index: u32) -> String {
    let mut u = *b"FAKECUDA\0\0\0\0\0\0\0\0";
    u[8..12].copy_from_slice(&index.to_be_bytes());
    if !machine.is_empty() {
        let hash = machine.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        u[12..].copy_from_slice(&hash.to_be_bytes());
    }
    cuinterpose_abi::uuid::gpu_uuid_text(&u)
}
