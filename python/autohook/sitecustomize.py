"""kace's automatic progress hook for PyTorch jobs: no change to the job's code.

kace's SPANK plugin puts this directory first on ``PYTHONPATH`` in ``--kace-colocate`` jobs, so
Python imports this file at start-up. It does nothing unless ``$KACE_PROGRESS_FILE`` is set and
``$KACE_PROGRESS_AUTO`` is not ``0``; then it waits for the job to import ``torch`` and registers
a global optimizer post-step hook (PyTorch >= 2.0), so every ``optimizer.step()`` counts one step
in the job's progress file (through ``kace_progress``, one directory up). Before ``torch`` is
imported it costs nothing; jobs that never import it are untouched.

It also keeps kace's memory guard a job's, not each process's: the plugin gives each task its
share of the job's GPU memory limit in ``$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (which bounds each
process) and the same value in ``$KACE_TASK_MEMORY_LIMIT``; in the ``$LOCAL_WORLD_SIZE`` workers
torchrun starts from one task, this file divides the task's share among them before CUDA starts.

Any ``sitecustomize`` this file shadows (a site's or a virtual environment's) is still run, after
this one. Nothing here may break the job: every failure is one line on stderr.
"""


def _kace_main():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))

    def warn(message):
        try:
            sys.stderr.write("kace: progress: %s\n" % message)
        except Exception:
            pass

    def load_kace_progress():
        if "kace_progress" in sys.modules:
            return sys.modules["kace_progress"]
        path = os.path.join(os.path.dirname(here), "kace_progress.py")
        spec = importlib.util.spec_from_file_location("kace_progress", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["kace_progress"] = module
        spec.loader.exec_module(module)
        return module

    def on_torch(torch_module, auto):
        try:
            load_kace_progress().install_torch_hook(torch_module, auto)
        except Exception as e:  # never into the job
            warn("couldn't install the PyTorch progress hook: %s" % e)

    class _LoaderAfter:
        """Delegates to the real loader of ``torch`` and calls back once it has run."""

        def __init__(self, loader, auto):
            self._loader = loader
            self._auto = auto

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            # torch's own loader again, once it ran: nothing may keep seeing this wrapper (a
            # module spec that pickles, importlib.reload, importlib.resources).
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            self._loader.exec_module(module)
            on_torch(module, self._auto)

    class _TorchWatcher:
        """A meta-path finder that only notices the first import of ``torch``."""

        def __init__(self, auto):
            self._auto = auto

        def find_spec(self, fullname, path=None, target=None):
            if fullname != "torch":
                return None
            sys.meta_path.remove(self)  # once; and the real search must not find us again
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _LoaderAfter(spec.loader, self._auto)
                    return spec
            return None

    def share_memory_limit():
        # Only the value the plugin gave the task, and once: the marker goes, so processes
        # these workers start themselves (which inherit LOCAL_WORLD_SIZE) keep their share.
        task = os.environ.get("KACE_TASK_MEMORY_LIMIT")
        if not task or os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != task:
            return
        workers = os.environ.get("LOCAL_WORLD_SIZE", "")
        if not workers.isdigit() or int(workers) <= 1:
            return
        digits = task[2:-1] if task.startswith("0=") and task.endswith("M") else ""
        if not digits.isdigit() or len(digits) > 20:
            warn("couldn't share the memory limit %r among %s workers" % (task, workers))
            return
        share = max(int(digits) // int(workers), 1)
        os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=%dM" % share
        del os.environ["KACE_TASK_MEMORY_LIMIT"]

    share_memory_limit()

    # `$KACE_PROGRESS_AUTO` is read by kace_progress.auto_mode when torch is imported: until
    # then nothing of kace is loaded.
    if os.environ.get("KACE_PROGRESS_FILE"):
        auto = os.environ.get("KACE_PROGRESS_AUTO")
        if "torch" in sys.modules:
            on_torch(sys.modules["torch"], auto)
        else:
            sys.meta_path.insert(0, _TorchWatcher(auto))

    # Run the sitecustomize this one shadows, as Python would have.
    try:
        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            # `import sitecustomize` later finds the site's module, as it would without kace.
            sys.modules["sitecustomize"] = module
    except Exception as e:
        warn("the sitecustomize kace's shadows failed: %s: %s" % (type(e).__name__, e))


try:
    _kace_main()
except Exception as _e:  # never into the job
    import sys as _sys

    _sys.stderr.write("kace: progress: couldn't start the progress hook: %s\n" % _e)
del _kace_main
