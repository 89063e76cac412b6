"""An unmodified PyTorch training loop: an MLP, Adam. `plain.py STEPS [TAIL_SECONDS]`: TAIL
seconds of other work after training (an evaluation, a checkpoint upload)."""

import sys
import time

import torch

import own_timing

torch.manual_seed(0)
torch.set_num_threads(1)
steps = int(sys.argv[1])
tail = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 64), torch.randn(64, 1)
for _ in range(steps):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    own_timing.mark()
time.sleep(tail)
