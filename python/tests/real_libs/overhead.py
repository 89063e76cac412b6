"""The automatic hook's cost, measured with the real torch (a benchmark, not a test): `python
overhead.py [PAIRS]` runs child processes with the hook off and on, alternating, PAIRS times
(default 5), and prints the median time per call of each. Run as docs/progress.md shows."""

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
AUTOHOOK = os.path.join(HERE, "..", "..", "autohook")


def child(what):
    import torch

    torch.set_num_threads(1)
    if what == "optimizer":
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.zeros(1)
        call, n = torch.optim.SGD([p], lr=0.1).step, 20000
    else:
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, num_layers=2).eval()
        x = torch.randn(int(what.split("-")[1]), 16, 64)
        torch.set_grad_enabled(False)

        def call():
            model(x)

        n = 2000
    for _ in range(n // 10):  # warm-up
        call()
    t = time.perf_counter()
    for _ in range(n):
        call()
    print((time.perf_counter() - t) / n * 1e6)


def run(what, auto):
    env = dict(os.environ, PYTHONPATH=AUTOHOOK, KACE_PROGRESS_AUTO=auto,
               KACE_PROGRESS_FILE=os.path.join(tempfile.mkdtemp(), "p.progress"))
    out = subprocess.run([sys.executable, __file__, "--child", what], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
        sys.exit(0)
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for what, auto in (("optimizer", "1"), ("forward-1", "forward"), ("forward-32", "forward")):
        off, on = [], []
        for _ in range(pairs):
            off.append(run(what, "0"))
            on.append(run(what, auto))
        a, b = statistics.median(off), statistics.median(on)
        print("%-10s KACE_PROGRESS_AUTO=%-7s %8.2f us per call off, %8.2f on: %+.2f us (%+.1f %%); "
              "off %.2f-%.2f, on %.2f-%.2f" % (what, auto, a, b, b - a, (b / a - 1) * 100,
                                              min(off), max(off), min(on), max(on)))
