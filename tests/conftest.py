"""Test configuration shared by every test module.

* The CUDA tests run on numba's CUDA simulator unless a GPU is present (or
  NUMBASEP_TEST_GPU=1 says to use the real device). The switch must be set
  before numba is imported anywhere, hence here; so is the fix for the
  simulator's racy shared-memory allocation (``tests/simulator.py``).
* The adversarial tests run last (:func:`pytest_collection_modifyitems`).
* pytest-xdist workers take turns compiling a kernel both need
  (:func:`_compile_in_turns`).
* Hypothesis profiles: "ci" (the default: bounded so the whole suite stays within
  a few minutes on 2 cores) and "thorough" (HYPOTHESIS_PROFILE=thorough, for
  local runs).
"""

import os
import shutil


def _gpu_present():
    if os.environ.get("NUMBASEP_TEST_GPU") == "1":
        return True
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


if not _gpu_present():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    from simulator import make_shared_arrays_thread_safe

    make_shared_arrays_thread_safe()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Modules whose tests run after all the others (in collection order otherwise).
_LAST = ("test_adversarial.py",)


def pytest_collection_modifyitems(items):
    """Run the adversarial tests last. Their worker process warms up with one call
    per kernel the generators reach; first in the run, it compiled them (about
    four minutes on 2 cores) while the test processes compiled many of the same
    kernels for their own tests. Last, it loads what the other tests left in
    Numba's cache. (Every process sorts the same way, as pytest-xdist needs.)"""
    items.sort(key=lambda item: item.path.name in _LAST)


def _lock_dir(controller_pid):
    import tempfile
    return os.path.join(tempfile.gettempdir(), f"numbasep-compile-turns-{controller_pid}")


def _compile_in_turns():
    """Make the pytest-xdist workers compile each cached kernel signature one at a
    time: a worker about to compile what another is compiling waits for it, then
    loads the result from Numba's cache instead of compiling it again (both
    workers compiled the plane input gradient's float32 and float64 kernels, about
    a minute each, at the same time). A lock file per signature, held while the
    compilation runs inside Numba's compiler lock (so that a process's threads
    never wait on each other here); the kernels call each other without cycles,
    so the workers never wait on each other in a circle. Kernels without a disk
    cache, and signatures naming a process's own objects, are not shared."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import fcntl
    import hashlib

    from numba.core import caching, dispatcher
    from numba.core.compiler_lock import global_compiler_lock

    turns = _lock_dir(os.getppid())
    os.makedirs(turns, exist_ok=True)
    compile_ = dispatcher.Dispatcher.compile

    def key(disp, sig):
        f = disp.py_func
        cells = tuple(c.cell_contents if isinstance(c.cell_contents, (bool, int, str))
                      else type(c.cell_contents).__name__ for c in f.__closure__ or ())
        text = repr((f.__module__, f.__qualname__, f.__code__.co_firstlineno, cells, sig))
        return None if " at 0x" in text else hashlib.sha1(text.encode()).hexdigest()

    def compile_in_turn(self, sig):
        with global_compiler_lock:
            name = None if isinstance(self._cache, caching.NullCache) else key(self, sig)
            if name is None:
                return compile_(self, sig)
            with open(os.path.join(turns, name), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                return compile_(self, sig)

    dispatcher.Dispatcher.compile = compile_in_turn


_compile_in_turns()


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_lock_dir(os.getpid()), ignore_errors=True)
