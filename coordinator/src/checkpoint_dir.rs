//! The checkpoint directory: the one owner of what lives in it and where, and of its creation
//! and removal. Commands, the CRIU wrapper, the whole-tree checkpoint and the hook all name
//! its paths through here.
//!
//! ```text
//! <dir>/                          mode 0700 where cuinterpose creates it
//!   cuinterpose.state             the published state (written by `state::publish`, renamed
//!                                 into place; `.cuinterpose.state.*.tmp` while in progress)
//!   cuinterpose.processes         the process list of a whole-tree checkpoint
//!   carrier/<allocation id>       the storage carrier: one file per carried allocation,
//!                                 written and read by its creator's shim
//!   criu/                         CRIU's images, with dump.log, restore.log, restore.pid
//! ```
//!
//! Under CRIU's own hook the checkpoint directory is CRIU's image directory (the hook sees no
//! other), and the hook's status lines go to `cuinterpose-hook.status` beside the images.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The state file's name.
pub const STATE_FILE_NAME: &str = "cuinterpose.state";
/// The process list's name: the processes `checkpoint` checkpointed natively, so that
/// `restore --dir` finds them without a root PID.
pub const PROCESSES_FILE_NAME: &str = "cuinterpose.processes";
/// The folder of CRIU's images.
pub const IMAGES_DIR_NAME: &str = "criu";
/// The hook's status file, in CRIU's image directory: one JSON line per action the hook ran.
pub const HOOK_STATUS_FILE_NAME: &str = "cuinterpose-hook.status";
pub use cuinterpose_protocol::CARRIER_FOLDER;

/// `<dir>/cuinterpose.state`.
pub fn state(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE_NAME)
}

/// `<dir>/cuinterpose.processes`.
pub fn processes(dir: &Path) -> PathBuf {
    dir.join(PROCESSES_FILE_NAME)
}

/// `<dir>/carrier`: the storage carrier's folder.
pub fn carrier(dir: &Path) -> PathBuf {
    dir.join(CARRIER_FOLDER)
}

/// `<dir>/carrier/<allocation id>`: one carried allocation's file.
pub fn carrier_file(dir: &Path, id: &cuinterpose_protocol::AllocationId) -> PathBuf {
    carrier(dir).join(cuinterpose_protocol::carrier_file_name(id))
}

/// `<dir>/criu`: CRIU's image directory.
pub fn images(dir: &Path) -> PathBuf {
    dir.join(IMAGES_DIR_NAME)
}

/// CRIU's log of a dump into `images`.
pub fn dump_log(images: &Path) -> PathBuf {
    images.join("dump.log")
}

/// CRIU's log of a restore from `images`.
pub fn restore_log(images: &Path) -> PathBuf {
    images.join("restore.log")
}

/// Where CRIU writes the restored root's PID.
pub fn restore_pid(images: &Path) -> PathBuf {
    images.join("restore.pid")
}

/// The hook's status file in CRIU's image directory `images`.
pub fn hook_status(images: &Path) -> PathBuf {
    images.join(HOOK_STATUS_FILE_NAME)
}

/// Creates `dir` (and its parents) with mode 0700 where it does not exist.
pub fn create(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Removes what a checkpoint wrote in `dir` (the state, the process list, CRIU's images, the
/// storage carrier): after an abort the directory would describe a checkpoint that did not
/// happen, so a later checkpoint into it would be refused and a restore could pick it up.
/// Anything else in `dir` stays.
pub fn discard(dir: &Path) {
    let _ = std::fs::remove_file(state(dir));
    let _ = std::fs::remove_file(processes(dir));
    let _ = std::fs::remove_dir_all(images(dir));
    let _ = std::fs::remove_dir_all(carrier(dir));
}

/// Removes the storage carrier's folder of `dir` where it is empty (a failed save removed its
/// files; a creator's files stay wherever something may still need them).
pub fn remove_empty_carrier(dir: &Path) {
    let _ = std::fs::remove_dir(carrier(dir));
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuinterpose_testkit::fixtures::TempDir;

    #[test]
    fn discard_removes_what_a_checkpoint_wrote_and_nothing_else() {
        let dir = TempDir::new("checkpoint-dir").unwrap();
        let dir = dir.path().join("ckpt");
        create(&dir).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(&dir).unwrap().permissions()
            ) & 0o777,
            0o700
        );
        for file in [state(&dir), processes(&dir), dir.join("notes.txt")] {
            std::fs::write(file, b"x").unwrap();
        }
        for folder in [carrier(&dir), images(&dir)] {
            create(&folder).unwrap();
            std::fs::write(folder.join("f"), b"x").unwrap();
        }
        discard(&dir);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["notes.txt"]);
        create(&carrier(&dir)).unwrap();
        remove_empty_carrier(&dir);
        assert!(!carrier(&dir).exists());
    }
}
