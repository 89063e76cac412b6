"""An unmodified inference loop (eval, no_grad, no optimizer): `infer.py FORWARDS`. Counted
only with KACE_PROGRESS_AUTO=forward."""

import sys

import torch

import own_timing

torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=2).eval()
x = torch.randn(8, 16, 64)
with torch.no_grad():
    for _ in range(int(sys.argv[1])):
        model(x)
        own_timing.mark()
