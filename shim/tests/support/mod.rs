//! Test support: builds libcuinterpose.so and fakecuda's libcuda.so.1 for this test's target
//! directory and profile, compiles the C test programs, and runs them in a private control
//! directory with the shim preloaded (or not).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cuinterpose_testkit::fixtures::TempDir;
use std::sync::OnceLock;

pub use cuinterpose_testkit::target_profile_dir as profile_dir;

/// The directory holding fakecuda's `libcuda.so.1` (built for this test's profile).
pub fn lib_dir() -> &'static Path {
    cuinterpose_testkit::fakecuda_lib_dir()
}

/// `libcuinterpose.so`, built for this test's profile.
pub fn shim() -> &'static Path {
    cuinterpose_testkit::build_shim()
}

fn compile(args: &[&str], source: &str, output: &Path) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    cuinterpose_testkit::cc(&source, output, args);
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

/// The test kit's stand-in CUDA runtime as `libcudart.so.13`.
pub fn fake_runtime() -> &'static Path {
    cuinterpose_testkit::stand_in_runtime(false)
}

/// tests/c/nulldriver.c as a shared library: two driver functions that return at once.
pub fn null_driver() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = profile_dir().join(format!("shim-null-driver.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("libnulldriver.so");
        compile(&["-shared", "-fPIC"], "nulldriver.c", &out);
        out
    })
}

/// A private directory for one test: control sockets of the shim and of fakecuda live here.
/// It is removed when the sandbox is dropped.
pub struct Sandbox {
    pub root: PathBuf,
    _dir: TempDir,
}

impl Sandbox {
    pub fn new(name: &str) -> Sandbox {
        let dir = TempDir::new(&format!("shim-{name}")).unwrap();
        Sandbox {
            root: dir.path().to_path_buf(),
            _dir: dir,
        }
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

/// A scriptable worker (cuinterpose-worker) in `sandbox`, with the shim preloaded when `shim`
/// is set, initialised on device 0.
pub fn worker(
    sandbox: &Sandbox,
    entry: cuinterpose_workload::EntryPath,
    shim: bool,
) -> cuinterpose_workload::Worker {
    worker_with(sandbox, entry, shim, &[])
}

/// [`worker`] with extra environment variables.
pub fn worker_with(
    sandbox: &Sandbox,
    entry: cuinterpose_workload::EntryPath,
    shim: bool,
    env: &[(&str, &str)],
) -> cuinterpose_workload::Worker {
    let mut config = cuinterpose_workload::WorkerConfig::new(cuinterpose_testkit::build_worker())
        .entry(entry)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("CUINTERPOSE_CONTROL_DIR", sandbox.control_dir())
        .env("FAKECUDA_CONTROL_DIR", sandbox.root.join("fakecuda"));
    config = if shim {
        config.env("LD_PRELOAD", self::shim())
    } else {
        config.env_remove("LD_PRELOAD")
    };
    for (key, value) in env {
        config = config.env(key, value);
    }
    let mut worker = cuinterpose_workload::Worker::spawn(&config).expect("spawn worker");
    worker.init(0).expect("init");
    worker
}

/// Sends one request to the shim of namespace pid `pid` in `sandbox`.
pub fn ask(
    sandbox: &Sandbox,
    pid: i32,
    request: &cuinterpose_protocol::Request,
) -> cuinterpose_protocol::Reply {
    use cuinterpose_protocol::NamespacePid;
    use cuinterpose_protocol::transport::{Endpoint, call};
    let endpoint = Endpoint::for_pid(
        &sandbox.control_dir(),
        NamespacePid::new(pid as u32).unwrap(),
    )
    .unwrap();
    call(&endpoint, request, None, std::time::Duration::from_secs(10))
        .expect("shim answers")
        .0
}

/// The shim's inspection of namespace pid `pid`.
pub fn inspect(sandbox: &Sandbox, pid: i32) -> cuinterpose_protocol::InspectionReply {
    match ask(sandbox, pid, &cuinterpose_protocol::Request::Inspect) {
        cuinterpose_protocol::Reply::Inspection(i) => i,
        other => panic!("inspect of {pid}: {other:?}"),
    }
}

/// Runs fakecuda-checkpoint (the native checkpoint tool) against host pid `pid`.
pub fn native(sandbox: &Sandbox, pid: i32, action: &str) {
    let out = Command::new(cuinterpose_testkit::build_fakecuda_checkpoint())
        .args(["--action", action, "--pid", &pid.to_string()])
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("FAKECUDA_CONTROL_DIR", sandbox.root.join("fakecuda"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{action} {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends `operation` to `pid` and returns the bytes it reports.
pub fn completed(sandbox: &Sandbox, pid: i32, operation: cuinterpose_protocol::Operation) -> u64 {
    use cuinterpose_protocol::{ExecuteRequest, Reply, Request};
    match ask(
        sandbox,
        pid,
        &Request::Execute(ExecuteRequest::host(operation)),
    ) {
        Reply::Completed(c) => {
            assert_eq!(c.operation, operation);
            c.bytes
        }
        other => panic!("{operation} in {pid}: {other:?}"),
    }
}

/// The whole cycle, phase by phase with a barrier between phases: capture, native checkpoint
/// and restore, restore; then every process is active again with the records it had.
/// Returns the bytes each phase moved, summed over processes.
pub fn toggle(sandbox: &Sandbox, pids: &[i32]) -> (u64, u64) {
    use cuinterpose_protocol::{Phase, Reply, Request};
    let mut before = Vec::new();
    for &pid in pids {
        match ask(sandbox, pid, &Request::BeginCheckpoint) {
            Reply::Inspection(i) => before.push(i.records),
            other => panic!("begin_checkpoint in {pid}: {other:?}"),
        }
    }
    let mut saved = 0;
    for op in cuinterpose_protocol::CAPTURE_OPERATIONS {
        for &pid in pids {
            saved += completed(sandbox, pid, op);
        }
    }
    for &pid in pids {
        native(sandbox, pid, "lock");
        native(sandbox, pid, "checkpoint");
    }
    for &pid in pids {
        native(sandbox, pid, "restore");
        native(sandbox, pid, "unlock");
    }
    let mut loaded = 0;
    for op in cuinterpose_protocol::RESTORE_OPERATIONS {
        for &pid in pids {
            loaded += completed(sandbox, pid, op);
        }
    }
    for (&pid, records) in pids.iter().zip(before) {
        let now = inspect(sandbox, pid);
        assert_eq!(now.phase, Phase::Active, "{pid}");
        assert_eq!(now.records, records, "records of {pid} after restore");
    }
    (saved, loaded)
}

/// fakecuda and the shim loaded into this process (the shim `RTLD_LOCAL`, so it interposes
/// nothing; it reaches fakecuda through `CUINTERPOSE_DRIVER`), with both control directories
/// in a sandbox. For benchmarks that call the two side by side.
pub struct InProcess {
    pub sandbox: Sandbox,
    pub driver: libloading::Library,
    pub shim: libloading::Library,
}

/// Loads [`InProcess`]. Call it before starting any thread: it sets environment variables.
pub fn in_process(name: &str) -> InProcess {
    let fakecuda = lib_dir().join("libcuda.so.1");
    let sandbox = Sandbox::new(name);
    // SAFETY: called before any other thread exists (see above); the libraries read these.
    unsafe {
        std::env::set_var("CUINTERPOSE_DRIVER", &fakecuda);
        std::env::set_var("CUINTERPOSE_CONTROL_DIR", sandbox.control_dir());
        std::env::set_var("FAKECUDA_CONTROL_DIR", sandbox.root.join("fakecuda"));
    }
    // SAFETY: loading the libraries runs no initialisers with preconditions.
    let driver = unsafe { libloading::Library::new(&fakecuda) }.unwrap();
    // SAFETY: as above; RTLD_LOCAL keeps the shim's exports out of the global scope.
    let shim = unsafe {
        libloading::os::unix::Library::open(Some(shim()), libc::RTLD_NOW | libc::RTLD_LOCAL)
    }
    .unwrap()
    .into();
    InProcess {
        sandbox,
        driver,
        shim,
    }
}

/// An export request for the unicast allocation `ticket` names, with `capability`.
pub fn export_request(
    ticket: &cuinterpose_protocol::Ticket,
    capability: cuinterpose_protocol::CapabilityToken,
) -> cuinterpose_protocol::Request {
    use cuinterpose_protocol::{AllocationReference, ExportRequest, Request, ResourceKind};
    Request::Export(ExportRequest {
        allocation: AllocationReference {
            id: ticket.handle.allocation,
            creator_pid: ticket.handle.creator_pid,
        },
        resource: ResourceKind::Unicast,
        capability,
    })
}
