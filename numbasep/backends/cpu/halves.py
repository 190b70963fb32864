"""float16 / bfloat16 <-> float32 conversions for the CPU backend, as parallel kernels.

The kernels compute in float32; 16-bit arguments are widened once per call and
results rounded once. NumPy converts float16 one element at a time in software
(about 3 ns per element each way on the development machine, more than the
convolution itself on most rows), and Numba cannot type float16 arrays on the
CPU. So the 16-bit arrays are handled here as their bit patterns (``uint16``):

* widening is exact: float16 through a 65,536-entry table built by NumPy
  itself; bfloat16 is the upper half of a float32, a shift;
* narrowing rounds to nearest, ties to even, as NumPy and ml_dtypes do:
  overflow gives Inf, values below half the smallest subnormal give zero, NaN
  stays NaN (quiet, with its sign; bfloat16 NaN is ml_dtypes' 0x7FC0), Inf stays Inf.

Each is checked against NumPy / ml_dtypes bit for bit (tests/test_halves.py).
"""

import numpy as np
from numba import njit, prange

_F16_TABLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


@njit(parallel=True, nogil=True, cache=True)
def _widen_f16(bits, table, out):
    for i in prange(bits.size):
        out[i] = table[bits[i]]


@njit(parallel=True, nogil=True, cache=True)
def _widen_bf16(bits, out_bits):
    for i in prange(bits.size):
        out_bits[i] = np.uint32(bits[i]) << np.uint32(16)


@njit(inline="always")
def _f16_bits(u):
    """float32 bits ``u`` (uint32) -> float16 bits, round to nearest even.

    Branch-free (every case computed, one selected) so that the loop vectorises:
    rounding adds half an output ulp less one, plus the output's lowest bit, then
    truncates (ties go to the even neighbour)."""
    one = np.uint32(1)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    # normal results: rebias the exponent (127 -> 15) and round away 13 bits
    normal = (a - np.uint32(0x38000000) + np.uint32(0xFFF) + ((a >> np.uint32(13)) & one)) \
        >> np.uint32(13)
    # subnormal results (and zero): the significand with its implicit bit, shifted
    # right by 14 .. 24 (more for smaller inputs, capped: they round to zero)
    shift = np.uint32(126) - min(a >> np.uint32(23), np.uint32(112))
    shift = min(shift, np.uint32(31))
    m = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    sub = (m + ((one << (shift - one)) - one) + ((m >> shift) & one)) >> shift
    h = sub if a < np.uint32(0x38800000) else normal
    h = np.uint32(0x7C00) if a >= np.uint32(0x477FF000) else h           # overflow, Inf
    nan = np.uint32(0x7E00) | ((a & np.uint32(0x7FFFFF)) >> np.uint32(13))
    h = nan if a > np.uint32(0x7F800000) else h
    return sign | h


@njit(inline="always")
def _bf16_bits(u):
    """float32 bits ``u`` (uint32) -> bfloat16 bits, round to nearest even."""
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):     # NaN: the quiet one
        return (u >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0)
    return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@njit(parallel=True, nogil=True, cache=True)
def _narrow_f16(src_bits, out):
    for i in prange(src_bits.size):
        out[i] = np.uint16(_f16_bits(src_bits[i]))


@njit(parallel=True, nogil=True, cache=True)
def _narrow_bf16(src_bits, out):
    for i in prange(src_bits.size):
        out[i] = np.uint16(_bf16_bits(src_bits[i]))


def widen(a):
    """A C-contiguous float16 or bfloat16 array as a new float32 array (exact)."""
    out = np.empty(a.shape, np.float32)
    bits = a.reshape(-1).view(np.uint16)
    if a.dtype == np.float16:
        _widen_f16(bits, _F16_TABLE, out.reshape(-1))
    else:
        _widen_bf16(bits, out.reshape(-1).view(np.uint32))
    return out


def narrow_into(buf, out):
    """Round the C-contiguous float32 ``buf`` into the C-contiguous 16-bit ``out``."""
    src = buf.reshape(-1).view(np.uint32)
    dst = out.reshape(-1).view(np.uint16)
    if out.dtype == np.float16:
        _narrow_f16(src, dst)
    else:
        _narrow_bf16(src, dst)
    return out
