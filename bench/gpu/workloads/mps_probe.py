#!/usr/bin/env python3
"""What one MPS client sees, for bench/gpu/mps-behaviour; one JSON object per line on stdout.

  mps_probe.py alloc MIB           allocate MIB MiB and hold it 2 s (exit 3 when refused)
  mps_probe.py partner SECONDS     matrix products until SECONDS pass or the first error (exit 4)
  mps_probe.py fault assert|illegal   end in a device-side assert or an illegal address
  mps_probe.py rate gemm|copy SECONDS   steps per second of a compute- or memory-bound loop
  mps_probe.py ratelog gemm|copy SECONDS   the same, one line per half second (op "ratelog"),
                                   so a change in mid-run (set_active_thread_percentage) shows
  mps_probe.py energy SECONDS      the NVML energy counter and power around a matrix loop

The device is $KACE_PROBE_DEVICE (default cuda), so the script can be rehearsed on a CPU.
"""
import json
import os
import sys
import time

import torch

DEVICE = os.environ.get("KACE_PROBE_DEVICE", "cuda")


def emit(**fields):
    fields.setdefault("pid", os.getpid())
    fields.setdefault("t", round(time.time(), 3))
    print(json.dumps(fields), flush=True)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def seen_limits():
    out = {
        "pinned_limit_env": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "thread_pct_env": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "task_limit_marker": os.environ.get("KACE_TASK_MEMORY_LIMIT"),
    }
    if DEVICE == "cuda":
        free, total = torch.cuda.mem_get_info()
        out["mem_get_info_mib"] = [free >> 20, total >> 20]
        out["multiprocessors"] = torch.cuda.get_device_properties(0).multi_processor_count
    return out


def alloc(mib):
    torch.zeros(1, device=DEVICE)  # the context first, so its cost is not the tensor's
    seen = seen_limits()
    try:
        x = torch.empty(mib << 20, dtype=torch.uint8, device=DEVICE)
        x.fill_(1)
        sync()
        time.sleep(2)
        emit(op="alloc", mib=mib, ok=True, **seen)
        return 0
    except Exception as e:  # torch.OutOfMemoryError or a CUDA error: either is the answer
        emit(op="alloc", mib=mib, ok=False, error="%s: %s" % (type(e).__name__, str(e)[:300]), **seen)
        return 3


def partner(seconds):
    a = torch.randn(4096, 4096, device=DEVICE)
    steps, t0, last = 0, time.time(), 0.0
    while time.time() - t0 < seconds:
        try:
            a = (a @ a).clamp_(-1, 1)
            sync()
            steps += 1
        except Exception as e:
            emit(op="partner", steps=steps, elapsed=round(time.time() - t0, 3),
                 error="%s: %s" % (type(e).__name__, str(e)[:300]))
            return 4
        if time.time() - last >= 0.5:
            last = time.time()
            emit(op="partner", steps=steps, elapsed=round(last - t0, 3))
    emit(op="partner", steps=steps, elapsed=round(time.time() - t0, 3), done=True)
    return 0


def fault(kind):
    x = torch.zeros(16, device=DEVICE)
    sync()
    emit(op="fault", kind=kind, stage="before")
    try:
        if kind == "assert":
            # An out-of-range index: PyTorch's kernel asserts on the device (a sticky error).
            x[torch.tensor([1 << 20], device=DEVICE)] = 1.0
        else:
            import cupy  # noqa: F401 - only on the GPU machine
            kernel = cupy.RawKernel(
                r'extern "C" __global__ void bad(int *p) { p[threadIdx.x] = 1; }', "bad")
            import numpy
            # Address 16 as the pointer argument: a write there is an illegal address.
            kernel((1,), (32,), (numpy.uint64(16),))
            cupy.cuda.runtime.deviceSynchronize()
        sync()
        emit(op="fault", kind=kind, stage="after", error=None)
        return 0
    except Exception as e:
        emit(op="fault", kind=kind, stage="after", error="%s: %s" % (type(e).__name__, str(e)[:300]))
        return 5


def rate(mode, seconds, every=None):
    """Steps per second over SECONDS; with EVERY, also one "ratelog" line per EVERY seconds
    (its own interval's rate), for the setpct case: whether a running client's rate changes
    when the control daemon sets its server's percentage."""
    seen = seen_limits()
    if mode == "gemm":
        a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32)
        step = lambda: torch.mm(a, a)  # noqa: E731
    else:
        a = torch.empty(1 << 28, dtype=torch.uint8, device=DEVICE)
        b = torch.empty_like(a)
        step = lambda: b.copy_(a)  # noqa: E731
    for _ in range(3):
        step()
    sync()
    steps, t0 = 0, time.time()
    mark, mark_steps = t0, 0
    while time.time() - t0 < seconds:
        for _ in range(4):
            step()
        sync()
        steps += 4
        now = time.time()
        if every is not None and now - mark >= every:
            emit(op="ratelog", mode=mode, since=round(mark, 3), t=round(now, 3),
                 per_s=round((steps - mark_steps) / (now - mark), 3))
            mark, mark_steps = now, steps
    elapsed = time.time() - t0
    emit(op="rate", mode=mode, steps=steps, per_s=round(steps / elapsed, 3), **seen)
    return 0


def energy(seconds):
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        read = lambda: (pynvml.nvmlDeviceGetTotalEnergyConsumption(h),  # noqa: E731
                        pynvml.nvmlDeviceGetPowerUsage(h))
    except Exception as e:
        emit(op="energy", error="%s: %s" % (type(e).__name__, e))
        return 6
    idle_mj, idle_mw = read()
    time.sleep(2)
    idle2_mj, _ = read()
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    sync()
    t0, steps, powers = time.time(), 0, []
    e0, _ = read()
    while time.time() - t0 < seconds:
        for _ in range(8):
            torch.mm(a, a)
        sync()
        steps += 8
        powers.append(read()[1])
    e1, _ = read()
    elapsed = time.time() - t0
    emit(op="energy", idle_power_w=idle_mw / 1000, idle_j_per_s=(idle2_mj - idle_mj) / 2000,
         busy_j=(e1 - e0) / 1000, busy_s=round(elapsed, 3), steps=steps,
         j_per_step=(e1 - e0) / 1000 / max(steps, 1),
         busy_power_w_mean=sum(powers) / max(len(powers), 1) / 1000,
         busy_power_w_max=max(powers or [0]) / 1000, power_samples=len(powers))
    return 0


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    op, args = argv[1], argv[2:]
    if op == "alloc":
        return alloc(int(args[0]))
    if op == "partner":
        return partner(float(args[0]))
    if op == "fault":
        return fault(args[0])
    if op == "rate":
        return rate(args[0], float(args[1]))
    if op == "ratelog":
        return rate(args[0], float(args[1]), every=0.5)
    if op == "energy":
        return energy(float(args[0]))
    print("mps_probe.py: unknown operation %r" % op, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
