//! `cuinterpose-worker`: a scriptable CUDA driver-API program driven over an inherited
//! control socket (see `cuinterpose_workload::proto`).

fn main() {
    let code = cuinterpose_workload::worker::main_with_args(std::env::args_os().skip(1));
    std::process::exit(code);
}
