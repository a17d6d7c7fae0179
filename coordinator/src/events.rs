//! What a command reports while it runs: a phase starts, a copy advances, a phase ends. The
//! CLI shows them as they happen (progress bars on a terminal, JSON lines with `--json`); the
//! final [`Report`](crate::report::Report) sums them up.

use std::collections::BTreeMap;
use std::time::Duration;

use cuinterpose_protocol::NamespacePid;
use serde_json::{Value, json};

use crate::report::{PhaseReport, gigabytes_per_second};

/// One participant's part of a host-carrier copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CopyState {
    /// Bytes copied so far.
    pub done: u64,
    /// Bytes it copies in all (0 for a participant that carries nothing).
    pub total: u64,
}

/// How far a copy phase (`save_allocations`, `load_allocations`) has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyProgress {
    pub phase: String,
    /// Since the phase started.
    pub elapsed: Duration,
    /// Each participant that answered the progress request.
    pub participants: BTreeMap<NamespacePid, CopyState>,
}

impl CopyProgress {
    /// All participants together.
    pub fn total(&self) -> CopyState {
        self.participants
            .values()
            .fold(CopyState::default(), |sum, state| CopyState {
                done: sum.done.saturating_add(state.done),
                total: sum.total.saturating_add(state.total),
            })
    }
}

/// A step of a running command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A phase begins.
    Started { phase: &'a str, participants: usize },
    /// A copy phase advanced (reported a few times a second while it runs).
    Copy(&'a CopyProgress),
    /// A phase completed.
    Done(&'a PhaseReport),
}

impl Event<'_> {
    /// The event as one JSON line (`--json`): `event` names its kind.
    pub fn json(&self) -> Value {
        match self {
            Self::Started {
                phase,
                participants,
            } => json!({
                "event": "phase_started",
                "phase": phase,
                "participants": participants,
            }),
            Self::Copy(progress) => {
                let total = progress.total();
                json!({
                    "event": "progress",
                    "phase": progress.phase,
                    "elapsed_ms": progress.elapsed.as_secs_f64() * 1e3,
                    "bytes_done": total.done,
                    "bytes_total": total.total,
                    "gb_per_s": gigabytes_per_second(total.done, progress.elapsed),
                    "participants": progress
                        .participants
                        .iter()
                        .map(|(pid, state)| json!({
                            "pid": pid.get(),
                            "bytes_done": state.done,
                            "bytes_total": state.total,
                        }))
                        .collect::<Vec<_>>(),
                })
            }
            Self::Done(phase) => json!({
                "event": "phase_done",
                "phase": phase.name,
                "elapsed_ms": phase.duration.as_secs_f64() * 1e3,
                "participants": phase.participants,
                "bytes": phase.bytes,
                "gb_per_s": gigabytes_per_second(phase.bytes, phase.duration),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid(value: u32) -> NamespacePid {
        NamespacePid::new(value).expect("non-zero")
    }

    fn copy() -> CopyProgress {
        CopyProgress {
            phase: "save_allocations".into(),
            elapsed: Duration::from_secs(2),
            participants: BTreeMap::from([
                (
                    pid(7),
                    CopyState {
                        done: 3_000_000_000,
                        total: 4_000_000_000,
                    },
                ),
                (pid(8), CopyState::default()),
            ]),
        }
    }

    #[test]
    fn each_event_is_one_json_object_naming_its_kind() {
        let started = Event::Started {
            phase: "inspect",
            participants: 2,
        }
        .json();
        assert_eq!(
            started,
            json!({"event": "phase_started", "phase": "inspect", "participants": 2})
        );
        let progress = Event::Copy(&copy()).json();
        assert_eq!(progress["event"], "progress");
        assert_eq!(progress["bytes_done"], 3_000_000_000u64);
        assert_eq!(progress["bytes_total"], 4_000_000_000u64);
        assert_eq!(progress["gb_per_s"], 1.5);
        assert_eq!(progress["elapsed_ms"], 2000.0);
        assert_eq!(
            progress["participants"],
            json!([
                {"pid": 7, "bytes_done": 3_000_000_000u64, "bytes_total": 4_000_000_000u64},
                {"pid": 8, "bytes_done": 0, "bytes_total": 0},
            ])
        );
        let phase = PhaseReport {
            name: "load_allocations".into(),
            duration: Duration::from_millis(500),
            bytes: 1_000_000_000,
            participants: 2,
        };
        let done = Event::Done(&phase).json();
        assert_eq!(
            done,
            json!({"event": "phase_done", "phase": "load_allocations", "elapsed_ms": 500.0,
                   "participants": 2, "bytes": 1_000_000_000u64, "gb_per_s": 2.0})
        );
        assert!(!done.to_string().contains('\n'), "one line");
    }

    #[test]
    fn totals_add_every_participant() {
        assert_eq!(
            copy().total(),
            CopyState {
                done: 3_000_000_000,
                total: 4_000_000_000
            }
        );
    }
}
