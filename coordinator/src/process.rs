//! A process tree as `/proc` shows it: the root and its descendants (by the parent PID in
//! `/proc/<pid>/stat`), each with its host PID and the PID its own namespace sees (the last
//! field of `NSpid:` in `/proc/<pid>/status`), which names its cuinterpose socket.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cuinterpose_protocol::NamespacePid;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process {pid} does not exist")]
    NoSuchProcess { pid: u32 },
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: cannot parse {what}", path.display())]
    Parse { path: PathBuf, what: &'static str },
    #[error(
        "processes {first} and {second} of the tree both have namespace pid {namespace_pid} and \
         would share one participant socket"
    )]
    DuplicateNamespacePid {
        namespace_pid: NamespacePid,
        first: u32,
        second: u32,
    },
}

/// The parent PID from the content of `/proc/<pid>/stat`. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_parent(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `PF_EXITING` in the flags of `/proc/<pid>/stat`: set as a process starts to exit, before
/// it closes its files.
const PF_EXITING: u64 = 0x4;

/// Whether the content of `/proc/<pid>/stat` describes a process that has died or is dying (a
/// zombie not yet reaped, one being torn down, or one inside its exit).
pub fn parse_dead(stat: &str) -> bool {
    let Some(end) = stat.rfind(')') else {
        return false;
    };
    let fields: Vec<&str> = stat[end + 1..].split_whitespace().collect();
    let exiting = fields
        .get(6)
        .and_then(|flags| flags.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0);
    exiting || matches!(fields.first(), Some(&("Z" | "X" | "x")))
}

/// The innermost namespace PID from the content of `/proc/<pid>/status`: `NSpid:` lists the
/// PID in every namespace from the one `/proc` belongs to down to the process's own, last.
pub fn parse_namespace_pid(status: &str) -> Option<NamespacePid> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?;
    let last: u32 = line.split_whitespace().last()?.parse().ok()?;
    NamespacePid::new(last)
}

/// `root` and its descendants given (pid, parent) pairs: breadth first, children ascending.
pub fn descendants(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &(pid, parent) in parents {
        if pid != root {
            children.entry(parent).or_default().push(pid);
        }
    }
    for list in children.values_mut() {
        list.sort_unstable();
    }
    let mut order = Vec::new();
    let mut queue = VecDeque::from([root]);
    while let Some(pid) = queue.pop_front() {
        if order.contains(&pid) {
            continue;
        }
        order.push(pid);
        if let Some(list) = children.get(&pid) {
            queue.extend(list.iter().copied());
        }
    }
    order
}

/// A process of a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeProcess {
    /// As this process (the coordinator) sees it.
    pub host_pid: u32,
    /// As the process sees itself; names its socket.
    pub namespace_pid: NamespacePid,
}

fn read(path: &Path) -> Result<Option<String>, ProcessError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        // Gone meanwhile (exited): not part of the tree any more.
        Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => Ok(None),
        Err(source) => Err(ProcessError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// `root` and its living descendants, from `proc` (normally `/proc`).
pub fn tree(proc: &Path, root: u32) -> Result<Vec<TreeProcess>, ProcessError> {
    if !proc.join(root.to_string()).exists() {
        return Err(ProcessError::NoSuchProcess { pid: root });
    }
    let entries = fs::read_dir(proc).map_err(|source| ProcessError::Read {
        path: proc.to_path_buf(),
        source,
    })?;
    let mut parents = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ProcessError::Read {
            path: proc.to_path_buf(),
            source,
        })?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path().join("stat");
        let Some(stat) = read(&path)? else { continue };
        if parse_dead(&stat) {
            // Dead, not yet reaped: not part of the living tree (a dead root is no tree).
            unless_root(pid, root)?;
            continue;
        }
        let parent = parsed(parse_parent(&stat), path, "the parent pid")?;
        parents.push((pid, parent));
    }
    let mut processes = Vec::new();
    for pid in descendants(root, &parents) {
        let path = proc.join(pid.to_string()).join("status");
        let Some(status) = read(&path)? else {
            unless_root(pid, root)?;
            continue;
        };
        let namespace_pid = parsed(parse_namespace_pid(&status), path, "NSpid")?;
        processes.push(TreeProcess {
            host_pid: pid,
            namespace_pid,
        });
    }
    Ok(processes)
}

/// A process gone from the tree is skipped, unless it is `root`: then there is no tree.
fn unless_root(pid: u32, root: u32) -> Result<(), ProcessError> {
    if pid == root {
        return Err(ProcessError::NoSuchProcess { pid });
    }
    Ok(())
}

/// `what`, parsed from the file at `path`, or why it could not be.
fn parsed<T>(value: Option<T>, path: PathBuf, what: &'static str) -> Result<T, ProcessError> {
    value.ok_or(ProcessError::Parse { path, what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_is_read_after_the_command_name() {
        assert_eq!(parse_parent("42 (bash) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parse_parent("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parse_parent("42 (x y) S"), None);
        assert_eq!(parse_parent("garbage"), None);
    }

    #[test]
    fn dead_processes_are_told_by_their_state() {
        assert!(parse_dead("42 (sh) Z 7 42 42 0 -1"));
        assert!(parse_dead("42 (a) Z) X 9 1 1"));
        assert!(
            !parse_dead("42 (a) Z) S 9 1 1"),
            "the state follows the last parenthesis"
        );
        assert!(!parse_dead("42 (worker) S 7 42"));
        assert!(!parse_dead("garbage"));
        // Still running, but inside its exit (PF_EXITING in the flags, the 9th field).
        assert!(parse_dead("42 (worker) R 7 42 42 0 -1 4194308 0"));
        assert!(!parse_dead("42 (worker) S 7 42 42 0 -1 4194304 0"));
    }

    #[test]
    fn namespace_pid_is_the_innermost() {
        let status = "Name:\tworker\nPid:\t5000\nNSpid:\t5000\t12\t3\nPPid:\t1\n";
        assert_eq!(parse_namespace_pid(status), NamespacePid::new(3));
        assert_eq!(parse_namespace_pid("NSpid:\t77\n"), NamespacePid::new(77));
        assert_eq!(parse_namespace_pid("Pid:\t77\n"), None);
        assert_eq!(parse_namespace_pid("NSpid:\t0\n"), None);
    }

    #[test]
    fn descendants_breadth_first() {
        let parents = [
            (1, 0),
            (10, 1),
            (12, 10),
            (11, 10),
            (20, 12),
            (30, 1),
            (31, 30),
        ];
        assert_eq!(descendants(10, &parents), [10, 11, 12, 20]);
        assert_eq!(descendants(99, &parents), [99]);
        // A cycle (pid reuse while scanning) does not loop.
        assert_eq!(descendants(5, &[(5, 6), (6, 5)]), [5, 6]);
    }

    #[test]
    fn the_real_tree_holds_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let own = std::process::id();
        let processes = tree(Path::new("/proc"), own).expect("tree");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(processes[0].host_pid, own);
        assert!(
            processes
                .iter()
                .any(|process| process.host_pid == child.id()),
            "{processes:?}"
        );
        assert!(matches!(
            tree(Path::new("/proc"), u32::MAX),
            Err(ProcessError::NoSuchProcess { pid: u32::MAX })
        ));
    }
}
