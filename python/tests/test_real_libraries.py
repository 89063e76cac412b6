"""The hook and the callbacks against the real torch, transformers and Lightning from PyPI.

Run by .ci/run with the venv .ci/install-deps makes and ``KACE_REAL_LIBS=1``:
``KACE_REAL_LIBS=1 /opt/kace-pyenv/bin/python -m unittest discover -s python/tests``. Without
``KACE_REAL_LIBS=1`` these are skipped (and say so); with it, a missing library is a failure.
The rates against the scripts' own timing are checked through kace's own reader in
node/tests/real_libraries.rs.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import kace_progress  # noqa: E402
from test_kace_progress import AUTOHOOK, oom_lines, parse, run_python  # noqa: E402

REAL = os.environ.get("KACE_REAL_LIBS") == "1"


@unittest.skipUnless(REAL, "needs the real torch, transformers and lightning: KACE_REAL_LIBS=1 in the venv .ci/install-deps makes")
class RealTorchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.progress = os.path.join(self.dir.name, "job.progress")
        self.env = {"KACE_PROGRESS_FILE": self.progress, "KACE_PROGRESS_INTERVAL": "0"}

    def tearDown(self):
        self.dir.cleanup()

    def test_versions(self):
        import lightning
        import torch
        import transformers

        sys.stderr.write("\nreal libraries: torch %s, transformers %s, lightning %s, Python %s\n"
                         % (torch.__version__, transformers.__version__, lightning.__version__,
                            sys.version.split()[0]))
        # What the hook's first version missed: the package deletes the module attribute.
        self.assertFalse(hasattr(torch.optim, "optimizer"))

    def test_torchruns_workers_share_the_tasks_memory_limit(self):
        # The real launcher: two workers of one task (a kace job's one task) on the CPU.
        script = os.path.join(self.dir.name, "worker.py")
        with open(script, "w") as f:
            f.write("import os, torch\nprint('WORKER', os.environ['LOCAL_RANK'], "
                    "os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'], flush=True)\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KACE_", "RANK"))}
        env.update(self.env, PYTHONPATH=AUTOHOOK, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3001M",
                   KACE_TASK_MEMORY_LIMIT="0=3001M", OMP_NUM_THREADS="1")
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", script],
            env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        workers = sorted(l for l in out.stdout.splitlines() if l.startswith("WORKER"))
        self.assertEqual(workers, ["WORKER 0 0=1500M", "WORKER 1 0=1500M"], out.stdout)

    def test_every_optimizer_step_counts_and_torch_keeps_its_loader(self):
        code = textwrap.dedent(
            """
            import pickle, torch
            m = torch.nn.Linear(4, 1)
            opt = torch.optim.Adam(m.parameters())
            for _ in range(7):
                opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()
            pickle.dumps(torch.__spec__)
            print(type(torch.__spec__.loader).__name__)
            """
        )
        out = run_python(code, self.env, [AUTOHOOK])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("kace: progress", out.stderr)
        self.assertEqual(out.stdout.strip(), "SourceFileLoader")
        self.assertEqual([s for _, s in parse(self.progress)], [1, 2, 3, 4, 5, 6, 7])

    def test_an_uncaught_out_of_memory_error_is_marked(self):
        code = textwrap.dedent(
            """
            import torch
            m = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad(); m(torch.randn(2, 4)).sum().backward(); opt.step()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            """
        )
        out = run_python(code, self.env, [AUTOHOOK])
        self.assertEqual(out.returncode, 1)
        self.assertIn("OutOfMemoryError", out.stderr)
        self.assertEqual(parse(self.progress)[-1][1], 3)
        self.assertEqual(len(oom_lines(self.progress)), 1)

    def test_forward_mode_counts_each_outermost_forward_once(self):
        code = textwrap.dedent(
            """
            import torch
            layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
            model = torch.nn.TransformerEncoder(layer, num_layers=2).eval()
            with torch.no_grad():
                for _ in range(5):
                    model(torch.randn(2, 4, 16))
                try:
                    model(torch.randn(2, 4, 7))  # the wrong width: raises inside a submodule
                except Exception:
                    pass
                model(torch.randn(2, 4, 16))
            """
        )
        out = run_python(code, dict(self.env, KACE_PROGRESS_AUTO="forward"), [AUTOHOOK])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("kace: progress", out.stderr)
        # 5, the failed call (always_call keeps the nesting depth right), 1 more.
        self.assertEqual([s for _, s in parse(self.progress)], [1, 2, 3, 4, 5, 6, 7])


@unittest.skipUnless(REAL, "needs the real transformers and lightning: KACE_REAL_LIBS=1")
class RealCallbackTest(unittest.TestCase):
    """The documented manual callbacks, subclassing the real base classes."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "job.progress")
        kace_progress._reporter = kace_progress.Reporter(self.path, interval=0.0)

    def tearDown(self):
        kace_progress._reporter = None
        self.dir.cleanup()

    def test_the_callbacks_are_the_frameworks_own_kind(self):
        import lightning
        import transformers

        self.assertIsInstance(kace_progress.huggingface_callback(), transformers.TrainerCallback)
        self.assertIsInstance(kace_progress.lightning_callback(), lightning.pytorch.callbacks.Callback)

    def test_the_lightning_callback_reports_a_real_fit(self):
        import lightning
        import torch

        class Tiny(lightning.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        trainer = lightning.Trainer(max_steps=12, accelerator="cpu", devices=1, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False,
                                    callbacks=[kace_progress.lightning_callback()])
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
        steps = [s for _, s in parse(self.path)]
        self.assertEqual(steps, list(range(1, 13)))


if __name__ == "__main__":
    unittest.main()
