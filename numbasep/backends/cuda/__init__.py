"""The CUDA backend: numba device arrays, ``@cuda.jit`` kernels.

Loaded by the registry (:mod:`numbasep.backends`) only when a CUDA array is
passed to an operator, so a CPU-only program never imports ``numba.cuda``.
This package is the only place in numbasep that does.
"""

import importlib.util

_INSTALL_HINT = (
    "numbasep's CUDA backend needs the numba-cuda package (NVIDIA's CUDA target "
    "for Numba), which is not installed; install it with  pip install numbasep[cuda]")


def numpy_compat():
    """Restore ``numpy.row_stack`` (removed in NumPy 2.5) for numba-cuda 0.30.

    numba-cuda registers an overload of ``np.row_stack`` when its array
    support is first imported, and fails with AttributeError on NumPy >= 2.5.
    ``row_stack`` was an alias of ``vstack``, so the alias is put back; NumPy
    versions that still have it are left untouched.
    """
    import numpy as np
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


def backend():
    """The :class:`~numbasep.backends.cuda.driver.CUDABackend` instance.

    Raises
    ------
    ImportError
        When numba-cuda is not installed (without it ``numba.cuda`` would be
        Numba's deprecated built-in target, which numbasep does not support).
    """
    if importlib.util.find_spec("numba_cuda") is None:
        raise ImportError(_INSTALL_HINT)
    numpy_compat()
    from .driver import CUDABackend
    return CUDABackend()
