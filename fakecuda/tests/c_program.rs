//! A C program built with `cc` against fakecuda's libcuda.so.1, using only cuda.h-style
//! declarations of its own.

mod support;
use support::*;

#[test]
fn c_program_creates_maps_and_copies() {
    let dir = lib_dir();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/vmm_roundtrip.c");
    let exe = profile_dir().join(format!("fakecuda-c-vmm-{}", std::process::id()));
    let link = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cuinterpose_testkit::cc(&src, &exe, &[&link, "-l:libcuda.so.1", &rpath]);
    let run = std::process::Command::new(&exe)
        .output()
        .expect("run the C program");
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "C program failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "granularity=2097152",
            "roundtrip=ok",
            "direct=h",
            "bad_release=CUDA_ERROR_INVALID_HANDLE",
            "done"
        ]
    );
}
