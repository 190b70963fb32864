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
