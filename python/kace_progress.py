"""kace_progress: report training progress to kace with no dependencies beyond the standard library.

kace measures a job's throughput from lines ``<unix-seconds> <steps-done>`` appended to the file
named by ``$KACE_PROGRESS_FILE`` (set by kace's SPANK plugin in ``--kace-colocate`` jobs and by
``kace profile run``). This module writes those lines for you:

    import kace_progress
    for batch in kace_progress.track(loader):   # one step per item
        ...
    kace_progress.step()                         # or one step, by hand
    kace_progress.set_steps(global_step)         # or an absolute count

    trainer = transformers.Trainer(..., callbacks=[kace_progress.huggingface_callback()])
    trainer = lightning.Trainer(..., callbacks=[kace_progress.lightning_callback()])

Outside a kace job (no ``$KACE_PROGRESS_FILE``) every call does nothing. Only the process of
rank 0 writes (``RANK``/``SLURM_PROCID`` unset or ``0``), so a multi-process job counts once.

Writes are single ``write(2)`` calls of one whole line on an ``O_APPEND`` descriptor, so a line is
never torn. They are rate-limited (``$KACE_PROGRESS_INTERVAL`` seconds, default 1) and the file is
bounded (``$KACE_PROGRESS_MAX_BYTES``, default 1 MiB): when it would grow past the bound, the file
is compacted in place (its first lines and every second later line are kept, which keeps the
throughput kace computes from it) and the interval doubles, so a job running for months cannot
fill the node's disk. Nothing here ever raises into the caller: a progress file that cannot be
written is reported once on stderr and then ignored.

A job that dies of an uncaught CUDA out-of-memory error gets one line ``<unix-seconds> oom``
(``install_torch_hook`` sets this up; ``mark_out_of_memory()`` writes it by hand): with the job's
failed exit, it tells kace's epilog that the job outgrew its memory limit, so that its workload's
limit is raised next time.
"""

import atexit
import os
import sys
import threading
import time

__all__ = [
    "Reporter",
    "reporter",
    "step",
    "set_steps",
    "track",
    "huggingface_callback",
    "lightning_callback",
    "mark_out_of_memory",
    "install_oom_marker",
]

ENV_FILE = "KACE_PROGRESS_FILE"
ENV_INTERVAL = "KACE_PROGRESS_INTERVAL"
ENV_MAX_BYTES = "KACE_PROGRESS_MAX_BYTES"
DEFAULT_INTERVAL = 1.0
DEFAULT_MAX_BYTES = 1 << 20
# Lines kept verbatim at the head of a compacted file: the warm-up kace skips lies there.
HEAD_LINES = 64
# The smallest bound accepted, so that the head alone always fits.
MIN_MAX_BYTES = 16 << 10


def _float_env(name, default, low):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        _warn("%s=%r is not a number; using %s" % (name, raw, default))
        return default
    if not value == value or value < low:  # NaN or too small
        _warn("%s=%r is below %s; using %s" % (name, raw, low, default))
        return default
    return value


def _warn(message):
    try:
        sys.stderr.write("kace: progress: %s\n" % message)
    except Exception:
        pass


def _is_rank_zero():
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value not in (None, "", "0"):
            return False
    return True


class Reporter:
    """Appends progress lines to one file, rate-limited and bounded.

    ``path=None`` is a reporter that does nothing. ``clock`` is for tests.
    """

    def __init__(self, path, interval=DEFAULT_INTERVAL, max_bytes=DEFAULT_MAX_BYTES, clock=time.time):
        self.path = path
        self.interval = float(interval)
        self.max_bytes = max(int(max_bytes), MIN_MAX_BYTES)
        self.clock = clock
        self.steps = 0
        self._written_steps = None
        self._last_write = None
        self._fd = None
        self._broken = path is None
        self._oom_marked = False
        self._lock = threading.Lock()

    @property
    def active(self):
        """Whether lines are being written."""
        return not self._broken

    def step(self, n=1):
        """Counts ``n`` more steps done and writes a line when the interval has passed."""
        if self._broken:
            return
        with self._lock:
            try:
                self.steps += int(n)
            except (TypeError, ValueError):
                return
            self._maybe_write()

    def set_steps(self, steps):
        """Sets the steps done so far (an absolute count, e.g. a trainer's global step)."""
        if self._broken:
            return
        with self._lock:
            try:
                steps = int(steps)
            except (TypeError, ValueError):
                return
            if steps < self.steps:
                return  # kace refuses lines that go backwards; so do we
            self.steps = steps
            self._maybe_write()

    def flush(self):
        """Writes the current count now if it was not written yet (called at exit)."""
        if self._broken:
            return
        with self._lock:
            if self._written_steps != self.steps:
                self._write()

    def mark_out_of_memory(self):
        """Writes the current count and one ``<unix-seconds> oom`` line (once)."""
        if self._broken or self._oom_marked:
            return
        with self._lock:
            if self._written_steps != self.steps:
                self._write()
            self._oom_marked = True
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                os.write(self._fd, ("%.3f oom\n" % self.clock()).encode("ascii"))
            except OSError as e:
                self._broken = True
                _warn("couldn't write progress file %s: %s" % (self.path, e))

    def _maybe_write(self):
        now = self.clock()
        if self._last_write is None or now - self._last_write >= self.interval:
            self._write(now)

    def _write(self, now=None):
        now = self.clock() if now is None else now
        line = ("%.3f %d\n" % (now, self.steps)).encode("ascii")
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            size = os.fstat(self._fd).st_size
            if size + len(line) > self.max_bytes:
                self._compact()
            os.write(self._fd, line)
        except OSError as e:
            self._broken = True
            _warn("couldn't write progress file %s: %s; progress is no longer reported" % (self.path, e))
            return
        self._last_write = now
        self._written_steps = self.steps

    def _compact(self):
        # In place: the directory may not be writable by the job (kace's progress root is root's).
        with open(self.path, "r+b") as f:
            lines = f.read().splitlines(True)
            head, kept = lines[:HEAD_LINES], _thin(lines[HEAD_LINES:])
            while len(kept) > 1 and sum(map(len, head + kept)) > self.max_bytes // 2:
                kept = _thin(kept)
            data = b"".join(head + kept)
            f.seek(0)
            f.truncate()
            f.write(data)
        # Grow more slowly from now on; an interval of 0 (every step) becomes the default.
        self.interval = max(self.interval * 2, DEFAULT_INTERVAL)


def _thin(lines):
    """Every second line, and always the last one (the newest count)."""
    kept = lines[::2]
    if len(lines) % 2 == 0 and lines:
        kept.append(lines[-1])
    return kept


_reporter = None
_reporter_lock = threading.Lock()


def reporter():
    """The process's reporter, built from the environment on first use."""
    global _reporter
    if _reporter is None:
        with _reporter_lock:
            if _reporter is None:
                path = os.environ.get(ENV_FILE) or None
                if path is not None and not _is_rank_zero():
                    path = None
                r = Reporter(
                    path,
                    interval=_float_env(ENV_INTERVAL, DEFAULT_INTERVAL, 0.0),
                    max_bytes=int(_float_env(ENV_MAX_BYTES, DEFAULT_MAX_BYTES, MIN_MAX_BYTES)),
                )
                if r.active:
                    atexit.register(r.flush)
                _reporter = r
    return _reporter


def step(n=1):
    """Counts ``n`` steps done."""
    reporter().step(n)


def set_steps(steps):
    """Sets the absolute number of steps done so far."""
    reporter().set_steps(steps)


def track(iterable):
    """Yields the items of ``iterable`` (e.g. a DataLoader), counting one step per item."""
    r = reporter()
    for item in iterable:
        yield item
        r.step()


def huggingface_callback():
    """A ``transformers.TrainerCallback`` that reports the trainer's global step."""
    from transformers import TrainerCallback  # only when asked for

    class KaceProgressCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if getattr(state, "is_world_process_zero", True):
                set_steps(state.global_step)
            return control

    return KaceProgressCallback()


def lightning_callback():
    """A PyTorch Lightning ``Callback`` that reports the trainer's global step."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback

    class KaceProgressCallback(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if getattr(trainer, "is_global_zero", True):
                set_steps(trainer.global_step)

    return KaceProgressCallback()


def mark_out_of_memory():
    """Tells kace that the job ran out of GPU memory now."""
    reporter().mark_out_of_memory()


def _is_cuda_out_of_memory(exc):
    # torch.cuda.OutOfMemoryError (PyTorch >= 1.13; torch.OutOfMemoryError in 2.5) is a
    # RuntimeError; older versions raise a plain RuntimeError with this text.
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def install_oom_marker():
    """Chains ``sys.excepthook`` so that an uncaught CUDA out-of-memory error is marked in the
    progress file before Python reports it as usual."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        try:
            if _is_cuda_out_of_memory(value):
                mark_out_of_memory()
        except Exception:  # never hide the job's own error
            pass
        previous(kind, value, traceback)

    sys.excepthook = hook


def _optimizer_step_hook(optimizer, args, kwargs):
    step()


def install_torch_hook(torch_module):
    """Registers a global optimizer post-step hook (PyTorch >= 2.0): one step per
    ``optimizer.step()``. Returns whether it was registered."""
    optim = getattr(torch_module, "optim", None)
    register = getattr(getattr(optim, "optimizer", None), "register_optimizer_step_post_hook", None)
    if register is None:
        _warn(
            "this PyTorch (%s) has no register_optimizer_step_post_hook; write progress lines "
            "with kace_progress.step()" % getattr(torch_module, "__version__", "unknown version")
        )
        return False
    register(_optimizer_step_hook)
    install_oom_marker()
    return True


if __name__ == "__main__":
    # `python3 kace_progress.py N [DELAY]`: report N steps, DELAY seconds apart (a smoke test).
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    for _ in track(range(count)):
        time.sleep(delay)
