"""Two ranks started by torch.multiprocessing.spawn (the PyTorch tutorial's pattern), which sets
no RANK: `spawn.py STEPS`, each rank training its own copy for STEPS steps."""

import sys

import torch
import torch.multiprocessing as mp

import own_timing


def rank(index, steps):
    torch.manual_seed(index)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 64), torch.randn(64, 1)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        own_timing.mark()


if __name__ == "__main__":
    mp.spawn(rank, args=(int(sys.argv[1]),), nprocs=2)
