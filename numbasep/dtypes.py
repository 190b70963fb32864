"""The dtype policy: which element types the operators accept and how they accumulate.

float16 and bfloat16 are stored in 16 bits but accumulated in float32 and rounded
once at the end; float32 accumulates in float32 and float64 in float64.
"""

import numpy as np

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
SUPPORTED = "float16, bfloat16 (ml_dtypes), float32, float64"


def is_supported(dtype):
    """True when ``dtype`` (a ``numpy.dtype``) is one numbasep computes with."""
    return dtype.name in _FLOAT_NAMES and dtype.isnative


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def accumulator(dtype):
    """The dtype partial sums are kept in for inputs of ``dtype``."""
    return _F64 if dtype == _F64 else _F32


# The NumPy-native supported dtypes, for an identity check on the hot path
# (bfloat16 takes the full check: recognising it would mean importing ml_dtypes).
_KNOWN = frozenset(np.dtype(n) for n in ("float16", "float32", "float64"))


def is_16bit(dtype):
    """For a supported dtype: whether it is stored in 16 bits (float16, bfloat16)."""
    return dtype.itemsize == 2


def common_dtype(named_dtypes):
    """Check that every array argument has one supported dtype and return it.

    Parameters
    ----------
    named_dtypes : sequence of (str, numpy.dtype)
        Argument names with the dtypes of the arrays given for them.

    Raises
    ------
    TypeError
        When a dtype is not supported or the arguments disagree.
    """
    first_name, first = named_dtypes[0]
    if first in _KNOWN:
        for _, dt in named_dtypes:
            if dt is not first and dt != first:
                break
        else:
            return first
    for name, dt in named_dtypes:
        if not is_supported(dt):
            detail = " (non-native byte order)" if dt.name in _FLOAT_NAMES else ""
            raise TypeError(
                f"{name} has dtype {dt.str if detail else dt.name}{detail}; "
                f"numbasep supports {SUPPORTED}"
            )
    for name, dt in named_dtypes[1:]:
        if dt != first:
            listing = ", ".join(f"{n}={d.name}" for n, d in named_dtypes)
            raise TypeError(
                f"all array arguments must share one dtype, got {listing}"
            )
    return first
