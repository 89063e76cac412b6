"""Tests of kace_progress and the automatic PyTorch hook (python3 -m unittest discover -s python/tests).

These run with any Python 3, without the frameworks: the hook and the callbacks meet stand-in
modules that copy what the real packages do where kace touches them (checked against torch
2.15.0's source): ``torch/optim/__init__.py`` ends with ``del optimizer``, so the module is no
attribute of the package; ``torch.optim.optimizer.register_optimizer_step_post_hook(hook)``
calls ``hook(optimizer, args, kwargs)``; ``torch.nn.modules.module``'s global forward hooks
(``register_module_forward_pre_hook(hook)``, ``register_module_forward_hook(hook, *,
with_kwargs=False, always_call=False)``) run for every module's call, nested ones included.
The same behaviours against the real torch, transformers and Lightning are in
``test_real_libraries.py`` (run by .ci/run in the venv .ci/install-deps makes).
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
AUTOHOOK = os.path.join(PYDIR, "autohook")
sys.path.insert(0, PYDIR)

import kace_progress  # noqa: E402


def parse(path):
    """The (time, steps) pairs of a progress file, checking every line's form as kace does."""
    points = []
    with open(path) as f:
        for line in f:
            t, s = line.split()
            if s == "oom":
                continue
            points.append((float(t), int(s)))
    return points


def oom_lines(path):
    with open(path) as f:
        return [line for line in f if line.split()[1:] == ["oom"]]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class ReporterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "job.progress")

    def tearDown(self):
        self.dir.cleanup()

    def test_lines_are_rate_limited_and_the_last_count_is_flushed(self):
        clock = FakeClock()
        r = kace_progress.Reporter(self.path, interval=1.0, clock=clock)
        for _ in range(10):  # ten steps within 0.9 s: only the first is written at once
            r.step()
            clock.now += 0.1
        self.assertEqual(parse(self.path), [(1000.0, 1)])
        r.step()  # 1.0 s after the first line
        self.assertEqual(parse(self.path)[-1], (1001.0, 11))
        r.step(4)
        r.flush()
        self.assertEqual(parse(self.path)[-1], (1001.0, 15))
        r.flush()  # nothing new: no duplicate line
        self.assertEqual(len(parse(self.path)), 3)

    def test_counts_never_go_backwards(self):
        clock = FakeClock()
        r = kace_progress.Reporter(self.path, interval=0.0, clock=clock)
        r.set_steps(10)
        clock.now += 1
        r.set_steps(5)  # e.g. a trainer resumed from an older checkpoint: ignored
        clock.now += 1
        r.set_steps(12)
        # Counted from the first value reported (taken as one step done): 10 -> 1, 12 -> 3.
        self.assertEqual([s for _, s in parse(self.path)], [1, 3])

    def test_a_resumed_trainers_count_starts_at_its_own_steps(self):
        clock = FakeClock()
        r = kace_progress.Reporter(self.path, interval=0.0, clock=clock)
        for global_step in (5001, 5002, 5003):  # resumed from a checkpoint at step 5000
            clock.now += 1
            r.set_steps(global_step)
        self.assertEqual([s for _, s in parse(self.path)], [1, 2, 3])

    def test_the_file_stays_bounded_and_keeps_head_and_newest_count(self):
        clock = FakeClock()
        cap = kace_progress.MIN_MAX_BYTES
        r = kace_progress.Reporter(self.path, interval=0.0, max_bytes=cap, clock=clock)
        for _ in range(20000):
            clock.now += 0.5
            r.step()
        r.flush()
        size = os.path.getsize(self.path)
        self.assertLessEqual(size, cap)
        points = parse(self.path)
        self.assertEqual(points[0], (1000.5, 1))
        self.assertEqual(points[kace_progress.HEAD_LINES - 1][1], kace_progress.HEAD_LINES)
        self.assertEqual(points[-1], (11000.0, 20000))
        self.assertGreaterEqual(r.interval, kace_progress.DEFAULT_INTERVAL)
        # Still a valid kace progress file: time and steps never go backwards.
        for a, b in zip(points, points[1:]):
            self.assertLessEqual(a[0], b[0])
            self.assertLess(a[1], b[1])
        # The rate kace computes from it is the true 2 steps/s.
        (t0, s0), (t1, s1) = points[kace_progress.HEAD_LINES], points[-1]
        self.assertAlmostEqual((s1 - s0) / (t1 - t0), 2.0, places=6)

    def test_compaction_with_a_doubled_interval_slows_growth(self):
        clock = FakeClock()
        r = kace_progress.Reporter(self.path, interval=0.0, max_bytes=kace_progress.MIN_MAX_BYTES, clock=clock)
        r.interval = 0.25
        for _ in range(4000):
            clock.now += 0.25
            r.step()
        self.assertGreaterEqual(r.interval, 0.5)

    def test_an_unwritable_file_is_reported_once_and_ignored(self):
        r = kace_progress.Reporter(os.path.join(self.dir.name, "missing-dir", "x.progress"))
        r.step()
        self.assertFalse(r.active)
        r.step()  # no exception, nothing written

    def test_track_counts_one_step_per_item(self):
        r = kace_progress.Reporter(self.path, interval=0.0)
        kace_progress._reporter = r
        try:
            self.assertEqual(list(kace_progress.track(range(5))), [0, 1, 2, 3, 4])
            self.assertEqual(r.steps, 5)
        finally:
            kace_progress._reporter = None


def run_python(code, env_extra, pythonpath):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KACE_", "RANK", "SLURM_PROCID"))}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# A stand-in `torch` (python/tests/stand_in/torch): what real PyTorch does where kace touches it.
STAND_IN = os.path.join(HERE, "stand_in")

OLD_TORCH = {"torch/__init__.py": "__version__ = '1.13.1'\nfrom . import optim\n",
             "torch/optim/__init__.py": "class Optimizer:\n    def step(self):\n        pass\n"}

TRAINING_LOOP = """
import torch
opt = torch.optim.Optimizer()
for _ in range(7):
    opt.step()
"""


def write_tree(root, files):
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


class AutoHookTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.libs = STAND_IN
        self.progress = os.path.join(self.dir.name, "job.progress")
        self.env = {"KACE_PROGRESS_FILE": self.progress, "KACE_PROGRESS_INTERVAL": "0"}

    def tearDown(self):
        self.dir.cleanup()

    def test_torchrun_workers_share_their_tasks_memory_limit_once(self):
        # What torchrun gives each of its workers (LOCAL_WORLD_SIZE), with the plugin's two
        # copies of the task's share; a process the worker starts keeps the worker's share.
        env = dict(self.env, LOCAL_WORLD_SIZE="4", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3001M",
                   KACE_TASK_MEMORY_LIMIT="0=3001M")
        code = """
        import os, subprocess, sys
        print(os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "KACE_TASK_MEMORY_LIMIT" in os.environ)
        sys.stdout.flush()
        subprocess.run([sys.executable, "-c",
                        "import os; print(os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'])"])
        """
        out = run_python(code, env, [AUTOHOOK])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split("\n"), ["0=750M False", "0=750M", ""])

    def test_a_memory_limit_not_the_plugins_or_one_process_is_left_as_it_is(self):
        show = "import os; print(os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'))"
        cases = [
            ({"LOCAL_WORLD_SIZE": "2", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=100M",
              "KACE_TASK_MEMORY_LIMIT": "0=3000M"}, "0=100M", ""),
            ({"LOCAL_WORLD_SIZE": "1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M",
              "KACE_TASK_MEMORY_LIMIT": "0=3000M"}, "0=3000M", ""),
            ({"LOCAL_WORLD_SIZE": "x", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M",
              "KACE_TASK_MEMORY_LIMIT": "0=3000M"}, "0=3000M", ""),
            ({"LOCAL_WORLD_SIZE": "2", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3G",
              "KACE_TASK_MEMORY_LIMIT": "0=3G"}, "0=3G", "couldn't share the memory limit"),
            ({"LOCAL_WORLD_SIZE": "2"}, "None", ""),
        ]
        for extra, shown, warned in cases:
            out = run_python(show, dict(self.env, **extra), [AUTOHOOK])
            self.assertEqual((out.returncode, out.stdout.strip()), (0, shown), extra)
            self.assertIn(warned, out.stderr, extra)
            if not warned:
                self.assertEqual(out.stderr, "", extra)

    def test_an_unmodified_training_loop_reports_every_optimizer_step(self):
        out = run_python(TRAINING_LOOP, self.env, [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([s for _, s in parse(self.progress)], [1, 2, 3, 4, 5, 6, 7])

    def test_an_uncaught_cuda_out_of_memory_error_is_marked_and_still_reported(self):
        loop = TRAINING_LOOP + "raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        out = run_python(loop, self.env, [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 1)
        self.assertIn("OutOfMemoryError", out.stderr)
        self.assertEqual([s for _, s in parse(self.progress)][-1], 7)
        self.assertEqual(len(oom_lines(self.progress)), 1)
        # Any other error is not an out-of-memory one.
        os.remove(self.progress)
        out = run_python(TRAINING_LOOP + "raise ValueError('bad batch')\n", self.env, [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 1)
        self.assertEqual(oom_lines(self.progress), [])

    def test_nothing_is_written_outside_kace_jobs_or_when_opted_out(self):
        env = dict(self.env)
        del env["KACE_PROGRESS_FILE"]
        out = run_python(TRAINING_LOOP, env, [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(os.path.exists(self.progress))
        out = run_python(TRAINING_LOOP, dict(self.env, KACE_PROGRESS_AUTO="0"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(os.path.exists(self.progress))

    def test_only_rank_zero_writes(self):
        out = run_python(TRAINING_LOOP, dict(self.env, RANK="1"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(os.path.exists(self.progress))

    def test_a_job_that_never_imports_torch_is_untouched(self):
        out = run_python("import json, sys; print(type(sys.meta_path[0]).__name__)", self.env, [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "_TorchWatcher")
        self.assertFalse(os.path.exists(self.progress))
        self.assertEqual(out.stderr, "")

    def test_the_shadowed_sitecustomize_still_runs(self):
        site = os.path.join(self.dir.name, "site")
        marker = os.path.join(self.dir.name, "marker")
        write_tree(site, {"sitecustomize.py": "open(%r, 'w').write('ran')\n" % marker})
        out = run_python(TRAINING_LOOP, self.env, [AUTOHOOK, self.libs, site])
        self.assertEqual(out.returncode, 0, out.stderr)
        with open(marker) as f:
            self.assertEqual(f.read(), "ran")
        self.assertEqual(len(parse(self.progress)), 7)

    def test_a_failing_shadowed_sitecustomize_does_not_stop_the_job(self):
        site = os.path.join(self.dir.name, "site")
        write_tree(site, {"sitecustomize.py": "raise RuntimeError('broken site')\n"})
        out = run_python(TRAINING_LOOP, self.env, [AUTOHOOK, self.libs, site])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("broken site", out.stderr)
        self.assertEqual(len(parse(self.progress)), 7)

    def test_the_last_line_carries_the_last_steps_time_not_the_exit(self):
        loop = TRAINING_LOOP + "import time\nstepped = time.time()\ntime.sleep(1.5)\nprint(stepped)\n"
        out = run_python(loop, dict(self.env, KACE_PROGRESS_INTERVAL="10"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        points = parse(self.progress)
        self.assertEqual(points[-1][1], 7)
        self.assertLess(points[-1][0], float(out.stdout) + 0.2, "stamped with the exit time")

    def test_a_second_process_of_the_job_continues_the_count(self):
        for _ in range(2):
            out = run_python(TRAINING_LOOP, self.env, [AUTOHOOK, self.libs])
            self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([s for _, s in parse(self.progress)], list(range(1, 15)))

    def test_of_concurrent_processes_only_the_lock_holder_writes(self):
        # Two ranks that a launcher started without RANK (torch.multiprocessing.spawn): both
        # step; only the one holding the file's lock writes, and the count stays one rank's.
        loop = TRAINING_LOOP.replace("range(7)", "range(30)") + "import time\ntime.sleep(0.5)\n"
        loop = "import time\n" + loop.replace("opt.step()", "opt.step(); time.sleep(0.02)")
        env = dict(self.env)
        env["PYTHONPATH"] = os.pathsep.join([AUTOHOOK, self.libs])
        procs = [subprocess.Popen([sys.executable, "-c", loop], env=env) for _ in range(2)]
        for p in procs:
            self.assertEqual(p.wait(timeout=60), 0)
        steps = [s for _, s in parse(self.progress)]
        self.assertEqual(steps, sorted(set(steps)), "two writers interleaved")
        self.assertLessEqual(steps[-1], 60)
        self.assertGreaterEqual(steps[-1], 30)

    def test_a_non_zero_local_rank_does_not_write(self):
        out = run_python(TRAINING_LOOP, dict(self.env, LOCAL_RANK="1"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertFalse(os.path.exists(self.progress))

    def test_forward_mode_counts_outermost_forwards_only(self):
        infer = textwrap.dedent(
            """
            import torch
            Module = torch.nn.Module
            model = Module(Module(Module()), Module())
            for _ in range(5):
                model(1)
            class Broken(Module):
                def forward(self, x):
                    return 1 / 0
            try:
                Module(Broken())(1)
            except ZeroDivisionError:
                pass
            model(1)
            """
        )
        out = run_python(infer, dict(self.env, KACE_PROGRESS_AUTO="forward"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        # Five, the failed one (its post-hook runs with always_call), then one more.
        self.assertEqual([s for _, s in parse(self.progress)], [1, 2, 3, 4, 5, 6, 7])

    def test_torch_keeps_its_own_loader_and_the_site_module_its_name(self):
        site = os.path.join(self.dir.name, "site")
        write_tree(site, {"sitecustomize.py": "SITE = 'the site'\n"})
        code = TRAINING_LOOP + textwrap.dedent(
            """
            import pickle, sitecustomize
            pickle.dumps(torch.__spec__)
            print(type(torch.__spec__.loader).__name__, type(torch.__loader__).__name__, sitecustomize.SITE)
            """
        )
        out = run_python(code, self.env, [AUTOHOOK, self.libs, site])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["SourceFileLoader", "SourceFileLoader", "the", "site"])
        self.assertEqual(len(parse(self.progress)), 7)

    def test_an_infinite_bound_is_refused_not_raised(self):
        out = run_python(TRAINING_LOOP, dict(self.env, KACE_PROGRESS_MAX_BYTES="inf"), [AUTOHOOK, self.libs])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("KACE_PROGRESS_MAX_BYTES='inf' is not a finite number", out.stderr)
        self.assertEqual(len(parse(self.progress)), 7)

    def test_an_old_pytorch_is_told_once_and_the_job_runs(self):
        old = os.path.join(self.dir.name, "old")
        write_tree(old, OLD_TORCH)
        out = run_python(TRAINING_LOOP, self.env, [AUTOHOOK, old])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("has no torch.optim.optimizer.register_optimizer_step_post_hook", out.stderr)
        self.assertFalse(os.path.exists(self.progress))


class CallbackTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "job.progress")
        kace_progress._reporter = kace_progress.Reporter(self.path, interval=0.0)
        self.saved = {k: sys.modules.get(k) for k in ("transformers", "lightning", "lightning.pytorch", "lightning.pytorch.callbacks")}

    def tearDown(self):
        kace_progress._reporter = None
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        self.dir.cleanup()

    def test_hugging_face_trainer_callback_reports_the_global_step(self):
        transformers = types.ModuleType("transformers")

        class TrainerCallback:  # the documented base class: every event is a no-op
            def on_step_end(self, args, state, control, **kwargs):
                pass

        transformers.TrainerCallback = TrainerCallback
        sys.modules["transformers"] = transformers
        cb = kace_progress.huggingface_callback()
        self.assertIsInstance(cb, TrainerCallback)
        for step in (1, 2, 3):
            state = types.SimpleNamespace(global_step=step, is_world_process_zero=True)
            cb.on_step_end(None, state, "control", model=None)
        self.assertEqual([s for _, s in parse(self.path)], [1, 2, 3])

    def test_lightning_callback_reports_the_global_step(self):
        for name in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks"):
            sys.modules[name] = types.ModuleType(name)

        class Callback:
            pass

        sys.modules["lightning.pytorch.callbacks"].Callback = Callback
        cb = kace_progress.lightning_callback()
        self.assertIsInstance(cb, Callback)
        trainer = types.SimpleNamespace(global_step=4, is_global_zero=True)
        cb.on_train_batch_end(trainer, None, None, None, 0)
        trainer.global_step = 9
        cb.on_train_batch_end(trainer, None, None, None, 1)
        self.assertEqual([s for _, s in parse(self.path)], [1, 6])


if __name__ == "__main__":
    unittest.main()
