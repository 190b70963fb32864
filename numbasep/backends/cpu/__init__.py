"""The CPU backend: NumPy arrays, Numba ``@njit(parallel=True)`` kernels.

Importing this package (``numbasep`` does, first thing) also sets one
process-wide default, before any OpenMP runtime is loaded: ``GOMP_SPINCOUNT``
(see :data:`OPENMP_SPIN`), and keys the kernels' on-disk cache entries on all of
this directory's sources (:mod:`.cache_key`), before any kernel is decorated.
"""

import os

from . import cache_key

#: How long (busy-wait iterations) GNU OpenMP's idle threads spin before they
#: sleep, unless the environment says otherwise. The default (300,000 iterations,
#: about a millisecond) keeps Numba's threads spinning through the pointwise GEMM
#: that follows a depthwise kernel, and NumPy's OpenBLAS threads then fight them
#: for the cores (and the other way round): on 2 cores, 2 threads, N = 8,
#: separable forward 56x56x144 -> 24 filters took 7.9 ms against 2.7-2.9 ms at
#: 10,000, and the separable gradient 19x19x728 -> 728 50 ms against 26 ms. The
#: depthwise rows of ``bench --quick`` and back-to-back small calls measured the
#: same either way (``python -m numbasep bench --quick`` with and without
#: GOMP_SPINCOUNT=10000 set). It is read when the OpenMP runtime loads, so it has no
#: effect where another library started OpenMP first, and it applies to every
#: library of the process that loads GNU OpenMP later.
OPENMP_SPIN = "10000"

os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN)

cache_key.install()


def backend():
    from .driver import CPUBackend
    return CPUBackend()
