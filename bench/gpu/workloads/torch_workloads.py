#!/usr/bin/env python3
"""Small PyTorch training workloads from randomly initialised models (no downloads), for
bench/gpu/run. Each trains until KACE_BENCH_SECONDS (default 10) or KACE_BENCH_STEPS pass and
reports every step through kace's own helper, python/kace_progress.py (lines "<unix-seconds>
<steps-done>" in $KACE_PROGRESS_FILE, rate-limited by $KACE_PROGRESS_INTERVAL). Prints nothing on
stdout: ncu writes its CSV there.

usage: torch_workloads.py NAME       (NAME: see WORKLOADS; `--list` prints them)
"""
import os
import sys
import time

import torch
from torch import nn

# kace's progress helper lives in the repository's python/ folder.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
import kace_progress  # noqa: E402

try:
    import torchvision  # optional: two workloads use its model definitions (weights=None)
except ImportError:  # pragma: no cover - depends on the machine
    torchvision = None


def conv_net():
    # A plain CNN when torchvision is absent.
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 1000))


def image(model, batch, size):
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 1000, (batch,))
    return model, x, y, nn.CrossEntropyLoss()


def build(name):
    if name == "resnet18":
        m = torchvision.models.resnet18(weights=None) if torchvision else conv_net()
        return image(m, 64, 128)
    if name == "mobilenet":
        m = torchvision.models.mobilenet_v3_small(weights=None) if torchvision else conv_net()
        return image(m, 128, 96)
    if name == "transformer":
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
                self.enc = nn.TransformerEncoder(layer, num_layers=4)
                self.head = nn.Linear(512, 10)

            def forward(self, x):
                return self.head(self.enc(x).mean(1))
        return Encoder(), torch.randn(32, 128, 512), torch.randint(0, 10, (32,)), nn.CrossEntropyLoss()
    if name == "lstm":
        class Lstm(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(256, 512, num_layers=2, batch_first=True)
                self.head = nn.Linear(512, 10)

            def forward(self, x):
                return self.head(self.lstm(x)[0][:, -1])
        return Lstm(), torch.randn(64, 100, 256), torch.randint(0, 10, (64,)), nn.CrossEntropyLoss()
    if name == "mlp":
        m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
        return m, torch.randn(512, 1024), torch.randint(0, 10, (512,)), nn.CrossEntropyLoss()
    if name == "gemm":
        # Not a model: a memory-light, compute-bound loop of large matrix products.
        m = nn.Linear(8192, 8192, bias=False)
        return m, torch.randn(8192, 8192), torch.randn(8192, 8192), nn.MSELoss()
    raise SystemExit(f"torch_workloads.py: unknown workload {name!r}")


WORKLOADS = ["resnet18", "mobilenet", "transformer", "lstm", "mlp", "gemm"]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    if sys.argv[1] == "--list":
        print(" ".join(WORKLOADS))
        return
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model, x, y, loss_fn = build(sys.argv[1])
    model, x, y = model.to(dev), x.to(dev), y.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    seconds = float(os.environ.get("KACE_BENCH_SECONDS", "10"))
    max_steps = int(os.environ.get("KACE_BENCH_STEPS", "0")) or None
    start = time.time()
    step = 0
    while time.time() - start < seconds and (max_steps is None or step < max_steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        step += 1
        kace_progress.step()


if __name__ == "__main__":
    main()
