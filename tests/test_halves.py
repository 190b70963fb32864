"""16-bit <-> float32 conversions of the CPU backend (numbasep/backends/cpu/halves.py),
bit for bit against NumPy (float16) and ml_dtypes (bfloat16).

Widening is checked on every 16-bit pattern. Narrowing is checked on every float32
that matters for rounding: each 16-bit value, its neighbours one float32 ulp away,
the exact midpoints between consecutive 16-bit values and their neighbours (ties
to even), the overflow and underflow thresholds, plus a stride through all 2**32
float32 patterns. ``NUMBASEP_EXHAUSTIVE=1`` checks all 2**32 (minutes).
"""

import os

import ml_dtypes
import numpy as np
import pytest

from numbasep.backends.cpu import halves

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


@pytest.fixture(autouse=True, params=["hardware", "software"])
def half_path(request, monkeypatch):
    """Every test runs on both float16 paths: the CPU's conversion instructions
    (where it has them) and the table / branch-free software."""
    if request.param == "hardware" and not halves.HARDWARE_HALF:
        pytest.skip("this CPU has no half-precision conversion instructions")
    monkeypatch.setattr(halves, "HARDWARE_HALF", request.param == "hardware")
    return request.param


def _bits32(values):
    return np.ascontiguousarray(values, np.float32).view(np.uint32)


def _same(got, want):
    """Bitwise equal, except that any NaN matches any NaN of the same sign."""
    g, w = got.view(np.uint16), want.view(np.uint16)
    gnan, wnan = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(gnan, wnan)
    np.testing.assert_array_equal(g[~wnan], w[~wnan])
    np.testing.assert_array_equal(g[wnan] >> 15, w[wnan] >> 15)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_widening_is_exact_on_every_pattern(dtype):
    a = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    got = halves.widen(a)
    want = a.astype(np.float32)
    assert got.dtype == np.float32 and got.shape == a.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _rounding_cases(dtype):
    """float32 bit patterns around every 16-bit value and every midpoint."""
    h = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    h = h[np.isfinite(h.astype(np.float32))]
    lo = np.sort(np.unique(h.astype(np.float64)))
    mid = (lo[:-1] + lo[1:]) / 2                                  # exact in float32 here
    base = _bits32(np.concatenate([lo, mid]).astype(np.float32)).astype(np.int64)
    near = np.concatenate([base + d for d in (-2, -1, 0, 1, 2)])
    near = near[(near >= 0) & (near < 1 << 31)].astype(np.uint32)
    special = np.array([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x477FEFFF,
                        0x477FF000, 0x477FF001, 0x33000000, 0x33000001, 0x32FFFFFF,
                        0x38800000, 0x387FFFFF, 0x7F7FFFFF, 0x00000001, 0], np.uint32)
    stride = np.arange(0, 1 << 32, 65521, dtype=np.uint64).astype(np.uint32)
    both = np.concatenate([near, special])
    return np.concatenate([both, both | np.uint32(0x80000000), stride])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_narrowing_rounds_like_the_reference_libraries(dtype):
    bits = _rounding_cases(dtype)
    f = bits.view(np.float32)
    got = halves.narrow_into(f, np.empty(f.shape, dtype))
    with np.errstate(over="ignore", invalid="ignore"):
        want = f.astype(dtype)
    _same(got, want)


@pytest.mark.skipif(os.environ.get("NUMBASEP_EXHAUSTIVE") != "1",
                    reason="all 2**32 float32 patterns: set NUMBASEP_EXHAUSTIVE=1")
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_narrowing_every_float32(dtype):
    step = 1 << 26
    out = np.empty(step, dtype)
    for start in range(0, 1 << 32, step):
        f = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            want = f.astype(dtype)
        _same(halves.narrow_into(f, out), want)


def test_narrowing_writes_into_a_given_array_and_keeps_shape():
    buf = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    out = np.zeros((2, 3, 4), F16)
    assert halves.narrow_into(buf, out) is out
    np.testing.assert_array_equal(out, buf.astype(F16))
