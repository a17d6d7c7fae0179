//! Live progress on stderr while a command runs, and `--json`'s event lines on stdout.
//!
//! - `--json`: one JSON line per event as it happens (`phase_started`, `progress` a few times
//!   a second during a copy, `phase_done`), flushed at once; the final report is the last line.
//! - stderr a terminal: a bar per participant during the copy phases (bytes, rate, ETA), and
//!   a line per completed phase.
//! - otherwise (a log file): a line per completed phase, and during a long copy a line every
//!   [`LOG_INTERVAL`].

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use cuinterpose_protocol::NamespacePid;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::output::print_json;
use crate::events::{CopyProgress, Event};
use crate::report::gigabytes_per_second;

/// Events as they happen, shown as `json` asks.
pub(super) fn progress(json: bool) -> impl FnMut(&Event) {
    let mut shown = Progress::new(Mode::for_output(json));
    move |event: &Event| shown.event(event)
}

/// How often a copy's progress is written to a stderr that is not a terminal.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Where events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Json,
    Terminal,
    Log,
}

impl Mode {
    pub fn for_output(json: bool) -> Self {
        if json {
            Self::Json
        } else if std::io::stderr().is_terminal() {
            Self::Terminal
        } else {
            Self::Log
        }
    }
}

/// Shows events as they come.
pub struct Progress {
    mode: Mode,
    bars: Option<Bars>,
    last_log: Option<Instant>,
}

/// The bars of the copy phase being shown.
struct Bars {
    multi: MultiProgress,
    per_participant: BTreeMap<NamespacePid, ProgressBar>,
}

impl Progress {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            bars: None,
            last_log: None,
        }
    }

    pub fn event(&mut self, event: &Event) {
        match (self.mode, event) {
            (Mode::Json, event) => print_json(&event.json()),
            (_, Event::Started { .. }) => self.last_log = Some(Instant::now()),
            (Mode::Terminal, Event::Copy(copy)) => self.draw(copy),
            (Mode::Log, Event::Copy(copy)) => {
                if self
                    .last_log
                    .is_none_or(|last| last.elapsed() >= LOG_INTERVAL)
                {
                    eprintln!("cuinterpose: {}", copy_line(copy));
                    self.last_log = Some(Instant::now());
                }
            }
            (_, Event::Done(phase)) => {
                if let Some(bars) = self.bars.take() {
                    for bar in bars.per_participant.values() {
                        bar.finish_and_clear();
                    }
                    let _ = bars.multi.clear();
                }
                eprintln!(
                    "cuinterpose: {} done in {:.1} ms",
                    phase.name,
                    phase.duration.as_secs_f64() * 1e3
                );
            }
        }
    }

    fn draw(&mut self, copy: &CopyProgress) {
        let bars = self.bars.get_or_insert_with(|| Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            per_participant: BTreeMap::new(),
        });
        for (pid, state) in &copy.participants {
            if state.total == 0 {
                continue; // carries nothing: no bar
            }
            let bar = bars.per_participant.entry(*pid).or_insert_with(|| {
                let bar = bars.multi.add(ProgressBar::new(state.total));
                bar.set_style(bar_style());
                bar.set_prefix(format!("{} {pid}", copy.phase));
                bar
            });
            bar.set_length(state.total);
            bar.set_position(state.done);
        }
    }
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{prefix:>24} [{bar:32}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ")
}

/// `save_allocations: 1.5 of 4.0 GiB (37%), 2.1 GB/s, 3 participants`.
pub fn copy_line(copy: &CopyProgress) -> String {
    let total = copy.total();
    let gib = |bytes: u64| bytes as f64 / f64::from(1u32 << 30);
    let percent = total
        .done
        .saturating_mul(100)
        .checked_div(total.total)
        .unwrap_or(100);
    format!(
        "{}: {:.1} of {:.1} GiB ({percent}%), {:.2} GB/s, {} participants",
        copy.phase,
        gib(total.done),
        gib(total.total),
        gigabytes_per_second(total.done, copy.elapsed),
        copy.participants.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::CopyState;

    #[test]
    fn a_log_line_says_bytes_share_rate_and_participants() {
        let pid = NamespacePid::new(7).expect("non-zero");
        let copy = CopyProgress {
            phase: "save_allocations".into(),
            elapsed: Duration::from_secs(1),
            participants: BTreeMap::from([(
                pid,
                CopyState {
                    done: 3 << 29,
                    total: 4 << 30,
                },
            )]),
        };
        assert_eq!(
            copy_line(&copy),
            "save_allocations: 1.5 of 4.0 GiB (37%), 1.61 GB/s, 1 participants"
        );
        let empty = CopyProgress {
            participants: BTreeMap::new(),
            ..copy
        };
        assert_eq!(
            copy_line(&empty),
            "save_allocations: 0.0 of 0.0 GiB (100%), 0.00 GB/s, 0 participants"
        );
        // The bar template is valid (it is parsed when the first bar is drawn).
        let _ = bar_style();
    }
}
