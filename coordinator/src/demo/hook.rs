//! `demo --criu --criu-hook`: the workload checkpointed and restored by plain `criu dump` and
//! `criu restore`, configured with one line (`action-script` naming this executable): first a
//! dump with `--leave-running` (the hook's watcher restores the tree in place), then two dump
//! and restore cycles. The demo runs no cuinterpose command between them: the hook does the work inside
//! CRIU. A dump that fails is put back by the hook's watcher, which the demo waits for.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::topology::{Demo, check_sharing};
use super::types::{DemoError, phase, setup};
use super::workers::{connect_all, kill_namespace};
use crate::compose::Workload;
use crate::criu::Criu;
use crate::events::Event;
use crate::hook;
use crate::report::Report;

/// Dump and restore cycles the demo runs through the hook.
pub const CYCLES: usize = 2;

/// The CRIU configuration file: the hook, and the plugin directory when one is given.
fn write_config(work: &Path, plugins: Option<&Path>) -> Result<PathBuf, DemoError> {
    let exe = std::env::current_exe().map_err(|e| setup(format!("this executable: {e}")))?;
    let config = work.join("criu.conf");
    let mut text = format!("action-script {}\n", exe.display());
    if let Some(plugins) = plugins {
        text.push_str(&format!("libdir {}\n", plugins.display()));
    }
    std::fs::write(&config, text)
        .map_err(|e| setup(format!("writing {}: {e}", config.display())))?;
    Ok(config)
}

/// CRIU's CUDA plugin on the embedded driver: `cuda-checkpoint` on CRIU's `PATH` is
/// fakecuda-checkpoint (next to this executable), which loads the demo's driver; the plugin,
/// which looks for `/proc/driver/nvidia/gpus/`, is forced on with CRIU's fault injection 138.
fn plugin_env(work: &Path, driver: &Path) -> Result<Vec<(OsString, OsString)>, DemoError> {
    let exe = std::env::current_exe().map_err(|e| setup(format!("this executable: {e}")))?;
    let tool = exe.with_file_name("fakecuda-checkpoint");
    if !tool.exists() {
        return Err(setup(format!(
            "{} not found next to cuinterpose: build the workspace first",
            tool.display()
        )));
    }
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| setup(format!("creating {}: {e}", bin.display())))?;
    let link = bin.join("cuda-checkpoint");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&tool, &link)
        .map_err(|e| setup(format!("linking {}: {e}", link.display())))?;
    let mut path = OsString::from(bin.as_os_str());
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    Ok(vec![
        ("PATH".into(), path),
        ("FAKECUDA_LIBCUDA".into(), driver.as_os_str().to_owned()),
        ("CRIU_FAULT".into(), "138".into()),
    ])
}

/// What CRIU's CUDA plugin logged in a cycle: the processes it found checkpointed at the dump
/// (the hook had done them) and those it restored.
fn plugin_saw(images: &Path) -> Result<(usize, usize), DemoError> {
    let read = |name: &str| std::fs::read_to_string(images.join(name)).unwrap_or_default();
    let found = read("dump.log")
        .lines()
        .filter(|line| {
            line.contains("cuda_plugin: pid") && line.contains("already in a checkpointed state")
        })
        .count();
    let resumed = read("restore.log")
        .lines()
        .filter(|line| line.contains("cuda_plugin: resuming devices on pid"))
        .count();
    if found == 0 || resumed == 0 {
        return Err(DemoError::Verification(format!(
            "CRIU's CUDA plugin did not take part (found {found} checkpointed, resumed \
             {resumed}; see {})",
            images.display()
        )));
    }
    Ok((found, resumed))
}

/// Where the hook's pre-dump put the shared bytes: the storage carrier's files beside CRIU's
/// images in `images`, or (none there) the host carriers, which CRIU's page images then hold.
pub(super) fn carried(images: &Path) -> String {
    let sizes: Vec<u64> = std::fs::read_dir(crate::checkpoint_dir::carrier(images))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .collect();
    if sizes.is_empty() {
        return "the shared bytes stayed in the host carriers (CRIU's page images hold them)"
            .into();
    }
    format!(
        "the shared bytes went to {} carrier files ({} bytes) beside CRIU's images",
        sizes.len(),
        sizes.iter().sum::<u64>()
    )
}

/// What the hook recorded for a successful `action` in `images` (the status file holds every
/// delivery; one must be `ok`).
pub(super) fn hook_said(images: &Path, action: &str) -> Result<String, DemoError> {
    let lines = hook::read_status(images);
    let mine: Vec<&serde_json::Value> = lines.iter().filter(|l| l["action"] == action).collect();
    match mine.iter().find(|line| line["status"] == "ok") {
        Some(line) => Ok(line["message"].as_str().unwrap_or_default().to_owned()),
        None => Err(DemoError::Verification(match mine.last() {
            Some(line) => format!("the hook's {action} did not succeed: {line}"),
            None => format!(
                "the hook recorded no {action} in {}",
                crate::checkpoint_dir::hook_status(images).display()
            ),
        })),
    }
}

/// Runs [`CYCLES`] plain CRIU dumps and restores of the tree rooted at `root`, verifying every
/// byte and sharing link after each. Returns the report and the restored root.
#[allow(clippy::too_many_arguments)]
pub(super) fn cycles(
    demo: &mut Demo,
    criu: &Criu,
    workload: &Workload,
    mut root: u32,
    unshare: &mut Child,
    sockets: &[PathBuf],
    work: &Path,
    plugins: Option<&Path>,
    progress: &mut dyn FnMut(&Event),
) -> Result<(Report, u32), DemoError> {
    // CRIU changes directory: a relative plugin directory would not be found.
    let plugins = plugins
        .map(|dir| {
            std::fs::canonicalize(dir)
                .map_err(|e| setup(format!("the CRIU plugin directory {}: {e}", dir.display())))
        })
        .transpose()?;
    let plugins = plugins.as_deref();
    let config = write_config(work, plugins)?;
    let mut criu = criu.clone();
    criu.extra_args = vec!["--config".into(), config.into_os_string()];
    criu.env = hook_environment(work, &workload.driver, workload.carriage);
    if plugins.is_some() {
        criu.env
            .extend(plugin_env(work, &work.join("lib/libcuda.so.1"))?);
    }
    let n = sockets.len();
    let mut report = Report::new("demo --criu --criu-hook");
    snapshot(
        demo,
        &criu,
        root,
        unshare,
        sockets,
        work,
        &mut report,
        progress,
    )?;
    for cycle in 1..=CYCLES {
        let images = work.join(format!("images-{cycle}"));
        // Nothing outside the tree may stay connected to it during the dump.
        demo.workers.clear();
        phase(
            format!("criu_dump_{cycle}"),
            n,
            &mut report,
            progress,
            || {
                criu.dump(root, &images).map_err(|error| {
                    after_failed_dump(demo, sockets, &images, error, unshare, root)
                })
            },
        )?;
        hook_said(&images, "pre-dump")?;
        demo.topology.push(format!(
            "criu cycle {cycle}: pre-dump: {}",
            carried(&images)
        ));
        take_counts(&mut report, &images);
        if cycle == 1 {
            let _ = unshare.wait();
        }

        root = phase(
            format!("criu_restore_{cycle}"),
            n,
            &mut report,
            progress,
            || Ok(criu.restore(&images)?),
        )?;
        let said = hook_said(&images, "post-resume")?;
        demo.topology
            .push(format!("criu cycle {cycle}: post-resume: {said}"));
        if plugins.is_some() {
            let (found, resumed) = plugin_saw(&images)?;
            demo.topology.push(format!(
                "criu cycle {cycle}: CRIU's CUDA plugin found {found} processes checkpointed \
                 by the hook and restored {resumed}"
            ));
        }
        demo.workers = connect_all(sockets)?;
        if cycle < CYCLES {
            // Every byte, before the next dump (the last cycle is verified, sharing included,
            // by the demo itself; the sharing check writes, so it runs once, at the end).
            let (regions, bytes) = demo.verify_all()?;
            demo.topology.push(format!(
                "criu cycle {cycle}: {regions} regions ({bytes} bytes) verified"
            ));
        }
    }
    Ok((report, root))
}

/// The participants and sharing the hook's pre-dump report names, into `report`.
pub(super) fn take_counts(report: &mut Report, images: &Path) {
    let lines = hook::read_status(images);
    let Some(prepared) = lines
        .iter()
        .find(|line| line["action"] == "pre-dump" && line["status"] == "ok")
    else {
        return;
    };
    let count = |key: &str| prepared["report"][key].as_u64().unwrap_or(0) as usize;
    report.participants = prepared["report"]["participants"]
        .as_array()
        .map(|pids| {
            pids.iter()
                .filter_map(|pid| pid.as_u64())
                .filter_map(|pid| cuinterpose_protocol::NamespacePid::new(pid as u32))
                .collect()
        })
        .unwrap_or_default();
    report.shared_allocations = count("shared_allocations");
    report.multicast_groups = count("multicast_groups");
}

/// A dump with `--leave-running` first (what `podman container checkpoint --leave-running`
/// asks for): CRIU resumes the tree after the dump without telling any script, and the hook's
/// watcher restores it in place from the state. Every byte is verified afterwards.
#[allow(clippy::too_many_arguments)]
fn snapshot(
    demo: &mut Demo,
    criu: &Criu,
    root: u32,
    unshare: &mut Child,
    sockets: &[PathBuf],
    work: &Path,
    report: &mut Report,
    progress: &mut dyn FnMut(&Event),
) -> Result<(), DemoError> {
    let images = work.join("images-snapshot");
    let mut criu = criu.clone();
    criu.extra_args.push("--leave-running".into());
    demo.workers.clear();
    let n = sockets.len();
    let watched = phase("criu_snapshot".to_owned(), n, report, progress, || {
        if let Err(error) = criu.dump(root, &images) {
            return Err(after_failed_dump(
                demo, sockets, &images, error, unshare, root,
            ));
        }
        let watched = watch_record(&images).ok_or_else(|| {
            DemoError::Verification("the hook's watcher recorded nothing after the snapshot".into())
        })?;
        if watched["status"] != "ok" {
            return Err(DemoError::Verification(format!(
                "the hook's watcher did not restore the snapshotted tree: {watched}"
            )));
        }
        Ok(watched)
    })?;
    demo.workers = connect_all(sockets)?;
    let (regions, bytes) = demo.verify_all()?;
    demo.topology.push(format!(
        "criu snapshot (--leave-running): {}; {regions} regions ({bytes} bytes) verified",
        watched["message"].as_str().unwrap_or_default()
    ));
    Ok(())
}

/// The watcher's record in `images`, waiting for it up to [`WATCHER_WAIT`].
fn watch_record(images: &Path) -> Option<serde_json::Value> {
    let deadline = Instant::now() + WATCHER_WAIT;
    loop {
        let lines = hook::read_status(images);
        if let Some(line) = lines.iter().find(|line| line["action"] == "watch") {
            return Some(line.clone());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long the demo waits for the hook's watcher after a failed dump.
const WATCHER_WAIT: Duration = Duration::from_secs(60);

/// The dump failed after `pre-dump`: the watcher puts the workload back once CRIU is gone.
/// Waits for its record, then checks the workload and ends it. The result is the failure the
/// demo reports: exit 3 when the workload was put back.
fn after_failed_dump(
    demo: &mut Demo,
    sockets: &[PathBuf],
    images: &Path,
    error: crate::commands::CommandError,
    unshare: &mut Child,
    root: u32,
) -> DemoError {
    // A pre-dump that refused or rolled its capture back (e.g. the storage carrier on a full
    // disk) left the tree running and started no watcher: CRIU stops before it dumps anything.
    let kept_running = [crate::plan::EXIT_REFUSED, crate::plan::EXIT_ABORTED].map(u64::from);
    let refused = hook::read_status(images).into_iter().find(|line| {
        line["action"] == "pre-dump"
            && line["status"] == "failed"
            && line["exit_code"]
                .as_u64()
                .is_some_and(|code| kept_running.contains(&code))
    });
    let watched = match refused {
        Some(_) => None,
        None => watch_record(images),
    };
    let by_watcher = watched.as_ref().is_some_and(|line| line["status"] == "ok");
    let resumed = by_watcher || refused.is_some();
    if resumed && let Ok(workers) = connect_all(sockets) {
        demo.workers = workers;
        if let (Ok((regions, bytes)), Ok(links)) = (demo.verify_all(), check_sharing(demo)) {
            let who = if by_watcher {
                "the hook's watcher put the workload back"
            } else {
                "the hook's pre-dump failed and left the workload running"
            };
            eprintln!(
                "cuinterpose: demo: {who}: {regions} regions ({bytes} bytes) verified at their \
                 original addresses and {links} sharing links live"
            );
        }
        demo.exit_all();
    } else {
        kill_namespace(root);
    }
    let _ = unshare.wait();
    let what = match watched {
        Some(line) => format!("the hook's watcher: {}", line["message"]),
        None => "the hook's watcher recorded nothing".to_owned(),
    };
    if resumed {
        DemoError::Command(crate::commands::CommandError::Aborted {
            during: "criu dump".into(),
            cause: error.to_string(),
            source: Box::new(error),
            resumed: Box::new(Report::new("resume")),
        })
    } else {
        DemoError::Verification(format!("criu dump failed ({error}); {what}"))
    }
}

/// The hook's environment (CRIU, or runc under Podman, passes it on): the demo's carrier,
/// control directory, driver, and that driver's own control directory, whatever this
/// process's environment or a settings file on the machine says.
pub(super) fn hook_environment(
    work: &Path,
    driver: &Path,
    carriage: crate::plan::Carriage,
) -> Vec<(OsString, OsString)> {
    let mut environment: Vec<(OsString, OsString)> = carrier_environment(carriage)
        .into_iter()
        .map(|(name, value)| (name.into(), value.into()))
        .collect();
    environment.extend([
        (
            cuinterpose_protocol::transport::CONTROL_DIR_VARIABLE.into(),
            work.join("control").into_os_string(),
        ),
        (
            crate::native::DRIVER_VARIABLE.into(),
            driver.as_os_str().to_owned(),
        ),
        (
            super::types::FAKECUDA_CONTROL_DIR.into(),
            super::types::fakecuda_dir(work).into_os_string(),
        ),
    ]);
    environment
}

/// The hook's carrier settings for `carriage`, as `--carrier` and `--staging-mib` take them.
pub(super) fn carrier_environment(carriage: crate::plan::Carriage) -> [(&'static str, String); 2] {
    let (carrier, staging) = match carriage {
        crate::plan::Carriage::Host => ("host", crate::plan::DEFAULT_STAGING_BYTES),
        crate::plan::Carriage::Storage { staging_bytes } => ("storage", staging_bytes),
    };
    [
        (crate::hook::CARRIER_VARIABLE, carrier.to_owned()),
        (crate::hook::STAGING_VARIABLE, (staging >> 20).to_string()),
    ]
}
