"""Importing numbasep sets GNU OpenMP's spin count (GOMP_SPINCOUNT) unless the
environment already does, and before Numba has loaded an OpenMP runtime (see
``numbasep.backends.cpu.OPENMP_SPIN`` for the measurements behind it)."""

import os
import subprocess
import sys

CODE = ("import os, sys; import numbasep; "
        "from numbasep.backends.cpu import OPENMP_SPIN; "
        "print(os.environ.get('GOMP_SPINCOUNT'), OPENMP_SPIN, "
        "'numba.np.ufunc.omppool' in sys.modules)")


def _run(env):
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_import_sets_the_spin_count_before_openmp_loads():
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    value, default, omp_loaded = _run(env)
    assert value == default and int(default) < 300_000
    assert omp_loaded == "False"


def test_a_spin_count_in_the_environment_is_kept():
    value, _, _ = _run(dict(os.environ, GOMP_SPINCOUNT="12345"))
    assert value == "12345"
