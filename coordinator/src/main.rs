//! `cuinterpose`: the coordinator's command line (see `cuinterpose --help`).

fn main() -> std::process::ExitCode {
    cuinterpose_coordinator::cli::run_from_env()
}
