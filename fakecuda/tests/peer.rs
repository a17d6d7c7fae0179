//! Peer access per device: which devices may reach each other (`FAKECUDA_PEERS`, models),
//! peer access per context pair, and copies that are the work of their context's device, so
//! memory that device was not granted is refused as a GPU would fault on it.

mod support;
use support::*;

const ALREADY_ENABLED: u32 = 704;
const NOT_ENABLED: u32 = 705;
const UNSUPPORTED: u32 = 217;
const N: usize = 4096;

/// The roles this binary's children run (before the test harness starts: see `run_role`).
#[ctor::ctor(unsafe)]
fn child_roles() {
    run_role(&[("peers", peers)]);
}

/// Child: the peer-access matrix and what enabling peer access says.
fn peers() {
    let cu = cuda();
    let init = cu.cuInit(0);
    if init != SUCCESS {
        say("PEERS", format!("init {init}"));
        return;
    }
    let mut count = 0;
    ok(cu.cuDeviceGetCount(&mut count));
    // Row by row, whether device `row` can access device `col`.
    let matrix: Vec<String> = (0..count)
        .map(|row| {
            (0..count)
                .map(|col| {
                    let mut can = -1;
                    ok(cu.cuDeviceCanAccessPeer(&mut can, row, col));
                    can.to_string()
                })
                .collect()
        })
        .collect();
    // And what enabling device 0's context for device 1's memory says.
    let c1 = cu.setup(1);
    let c0 = cu.setup(0);
    say(
        "PEERS",
        format!("{} {}", matrix.join("/"), cu.cuCtxEnablePeerAccess(c1, 0)),
    );
    let _ = c0;
}

/// What a child on `devices` with `FAKECUDA_PEERS=peers` reports: the capability matrix and
/// the result of enabling device 0 for device 1 (or `init` and its error).
fn check(devices: &str, peers: Option<&str>) -> String {
    let mut cmd = role_command("peers");
    cmd.env("FAKECUDA_DEVICES", devices);
    match peers {
        Some(p) => cmd.env("FAKECUDA_PEERS", p),
        None => cmd.env_remove("FAKECUDA_PEERS"),
    };
    let child = Child::spawn(cmd);
    let line = child.expect("PEERS", 30);
    assert!(child.wait().success(), "{devices} / {peers:?}");
    line
}

#[test]
fn peers_are_distinct_devices_of_one_model_in_one_island() {
    assert_eq!(check("2", None), "01/10 0");
    assert_eq!(check("3", Some("all")), "011/101/110 0");
    assert_eq!(check("2", Some("none")), format!("00/00 {UNSUPPORTED}"));
    assert_eq!(check("H200,A100", None), format!("00/00 {UNSUPPORTED}"));
    assert_eq!(
        check("4", Some("0+2, 1+3")),
        format!("0010/0001/1000/0100 {UNSUPPORTED}")
    );
    for bad in ["0+9", "0+1,1", "zero"] {
        assert_eq!(check("2", Some(bad)), "init 1", "{bad}");
    }
}

#[test]
fn copies_need_their_devices_access_and_peer_access_grants_it() {
    let _serial = serial();
    let cu = cuda();
    let c0 = cu.setup(0);
    let can = |dev, peer| {
        let mut v = -1;
        ok(cu.cuDeviceCanAccessPeer(&mut v, dev, peer));
        v
    };
    assert_eq!((can(0, 1), can(1, 0), can(0, 0)), (1, 1, 0));
    let mut v = 0;
    assert_eq!(cu.cuDeviceCanAccessPeer(&mut v, 0, 7), INVALID_DEVICE);
    assert_eq!(
        cu.cuDeviceCanAccessPeer(std::ptr::null_mut(), 0, 1),
        INVALID_VALUE
    );
    ok(cu.cuDeviceGetP2PAttribute(&mut v, 2, 0, 1));
    assert_eq!(v, 1, "access supported");
    assert_eq!(cu.cuDeviceGetP2PAttribute(&mut v, 2, 1, 1), INVALID_DEVICE);
    assert_eq!(cu.cuDeviceGetP2PAttribute(&mut v, 9, 0, 1), INVALID_VALUE);

    // Device 0's cuMemAlloc memory, with known bytes.
    let alloc = || {
        let mut p = 0;
        ok(cu.cuMemAlloc_v2(&mut p, N));
        p
    };
    let p0 = alloc();
    cu.write(p0, &pattern(1, N));
    let c1 = cu.setup(1);
    let p1 = alloc();
    let mut buf = vec![0u8; N];
    let read = |p: u64, buf: &mut Vec<u8>| cu.cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), p, N);
    assert_eq!(
        read(p0, &mut buf),
        ILLEGAL_ADDRESS,
        "device 1 has no access"
    );
    assert_eq!(cu.cuMemcpyDtoD_v2(p1, p0, N), ILLEGAL_ADDRESS);
    assert_eq!(cu.cuMemsetD8_v2(p0, 7, N), ILLEGAL_ADDRESS);
    // A peer copy touches each side with its own context's device.
    ok(cu.cuMemcpyPeer(p1, c1, p0, c0, N));
    assert_eq!(cu.read(p1, N), pattern(1, N));
    assert_eq!(cu.cuMemcpyPeer(p1, c1, p0, 0xbad, N), INVALID_CONTEXT);

    // Enabling: the driver's argument errors, then access to everything context 0 allocates.
    assert_eq!(cu.cuCtxEnablePeerAccess(c0, 1), INVALID_VALUE);
    assert_eq!(cu.cuCtxEnablePeerAccess(c1, 0), INVALID_CONTEXT, "itself");
    assert_eq!(cu.cuCtxEnablePeerAccess(0xbad, 0), INVALID_CONTEXT);
    assert_eq!(cu.cuCtxDisablePeerAccess(c0), NOT_ENABLED);
    ok(cu.cuCtxEnablePeerAccess(c0, 0));
    assert_eq!(cu.cuCtxEnablePeerAccess(c0, 0), ALREADY_ENABLED);
    assert_eq!(cu.read(p0, N), pattern(1, N), "an allocation made before");
    ok(cu.cuMemsetD8_v2(p0, 7, N));
    cu.setup(0);
    let later = alloc();
    cu.write(later, &pattern(2, N));
    // One way only: device 0 still cannot touch device 1's memory.
    assert_eq!(read(p1, &mut buf), ILLEGAL_ADDRESS, "access is one-way");
    cu.setup(1);
    assert_eq!(cu.read(later, N), pattern(2, N), "an allocation made after");
    // Stream work is the work of the stream's context.
    let mut s = 0;
    ok(cu.cuStreamCreate(&mut s, 0));
    // The source outlives the synchronize: an async copy reads it when the stream runs.
    let source = pattern(3, N);
    ok(cu.cuMemcpyHtoDAsync_v2(p0, source.as_ptr().cast(), N, s));
    ok(cu.cuStreamSynchronize(s));
    assert_eq!(cu.read(p0, N), pattern(3, N));

    // VMM memory: its grants decide, whatever peer access the contexts have.
    cu.setup(0);
    let h = cu.create(GRAN, 0, POSIX_FD);
    let vmm = cu.map_rw(h, GRAN, 0);
    cu.setup(1);
    assert_eq!(
        read(vmm, &mut buf),
        ILLEGAL_ADDRESS,
        "granted to device 0 only"
    );
    ok(cu.grant(vmm, GRAN, 1, 1));
    ok(read(vmm, &mut buf));
    assert_eq!(
        cu.cuMemsetD8_v2(vmm, 1, N),
        ILLEGAL_ADDRESS,
        "read-only for device 1"
    );

    // Disabling ends it; so does a reset of either device.
    ok(cu.cuCtxDisablePeerAccess(c0));
    assert_eq!(cu.cuCtxDisablePeerAccess(c0), NOT_ENABLED);
    assert_eq!(read(p0, &mut buf), ILLEGAL_ADDRESS, "disabled");
    ok(cu.cuCtxEnablePeerAccess(c0, 0));
    ok(cu.cuStreamDestroy_v2(s));
    ok(cu.cuDevicePrimaryCtxReset_v2(1));
    let again = cu.setup(1);
    assert_eq!(again, c1, "a primary context keeps its handle");
    assert_eq!(read(p0, &mut buf), ILLEGAL_ADDRESS, "the reset ended it");
    ok(cu.cuCtxEnablePeerAccess(c0, 0));
    ok(cu.cuCtxDisablePeerAccess(c0));

    cu.setup(0);
    for p in [p0, later] {
        ok(cu.cuMemFree_v2(p));
    }
    cu.unmap_free(vmm, GRAN, h);
}
