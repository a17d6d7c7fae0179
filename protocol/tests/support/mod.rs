//! Shared by the protocol's process-level tests: run each test alone and fail it if it leaks
//! a file descriptor (the tests of one binary share a process and its descriptor table).

use std::fs;
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
