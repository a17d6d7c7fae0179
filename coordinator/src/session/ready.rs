//! Participants whose native restore is still under way: a `load_allocations` to one of them
//! waits (on its own exchange thread) until its native restore and unlock ended, so one
//! process's load overlaps the next one's native restore.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};

use cuinterpose_protocol::NamespacePid;

/// Each awaited participant's native restore: pending (`None`), done, or failed (why).
#[derive(Debug, Default)]
pub struct Readiness {
    natives: Mutex<BTreeMap<NamespacePid, Option<Result<(), String>>>>,
    changed: Condvar,
}

impl Readiness {
    /// `pids` are restored natively from now on; every other participant is ready.
    pub fn pending(pids: impl IntoIterator<Item = NamespacePid>) -> Self {
        Self {
            natives: Mutex::new(pids.into_iter().map(|pid| (pid, None)).collect()),
            changed: Condvar::new(),
        }
    }

    /// `pid`'s native restore ended with `result`.
    pub fn done(&self, pid: NamespacePid, result: Result<(), String>) {
        let mut natives = self.natives.lock().unwrap_or_else(|p| p.into_inner());
        natives.insert(pid, Some(result));
        self.changed.notify_all();
    }

    /// Every participant still pending fails with `why` (the native restores stopped early).
    pub fn abandon(&self, why: &str) {
        let mut natives = self.natives.lock().unwrap_or_else(|p| p.into_inner());
        for state in natives.values_mut().filter(|state| state.is_none()) {
            *state = Some(Err(why.to_owned()));
        }
        self.changed.notify_all();
    }

    /// Waits until `pid` is ready: `Err` names why its native restore failed.
    pub fn wait(&self, pid: NamespacePid) -> Result<(), String> {
        let mut natives = self.natives.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match natives.get(&pid) {
                None => return Ok(()),
                Some(Some(result)) => return result.clone(),
                Some(None) => {
                    natives = self
                        .changed
                        .wait(natives)
                        .unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pid(n: u32) -> NamespacePid {
        NamespacePid::new(n).unwrap()
    }

    #[test]
    fn a_load_waits_for_its_own_native_restore_only() {
        let ready = Arc::new(Readiness::pending([pid(2), pid(3)]));
        assert_eq!(ready.wait(pid(9)), Ok(()), "not restored natively: ready");
        let waiting = {
            let ready = Arc::clone(&ready);
            std::thread::spawn(move || ready.wait(pid(3)))
        };
        ready.done(pid(2), Ok(()));
        assert_eq!(ready.wait(pid(2)), Ok(()));
        // Another participant's restore does not release it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!waiting.is_finished(), "3 waits for its own native restore");
        ready.done(pid(3), Err("cuCheckpointProcessRestore failed".into()));
        assert_eq!(
            waiting.join().unwrap(),
            Err("cuCheckpointProcessRestore failed".into())
        );
    }

    #[test]
    fn abandoned_natives_fail_those_still_pending() {
        let ready = Readiness::pending([pid(2), pid(3)]);
        ready.done(pid(2), Ok(()));
        ready.abandon("process 3 was not restored: an earlier native restore failed");
        assert_eq!(ready.wait(pid(2)), Ok(()));
        assert!(ready.wait(pid(3)).unwrap_err().contains("not restored"));
    }
}
