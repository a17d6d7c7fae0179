//! Shared by the protocol's process-level tests: run each test alone and fail it if it leaks
//! a file descriptor (the tests of one binary share a process and its descriptor table).

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

pub fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

pub fn check(body: impl FnOnce()) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let before = open_fds();
    body();
    assert_eq!(
        before,
        open_fds(),
        "open file descriptors before and after the test"
    );
}

/// A private (0700) scratch directory, named after the test process and `name`, removed on
/// drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("cuitr-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).expect("create scratch dir");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).expect("chmod scratch");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
