"""The CPU backend: NumPy arrays, Numba ``@njit(parallel=True)`` kernels."""


def backend():
    from .driver import CPUBackend
    return CPUBackend()
