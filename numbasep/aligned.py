"""Arrays whose data starts on a 64-byte boundary.

NumPy aligns large arrays to 16 bytes only. The channels-last kernels store 16
channels of float32 (64 bytes, one cache line) at a time: when the array starts
16 bytes off a line, every such store and load spans two lines, and a store
that covers only part of a line makes the core read the line first. 2 threads,
8x56x56x144 3x3 forward, min of 3 rounds: input and result 64-byte aligned
0.62 ms, 16 bytes off 0.78 ms (the result alone off: 0.75 ms). The frameworks
numbasep is measured against allocate their tensors 64-byte aligned.
"""

import math

import numpy as np

#: Byte alignment of :func:`empty_aligned`: one cache line, one AVX-512 vector.
ALIGN = 64

# Results and temporaries smaller than this are allocated plainly: they sit in
# the caches, and aligning costs about 1.4 us of a small call's budget.
_SMALL = 1 << 16


def empty_aligned(shape, dtype=np.float32):
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary.

    Parameters
    ----------
    shape : int or sequence of ints
    dtype : data-type, optional

    Returns
    -------
    numpy.ndarray
        A view of a slightly larger byte buffer (``base`` is not None).

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = numbasep.empty_aligned((8, 56, 56, 144), np.float32)
    >>> x.ctypes.data % 64, x.flags.c_contiguous
    (0, True)
    """
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, np.uint8)
    start = -buf.__array_interface__["data"][0] % ALIGN
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def empty(shape, dtype):
    """What the CPU backend allocates its results with: :func:`empty_aligned`
    from 64 KB on, plain ``numpy.empty`` below."""
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < _SMALL:
        return np.empty(shape, dtype)
    return empty_aligned(shape, dtype)


def contiguous(a, dtype=None):
    """``a`` itself when C-contiguous (and of ``dtype``), else a C-contiguous copy
    allocated as :func:`empty` allocates."""
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    if a.flags.c_contiguous and a.dtype == dtype:
        return a
    out = empty(a.shape, dtype)
    out[...] = a
    return out
