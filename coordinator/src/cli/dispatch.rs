//! Running a parsed command: [`run`] parses and reports the outcome, `execute` dispatches each
//! command to the coordinator, `inspect` prints what the participants hold.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use serde_json::{Value, json};

use super::args::{Cli, Command, Format, StateCommand, Target};
use super::launch::launch;
use super::output::{failure_json, print_json, print_report};
use super::progress::progress;
use super::settings::{
    EXIT_REFUSED, EXIT_USAGE, Failure, Usage, carriage, driver_path, session, staging_bytes,
    workload,
};
use crate::commands::{self, CommandError};
use crate::compose;
use crate::plan::Carriage;
use crate::report::Report;
use crate::{render, session, state};

/// [`run`] with the process's arguments; with none at all and CRIU's action variable set,
/// `criu-hook` (CRIU runs action scripts without arguments).
pub fn run_from_env() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.len() == 1 && std::env::var_os(crate::hook::ACTION_VARIABLE).is_some() {
        args.push("criu-hook".into());
    }
    run(args)
}

/// Parses `args` and runs the command.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let json = cli.wants_json();
    let command = cli.name();
    match execute(cli.command) {
        Ok(code) => code,
        Err(Failure::Usage(Usage(message))) => {
            eprintln!("cuinterpose: {message}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Command(error)) => {
            let code = error.exit_code();
            for line in error.to_string().lines() {
                eprintln!("cuinterpose: {line}");
            }
            if json {
                print_json(&failure_json(command, &error));
            }
            ExitCode::from(code)
        }
    }
}

/// Adds the variables the hook's settings file and the workload's own processes provide (see
/// [`crate::hook::settings`]) where the environment CRIU passed on has none, by starting the
/// hook again with them.
fn adopt_hook_settings() -> Result<(), ExitCode> {
    let root = std::env::var(crate::hook::INIT_PID_VARIABLE)
        .ok()
        .and_then(|pid| pid.trim().parse().ok());
    let set =
        crate::hook::settings::gather(|name| std::env::var(name).ok(), root).map_err(|error| {
            eprintln!("cuinterpose criu-hook: hook settings: {error}");
            ExitCode::from(EXIT_USAGE)
        })?;
    super::restart::with_environment(&set).map_err(|error| {
        eprintln!("cuinterpose criu-hook: hook settings: {error}");
        ExitCode::from(EXIT_USAGE)
    })
}

/// The hook's `--device-map`: `CUINTERPOSE_DEVICE_MAP` (environment or settings file), the
/// same forms, for a plain `criu restore` onto other GPUs.
fn hook_device_map() -> Result<Option<crate::remap::DeviceMapSpec>, Usage> {
    let name = crate::hook::DEVICE_MAP_VARIABLE;
    match std::env::var(name) {
        Ok(text) if text.trim().is_empty() => Ok(None),
        Ok(text) => text
            .parse()
            .map(Some)
            .map_err(|why| Usage(format!("{name}={text:?}: {why}"))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Usage(format!("{name} is not valid UTF-8"))),
    }
}

/// One CRIU action: run, recorded in the status file, said on stderr.
fn criu_hook(workload: &compose::Workload) -> ExitCode {
    use crate::hook::{self, Context};
    let context = match Context::from_lookup(|name| std::env::var(name).ok()) {
        Ok(context) => context,
        Err(error) => {
            eprintln!("cuinterpose criu-hook: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    let action = context.action.name().to_owned();
    let mut quiet = |_: &crate::events::Event| {};
    let outcome = hook::run(&context, workload, &mut quiet);
    hook::record(context.image_dir.as_deref(), &action, &outcome);
    match outcome {
        Ok(done) => {
            eprintln!("cuinterpose criu-hook: {action}: {}", done.message);
            ExitCode::SUCCESS
        }
        Err(error) => {
            for line in error.to_string().lines() {
                eprintln!("cuinterpose criu-hook: {action}: {line}");
            }
            ExitCode::from(error.exit_code().max(1))
        }
    }
}

fn execute(command: Command) -> Result<ExitCode, Failure> {
    match command {
        Command::Inspect { target, json } => inspect(&target, json),
        Command::Prepare {
            checkpoint_dir,
            target,
            carrier,
            json,
        } => {
            let carriage = carriage(&carrier, true)?;
            let session = session(&target)?
                .carrying(carriage)
                .on_machine(commands::machine_at(&driver_path()));
            let report = commands::prepare(&session, &checkpoint_dir, &mut progress(json))?;
            print_report(&report, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore {
            checkpoint_dir,
            dir,
            control_dir: control,
            pids,
            json,
            criu,
            staging_mib,
            device_map,
        } => {
            let staged = match staging_mib {
                Some(mib) => Carriage::Storage {
                    staging_bytes: staging_bytes(mib)?,
                },
                None => Carriage::Host,
            };
            if criu.criu && dir.is_none() {
                return Err(Usage(
                    "--criu restores a checkpoint taken with `checkpoint --criu`: use --dir".into(),
                )
                .into());
            }
            let target = Target {
                control_dir: control,
                pids,
            };
            let report = match (checkpoint_dir, dir) {
                (Some(checkpoint_dir), None) => {
                    restore_participants(&checkpoint_dir, &target, staged, device_map, json)?
                }
                (None, Some(dir)) => restore_tree(&dir, target, staged, device_map, &criu, json)?,
                _ => unreachable!("clap requires exactly one of --checkpoint-dir and --dir"),
            };
            print_report(&report, json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Checkpoint {
            tree,
            dir,
            criu,
            carrier,
        } => {
            let mut workload = workload(tree.control_dir.clone(), tree.lock_timeout_ms)?;
            workload.carriage = carriage(&carrier, true)?;
            let report = match criu.get() {
                Some(criu) => crate::criu::checkpoint(
                    &workload,
                    &criu,
                    tree.root,
                    &dir,
                    &mut progress(tree.json),
                )?,
                None => compose::checkpoint(&workload, tree.root, &dir, &mut progress(tree.json))?,
            };
            print_report(&report, tree.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Toggle {
            tree,
            dir,
            criu,
            carrier,
            device_map,
        } => {
            let mut workload = workload(tree.control_dir.clone(), tree.lock_timeout_ms)?;
            workload.device_map = device_map;
            workload.carriage = carriage(&carrier, dir.is_some() || criu.criu)?;
            let report = match criu.get() {
                Some(criu) => toggle_criu(&workload, &criu, tree.root, dir, tree.json)?,
                None => compose::toggle(
                    &workload,
                    tree.root,
                    dir.as_deref(),
                    &mut progress(tree.json),
                )?,
            };
            print_report(&report, tree.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo {
            processes,
            shared_mib,
            mesh,
            driver,
            keep,
            json,
            criu,
            criu_hook,
            criu_plugins,
            podman,
            carrier,
        } => {
            // The driver the demo loads reads its control directory from the environment.
            if let Err(error) = super::restart::with_environment(&crate::demo::environment()) {
                eprintln!("cuinterpose demo: FAILED: {error}");
                return Ok(ExitCode::from(EXIT_USAGE));
            }
            let options = crate::demo::Options {
                // CRIU's and Podman's image directories are kept (auto: storage).
                carriage: carriage(&carrier, criu.criu || podman)?,
                processes,
                shared_mib,
                mesh,
                criu: criu.get(),
                criu_hook,
                criu_plugins,
                podman,
                driver: driver.map_or(
                    crate::demo::DriverChoice::Embedded,
                    crate::demo::DriverChoice::Path,
                ),
                keep,
            };
            Ok(demo(&options, json))
        }
        Command::CriuHook {
            control_dir,
            lock_timeout_ms,
            watch_criu,
            root,
            dir,
        } => hook_command(control_dir, lock_timeout_ms, watch_criu, root, dir),
        Command::Launch {
            shim,
            control_dir: control,
            command,
        } => launch(shim, control, command),
        Command::State(StateCommand::Show { path, format }) => state_show(&path, format),
    }
}

/// `restore --checkpoint-dir`: the participants were restored natively by someone else; the
/// coordinator's restore phases from the state in `checkpoint_dir`.
fn restore_participants(
    checkpoint_dir: &std::path::Path,
    target: &Target,
    staged: Carriage,
    device_map: Option<crate::remap::DeviceMapSpec>,
    json: bool,
) -> Result<Report, Failure> {
    // The state first: a missing or corrupt one is named as such, not as "no participants"
    // when nothing runs.
    let saved = state::load(checkpoint_dir).map_err(CommandError::from)?;
    let session = session(target)?.carrying(staged);
    // The map says where the processes now are, for the final comparison.
    let remap = match &device_map {
        Some(spec) => {
            let driver = crate::native::NativeDriver::load_from(&driver_path())
                .map_err(CommandError::from)?;
            commands::resolve_device_map(&driver, spec, &saved)?
        }
        None => crate::remap::Remap::identity(),
    };
    Ok(commands::restore_remapped(
        &session,
        checkpoint_dir,
        remap,
        &mut progress(json),
    )?)
}

/// `restore --dir`: the whole tree, natively (and with CRIU where asked), from `dir`.
fn restore_tree(
    dir: &std::path::Path,
    target: Target,
    staged: Carriage,
    device_map: Option<crate::remap::DeviceMapSpec>,
    criu: &super::args::CriuArgs,
    json: bool,
) -> Result<Report, Failure> {
    if target.pids.len() > 1 {
        return Err(
            Usage("with --dir, --pid names the workload's root process once".into()).into(),
        );
    }
    let mut workload = workload(target.control_dir, 0)?;
    workload.device_map = device_map;
    workload.carriage = staged;
    Ok(match criu.get() {
        Some(criu) => crate::criu::restore(&workload, &criu, dir, &mut progress(json))?,
        None => compose::restore(
            &workload,
            target.pids.first().copied(),
            dir,
            &mut progress(json),
        )?,
    })
}

/// `toggle --criu`: dump the tree into `dir`, then restore it from there (in place when a
/// device map is refused).
fn toggle_criu(
    workload: &compose::Workload,
    criu: &crate::criu::Criu,
    root: u32,
    dir: Option<std::path::PathBuf>,
    json: bool,
) -> Result<Report, Failure> {
    let dir = dir.ok_or_else(|| Usage("toggle --criu needs --dir for the images".into()))?;
    let mut report = Report::new("toggle");
    report.absorb(crate::criu::checkpoint(
        workload,
        criu,
        root,
        &dir,
        &mut progress(json),
    )?);
    report.absorb(compose::resume_unless_refused_map(
        workload,
        "criu restore",
        |workload| crate::criu::restore(workload, criu, &dir, &mut progress(json)),
    )?);
    Ok(report)
}

/// `state show`: the state file at `path` (or in the directory `path`) as JSON or YAML.
fn state_show(path: &std::path::Path, format: Format) -> Result<ExitCode, Failure> {
    let state = if path.is_dir() {
        state::load(path)
    } else {
        state::load_file(path)
    }
    .map_err(CommandError::from)?;
    let value = render::state_json(&state);
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON values serialize")
        ),
        Format::Yaml => print!("{}", render::yaml(&value)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `criu-hook`: one CRIU action, or (with `--watch-criu`) the watcher a pre-dump started.
fn hook_command(
    control_dir: Option<std::path::PathBuf>,
    lock_timeout_ms: u32,
    watch_criu: Option<u32>,
    root: Option<u32>,
    dir: Option<std::path::PathBuf>,
) -> Result<ExitCode, Failure> {
    if watch_criu.is_none()
        && let Err(code) = adopt_hook_settings()
    {
        return Ok(code);
    }
    let mut workload = workload(control_dir, lock_timeout_ms)?;
    if let (Some(criu), Some(root), Some(dir)) = (watch_criu, root, dir) {
        // The watcher's control directory was resolved by the hook that started it; it puts
        // a tree CRIU left running back where it is, so no device map.
        return Ok(ExitCode::from(crate::hook::watch::watch_and_record(
            criu, root, &dir, &workload,
        )));
    }
    workload.device_map = hook_device_map()?;
    workload.carriage = super::settings::hook_carriage(|name| std::env::var(name).ok())?;
    Ok(criu_hook(&workload))
}

/// Runs the demo and says how it went.
fn demo(options: &crate::demo::Options, json: bool) -> ExitCode {
    match crate::demo::run(options, &mut progress(json)) {
        Ok(outcome) => {
            if json {
                print_json(&outcome.json());
            } else {
                print!("{}", outcome.text());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("cuinterpose demo: FAILED: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn inspect(target: &Target, json: bool) -> Result<ExitCode, Failure> {
    let session = session(target)?;
    let inspection = session::inspect(&session);
    if json {
        let participants: serde_json::Map<String, Value> = inspection
            .replies
            .iter()
            .map(|(pid, reply)| {
                let value = match reply {
                    Ok(reply) => json!({
                        "phase": reply.phase.wire_name(),
                        "raw_imports": reply.raw_imports,
                        "devices": reply.devices.iter().map(render::device_json).collect::<Vec<_>>(),
                        "records": reply.records.iter().map(render::record_json).collect::<Vec<_>>(),
                    }),
                    Err(error) => json!({ "error": error }),
                };
                (pid.to_string(), value)
            })
            .collect();
        let mut value = json!({
            "participants": participants,
            "valid": inspection.is_valid(),
        });
        match &inspection.validation {
            Some(Ok(topology)) => {
                value["summary"] = json!({
                    "participants": topology.participants.len(),
                    "records": topology.records,
                    "shared_allocations": topology.shared_allocations.len(),
                    "importer_records": topology.importer_records,
                    "bytes_to_save": topology.bytes_to_save,
                    "multicast_groups": topology.multicast_groups.len(),
                });
            }
            Some(Err(errors)) => {
                value["errors"] = json!(errors.iter().map(ToString::to_string).collect::<Vec<_>>());
            }
            None => {
                value["errors"] = json!(["not every participant answered"]);
            }
        }
        print_json(&value);
    } else {
        for (pid, reply) in &inspection.replies {
            match reply {
                Ok(reply) => print!("{}", render::inspection_text(*pid, reply)),
                Err(error) => println!("participant {pid}: no inspection: {error}"),
            }
        }
        match &inspection.validation {
            Some(Ok(topology)) => println!(
                "topology: valid: {} participants, {} records, {} shared allocations ({} bytes to save), {} importer records, {} multicast groups",
                topology.participants.len(),
                topology.records,
                topology.shared_allocations.len(),
                topology.bytes_to_save,
                topology.importer_records,
                topology.multicast_groups.len()
            ),
            Some(Err(errors)) => {
                println!(
                    "topology: invalid ({} problem{}):",
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                );
                for error in errors {
                    println!("  {error}");
                }
            }
            None => println!("topology: not validated: not every participant answered"),
        }
    }
    Ok(ExitCode::from(if inspection.is_valid() {
        0
    } else {
        EXIT_REFUSED
    }))
}
