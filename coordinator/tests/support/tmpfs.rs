//! Full disks for the abort tests: a tmpfs mounted at a directory (root only), and the loud
//! skip where that or CRIU is not possible (a failure under `CI=true`).

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A tmpfs mounted at a directory; unmounted (and the directory removed) on drop.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `2m`) at `dir`, creating it.
    pub fn mount(dir: PathBuf, size: &str) -> Result<Tmpfs, String> {
        Self::mount_as(dir, "tmpfs", &format!("size={size},mode=0700"))
    }

    /// Mounts a ramfs at `dir`: a file system without `O_DIRECT`.
    pub fn mount_ramfs(dir: PathBuf) -> Result<Tmpfs, String> {
        Self::mount_as(dir, "ramfs", "mode=0700")
    }

    fn mount_as(dir: PathBuf, kind: &str, options: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", kind, "-o", options, kind])
            .arg(&dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!(
                "mount -t {kind}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir))
    }

    /// Fills the file system to the last byte.
    pub fn fill(&self) {
        use std::io::Write as _;
        let mut filler = std::fs::File::create(self.0.join("filler")).expect("filler");
        let block = [0u8; 4096];
        while filler.write_all(&block).is_ok() {}
        let _ = filler.flush();
    }

    /// Unmounts now; the error names what still holds it.
    pub fn unmount(&self) -> Result<(), String> {
        let out = Command::new("umount")
            .arg(&self.0)
            .output()
            .expect("run umount");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(&self.0)
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

pub use cuinterpose_testkit::unavailable;
