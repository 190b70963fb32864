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

Where the CPU converts float16 in hardware (x86-64 with F16C, AArch64), float16
goes through LLVM's ``fpext``/``fptrunc`` on ``half`` (vcvtph2ps / vcvtps2ph:
16 lanes per instruction) instead: the table lookup is a gather and the
branch-free rounding several dozen instructions per element. The hardware rounds
to nearest even like the software; only two things differ, and are handled: it
quiets a signalling NaN when widening (the kernel restores NumPy's exact bits),
and its NaN payloads when narrowing are any NaN of the same sign (as here).

Some kernels skip the widened copy and read 16-bit operands in place, converting
each element as they load it: :func:`value` (what such a kernel calls on every
element it reads) and :func:`bits` (the view the driver passes it).

Each is checked against NumPy / ml_dtypes bit for bit (tests/test_halves.py,
tests/test_raw16.py).
"""

import platform

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

_F16_TABLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def _hardware_half():
    """Whether LLVM turns half <-> float conversions into instructions here (else
    it would call a runtime helper, which Numba's JIT does not link)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        try:
            return bool(llb.get_host_cpu_features().get("f16c"))
        except Exception:  # pragma: no cover (no feature list: stay in software)
            return False
    return machine in ("aarch64", "arm64")


HARDWARE_HALF = _hardware_half()


def _conversion(accepts, result, emit, doc):
    """An intrinsic converting one scalar of a type in ``accepts`` to ``result`` with
    the LLVM instructions ``emit(builder, value)`` returns."""
    @intrinsic
    def convert(typingctx, a):
        if a not in accepts:
            return None

        def codegen(context, builder, signature, args):
            return emit(builder, args[0])
        return result(a), codegen
    convert.__doc__ = doc
    return convert


_I16, _I32, _HALF, _FLOAT = ir.IntType(16), ir.IntType(32), ir.HalfType(), ir.FloatType()

_half_to_float = _conversion(
    (types.uint16, types.int16), types.float32,
    lambda b, v: b.fpext(b.bitcast(v, _HALF), _FLOAT),
    "float16 bits (uint16 or int16) -> float32, by the CPU's conversion instruction.")

_float_bits = _conversion(
    (types.float32,), types.uint32, lambda b, v: b.bitcast(v, _I32),
    "The bits of a float32 (uint32).")

_bf16_to_float = _conversion(
    (types.uint16,), types.float32,
    lambda b, v: b.bitcast(b.shl(b.zext(v, _I32), ir.Constant(_I32, 16)), _FLOAT),
    "bfloat16 bits (uint16) -> float32: the upper half of its bits.")

_bits_to_half = _conversion(
    (types.uint32,), types.uint16,
    lambda b, v: b.bitcast(b.fptrunc(b.bitcast(v, _FLOAT), _HALF), _I16),
    "float32 bits (uint32) -> float16 bits (uint16), rounded to nearest even by the "
    "CPU's conversion instruction.")


def value(v):
    """An element of a kernel operand as the kernels compute with it.

    16-bit operands may reach a kernel as their bit patterns, converted element by
    element as they are read (no widened copy): bfloat16 as ``uint16``, float16 as
    ``int16`` (only where :data:`HARDWARE_HALF`). Floats are returned as they are,
    so a kernel written with ``value`` compiles to the same code for them."""
    return v


@overload(value)
def _value(v):
    if v == types.uint16:
        return lambda v: _bf16_to_float(v)
    if v == types.int16:
        return lambda v: _half_to_float(v)
    return lambda v: v


def stored(v, a):
    """The float ``v`` as array ``a`` holds it: rounded to a 16-bit bit pattern
    when ``a`` holds those (``uint16`` bfloat16, ``int16`` float16; as
    :func:`narrow_into` rounds), else as it is. (The scalar twin of the register
    kernels' 16-bit stores.)"""
    return v


@overload(stored)
def _stored(v, a):
    if a.dtype == types.uint16:
        return lambda v, a: np.uint16(_bf16_bits(_float_bits(np.float32(v))))
    if a.dtype == types.int16:
        return lambda v, a: np.int16(_bits_to_half(_float_bits(np.float32(v))))
    return lambda v, a: v


def bits(a):
    """A C-contiguous bfloat16 / float16 array as the bit patterns :func:`value`
    reads (``uint16`` / ``int16``), a view; None for any other dtype, or for
    float16 where the CPU has no conversion instructions."""
    if a.dtype.itemsize != 2:
        return None
    if a.dtype == np.float16:
        return a.view(np.int16) if HARDWARE_HALF else None
    return a.view(np.uint16)


@njit(parallel=True, nogil=True, cache=True)
def _widen_f16_hw(bits, out_bits):
    for i in prange(bits.size):
        h = bits[i]
        u = _float_bits(_half_to_float(h))
        # a NaN keeps its exact payload, quiet or signalling, as NumPy's does
        nan = ((np.uint32(h) & np.uint32(0x8000)) << np.uint32(16)) | np.uint32(0x7F800000) \
            | ((np.uint32(h) & np.uint32(0x3FF)) << np.uint32(13))
        out_bits[i] = nan if (h & np.uint16(0x7FFF)) > np.uint16(0x7C00) else u


@njit(parallel=True, nogil=True, cache=True)
def _narrow_f16_hw(src_bits, out):
    for i in prange(src_bits.size):
        out[i] = _bits_to_half(src_bits[i])


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


def widen(a, out=None):
    """A C-contiguous float16 or bfloat16 array as float32 (exact): into ``out``
    (C-contiguous float32, same shape) when given, else a new array."""
    if out is None:
        out = np.empty(a.shape, np.float32)
    bits = a.reshape(-1).view(np.uint16)
    if a.dtype == np.float16:
        if HARDWARE_HALF:
            _widen_f16_hw(bits, out.reshape(-1).view(np.uint32))
        else:
            _widen_f16(bits, _F16_TABLE, out.reshape(-1))
    else:
        _widen_bf16(bits, out.reshape(-1).view(np.uint32))
    return out


def narrow_into(buf, out):
    """Round the C-contiguous float32 ``buf`` into the C-contiguous 16-bit ``out``."""
    src = buf.reshape(-1).view(np.uint32)
    dst = out.reshape(-1).view(np.uint16)
    if out.dtype == np.float16:
        if HARDWARE_HALF:
            _narrow_f16_hw(src, dst)
        else:
            _narrow_f16(src, dst)
    else:
        _narrow_bf16(src, dst)
    return out
