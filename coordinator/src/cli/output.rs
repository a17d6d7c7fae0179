//! What commands print on stdout: reports and failures as text or JSON (progress, on stderr,
//! is `progress`'s).

use std::io::Write as _;

use cuinterpose_protocol::NamespacePid;
use serde_json::{Value, json};

use crate::commands::CommandError;
use crate::report::Report;

pub(super) fn print_json(value: &Value) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{value}");
    // Event lines must reach a reader as they happen, not when a buffer fills.
    let _ = stdout.flush();
}

pub(super) fn print_report(report: &Report, json: bool) {
    if json {
        print_json(&report.json());
    } else {
        print!("{}", report.text());
    }
}

pub(super) fn failure_json(command: &str, error: &CommandError) -> Value {
    let mut value = json!({
        "command": command,
        "status": "failed",
        "exit_code": error.exit_code(),
        "message": error.to_string(),
    });
    if let CommandError::Aborted { resumed, .. } = error {
        value["status"] = json!("aborted");
        value["resumed"] = resumed.json();
    }
    let run = match error {
        CommandError::Run(run) => Some(run),
        CommandError::AfterMutation { source, .. } | CommandError::Aborted { source, .. } => {
            match source.as_ref() {
                CommandError::Run(run) => Some(run),
                _ => None,
            }
        }
        _ => None,
    };
    if let Some(run) = run {
        value["phase"] = json!(run.stage.name_in(run.kind));
        value["mutated"] = json!(run.mutated);
        value["rolled_back"] = json!(run.rolled_back);
        value["unconfirmed"] = json!(
            run.unconfirmed
                .iter()
                .map(|pid| pid.get())
                .collect::<Vec<_>>()
        );
        if run.rolled_back && run.mutated {
            value["status"] = json!("aborted");
        }
        value["fail_stopped"] = json!(
            run.fail_stopped
                .iter()
                .map(|pid| pid.get())
                .collect::<Vec<_>>()
        );
        value["failures"] = Value::Array(
            run.failures
                .iter()
                .map(|failure| {
                    json!({
                        "participant": failure.participant.map(NamespacePid::get),
                        "message": failure.to_string(),
                    })
                })
                .collect(),
        );
    }
    value
}
