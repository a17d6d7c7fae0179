//! What a run did: per phase, its duration, the bytes moved and the participants; as text
//! (default) or JSON.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use cuinterpose_protocol::NamespacePid;
use serde_json::{Value, json};

/// One completed phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseReport {
    /// `inspect`, `begin_checkpoint`, an operation's wire name, `publish_state`, `verify`,
    /// `native_checkpoint`, ...
    pub name: String,
    pub duration: Duration,
    /// Host-carrier bytes moved by all participants (0 where nothing is copied).
    pub bytes: u64,
    pub participants: usize,
}

/// One participant's part of a host-carrier copy phase: what its shim copied, how long its
/// exchange took (from the request sent to the reply read) and how much of that the transfers
/// themselves took (the shim's measure; the rest laid out the carrier or recreated memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    pub phase: String,
    pub participant: NamespacePid,
    pub bytes: u64,
    pub duration: Duration,
    pub copying: Duration,
    /// Most host memory the participant's carriers held at once.
    pub peak_carrier_bytes: u64,
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// `prepare`, `restore`, `checkpoint`, `toggle`, ...
    pub command: String,
    pub participants: Vec<NamespacePid>,
    pub phases: Vec<PhaseReport>,
    /// Creator allocations saved through host carriers.
    pub shared_allocations: usize,
    pub multicast_groups: usize,
    pub checkpoint_dir: Option<PathBuf>,
    /// After a CRIU restore: each participant's host PID (its namespace PID stays; the host
    /// PID is what the user signals).
    pub host_pids: std::collections::BTreeMap<NamespacePid, u32>,
    /// Each participant's part of each copy phase (`save_allocations`, `load_allocations`).
    pub copies: Vec<CopyReport>,
}

impl Report {
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }

    /// Sum of the phases' durations.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|phase| phase.duration).sum()
    }

    /// The copy throughput of the phase `name`: its participants' bytes over the longest
    /// transfer time among them (they copy at the same time); 0 without copies.
    pub fn copy_gigabytes_per_second(&self, name: &str) -> f64 {
        let copies = self.copies.iter().filter(|c| c.phase == name);
        let bytes = copies
            .clone()
            .fold(0u64, |sum, c| sum.saturating_add(c.bytes));
        let longest = copies.map(|c| c.copying).max().unwrap_or_default();
        gigabytes_per_second(bytes, longest)
    }

    /// Host-carrier bytes moved, all phases together.
    pub fn bytes(&self) -> u64 {
        self.phases
            .iter()
            .fold(0u64, |sum, phase| sum.saturating_add(phase.bytes))
    }

    /// Appends `other`'s phases (a composition: prepare, then native checkpoint, ...); keeps
    /// this report's command and takes the other's participants and counts where this has none.
    pub fn absorb(&mut self, other: Report) {
        if self.participants.is_empty() {
            self.participants = other.participants;
        }
        self.shared_allocations = self.shared_allocations.max(other.shared_allocations);
        self.multicast_groups = self.multicast_groups.max(other.multicast_groups);
        if self.checkpoint_dir.is_none() {
            self.checkpoint_dir = other.checkpoint_dir;
        }
        if self.host_pids.is_empty() {
            self.host_pids = other.host_pids;
        }
        self.phases.extend(other.phases);
        self.copies.extend(other.copies);
    }

    /// Human-readable summary, one line per phase.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: ok in {}, {} participants ({}), {} shared allocations, {} multicast groups, {} host-carrier bytes",
            self.command,
            milliseconds(self.duration()),
            self.participants.len(),
            self.participants
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            self.shared_allocations,
            self.multicast_groups,
            self.bytes()
        );
        if let Some(dir) = &self.checkpoint_dir {
            let _ = writeln!(out, "  checkpoint directory: {}", dir.display());
        }
        if !self.host_pids.is_empty() {
            let pairs: Vec<String> = self
                .host_pids
                .iter()
                .map(|(ns, host)| format!("{ns} is host pid {host}"))
                .collect();
            let _ = writeln!(out, "  restored processes: {}", pairs.join(", "));
        }
        for phase in &self.phases {
            let _ = write!(
                out,
                "  {:<28} {:>12}  {} participants",
                phase.name,
                milliseconds(phase.duration),
                phase.participants
            );
            if phase.bytes > 0 {
                let _ = write!(
                    out,
                    ", {} bytes ({:.2} GB/s; copies alone {:.2} GB/s)",
                    phase.bytes,
                    gigabytes_per_second(phase.bytes, phase.duration),
                    self.copy_gigabytes_per_second(&phase.name)
                );
            }
            out.push('\n');
            for copy in self.copies.iter().filter(|c| c.phase == phase.name) {
                let _ = writeln!(
                    out,
                    "    participant {:<19} {:>12}  {} bytes ({:.2} GB/s; copies {} at {:.2} GB/s; \
                     carrier peak {} bytes)",
                    copy.participant,
                    milliseconds(copy.duration),
                    copy.bytes,
                    gigabytes_per_second(copy.bytes, copy.duration),
                    milliseconds(copy.copying),
                    gigabytes_per_second(copy.bytes, copy.copying),
                    copy.peak_carrier_bytes
                );
            }
        }
        out
    }

    pub fn json(&self) -> Value {
        json!({
            "command": self.command,
            "status": "ok",
            "elapsed_ms": self.duration().as_secs_f64() * 1e3,
            "participants": self.participants.iter().map(|pid| pid.get()).collect::<Vec<_>>(),
            "shared_allocations": self.shared_allocations,
            "multicast_groups": self.multicast_groups,
            "bytes": self.bytes(),
            "checkpoint_dir": self.checkpoint_dir.as_ref().map(|dir| dir.display().to_string()),
            "host_pids": self
                .host_pids
                .iter()
                .map(|(ns, host)| (ns.to_string(), json!(host)))
                .collect::<serde_json::Map<_, _>>(),
            "phases": self.phases.iter().map(|phase| json!({
                "phase": phase.name,
                "elapsed_ms": phase.duration.as_secs_f64() * 1e3,
                "participants": phase.participants,
                "bytes": phase.bytes,
                "gb_per_s": gigabytes_per_second(phase.bytes, phase.duration),
                "copy_gb_per_s": self.copy_gigabytes_per_second(&phase.name),
            })).collect::<Vec<_>>(),
            "copies": self.copies.iter().map(|copy| json!({
                "phase": copy.phase,
                "participant": copy.participant.get(),
                "elapsed_ms": copy.duration.as_secs_f64() * 1e3,
                "bytes": copy.bytes,
                "gb_per_s": gigabytes_per_second(copy.bytes, copy.duration),
                "copy_ms": copy.copying.as_secs_f64() * 1e3,
                "copy_gb_per_s": gigabytes_per_second(copy.bytes, copy.copying),
                "peak_carrier_bytes": copy.peak_carrier_bytes,
            })).collect::<Vec<_>>(),
        })
    }
}

fn milliseconds(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

/// Bytes / 1e9 / seconds; 0 for an empty phase.
pub fn gigabytes_per_second(bytes: u64, duration: Duration) -> f64 {
    let seconds = duration.as_secs_f64();
    if bytes == 0 || seconds == 0.0 {
        return 0.0;
    }
    bytes as f64 / 1e9 / seconds
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuinterpose_testkit::fixtures::pid;

    fn sample() -> Report {
        Report {
            command: "prepare".into(),
            participants: vec![pid(101), pid(102)],
            phases: vec![
                PhaseReport {
                    name: "inspect".into(),
                    duration: Duration::from_micros(1500),
                    bytes: 0,
                    participants: 2,
                },
                PhaseReport {
                    name: "save_allocations".into(),
                    duration: Duration::from_secs(2),
                    bytes: 4_000_000_000,
                    participants: 2,
                },
            ],
            shared_allocations: 3,
            multicast_groups: 1,
            checkpoint_dir: Some("/ckpt".into()),
            host_pids: Default::default(),
            copies: Vec::new(),
        }
    }

    #[test]
    fn copy_phases_name_each_participant_and_its_rate() {
        let mut report = sample();
        for (participant, millis) in [(101, 1000), (102, 4000)] {
            report.copies.push(CopyReport {
                phase: "save_allocations".into(),
                participant: pid(participant),
                bytes: 2_000_000_000,
                duration: Duration::from_millis(millis),
                copying: Duration::from_millis(millis / 2),
                peak_carrier_bytes: 2_000_000_000,
            });
        }
        let text = report.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(
            lines[4].starts_with("    participant 101")
                && lines[4].ends_with(
                    "2000000000 bytes (2.00 GB/s; copies 500.0 ms at 4.00 GB/s; carrier peak \
                     2000000000 bytes)"
                ),
            "{text}"
        );
        assert!(
            lines[5].ends_with(
                "(0.50 GB/s; copies 2000.0 ms at 1.00 GB/s; carrier peak 2000000000 bytes)"
            ),
            "{text}"
        );
        // 4 GB over the slower participant's 2 s of copying.
        assert!(
            lines[3].ends_with("(2.00 GB/s; copies alone 2.00 GB/s)"),
            "{text}"
        );
        let value = report.json();
        assert_eq!(value["copies"][1]["participant"], 102);
        assert_eq!(value["copies"][1]["phase"], "save_allocations");
        assert_eq!(value["copies"][1]["gb_per_s"], 0.5);
        assert_eq!(value["copies"][0]["elapsed_ms"], 1000.0);
        assert_eq!(value["copies"][0]["copy_ms"], 500.0);
        assert_eq!(value["copies"][0]["copy_gb_per_s"], 4.0);
        assert_eq!(value["copies"][0]["peak_carrier_bytes"], 2_000_000_000u64);
        assert_eq!(value["phases"][1]["copy_gb_per_s"], 2.0);
        assert_eq!(sample().json()["phases"][1]["copy_gb_per_s"], 0.0);
        assert_eq!(sample().json()["copies"], json!([]));
    }

    #[test]
    fn a_restore_names_the_host_pids() {
        let mut report = sample();
        report.host_pids.insert(NamespacePid::new(1).unwrap(), 4711);
        report.host_pids.insert(NamespacePid::new(2).unwrap(), 4712);
        assert!(
            report
                .text()
                .contains("  restored processes: 1 is host pid 4711, 2 is host pid 4712\n"),
            "{}",
            report.text()
        );
        assert_eq!(report.json()["host_pids"], json!({"1": 4711, "2": 4712}));
        assert_eq!(sample().json()["host_pids"], json!({}));
    }

    #[test]
    fn text_names_every_phase() {
        let text = sample().text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("prepare: ok in 2001.5 ms, 2 participants (101, 102), 3 shared allocations, 1 multicast groups, 4000000000 host-carrier bytes"), "{text}");
        assert_eq!(lines[1], "  checkpoint directory: /ckpt");
        assert!(
            lines[2].starts_with("  inspect ") && lines[2].ends_with("1.5 ms  2 participants"),
            "{text}"
        );
        assert!(
            lines[3]
                .ends_with("2 participants, 4000000000 bytes (2.00 GB/s; copies alone 0.00 GB/s)"),
            "{text}"
        );
    }

    #[test]
    fn json_carries_phases_and_totals() {
        let value = sample().json();
        assert_eq!(value["command"], "prepare");
        assert_eq!(value["bytes"], 4_000_000_000u64);
        assert_eq!(value["participants"], json!([101, 102]));
        assert_eq!(value["phases"][1]["phase"], "save_allocations");
        assert_eq!(value["phases"][1]["gb_per_s"], 2.0);
        assert_eq!(value["phases"][0]["elapsed_ms"], 1.5);
        assert_eq!(value["checkpoint_dir"], "/ckpt");
    }

    #[test]
    fn absorb_appends_phases() {
        let mut report = Report::new("checkpoint");
        report.absorb(sample());
        report.phases.push(PhaseReport {
            name: "native_checkpoint".into(),
            duration: Duration::from_millis(1),
            bytes: 0,
            participants: 2,
        });
        assert_eq!(report.command, "checkpoint");
        assert_eq!(report.participants, [pid(101), pid(102)]);
        assert_eq!(report.phases.len(), 3);
        assert_eq!(report.bytes(), 4_000_000_000);
    }
}
