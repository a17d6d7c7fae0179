"""Real-client check on a GPU: torch.multiprocessing tensor sharing under the shim with the
default caching allocator (legacy IPC) and with expandable segments (VMM export + pidfd_getfd),
each toggled in place through the real driver, then compared and computed on (ipc.py does the
work; this runs it both ways and prints one JSON line per mode)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CUINTERPOSE = os.environ.get("CUINTERPOSE_BIN", "cuinterpose")

failures = 0
for conf in ["", "expandable_segments:True"]:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    run = subprocess.run(
        [CUINTERPOSE, "launch", "--", sys.executable, os.path.join(HERE, "ipc.py")],
        env=env, capture_output=True, text=True, timeout=900,
    )
    sys.stderr.write(run.stderr[-4000:])
    print(run.stdout.strip() or f'{{"test": "clients", "alloc_conf": "{conf}", "ok": false}}')
    failures += run.returncode != 0
sys.exit(1 if failures else 0)
