//! Running the demo: its work directory, the driver it points everything at, then start,
//! build, inspect, checkpoint and restore (in place or through CRIU), and verify.

use std::path::{Path, PathBuf};

use cuinterpose_protocol::transport::Timeouts;
use cuinterpose_workload::Worker;
use cuinterpose_workload::cuda::HANDLE_TYPE_POSIX_FD as POSIX;

use super::topology::{Demo, build_topology, check_sharing, device_count};
use super::types::{
    DemoError, DriverChoice, FAKECUDA_CONTROL_DIR, Options, Outcome, fakecuda_dir, phase, setup,
    worker_error,
};
use super::workers::{
    Artifacts, artifacts, config, connect_all, entry_for, kill_namespace, namespace_root,
    start_namespace,
};
use crate::compose::{self, Workload};
use crate::criu;
use crate::events::Event;
use crate::report::Report;
use crate::session::{self, Session};

/// Mesh allocations per process: each process creates as many as it imports, two records each
/// (allocation and mapping), and the rest of the topology needs a few dozen more.
pub const MAX_MESH: usize = 4000;

/// The demo's work directory: named after this process, so that it is the same when the
/// program starts again to take [`environment`].
pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("cuinterpose-demo-{}", std::process::id()))
}

/// What the demo's own process needs in its environment before it starts: fakecuda, loaded
/// for the native checkpoint calls, finds the workers' control sockets through it.
pub fn environment() -> Vec<(String, String)> {
    vec![(
        FAKECUDA_CONTROL_DIR.to_owned(),
        fakecuda_dir(&work_dir()).display().to_string(),
    )]
}

/// Runs the demo.
pub fn run(options: &Options, progress: &mut dyn FnMut(&Event)) -> Result<Outcome, DemoError> {
    if options.processes < 2 {
        return Err(setup(
            "--processes must be at least 2 (sharing needs two processes)",
        ));
    }
    if options.mesh > MAX_MESH {
        return Err(setup(format!(
            "--mesh {} is too many: at most {MAX_MESH} (each adds 4 records to a process, and \
             an inspection carries at most {} records)",
            options.mesh,
            cuinterpose_protocol::MAX_RECORDS
        )));
    }
    let artifacts = artifacts()?;
    let work = work_dir();
    let _ = std::fs::remove_dir_all(&work);
    for sub in ["control", "fakecuda", "lib"] {
        std::fs::create_dir_all(work.join(sub))
            .map_err(|e| setup(format!("creating {}: {e}", work.display())))?;
    }
    let result = point_at_driver(options, &artifacts, &work)
        .and_then(|driver| run_in(options, &artifacts, &work, &driver, progress));
    if !options.keep {
        // Nothing the demo made outlives it unless --keep asked for it.
        let _ = std::fs::remove_dir_all(&work);
        if result.is_err() {
            eprintln!(
                "cuinterpose: demo: its work directory was removed; rerun with --keep to keep it \
                 (logs, state, CRIU images)"
            );
        }
    }
    result.map(|mut outcome| {
        outcome.work_dir = work;
        outcome
    })
}

/// Links the driver into `work`; the coordinator's own native calls go to the path returned.
fn point_at_driver(
    options: &Options,
    artifacts: &Artifacts,
    work: &Path,
) -> Result<PathBuf, DemoError> {
    let driver_path = match &options.driver {
        DriverChoice::Embedded => {
            if !artifacts.fakecuda.exists() {
                return Err(setup(format!(
                    "{} not found next to cuinterpose: build the workspace first",
                    artifacts.fakecuda.display()
                )));
            }
            let link = work.join("lib/libcuda.so.1");
            std::os::unix::fs::symlink(&artifacts.fakecuda, &link)
                .map_err(|e| setup(format!("linking {}: {e}", link.display())))?;
            link
        }
        DriverChoice::Path(p) => p.clone(),
    };
    // The coordinator's own native-checkpoint calls reach the same driver and, for fakecuda,
    // the same control directory as the workers (see `environment`).
    Ok(driver_path)
}

fn run_in(
    options: &Options,
    artifacts: &Artifacts,
    work: &Path,
    driver: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Outcome, DemoError> {
    let n = options.processes;
    let mut namespace = None;
    let mut container = None;
    let workers = match &options.criu {
        _ if options.podman => {
            let (started, sockets) = super::podman::start(
                artifacts,
                work,
                &options.driver,
                driver,
                n,
                options.keep,
                options.carriage,
            )?;
            let workers = connect_all(&sockets)?;
            container = Some((started, sockets));
            workers
        }
        None => (0..n)
            .map(|i| {
                Worker::spawn(&config(artifacts, work, &options.driver, entry_for(i)))
                    .map_err(worker_error(format!("starting worker {i}")))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(criu) => {
            criu::check(criu).map_err(|e| setup(format!("CRIU cannot run here: {e}")))?;
            let (unshare, sockets) = start_namespace(artifacts, work, &options.driver, n)?;
            let root = namespace_root(unshare.id())?;
            namespace = Some((unshare, sockets.clone(), root));
            connect_all(&sockets)?
        }
    };
    let mut demo = Demo::new(workers, options.shared_mib << 20, options.mesh);
    for i in 0..n {
        let device = 0;
        demo.w(i)
            .init(device)
            .map_err(worker_error(format!("initialising CUDA in worker {i}")))?;
    }
    let count = device_count(&demo.workers[0]);
    for i in 0..n {
        let device = (i as i32) % count;
        demo.w(i)
            .set_device(device)
            .map_err(worker_error("selecting the device"))?;
    }
    demo.granularity = demo
        .w(0)
        .granularity(0, POSIX, 0)
        .map_err(worker_error("granularity"))?;
    build_topology(&mut demo)?;

    let workload = Workload {
        control_dir: work.join("control"),
        timeouts: Timeouts::from_env().map_err(|e| setup(e.to_string()))?,
        lock_timeout_ms: 10_000,
        proc_dir: PathBuf::from("/proc"),
        device_map: None,
        carriage: options.carriage,
        driver: driver.to_path_buf(),
    };
    let session = Session::open(&workload.control_dir, &[], workload.timeouts)
        .map_err(crate::commands::CommandError::from)?;
    let inspection = session::inspect(&session);
    match &inspection.validation {
        Some(Ok(topology)) => demo.topology.push(format!(
            "inspect: {} participants, {} records, {} shared allocations ({} bytes to save)",
            topology.participants.len(),
            topology.records,
            topology.shared_allocations.len(),
            topology.bytes_to_save
        )),
        other => return Err(setup(format!("the topology does not validate: {other:?}"))),
    }

    let report = match (&options.criu, namespace.take()) {
        _ if container.is_some() => {
            let (started, sockets) = container.as_ref().expect("checked");
            super::podman::cycles(&mut demo, started, sockets, progress)?
        }
        (Some(criu), Some((mut unshare, sockets, root))) if options.criu_hook => {
            let (report, root) = super::hook::cycles(
                &mut demo,
                criu,
                &workload,
                root,
                &mut unshare,
                &sockets,
                work,
                options.criu_plugins.as_deref(),
                progress,
            )?;
            namespace = Some((unshare, sockets, root));
            report
        }
        (Some(criu), Some((mut unshare, sockets, root))) => {
            let report = criu_cycle(
                &mut demo,
                &workload,
                criu,
                &mut unshare,
                &sockets,
                root,
                work,
                progress,
            )?;
            namespace = Some((unshare, sockets, root));
            report
        }
        _ => {
            let keep = options.keep.then(|| work.join("checkpoint"));
            compose::toggle(&workload, std::process::id(), keep.as_deref(), progress)?
        }
    };
    let mut report = report;
    let (regions, bytes, sharing) = phase("demo_verify".into(), n, &mut report, progress, || {
        let (regions, bytes) = demo.verify_all()?;
        Ok((regions, bytes, check_sharing(&mut demo)?))
    })?;
    if let Some((started, _)) = container {
        // Tell every restored worker to exit, then remove the container.
        demo.exit_all();
        drop(started);
    }
    if let Some((_, sockets, _)) = namespace {
        // Tell every restored worker to exit; the namespace then ends with them.
        demo.exit_all();
        drop(sockets);
    }
    Ok(Outcome {
        report,
        processes: n,
        topology: demo.topology,
        regions_verified: regions,
        bytes_verified: bytes,
        sharing_checks: sharing,
        work_dir: PathBuf::new(),
    })
}

/// `demo --criu`: dump the namespace's tree into `work/checkpoint` and restore it, the workers
/// connected again. An aborted dump leaves the tree running with its sharing rebuilt: that is
/// checked, then the tree ends; any other failure ends it as it is.
#[allow(clippy::too_many_arguments)]
fn criu_cycle(
    demo: &mut Demo,
    workload: &Workload,
    criu: &criu::Criu,
    unshare: &mut std::process::Child,
    sockets: &[PathBuf],
    root: u32,
    work: &Path,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, DemoError> {
    // Nothing outside the tree may stay connected to it during the dump.
    demo.workers.clear();
    let dir = work.join("checkpoint");
    let mut report = Report::new("demo --criu");
    match criu::checkpoint(workload, criu, root, &dir, progress) {
        Ok(checkpointed) => report.absorb(checkpointed),
        Err(error) => {
            if error.exit_code() == crate::plan::EXIT_ABORTED {
                demo.workers = connect_all(sockets)?;
                let (regions, bytes) = demo.verify_all()?;
                let links = check_sharing(demo)?;
                eprintln!(
                    "cuinterpose: demo: after the abort, {regions} regions ({bytes} bytes) \
                     verified at their original addresses and {links} sharing links live"
                );
                demo.exit_all();
            } else {
                kill_namespace(root);
            }
            let _ = unshare.wait();
            return Err(error.into());
        }
    }
    let _ = unshare.wait();
    report.absorb(criu::restore(workload, criu, &dir, progress)?);
    demo.workers = connect_all(sockets)?;
    Ok(report)
}
