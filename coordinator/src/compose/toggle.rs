//! `toggle`: checkpoint and restore in place, and what a toggle does when its device map
//! cannot be honoured (the workload resumes on its own GPUs).

use std::fs;
use std::path::{Path, PathBuf};

use super::{Workload, checkpoint, restore};
use crate::commands::CommandError;
use crate::events::Event;
use crate::report::Report;

/// The restore half of a toggle, `restore` of `workload`. A device map this machine cannot
/// honour is refused before that restore changes anything; the workload is then restored on
/// its own GPUs (a failure of that is one after mutation, `during`) and the toggle aborts
/// (exit 3), saying why. Any other outcome is returned as it is.
pub fn resume_unless_refused_map(
    workload: &Workload,
    during: &str,
    mut restore: impl FnMut(&Workload) -> Result<Report, CommandError>,
) -> Result<Report, CommandError> {
    match restore(workload) {
        Err(refused @ (CommandError::DeviceMap(_) | CommandError::Devices(_))) => {
            let in_place = Workload {
                device_map: None,
                ..workload.clone()
            };
            let resumed = restore(&in_place).map_err(|error| error.after_mutation(during))?;
            Err(CommandError::Aborted {
                during: "restore onto other GPUs".into(),
                cause: refused.to_string(),
                source: Box::new(refused),
                resumed: Box::new(resumed),
            })
        }
        other => other,
    }
}

/// Checkpoint and restore in place: the workload keeps running afterwards, with its sharing
/// rebuilt. Uses `dir`, or a fresh temporary directory removed after success.
pub fn toggle(
    workload: &Workload,
    root: u32,
    dir: Option<&Path>,
    progress: &mut dyn FnMut(&Event),
) -> Result<Report, CommandError> {
    let temporary = match dir {
        Some(_) => None,
        None => Some(temporary_dir(root)?),
    };
    let dir = dir.map_or_else(|| temporary.clone().expect("temporary"), Path::to_path_buf);
    let mut report = Report::new("toggle");
    match checkpoint(workload, root, &dir, progress) {
        Ok(checkpointed) => report.absorb(checkpointed),
        Err(error) => {
            // Nothing was changed, or the workload was put back in place: the temporary
            // directory holds nothing worth keeping. After a fail-stop it holds the state a
            // recovery needs, so it stays.
            if let Some(temporary) = &temporary
                && matches!(error.exit_code(), 1 | 3)
            {
                let _ = fs::remove_dir_all(temporary);
            }
            return Err(error);
        }
    }
    let restored = resume_unless_refused_map(workload, "restore", |workload| {
        restore(workload, Some(root), &dir, progress)
    })
    .map_err(|error| error.after_mutation("restore"));
    if let (Err(CommandError::Aborted { .. }), Some(temporary)) = (&restored, &temporary) {
        let _ = fs::remove_dir_all(temporary);
    }
    report.absorb(restored?);
    if let Some(temporary) = temporary {
        let _ = fs::remove_dir_all(&temporary);
        report.checkpoint_dir = None;
    }
    Ok(report)
}

fn temporary_dir(root: u32) -> Result<PathBuf, CommandError> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let path = std::env::temp_dir().join(format!(
        "cuinterpose-toggle-{root}-{}-{nanos:x}",
        std::process::id()
    ));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(CommandError::io(
            &path,
            "creating a temporary checkpoint directory",
        ))?;
    Ok(path)
}
