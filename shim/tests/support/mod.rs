//! Test support: builds libcuinterpose.so and fakecuda's libcuda.so.1 for this test's target
//! directory and profile, compiles the C test programs, and runs them in a private control
//! directory with the shim preloaded (or not).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `target/<profile>/`: the directory above the test executable's `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<exe>")
        .to_path_buf()
}

/// Builds both cdylibs (cargo does not build cdylib-only packages for integration tests).
/// Returns (directory holding `libcuda.so.1`, path of `libcuinterpose.so`).
pub fn libraries() -> &'static (PathBuf, PathBuf) {
    static LIBS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    LIBS.get_or_init(|| {
        let profile = profile_dir();
        let name = profile.file_name().and_then(|n| n.to_str()).unwrap_or("debug").to_owned();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--quiet", "-p", "fakecuda", "-p", "cuinterpose-shim", "--lib", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", profile.parent().expect("target dir"));
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
        assert!(out.status.success(), "building the libraries failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let dir = profile.join("shim-test-lib");
        std::fs::create_dir_all(&dir).expect("create lib dir");
        let link = dir.join("libcuda.so.1");
        let tmp = dir.join(format!("libcuda.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(profile.join("libcuda.so"), &tmp).expect("symlink");
        std::fs::rename(&tmp, &link).expect("install symlink");
        (dir, profile.join("libcuinterpose.so"))
    })
}

pub fn lib_dir() -> &'static Path {
    &libraries().0
}

pub fn shim() -> &'static Path {
    &libraries().1
}

fn compile(args: &[&str], source: &str, output: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(source);
    let out = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(output)
        .arg(&source)
        .args(args)
        .output()
        .expect("run cc");
    assert!(out.status.success(), "cc {} failed:\n{}", source.display(), String::from_utf8_lossy(&out.stderr));
}

/// The `share` C program (tests/c/share.c), linked against libcuda.so.1.
pub fn share_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = profile_dir().join("shim-test-c");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("share.{}", std::process::id()));
        let lib = format!("-L{}", lib_dir().display());
        compile(&[&lib, "-l:libcuda.so.1", "-ldl"], "share.c", &out);
        out
    })
}

/// The stand-in CUDA runtime (tests/c/fakecudart.c) as `libcudart.so.13`.
pub fn fake_runtime() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = profile_dir().join(format!("shim-test-cudart.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("libcudart.so.13");
        compile(&["-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-ldl"], "fakecudart.c", &out);
        out
    })
}

/// A private directory for one test: control sockets of the shim and of fakecuda live here.
pub struct Sandbox {
    pub root: PathBuf,
}

impl Sandbox {
    pub fn new(name: &str) -> Sandbox {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "cuishim-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Sandbox { root }
    }

    pub fn control_dir(&self) -> PathBuf {
        self.root.join("ctl")
    }

    /// A command with fakecuda on the library path, the shim preloaded when `shim` is set,
    /// and both control directories inside the sandbox.
    pub fn command(&self, program: &Path, shim: bool) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("LD_LIBRARY_PATH", lib_dir())
            .env("CUINTERPOSE_CONTROL_DIR", self.control_dir())
            .env("FAKECUDA_CONTROL_DIR", self.root.join("fakecuda"));
        if shim {
            cmd.env("LD_PRELOAD", self::shim());
        } else {
            cmd.env_remove("LD_PRELOAD");
        }
        cmd
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Asserts success and returns stdout.
pub fn stdout_of(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}
