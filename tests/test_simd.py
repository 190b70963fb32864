"""The register intrinsics of numbasep/backends/cpu/simd.py, element by element."""

import numba
import numpy as np
import pytest

from numbasep.backends.cpu import simd


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transpose8_moves_every_element_and_nothing_else(dtype):
    @numba.njit
    def run(src, s0, ss, dst, d0, doffs, di):
        simd.transpose8(src, s0, ss, dst, d0, doffs, di)

    src = np.arange(200, dtype=dtype)
    dst = np.full(400, -1, dtype)
    doffs = np.array([0, 0, 0, 50, 13, 100, 161, 200, 230, 300, 350], np.int64)
    run(src, 5, 23, dst, 7, doffs, 3)
    want = np.full(400, -1, dtype)
    for r in range(8):
        for c in range(8):
            want[7 + doffs[3 + c] + r] = src[5 + r * 23 + c]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_deinterleave8_splits_even_and_odd(dtype):
    @numba.njit
    def run(src, s0, dst, d0, d1):
        simd.deinterleave8(src, s0, dst, d0, d1)

    src = np.arange(40, dtype=dtype) * 1.5
    dst = np.full(60, -1, dtype)
    run(src, 3, dst, 2, 31)
    want = np.full(60, -1, dtype)
    want[2:10] = src[3:19:2]
    want[31:39] = src[4:19:2]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("m", [0, 1, 3])
def test_taps_dot8_adds_each_taps_block_sum_to_its_accumulator(dtype, n, m):
    @numba.njit
    def run(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m):
        simd.taps_dot8(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m, 3)

    rng = np.random.default_rng(3)
    x = rng.standard_normal(700).astype(dtype)
    g = rng.standard_normal(400).astype(dtype)
    acc = rng.standard_normal(60).astype(dtype)
    before = acc.copy()
    toffs = np.array([0, 41, 17, 99], np.int64)        # the 4th is not a tap: unused
    want = acc.astype(np.float64)
    for t in range(3):
        for r in range(m):
            for k in range(n):
                xs = 2 + r * 151 + k * 19 + toffs[t]
                gs = 5 + r * 97 + k * 11
                want[4 + t * 13:12 + t * 13] += x[xs:xs + 8].astype(np.float64) * g[gs:gs + 8]
    run(acc, 4, 13, x, 2, 19, 151, toffs, g, 5, 11, 97, n, m)
    np.testing.assert_allclose(acc, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    untouched = np.ones(60, bool)
    for t in range(3):
        untouched[4 + t * 13:12 + t * 13] = False
    assert np.array_equal(acc[untouched], before[untouched])
