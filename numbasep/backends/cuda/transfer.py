"""Copying bfloat16 host arrays to the device, which numba-cuda cannot do itself.

numba-cuda copies a host array through its buffer protocol, which has no type
code for ml_dtypes' bfloat16: on a real GPU ``cuda.to_device`` refuses such an
array ("cannot include dtype 'E' in a buffer"). Its simulator copies with NumPy
and never meets the problem, so only a device shows it. A bfloat16 array is
therefore copied as its ``uint16`` bits and the device array viewed back as
bfloat16: the same bytes, no conversion, no extra copy. (The way back needs no
help: ``copy_to_host()`` copies into a byte buffer and views it with the array's
dtype; only ``copy_to_host(ary)`` into a bfloat16 ``ary`` is refused.)

Used by the command line's self-check, the GPU check script and the tests; the
README shows users the same view.
"""

import numpy as np


def to_device(a):
    """A numba device array holding a copy of the host array ``a``, of any dtype."""
    from numba import cuda

    a = np.asarray(a)
    if a.dtype.name != "bfloat16":
        return cuda.to_device(a)
    return cuda.to_device(a.view(np.uint16)).view(a.dtype)
