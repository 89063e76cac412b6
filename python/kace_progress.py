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

Outside a kace job (no ``$KACE_PROGRESS_FILE``) every call does nothing. A job counts once
however many processes it runs: a process whose ``RANK``, ``LOCAL_RANK`` or ``SLURM_PROCID`` is
set and not ``0`` never writes, and of the others only the one holding the file's lock (an
exclusive ``flock``, taken at its first write and kept until it exits) writes, so the ranks of a
launcher that sets no rank (``torch.multiprocessing.spawn``) do not write twice. A process that
takes the lock over continues from the file's last count, so two trainings run one after the
other in one job add up instead of restarting at 0. Counts given with ``set_steps`` (a trainer's
global step) are counted from the first value this process reports, so a trainer resumed from a
checkpoint counts the steps it does, not the ones it loaded.

Each line carries the time of the last counted step, the exit flush included: work after the
last step (evaluation, saving a checkpoint, shutting workers down) is not counted as slow steps.

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
import fcntl
import math
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
    "install_torch_hook",
    "auto_mode",
]

ENV_FILE = "KACE_PROGRESS_FILE"
ENV_INTERVAL = "KACE_PROGRESS_INTERVAL"
ENV_MAX_BYTES = "KACE_PROGRESS_MAX_BYTES"
# How many bytes of the file's end are read for its last count when a process takes over.
TAIL_BYTES = 4096
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
    if not math.isfinite(value) or value < low:  # NaN, infinite or too small
        _warn("%s=%r is not a finite number of at least %s; using %s" % (name, raw, low, default))
        return default
    return value


def _warn(message):
    try:
        sys.stderr.write("kace: progress: %s\n" % message)
    except Exception:
        pass


def _is_rank_zero():
    # torchrun sets RANK and LOCAL_RANK; Lightning's own launcher only LOCAL_RANK; srun
    # SLURM_PROCID. torch.multiprocessing.spawn sets none of them: the file's lock covers it.
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
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
        # Steps this process did; what is written is `_base + steps` (the count it took over).
        self.steps = 0
        self._base = 0
        # The first absolute count `set_steps` was given: this process's steps count from it.
        self._origin = None
        self._stepped_at = None
        self._written_steps = None
        self._last_write = None
        self._last_try = None
        self._fd = None
        self._owner = False
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
                n = int(n)
            except (TypeError, ValueError, OverflowError):
                return
            if n <= 0:
                return
            self.steps += n
            self._stepped_at = self.clock()
            self._maybe_write(self._stepped_at)

    def set_steps(self, steps):
        """Sets the steps done so far (an absolute count, e.g. a trainer's global step)."""
        if self._broken:
            return
        with self._lock:
            try:
                steps = int(steps)
            except (TypeError, ValueError, OverflowError):
                return
            if self._origin is None:
                # The first report is taken as one step after the origin (a per-step callback).
                self._origin = steps - 1 - self.steps
            steps -= self._origin
            if steps <= self.steps:
                return  # kace refuses lines that go backwards; so do we
            self.steps = steps
            self._stepped_at = self.clock()
            self._maybe_write(self._stepped_at)

    def flush(self):
        """Writes the current count now if it was not written yet (called at exit)."""
        if self._broken:
            return
        with self._lock:
            if self._stepped_at is not None and self._written_steps != self.steps:
                # The time of the last step, not of the exit: work after training is no step.
                self._write(self._stepped_at)

    def mark_out_of_memory(self):
        """Writes the current count and one ``<unix-seconds> oom`` line (once)."""
        if self._broken or self._oom_marked:
            return
        with self._lock:
            if self._stepped_at is not None and self._written_steps != self.steps:
                self._write(self._stepped_at)
            if self._broken or not self._take_over():
                return
            self._oom_marked = True
            try:
                os.write(self._fd, ("%.3f oom\n" % self.clock()).encode("ascii"))
            except OSError as e:
                self._fail(e)

    def _maybe_write(self, now):
        if self._last_write is None or now - self._last_write >= self.interval:
            # A process waiting for the lock tries again once per interval, not at every step.
            if self._owner or self._last_try is None or now - self._last_try >= self.interval:
                self._write(now)

    def _write(self, now):
        self._last_try = now
        if not self._take_over():
            return
        line = ("%.3f %d\n" % (now, self._base + self.steps)).encode("ascii")
        try:
            size = os.fstat(self._fd).st_size
            if size + len(line) > self.max_bytes:
                self._compact()
            os.write(self._fd, line)
        except OSError as e:
            self._fail(e)
            return
        self._last_write = now
        self._written_steps = self.steps

    def _take_over(self):
        """Opens the file and takes its lock, once; then continues from its last count. False
        while another process of the job holds the lock (or when the file is unusable)."""
        if self._owner:
            return True
        try:
            if self._fd is None:
                self._fd = _open_for_append(self.path)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another process of this job writes; this one counts on quietly
        except OSError as e:
            self._fail(e)
            return False
        self._owner = True
        self._base = _last_count(self._fd)
        return True

    def _fail(self, e):
        self._broken = True
        _warn("couldn't write progress file %s: %s; progress is no longer reported" % (self.path, e))

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


def _open_for_append(path):
    flags = os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    try:
        # Read access too, for the last count when taking over (the prolog's file is the job
        # user's, mode 0600).
        return os.open(path, os.O_RDWR | flags, 0o644)
    except PermissionError:
        return os.open(path, os.O_WRONLY | flags, 0o644)


def _last_count(fd):
    """The steps of the file's last valid line (0 when there is none or it cannot be read)."""
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES))
    except OSError:
        return 0
    for line in reversed(tail.split(b"\n")):
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            t, steps = float(parts[0]), float(parts[1])
        except ValueError:
            continue  # an `oom` line, or a torn first line of the tail
        if math.isfinite(t) and math.isfinite(steps) and steps >= 0:
            return int(math.ceil(steps))
    return 0


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


# What `$KACE_PROGRESS_AUTO` asks the automatic hook to count.
AUTO_OFF = "off"
AUTO_OPTIMIZER = "optimizer"
AUTO_FORWARD = "forward"


def auto_mode(value):
    """The automatic hook's mode for a ``$KACE_PROGRESS_AUTO`` value: unset or ``1`` counts
    optimizer steps, ``forward`` counts outermost module forwards (inference), ``0`` is off."""
    value = (value or "1").strip().lower()
    if value in ("0", "no", "false", "off"):
        return AUTO_OFF
    if value == AUTO_FORWARD:
        return AUTO_FORWARD
    if value not in ("1", "yes", "true", "on", AUTO_OPTIMIZER):
        _warn("KACE_PROGRESS_AUTO=%r is not 0, 1 or forward; counting optimizer steps" % value)
    return AUTO_OPTIMIZER


def _submodule(torch_module, name):
    # Import, not attribute access: torch/optim/__init__.py ends with `del optimizer` (every
    # PyTorch from 2.0 to 2.15), so `torch.optim.optimizer` is no attribute of the package.
    import importlib

    try:
        return importlib.import_module(torch_module.__name__ + "." + name)
    except Exception:
        return None


def install_torch_hook(torch_module, auto=None):
    """Registers PyTorch's global hooks (PyTorch >= 2.0) as ``auto`` (a ``$KACE_PROGRESS_AUTO``
    value, see :func:`auto_mode`) asks: one step per ``optimizer.step()``, or one step per
    outermost ``Module`` forward call, and the out-of-memory marker. Returns whether a counter
    was registered."""
    mode = auto_mode(auto)
    if mode == AUTO_OFF:
        return False
    version = getattr(torch_module, "__version__", "unknown version")
    install_oom_marker()  # whatever happens to the counter, an OOM is still told
    if mode == AUTO_FORWARD:
        return _install_forward_counter(torch_module, version)
    optimizer = _submodule(torch_module, "optim.optimizer")
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        _warn(
            "this PyTorch (%s) has no torch.optim.optimizer.register_optimizer_step_post_hook "
            "(PyTorch 2.0 or newer has it); write progress lines with kace_progress.step()" % version
        )
        return False
    register(_optimizer_step_hook)
    return True


def _install_forward_counter(torch_module, version):
    # Global module hooks see every module's call; only the outermost (depth 0) one is a step.
    # A hook on every call costs about 2 us per module call (it also turns off the module call's
    # no-hook fast path): opt-in only (docs/progress.md has the measured overhead).
    module = _submodule(torch_module, "nn.modules.module")
    pre = getattr(module, "register_module_forward_pre_hook", None)
    post = getattr(module, "register_module_forward_hook", None)
    if pre is None or post is None:
        _warn("this PyTorch (%s) has no global module forward hooks; write progress lines with "
              "kace_progress.step()" % version)
        return False
    depth = threading.local()  # nn.DataParallel runs replicas' forwards in threads

    def before(mod, args):
        depth.n = getattr(depth, "n", 0) + 1

    def after(mod, args, output):
        n = getattr(depth, "n", 1) - 1
        depth.n = max(n, 0)
        if n <= 0:
            step()

    pre(before)
    try:
        # always_call (PyTorch >= 2.1): the depth stays right when a forward raises.
        post(after, always_call=True)
    except TypeError:
        post(after)
    return True


if __name__ == "__main__":
    # `python3 kace_progress.py N [DELAY]`: report N steps, DELAY seconds apart (a smoke test).
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    for _ in track(range(count)):
        time.sleep(delay)
