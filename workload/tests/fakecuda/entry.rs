//! How a program reaches the driver: every entry path (direct symbols, dlsym, the runtime's
//! lookups, cuGetProcAddress at each version), and symbols that cannot be resolved.

use super::*;

fn check_entry(entry: EntryPath) {
    let env = Env::new();
    let mut w = env.worker_with(entry.clone());
    let h = w.create(GRAN, 0, POSIX_FD).expect("create");
    let p = w.map_rw(h, GRAN, 0).expect("map");
    w.fill(p, GRAN, 5).expect("fill");
    w.verify(p, GRAN, 5).expect("verify");
    w.unmap(p, GRAN).expect("unmap");
    w.free_address(p, GRAN).expect("free");
    w.release(h).expect("release");

    let d = w.mem_alloc(4096).expect("cuMemAlloc");
    let (base, size) = w.address_range(d + 100).expect("range");
    assert_eq!(base, d);
    assert!(size >= 4096);
    w.write(d, b"abc").expect("write");
    assert_eq!(w.read(d, 3).expect("read"), b"abc");
    w.mem_free(d).expect("free");
    w.synchronize().expect("synchronize");
    assert!(w.driver_version().expect("version") >= 12000);

    let lib = support::fakecuda_library();
    let r = w.resolve("cuMemCreate").expect("resolve");
    let found = std::fs::canonicalize(r.library.as_deref().expect("dladdr names a library"))
        .expect("library exists");
    assert_eq!(found, lib, "{entry}: cuMemCreate comes from fakecuda");
    assert_eq!(r.symbol.as_deref(), Some("cuMemCreate"));
    assert_ne!(r.address, 0);
    if entry.api_version().is_some() {
        // By version, the unsuffixed name is the current ABI's function.
        let r = w.resolve("cuMemAlloc").expect("resolve");
        assert_eq!(r.symbol.as_deref(), Some("cuMemAlloc_v2"), "{entry}");
        let r = w.resolve("cuIpcOpenMemHandle").expect("resolve");
        assert_eq!(
            r.symbol.as_deref(),
            Some("cuIpcOpenMemHandle_v2"),
            "{entry}"
        );
    } else {
        let err = w.resolve("cuNoSuchFunction").expect_err("unknown symbol");
        assert!(
            matches!(&err, WorkloadError::Unresolved { symbol, message, .. }
                if symbol == "cuNoSuchFunction" && message.contains(&entry.to_string())),
            "{err}"
        );
    }
}

#[test]
fn entry_path_dlsym() {
    check_entry(EntryPath::Dlsym);
}

#[test]
fn entry_path_default() {
    check_entry(EntryPath::Default);
}

#[test]
fn entry_path_next() {
    check_entry(EntryPath::Next);
}

#[test]
fn entry_path_proc_address() {
    check_entry(EntryPath::ProcAddress(12030));
}

#[test]
fn entry_path_proc_address_v1() {
    check_entry(EntryPath::ProcAddressV1(12000));
}

/// The runtime path: `cudaGetDriverEntryPointByVersion`, and `cudaGetDriverEntryPoint` where
/// the runtime lacks it.
#[test]
fn entry_path_runtime() {
    for legacy in [false, true] {
        let lib = cuinterpose_testkit::stand_in_runtime(legacy);
        check_entry(EntryPath::Runtime(lib.to_path_buf()));
    }
}

/// A symbol the entry path cannot give is an error naming it and the path, on use only.
#[test]
fn unresolvable_symbols_are_reported_when_used() {
    let env = Env::new();
    let mut w = env.worker_with(EntryPath::ProcAddressV1(12000));
    let err = w.mc_create(1, GRAN, 0).expect_err("multicast is 12.1");
    match &err {
        WorkloadError::Unresolved {
            symbol,
            message,
            code,
            ..
        } => {
            assert_eq!(symbol, "cuMulticastCreate");
            assert!(message.contains("proc-address-v1:12000"), "{message}");
            assert_eq!(*code, i64::from(cuda::NOT_FOUND));
        }
        other => panic!("expected Unresolved, got {other}"),
    }
    w.create(GRAN, 0, 0).expect("the worker carries on");

    let missing = env.control_dir().join("no-such-libcudart.so");
    let mut r = Worker::spawn(&env.config(EntryPath::Runtime(missing.clone()))).expect("spawn");
    let err = r.init(0).expect_err("no runtime library");
    assert!(
        matches!(&err, WorkloadError::Unresolved { message, .. }
            if message.contains(&missing.display().to_string())),
        "{err}"
    );
    let mut d = Worker::spawn(
        &env.config(EntryPath::Dlsym)
            .driver("/nonexistent/libcuda.so.1"),
    )
    .expect("spawn");
    assert!(matches!(d.init(0), Err(WorkloadError::Unresolved { .. })));
}
