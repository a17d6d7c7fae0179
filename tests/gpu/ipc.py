"""Two processes share a CUDA tensor through torch.multiprocessing (legacy IPC handles:
cudaIpcGetMemHandle / cudaIpcOpenMemHandle, which reach the shim's memory IPC adapter) under
the shim; the parent checkpoints and restores the whole tree in place with `cuinterpose
toggle` through the real driver's cuCheckpointProcess*, then both compare the tensor and keep
computing on it.

Run under the shim: `cuinterpose launch -- python3 tests/gpu/ipc.py` (run.sh does this).
Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to share through VMM + pidfd_getfd
instead (clients.py runs both)."""

import json
import os
import subprocess
import sys

import torch
import torch.multiprocessing as mp

CUINTERPOSE = os.environ.get("CUINTERPOSE_BIN", "cuinterpose")
N = int(os.environ.get("IPC_ELEMENTS", str(64 << 20)))  # 256 MiB of float32


def child(queue, done):
    tensor = queue.get()  # opened through the IPC handle
    expected = torch.arange(N, device="cuda", dtype=torch.float32)
    assert torch.equal(tensor, expected), "child sees the parent's bytes"
    done.put("opened")
    assert queue.get() == "restored"
    assert torch.equal(tensor, expected * 2), "child sees the parent's post-restore write"
    tensor.add_(1)  # a write the parent must see
    torch.cuda.synchronize()
    done.put("wrote")
    queue.get()


def main():
    mp.set_start_method("spawn")
    tensor = torch.arange(N, device="cuda", dtype=torch.float32)
    queue, done = mp.Queue(), mp.Queue()
    proc = mp.Process(target=child, args=(queue, done))
    proc.start()
    queue.put(tensor)
    assert done.get(timeout=120) == "opened"
    address = tensor.data_ptr()
    toggle = subprocess.run(
        [CUINTERPOSE, "toggle", "--pid", str(os.getpid()), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    sys.stderr.write(toggle.stderr)
    if toggle.returncode != 0:
        print(toggle.stdout)
        raise SystemExit(f"toggle failed with {toggle.returncode}")
    report = json.loads(toggle.stdout)
    assert tensor.data_ptr() == address, "same address after restore"
    assert torch.equal(tensor, torch.arange(N, device="cuda", dtype=torch.float32)), "same bytes"
    tensor.mul_(2)
    torch.cuda.synchronize()
    queue.put("restored")
    assert done.get(timeout=120) == "wrote"
    assert torch.equal(tensor, torch.arange(N, device="cuda", dtype=torch.float32) * 2 + 1), "sharing is live"
    queue.put("exit")
    proc.join(60)
    phases = {p["phase"]: p for p in report["phases"]}
    print(json.dumps({
        "test": "ipc",
        "ok": True,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "bytes": N * 4,
        "save_gb_per_s": phases.get("save_allocations", {}).get("gb_per_s"),
        "load_gb_per_s": phases.get("load_allocations", {}).get("gb_per_s"),
        "toggle_ms": report["elapsed_ms"],
    }))


if __name__ == "__main__":
    main()
