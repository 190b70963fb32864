"""Test configuration shared by every test module.

* The CUDA tests run on numba's CUDA simulator unless a GPU is present (or
  NUMBASEP_TEST_GPU=1 says to use the real device). The switch must be set
  before numba is imported anywhere, hence here; so is the fix for the
  simulator's racy shared-memory allocation (``tests/simulator.py``).
* The adversarial tests run last (:func:`pytest_collection_modifyitems`).
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
