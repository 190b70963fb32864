"""numba's CUDA simulator, made safe for the CUDA tests that run on it.

The simulator runs each simulated thread of a block as a Python thread and hands
out ``cuda.shared.array`` through a dictionary keyed by the calling line: look
the line up, and allocate the array when it is missing. The two steps are not
atomic (numba-cuda 0.30), so when the interpreter switches threads between them
(the tests set a short switch interval to speed up the simulator's barriers) two
threads of one block can each allocate their own "shared" array: a block-wide
reduction or GEMM tile then sums the wrong values. It was seen as rare failures of
CPU/CUDA agreement and of bitwise-repeatable filter gradients, in tests that pass
when rerun. :func:`make_shared_arrays_thread_safe` replaces the lookup with one that
holds a lock; it changes nothing else (the key is still the calling file and line).
"""

import sys
import threading

import numpy as np


def make_shared_arrays_thread_safe():
    """Patch the simulator's ``cuda.shared.array`` to allocate under a lock.
    Idempotent; a no-op when the simulator's internals are not where expected."""
    try:
        from numba.core import types
        from numba.cuda.simulator import kernelapi
        from numba.np import numpy_support
    except ImportError:
        return
    shared = getattr(kernelapi, "FakeCUDAShared", None)
    if shared is None or getattr(shared, "_numbasep_thread_safe", False):
        return
    unpatched = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0 or not hasattr(self, "_allocations"):
            return unpatched(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    shared.array = array
    shared._numbasep_thread_safe = True
