#!/usr/bin/env bash
# One prepared script for a machine with an NVIDIA GPU (nvcc, PyTorch and the driver present;
# no internet; device time is scarce). Expects release binaries built elsewhere and carried in:
#   target/release/{cuinterpose,cuinterpose-worker,libcuinterpose.so}
# (cargo build --release --workspace). Prints one JSON line per check; exits non-zero if any
# check failed. Everything it writes goes to ${OUT:-/tmp/cuinterpose-gpu}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/cuinterpose-gpu}"
mkdir -p "$OUT"
BIN="$PWD/target/release"
export CUINTERPOSE_BIN="$BIN/cuinterpose"
export CUINTERPOSE_SHIM="$BIN/libcuinterpose.so"
export CUINTERPOSE_CONTROL_DIR="$OUT/control"
failed=0
check() { # name, command...
  local name="$1"; shift
  echo "== $name" >&2
  if ! timeout 300 "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
    echo "{\"check\": \"$name\", \"ok\": false}"; tail -20 "$OUT/$name.err" >&2; failed=1
  else
    tail -n 1 "$OUT/$name.out"
  fi
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true

# 1. The demo against the real driver: two processes sharing a VMM allocation (1 GiB), private
#    and untracked memory, a memory-IPC pair; toggled through the real cuCheckpointProcess*.
check demo "$BIN/cuinterpose" demo --driver libcuda.so.1 --processes 2 --shared-mib 1024 --json

# 2. The baseline: plain pinned cuMemcpy of the same size, both directions.
if nvcc -O2 -o "$OUT/pinned_copy" tests/gpu/pinned_copy.cu -lcuda 2>"$OUT/nvcc.err"; then
  check pinned_copy "$OUT/pinned_copy" 1024
else
  echo '{"check": "pinned_copy", "ok": false, "why": "nvcc failed"}'; cat "$OUT/nvcc.err" >&2; failed=1
fi

# 2b. The control plane at scale on the real driver: 8 processes, each creating 1000 shared
#     2 MiB allocations that the next imports (16 GiB in all), toggled; the report's phases.
check mesh "$BIN/cuinterpose" demo --driver libcuda.so.1 --processes 8 --mesh 1000 --json

# 3. PyTorch: torch.multiprocessing sharing (legacy IPC and expandable segments), toggled.
check clients python3 tests/gpu/clients.py

# 4. cuda.core memory-pool IPC (the pool adapter) shared by 2 and 4 processes across toggles,
#    on the real driver, where cuda.core and pytest are installed (said plainly otherwise).
if python3 -c 'import cuda.core, pytest' 2>/dev/null; then
  check pool_ipc env LD_PRELOAD="$CUINTERPOSE_SHIM" \
    python3 -m pytest -q -p no:cacheprovider tests/python-checkpoint/test_pool_sharing.py
else
  echo '{"check": "pool_ipc", "ok": false, "why": "cuda.core or pytest is not installed here: not run"}'
fi

exit $failed
