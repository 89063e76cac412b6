"""A training loop that dies of an uncaught CUDA out-of-memory error after `oom.py STEPS` steps
(raised by hand: there is no GPU here; torch.OutOfMemoryError is what the allocator raises)."""

import sys

import torch

import own_timing

torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    own_timing.mark()
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
