//! The worker over fakecuda, without any interposer.

#[path = "../support/mod.rs"]
mod support;

mod entry;

use cuinterpose_workload::{
    Command, EntryPath, ErrorKind, Grant, Reply, Worker, WorkloadError, checksum, cuda, pattern,
    pattern_byte, pattern_checksum,
};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};
use support::{Env, FABRIC, GRAN, POSIX_FD};

/// A creates and fills, B imports the FD the test process relays, maps elsewhere and
/// verifies; writes go both ways.
#[test]
fn two_workers_share_a_vmm_allocation_by_fd() {
    let env = Env::new();
    let (mut a, mut b) = (env.worker(), env.worker());
    let size = 2 * GRAN;
    let h = a.create(size, 0, POSIX_FD).expect("create");
    let pa = a.map_rw(h, size, 0).expect("map in A");
    a.fill(pa, size, 7).expect("fill");
    a.verify(pa, size, 7).expect("A verifies its own fill");
    assert_eq!(
        a.checksum(pa, size).expect("checksum"),
        pattern_checksum(7, size)
    );

    let fd = a.export(h).expect("export");
    let hb = b.import(fd.as_fd()).expect("import");
    drop(fd);
    let pb = b.reserve(size).expect("reserve");
    b.map(pb, size, 0, hb).expect("map in B");
    b.set_access(pb, size, &[Grant::readwrite(0), Grant::read(1)])
        .expect("grant");
    assert_eq!(b.get_access(pb, 0).expect("access"), 3);
    assert_eq!(b.get_access(pb, 1).expect("access"), 1);
    b.verify(pb, size, 7).expect("B sees A's bytes");

    let msg = b"written by B";
    b.write(pb + GRAN + 100, msg).expect("write");
    assert_eq!(
        a.read(pa + GRAN + 100, msg.len() as u64).expect("read"),
        msg
    );
    let err = a
        .verify(pa, size, 7)
        .expect_err("A's pattern was overwritten");
    assert_eq!(
        err.mismatch(),
        Some((GRAN + 100, pattern_byte(7, GRAN + 100), msg[0])),
        "{err}"
    );
    a.memset(pa, 0xab, 16).expect("memset");
    assert_eq!(b.read(pb, 16).expect("read"), vec![0xab; 16]);
    let both = b.read(pb, 32).expect("read");
    assert_eq!(checksum(&both), b.checksum(pb, 32).expect("checksum"));

    let props = b.properties(hb).expect("properties");
    assert_eq!(
        (
            props.allocation_type,
            props.requested_handle_types,
            props.location_type,
            props.location_id
        ),
        (1, POSIX_FD, 1, 0)
    );
    assert_eq!(
        b.retain(pb).expect("retain"),
        hb,
        "retain returns the imported handle"
    );
    b.release(hb).expect("release the retained reference");
    b.unmap(pb, size).expect("unmap");
    b.free_address(pb, size).expect("free");
    b.release(hb).expect("release");
    a.unmap(pa, size).expect("unmap");
    a.release(h).expect("release");
}

/// The exporter keeps its FD; the importer takes it by number with pidfd_getfd.
#[test]
fn import_from_pid_takes_the_kept_descriptor() {
    let env = Env::new();
    let (mut a, mut b) = (env.worker(), env.worker());
    let h = a.create(GRAN, 1, POSIX_FD).expect("create on device 1");
    let pa = a.map_rw(h, GRAN, 1).expect("map");
    // Copies are the work of the current context's device: device 1's, which has access.
    a.set_device(1).expect("device 1");
    b.set_device(1).expect("device 1");
    a.fill(pa, GRAN, 99).expect("fill");
    let (ours, number) = a.export_kept(h).expect("export, kept");
    drop(ours);
    assert!(
        a.fd_targets()
            .expect("targets")
            .iter()
            .any(|t| t.fd == number && t.target.contains("memfd")),
        "the kept FD is open in A as a memfd"
    );
    let hb = b
        .import_from_pid(a.worker_host_pid(), number)
        .expect("import from pid");
    let pb = b.map_rw(hb, GRAN, 1).expect("map in B");
    b.verify(pb, GRAN, 99).expect("B sees A's bytes");

    // The copy a PidGetFd leaves in B imports by number, as often as wanted.
    let copy = b
        .pid_get_fd(a.worker_host_pid(), number)
        .expect("pidfd_getfd");
    let h2 = import_number(&mut b, copy);
    assert_ne!(h2, hb, "each import is a new handle");
    b.release(h2).expect("release");
    b.close_fd(copy).expect("close the copy");

    a.close_fd(number).expect("close the kept FD");
    let err = b
        .import_from_pid(a.worker_host_pid(), number)
        .expect_err("the number is closed now");
    assert_eq!(err.errno(), Some(libc::EBADF), "{err}");
    let err = a.close_fd(number).expect_err("closed twice");
    assert_eq!(err.errno(), Some(libc::EBADF), "{err}");
}

/// Legacy IPC: producer allocates and fills, consumer opens the handle and sees the bytes.
#[test]
fn memory_ipc_producer_consumer() {
    let env = Env::new();
    let (mut a, mut b) = (env.worker(), env.worker());
    let size = 3 << 20;
    let d = a.mem_alloc(size).expect("cuMemAlloc");
    a.fill(d, size, 11).expect("fill");
    let handle = a.ipc_get(d).expect("ipc get");
    assert_eq!(
        a.ipc_get(d).expect("ipc get again"),
        handle,
        "handles are stable"
    );
    let p = b.ipc_open(&handle).expect("ipc open");
    b.verify(p, size, 11).expect("consumer sees the bytes");
    b.write(p + 5, b"hi").expect("write");
    assert_eq!(a.read(d + 5, 2).expect("read"), b"hi");
    assert_eq!(b.address_range(p).expect("range").0, p);
    b.ipc_close(p).expect("ipc close");
    let err = b.ipc_close(p).expect_err("closed twice");
    assert!(err.cuda_code().is_some(), "{err}");
    a.mem_free(d).expect("free");
    let bad = [0u8; 64];
    let err = b.ipc_open(&bad).expect_err("a zero handle");
    assert!(err.cuda_code().is_some(), "{err}");
}

/// Driver failures come back with their CUresult.
#[test]
fn failing_calls_return_the_cuda_code() {
    let env = Env::new();
    let mut w = env.worker();
    let err = w.release(0xdead_beef).expect_err("unknown handle");
    assert_eq!(err.cuda_code(), Some(cuda::INVALID_HANDLE), "{err}");
    assert!(
        err.to_string().contains("CUDA_ERROR_INVALID_HANDLE"),
        "{err}"
    );

    // FABRIC: creation succeeds, export is NOT_SUPPORTED (no IMEX); POSIX export of a
    // FABRIC-only allocation is INVALID_VALUE.
    let h = w.create(GRAN, 0, FABRIC).expect("create with FABRIC");
    let err = w.export_with(h, FABRIC, false).expect_err("fabric export");
    assert_eq!(err.cuda_code(), Some(cuda::NOT_SUPPORTED), "{err}");
    let err = w
        .export(h)
        .expect_err("posix export of a fabric allocation");
    assert_eq!(err.cuda_code(), Some(cuda::INVALID_VALUE), "{err}");
    let err = w.import_fabric(vec![0; 64]).expect_err("fabric import");
    // fakecuda reads the handle pointer as a descriptor number before it looks at the type,
    // so a FABRIC import answers INVALID_VALUE where its README promises NOT_SUPPORTED.
    assert!(
        matches!(
            err.cuda_code(),
            Some(cuda::INVALID_VALUE | cuda::NOT_SUPPORTED)
        ),
        "{err}"
    );
    w.release(h).expect("release");

    let err = w.create(GRAN + 1, 0, POSIX_FD).expect_err("unaligned size");
    assert_eq!(err.cuda_code(), Some(cuda::INVALID_VALUE), "{err}");
    let err = w.create(GRAN, 7, POSIX_FD).expect_err("no device 7");
    assert!(err.cuda_code().is_some(), "{err}");
    assert_eq!(
        w.granularity(0, POSIX_FD, cuda::GRANULARITY_RECOMMENDED)
            .expect("granularity"),
        GRAN
    );

    // Mapped without access: copies fail, nothing faults.
    let h = w.create(GRAN, 0, 0).expect("create");
    let p = w.reserve(GRAN).expect("reserve");
    w.map(p, GRAN, 0, h).expect("map");
    let err = w.read(p, 8).expect_err("no access granted");
    assert_eq!(err.cuda_code(), Some(cuda::ILLEGAL_ADDRESS), "{err}");
    let err = w.map(p, GRAN, 0, h).expect_err("mapped twice");
    assert!(err.cuda_code().is_some(), "{err}");

    // Requests the worker refuses, and a panic, leave it serving.
    let err = w.read(p, 1 << 30).expect_err("too large");
    assert!(
        matches!(
            err,
            WorkloadError::Rejected {
                kind: ErrorKind::Request,
                ..
            }
        ),
        "{err}"
    );
    let err = w
        .call(&Command::Panic {
            message: "boom".into(),
        })
        .expect_err("panic");
    assert!(
        matches!(&err, WorkloadError::Rejected { kind: ErrorKind::Panic, message, .. } if message == "boom"),
        "{err}"
    );
    let err = w
        .import_with(
            &Command::Import {
                handle_type: POSIX_FD,
                fd: None,
                shareable: None,
                keep: false,
            },
            None,
        )
        .expect_err("nothing to import");
    assert!(matches!(err, WorkloadError::Rejected { .. }), "{err}");
    w.ping().expect("still serving");
}

/// A worker that dies or hangs gives an error, never a hang.
#[test]
fn dead_and_hung_workers_give_errors() {
    let env = Env::new();

    let mut w = env.worker();
    let pid = w.pid();
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let t = Instant::now();
    let err = w.ping().expect_err("dead");
    assert!(t.elapsed() < Duration::from_secs(10));
    match &err {
        WorkloadError::Died { pid: p, status, .. } => {
            assert_eq!(*p, pid);
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.and_then(|s| s.signal()),
                Some(libc::SIGKILL),
                "{err}"
            );
        }
        other => panic!("expected Died, got {other}"),
    }
    assert!(err.to_string().contains(&pid.to_string()), "{err}");
    assert!(matches!(w.ping(), Err(WorkloadError::Unusable { .. })));

    let mut w = env.worker();
    w.set_timeout(Duration::from_millis(300));
    let t = Instant::now();
    let err = w.sleep(10_000).expect_err("hung");
    assert!(err.is_timeout(), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(matches!(w.ping(), Err(WorkloadError::Unusable { .. })));
    let status = w.kill().expect("kill");
    assert!(!status.success());

    let mut w = env.worker();
    let status = w.exit(3).expect("exit");
    assert_eq!(status.code(), Some(3));

    let mut w = env.worker();
    let status = w.wait().expect("closing the socket ends the worker");
    assert_eq!(status.code(), Some(0));

    // A program that is not a worker dies before answering the handshake.
    let err = Worker::spawn(&env.config(EntryPath::Dlsym).arg("--bogus")).expect_err("bad flag");
    assert!(err.is_died(), "{err}");
}

/// Create, export, import and release leave every descriptor table as it was.
#[test]
fn descriptor_counts_are_stable() {
    let env = Env::new();
    let (mut a, mut b) = (env.worker(), env.worker());
    let cycle = |a: &mut Worker, b: &mut Worker, seed: u64| {
        let h = a.create(GRAN, 0, POSIX_FD).expect("create");
        let pa = a.map_rw(h, GRAN, 0).expect("map");
        a.fill(pa, GRAN, seed).expect("fill");
        let fd = a.export(h).expect("export");
        let hb = b.import(fd.as_fd()).expect("import");
        drop(fd);
        let pb = b.map_rw(hb, GRAN, 0).expect("map");
        b.verify(pb, GRAN, seed).expect("verify");
        b.unmap(pb, GRAN).expect("unmap");
        b.free_address(pb, GRAN).expect("free");
        b.release(hb).expect("release");
        a.unmap(pa, GRAN).expect("unmap");
        a.free_address(pa, GRAN).expect("free");
        a.release(h).expect("release");
        // A kept export, imported again by its number in the exporter.
        let h3 = a.create(GRAN, 0, POSIX_FD).expect("create");
        let (fd, n) = a.export_kept(h3).expect("export kept");
        drop(fd);
        let h4 = import_number(a, n);
        a.close_fd(n).expect("close kept");
        a.release(h4).expect("release");
        a.release(h3).expect("release");
    };
    cycle(&mut a, &mut b, 1);
    let (na, nb) = (
        a.open_fd_count().expect("count"),
        b.open_fd_count().expect("count"),
    );
    for seed in 2..5 {
        cycle(&mut a, &mut b, seed);
        let ta = a.fd_targets().expect("targets");
        assert_eq!(a.open_fd_count().expect("count"), na, "A: {ta:?}");
        let tb = b.fd_targets().expect("targets");
        assert_eq!(b.open_fd_count().expect("count"), nb, "B: {tb:?}");
    }
    let d = a.dup_fd(0).expect("dup");
    assert_eq!(a.open_fd_count().expect("count"), na + 1);
    a.close_fd(d).expect("close");
    assert_eq!(a.open_fd_count().expect("count"), na);
}

/// Imports descriptor number `fd` of the worker's own table.
fn import_number(w: &mut Worker, fd: i32) -> u64 {
    w.import_number(fd).expect("import by number")
}

/// A team of one device: bind memory (v2, per device) and through the address (v1), map the
/// multicast object and see the bound memory through it.
#[test]
fn multicast_binds_and_maps() {
    let env = Env::new();
    let mut w = env.worker();
    assert_eq!(
        w.mc_granularity(1, GRAN, 0, cuda::GRANULARITY_MINIMUM)
            .expect("granularity"),
        GRAN
    );
    let mc = w.mc_create(1, 2 * GRAN, 0).expect("create");
    w.mc_add_device(mc, 0).expect("add device");
    let h = w.create(GRAN, 0, 0).expect("memory");
    let p = w.map_rw(h, GRAN, 0).expect("map memory");
    w.fill(p, GRAN, 21).expect("fill");
    w.mc_bind_mem(mc, 0, h, 0, GRAN, Some(0))
        .expect("bind mem v2");
    let h2 = w.create(GRAN, 0, 0).expect("memory");
    let p2 = w.map_rw(h2, GRAN, 0).expect("map memory");
    w.fill(p2, GRAN, 22).expect("fill");
    w.mc_bind_addr(mc, GRAN, p2, GRAN, None)
        .expect("bind addr v1");
    let m = w.map_rw(mc, 2 * GRAN, 0).expect("map the multicast object");
    w.verify(m, GRAN, 21).expect("first half shows h");
    w.verify(m + GRAN, GRAN, 22).expect("second half shows h2");
    w.unmap(m, 2 * GRAN).expect("unmap");
    w.mc_unbind(mc, 0, 0, GRAN).expect("unbind");
    w.mc_unbind(mc, 0, GRAN, GRAN).expect("unbind");
    w.release(mc).expect("release mc");
}

/// The wrapper prefix runs the worker in a new PID namespace; it still answers, and knows
/// both of its PIDs.
#[test]
fn wrapper_prefix_runs_the_worker_in_a_pid_namespace() {
    if !nix::unistd::geteuid().is_root() {
        return cuinterpose_testkit::unavailable(
            "wrapper_prefix_runs_the_worker_in_a_pid_namespace",
            "it needs root, for `unshare -fp` (a new PID namespace)",
        );
    }
    let env = Env::new();
    let mut w = Worker::spawn(
        &env.config(EntryPath::Dlsym)
            .wrapper(["unshare", "-fp", "setsid"]),
    )
    .expect("spawn behind unshare");
    assert_eq!(w.worker_pid(), 1, "init of its namespace");
    assert_eq!(w.identity().nspid.len(), 2, "{:?}", w.identity());
    assert_ne!(
        w.worker_host_pid(),
        w.pid() as i32,
        "unshare is the spawned process"
    );
    let info = w.init(0).expect("init");
    assert_eq!(info.pid, 1);
    let h = w.create(GRAN, 0, POSIX_FD).expect("create");
    let p = w.map_rw(h, GRAN, 0).expect("map");
    w.fill(p, GRAN, 3).expect("fill");
    w.verify(p, GRAN, 3).expect("verify");
    let status = w.wait().expect("ends when the socket closes");
    assert!(status.success(), "{status}");
}

/// JSON replies carry what the typed helpers return; raw `call` works too.
#[test]
fn raw_calls_and_patterns_agree() {
    let env = Env::new();
    let mut w = env.worker();
    let p = w.mem_alloc(1 << 16).expect("alloc");
    w.write(p, &pattern(9, 1 << 16)).expect("write the pattern");
    let r = w
        .call(&Command::Verify {
            address: p,
            size: 1 << 16,
            seed: 9,
        })
        .expect("verify");
    assert_eq!(r, Reply::Done);
    let r = w
        .call(&Command::Checksum {
            address: p,
            size: 1 << 16,
        })
        .expect("checksum");
    assert_eq!(
        r,
        Reply::Checksum {
            checksum: pattern_checksum(9, 1 << 16)
        }
    );
    let host = w.host_register(1 << 16, 0).expect("host register");
    w.host_unregister(host).expect("host unregister");
    let ctx = w.ctx_create(1, 0).expect("ctx create");
    w.ctx_destroy(ctx).expect("ctx destroy");
    w.set_device(0).expect("primary ctx again");
}

/// A team shared by two workers: A's bind waits (sent, not yet answered) until B adds the
/// second device.
#[test]
fn multicast_team_across_workers_with_a_pending_bind() {
    let env = Env::new();
    let (mut a, mut b) = (env.worker(), env.worker());
    let mc = a.mc_create(2, GRAN, u64::from(POSIX_FD)).expect("create");
    let fd = a.export(mc).expect("export the team");
    let mc_b = b.import(fd.as_fd()).expect("import the team");
    a.mc_add_device(mc, 0).expect("add device 0");
    let h = a.create(GRAN, 0, 0).expect("memory");
    a.send(
        &Command::McBindMem {
            mc,
            mc_offset: 0,
            mem_handle: h,
            mem_offset: 0,
            size: GRAN,
            flags: 0,
            device: Some(0),
        },
        None,
    )
    .expect("send the bind");
    let err = a.ping().expect_err("one command at a time");
    assert!(matches!(err, WorkloadError::Protocol { .. }), "{err}");
    let mut pfd = libc::pollfd {
        fd: a.control_socket().expect("socket").as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, 200) };
    assert_eq!(ready, 0, "the bind waits for the missing device");
    b.mc_add_device(mc_b, 1).expect("add device 1");
    let (r, fd) = a.receive().expect("the bind completes");
    assert_eq!(r, Reply::Done);
    assert!(fd.is_none());
    a.ping().expect("serving again");
}
