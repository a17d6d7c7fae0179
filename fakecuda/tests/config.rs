//! Settings read at `cuInit`: `FAKECUDA_GRANULARITY_KIB` (the allocation and mapping
//! granularity, for tests and benches that hold thousands of small allocations) and
//! `FAKECUDA_COPY_THREADS` (how many threads a large copy is split over); each checked in a
//! child process started with the setting, bad values failing `cuInit`.

mod support;
use support::*;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("init", init), ("granularity", granularity), ("copy", copy)]);
}

fn init() {
    say("INIT", cuda().cuInit(0));
}

fn granularity() {
    let cu = cuda();
    cu.setup(0);
    let mut g = 0usize;
    ok(cu.cuMemGetAllocationGranularity(&mut g, &AllocProp::device(0, POSIX_FD), 0));
    let mut h = 0;
    let half = cu.cuMemCreate(&mut h, g / 2, &AllocProp::device(0, POSIX_FD), 0);
    let p = cu.map_rw(cu.create(g, 0, POSIX_FD), g, 0);
    cu.write(p, &pattern(3, g));
    let same = cu.read(p, g) == pattern(3, g);
    say("GRANULARITY", format!("{g} {half} {}", u8::from(same)));
}

fn copy() {
    let cu = cuda();
    cu.setup(0);
    // Large enough to be split, and not a multiple of the parts.
    let size = 24 << 20;
    let p = cu.map_rw(cu.create(size, 0, POSIX_FD), size, 0);
    let bytes = pattern(9, size - 12345);
    cu.write(p + 12345, &bytes);
    let same = cu.read(p + 12345, bytes.len()) == bytes;
    say("COPY", u8::from(same));
}

/// What a child in `role` with `env` says on its `tag` line.
fn check(role: &str, env: &[(&str, &str)], tag: &str) -> String {
    let mut cmd = role_command(role);
    for (key, value) in env {
        cmd.env(key, value);
    }
    let child = Child::spawn(cmd);
    let line = child.expect(tag, 30);
    assert!(child.wait().success(), "{role} with {env:?}");
    line
}

#[test]
fn granularity_is_configurable() {
    // The default is a GPU's 2 MiB; a smaller one holds (and shares) allocations of its size.
    assert_eq!(check("granularity", &[], "GRANULARITY"), "2097152 1 1");
    let small = [("FAKECUDA_GRANULARITY_KIB", "64")];
    assert_eq!(check("granularity", &small, "GRANULARITY"), "65536 1 1");
}

#[test]
fn large_copies_keep_their_bytes_on_any_number_of_threads() {
    for threads in ["1", "2", "3", "8"] {
        let env = [("FAKECUDA_COPY_THREADS", threads)];
        assert_eq!(check("copy", &env, "COPY"), "1", "{threads} threads");
    }
}

#[test]
fn bad_settings_fail_init() {
    const INVALID_VALUE: &str = "1";
    for (key, value) in [
        ("FAKECUDA_GRANULARITY_KIB", "48"),
        ("FAKECUDA_GRANULARITY_KIB", "2"),
        ("FAKECUDA_GRANULARITY_KIB", "big"),
        ("FAKECUDA_COPY_THREADS", "0"),
        ("FAKECUDA_COPY_THREADS", "65"),
    ] {
        assert_eq!(
            check("init", &[(key, value)], "INIT"),
            INVALID_VALUE,
            "{key}={value}"
        );
    }
    assert_eq!(
        check("init", &[("FAKECUDA_COPY_THREADS", "4")], "INIT"),
        "0"
    );
}
