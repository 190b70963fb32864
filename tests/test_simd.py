"""The register intrinsics of numbasep/backends/cpu/simd.py, element by element."""

import ctypes
import mmap
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import pytest

import numbasep
from numbasep.backends.cpu import halves, simd

_compiled = {}


def _once(*key):
    """``numba.njit``, one dispatcher per test function and ``key`` (the register
    width and compile-time constants the function closes over): parametrized
    cases that differ only in run-time arguments share its compilations, each
    seconds of LLVM for the intrinsics (96 of them for the dots_rows cases
    alone, of 4 distinct ones)."""
    def jit(py_func):
        at = (py_func.__qualname__,) + key
        if at not in _compiled:
            _compiled[at] = numba.njit(py_func)
        return _compiled[at]
    return jit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transpose8_moves_every_element_and_nothing_else(dtype):
    @_once()
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


def _deinterleave_run(src, s0, n, dst, d0, d1):
    simd.deinterleave(src, s0, n, dst, d0, d1)


def _before_guard_page(count, dtype):
    """An array of ``count`` elements that ends where a page no access is allowed
    to begins (a read past its end faults), or None where that cannot be set up."""
    page = mmap.PAGESIZE
    size = -(-count * np.dtype(dtype).itemsize // page) * page
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = mmap.mmap(-1, size + page)
        at = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        if libc.mprotect(ctypes.c_void_p(at + size), ctypes.c_size_t(page), 0) != 0:
            return None
    except (AttributeError, OSError, TypeError):
        return None
    whole = np.frombuffer(buf, np.uint8, size)
    return whole[size - count * np.dtype(dtype).itemsize:].view(dtype)


# pair counts around one and two vectors of each width (8 float64 or 16 float32
# lanes with AVX-512, 4 or 8 without), none, and a 56-column row's 28
@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 28, 40])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_deinterleave_splits_even_and_odd_and_touches_nothing_else(dtype, n):
    run = _once()(_deinterleave_run)
    src = _before_guard_page(2 * n + 3, dtype)
    if src is None:
        pytest.skip("no guard page here (mprotect)")
    src[:] = np.arange(2 * n + 3) * 1.5 - 20
    dst = np.full(2 * n + 50, -1, dtype)
    # the last element read is the last before the guard page
    run(src, 3, n, dst, 2, n + 30)
    want = np.full_like(dst, -1)
    want[2:2 + n] = src[3::2][:n]
    want[n + 30:2 * n + 30] = src[4::2][:n]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("n", [5, 16, 21])
@pytest.mark.parametrize("bits", [np.float16, ml_dtypes.bfloat16])
def test_deinterleave_widens_16_bit_bit_patterns(bits, n):
    run = _once()(_deinterleave_run)
    src = (np.arange(2 * n + 3) * 1.25 - 7).astype(bits)
    dst = np.full(2 * n + 10, -1, np.float32)
    run(halves.bits(src), 3, n, dst, 1, n + 5)
    want = np.full_like(dst, -1)
    want[1:1 + n] = src[3::2][:n].astype(np.float32)
    want[n + 5:2 * n + 5] = src[4::2][:n].astype(np.float32)
    np.testing.assert_array_equal(dst, want)


def _interleaved_run(dst, d0, src, s0, offs, wv, t0, n0, n1, width, stream):
    simd.interleaved_sums(dst, d0, src, s0, offs, wv, t0, n0, n1, width, stream)
    simd.sfence()


def _interleaved_want(src, s0, offs, wv, t0, n0, n1, width):
    """interleaved_sums in float64, term by term."""
    src, wv = src.astype(np.float64), wv.astype(np.float64)
    want = np.zeros(width)
    for i in range(width):
        first, n = (t0, n0) if i % 2 == 0 else (t0 + n0, n1)
        want[i] = sum(src[s0 + i // 2 + offs[t]] * wv[t] for t in range(first, first + n))
    return want


# widths below one pair of vectors, between, and above a block of 4 pairs
# (simd._PAIRED_BLOCK), ending on a vector, inside one, or on a pair
@pytest.mark.parametrize("stream", [0, 1])
@pytest.mark.parametrize("width", [1, 15, 32, 33, 112, 160, 200, 256])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_interleaved_sums_add_each_parity_s_taps(dtype, width, stream):
    run = _once()(_interleaved_run)
    rng = np.random.default_rng(width)
    src = rng.standard_normal(width + 200).astype(dtype)
    offs = rng.integers(0, 40, 9)
    wv = rng.standard_normal(9).astype(dtype)
    per = 64 // np.dtype(dtype).itemsize          # a streamed row starts on a line
    dst = numbasep.empty_aligned((width + 3 * per,), dtype)
    dst[:] = 7
    run(dst, per, src, 3, offs, wv, 2, 4, 3, width, stream)
    assert (dst[:per] == 7).all() and (dst[per + width:] == 7).all()   # nothing else touched
    want = _interleaved_want(src, 3, offs, wv, 2, 4, 3, width)
    np.testing.assert_allclose(dst[per:per + width], want, rtol=0,
                               atol={np.float32: 1e-5}.get(dtype, 1e-13) * 8)


def test_interleaved_sums_of_no_taps_are_plus_zero():
    run = _once()(_interleaved_run)
    src = -np.ones(100, np.float32)
    dst = np.full(40, 7, np.float32)
    wv = np.float32([2, 3])
    run(dst, 0, src, 0, np.int64([0, 1]), wv, 0, 2, 0, 37, 0)    # odd columns: no taps
    np.testing.assert_array_equal(dst[:37:2], np.float32(-5))
    assert (dst[1:37:2] == 0).all() and not np.signbit(dst[1:37:2]).any()
    assert (dst[37:] == 7).all()


@pytest.mark.parametrize("bits", [np.float16, ml_dtypes.bfloat16])
def test_interleaved_sums_round_into_16_bit_bit_patterns(bits):
    run = _once()(_interleaved_run)
    rng = np.random.default_rng(5)
    src = (rng.standard_normal(120) * 50).astype(np.float32)
    dst = halves.bits(np.full(50, -1, bits))
    offs, wv = np.int64([0, 5, 2]), np.float32([1, 0.5, 1])
    run(dst, 2, src, 3, offs, wv, 0, 2, 1, 45, 0)
    want = np.full(50, -1, np.float32)
    for i in range(45):
        j = 3 + i // 2
        want[2 + i] = (np.float32(src[j] + src[j + 5] * np.float32(0.5)) if i % 2 == 0
                       else src[j + 2])
    np.testing.assert_array_equal(dst, halves.bits(want.astype(bits)))


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("m", [0, 1, 3])
def test_taps_dot_adds_each_taps_block_sum_to_its_accumulator(lanes, dtype, n, m):
    @_once(lanes)
    def run(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m):
        if lanes == 8:
            simd.taps_dot8(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m,
                           3)
        else:
            simd.taps_dot16(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m,
                            3)

    rng = np.random.default_rng(3)
    x = rng.standard_normal(700).astype(dtype)
    g = rng.standard_normal(400).astype(dtype)
    acc = rng.standard_normal(90).astype(dtype)
    before = acc.copy()
    toffs = np.array([0, 41, 17, 99], np.int64)        # the 4th is not a tap: unused
    want = acc.astype(np.float64)
    step = lanes + 5
    for t in range(3):
        for r in range(m):
            for k in range(n):
                xs = 2 + r * 151 + k * 19 + toffs[t]
                gs = 5 + r * 97 + k * 11
                want[4 + t * step:4 + lanes + t * step] += \
                    x[xs:xs + lanes].astype(np.float64) * g[gs:gs + lanes]
    run(acc, 4, step, x, 2, 19, 151, toffs, g, 5, 11, 97, n, m)
    np.testing.assert_allclose(acc, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    untouched = np.ones(90, bool)
    for t in range(3):
        untouched[4 + t * step:4 + lanes + t * step] = False
    assert np.array_equal(acc[untouched], before[untouched])


def _fma_exact(a, b, c):
    """Elementwise ``a*b + c`` rounded once, in the arrays' dtype (float32 or
    float64): the exact value as a fraction, rounded to float64 and, for float32,
    then to float32 (a double rounding, exact unless the float64 value is a
    float32 tie, a 2**-29 chance per element, never hit by these seeds)."""
    out = np.empty_like(c)
    for i in range(c.size):
        exact = Fraction(float(a[i])) * Fraction(float(b)) + Fraction(float(c[i]))
        out[i] = c.dtype.type(float(exact))
    return out


def _fma32(a, b, c):
    """float32 fma, emulated: the product is exact in float64, the sum rounded
    there and then to float32 (a double rounding: wrong only on ties of a 2**-29
    chance per step, never hit by these seeds)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def _window_sum(x, s0, rowstep, colstep, wt, w0, wrow, wstep, rows, cols, lane):
    """One lane's sum, in the intrinsics' order: (row, column), the first product
    rounded alone, the rest fused."""
    acc = None
    for r in range(rows):
        for j in range(cols):
            xv = x[s0 + r * rowstep + j * colstep + lane]
            wv = wt[w0 + r * wrow + j * wstep + lane]
            acc = np.float32(xv * wv) if acc is None else _fma32(xv, wv, acc)
    return acc


@pytest.fixture(params=[8, 16], ids=["8 lanes", "16 lanes"])
def lanes(request, monkeypatch):
    """The intrinsics built for either register width (16: AVX-512 hosts; 8:
    others), whatever this host has: ``lanes(name)``."""
    monkeypatch.setattr(simd, "WIDE", request.param)

    def build(name):
        return simd._by_channels(*simd.CHANNEL_ARGS[name], "")
    return build


@pytest.mark.parametrize("channels", [8, 24, 40, 56])
@pytest.mark.parametrize("step", [1, 2, -1, 3], ids=["forward", "stride2", "gather", "other"])
@pytest.mark.parametrize("n", [0, 3, 9])
def test_taps_rows_sums_each_pixel_in_order(lanes, channels, step, n):
    """Every pixel, channel and window tap, in the scalar kernels' order, for each
    pixel step the intrinsic shares loads on (1 and -1 column steps) and others;
    blocks that overlap at the end of the row; nothing else written."""
    taps_rows = lanes("taps_rows")
    # channel groups per block: one across the row, or a chunk of two (40 channels
    # in 8 lanes: chunks of 2, 2 and 1 groups) or four (56), whose blocks 16 lanes
    # compute in pairs side by side (negative: 56 channels, a pair and one alone)
    together = {40: 2, 56: -4}.get(channels, 1)
    # the code generated for a forward's steps (1, 2) or a gather's (-1); pixel
    # step 3 takes the general code the gather's set keeps
    steps = 1 if step in (1, 2) else -1

    @_once(simd.WIDE, together, steps)
    def run(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
            channels):
        taps_rows(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
                  channels, 3, 0, None, 1, together, steps)

    rng = np.random.default_rng(channels + n)
    rows, KW = 2, 3
    C = channels + 4                  # pixel stride: channels plus some not computed
    colstep = 2 * C
    sstep = step * colstep
    rowstep = 40 * C
    s0 = 20 * C + 3
    x = rng.standard_normal(s0 + 2 * rowstep + 40 * C).astype(np.float32)
    wrow, wstep = 7 * C, 2 * C        # weight rows and columns apart as in a strided gather
    wt = rng.standard_normal(rows * wrow + 8).astype(np.float32)
    dst = np.full(n * C + 50, np.float32(-7))
    run(dst, 5, C, x, s0, sstep, rowstep, colstep, wt, 2, wrow, wstep, n, rows, channels)
    want = np.full_like(dst, np.float32(-7))
    for k in range(n):
        for lane in range(channels):
            want[5 + k * C + lane] = _window_sum(x, s0 + k * sstep, rowstep, colstep, wt, 2,
                                                 wrow, wstep, rows, KW, lane)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("cpix, ctap, c0, n", [(1, 1, -2, 7), (1, -1, 0, 7), (2, 1, -2, 4),
                                               (1, 2, -4, 8)],
                         ids=["forward", "gather", "stride2", "dilation2"])
@pytest.mark.parametrize("first", [0, 1], ids=["blocks", "singles"])
@pytest.mark.parametrize("channels", [8, 24, 40])
def test_taps_rows_leaves_out_the_columns_outside(lanes, cpix, ctap, c0, n, first, channels):
    """``edges``: a row of pixels whose windows both sides of a 5-column map cut
    (blocks, and single pixels when fewer than a block), each summing the taps
    inside in order, the first product rounded alone (a sum of -0 products is
    -0); the columns outside hold NaN, which no sum may see, and those read in
    their place are not added."""
    taps_rows = lanes("taps_rows")
    # 24 in 8 lanes: chunks of 2 and 1 groups; 40 in 16 lanes: a pair of groups
    # side by side (a negative ``together``)
    together = {8: 1, 24: 2, 40: -2}[channels]

    @_once(simd.WIDE, together)
    def run(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
            channels, edges):
        taps_rows(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
                  channels, 3, 0, edges, 1, together, 0)

    rng = np.random.default_rng(channels + n + first)
    W, rows, KW, margin = 5, 2, 3, 8
    C = channels + 4
    rowstep = (W + 2 * margin) * C
    x = np.full(rows * rowstep, np.nan, np.float32)
    for r in range(rows):
        start = r * rowstep + margin * C
        x[start:start + W * C] = rng.standard_normal(W * C)
        x[start:start + C] = -0.0       # pixel 0 sums only -0 * w (w > 0): -0
    wt = np.abs(rng.standard_normal(rows * KW * C)).astype(np.float32)
    count = n
    if first:                           # the last 2 pixels: fewer than a block
        count = 2
        c0 += (n - 2) * cpix
    base = margin * C + c0 * C
    dst = np.full(count * C + 40, np.float32(-7))
    run(dst, 3, C, x, base, cpix * C, rowstep, ctap * C, wt, 0, KW * C, C, count, rows,
        channels, (c0, cpix, ctap, W, C))
    want = np.full_like(dst, np.float32(-7))
    for k in range(count):
        for lane in range(channels):
            acc = None
            for r in range(rows):
                for j in range(KW):
                    col = c0 + k * cpix + j * ctap
                    if not 0 <= col < W:
                        continue
                    xv = x[r * rowstep + (margin + col) * C + lane]
                    wv = wt[r * KW * C + j * C + lane]
                    acc = np.float32(xv * wv) if acc is None else _fma32(xv, wv, acc)
            want[3 + k * C + lane] = acc
    np.testing.assert_array_equal(dst.view(np.uint32), want.view(np.uint32))
    assert not np.isnan(want).any()


@pytest.mark.parametrize("masked", [False, True], ids=["inside", "edges"])
@pytest.mark.parametrize("channels", [8, 24, 40])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("n", [0, 3, 9])
def test_taps_row_pairs_sum_two_rows_in_order(lanes, masked, channels, rows, n):
    """Two output rows, the second's window one input row further down: each
    pixel's sum as :func:`taps_rows` forms it (taps in order, the first product
    rounded alone), the second row at ``drow``; with ``edges``, the columns
    outside the map (NaN) left out; nothing else written."""
    pairs = lanes("taps_row_pairs")
    together = {8: 1, 24: 2, 40: -2}[channels]

    @_once(simd.WIDE, together, masked)
    def run(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
            channels, edges, drow):
        pairs(dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows,
              channels, 3, 0, edges, 1, together, 1, drow)

    rng = np.random.default_rng(channels + 10 * n + rows)
    KW, margin = 3, 4
    c0 = -1 if masked else 0            # masked: both end pixels' windows cut
    W = n + 2 + 2 * c0
    C = channels + 4
    rowstep = (W + 2 * margin) * C
    x = np.full((rows + 1) * rowstep, np.nan, np.float32)
    for r in range(rows + 1):
        start = r * rowstep + margin * C
        x[start:start + W * C] = rng.standard_normal(W * C)
    wt = rng.standard_normal(rows * KW * C).astype(np.float32)
    drow = n * C + 11
    dst = np.full(2 * drow + 40, np.float32(-7))
    edges = (c0, 1, 1, W, C) if masked else None
    run(dst, 3, C, x, (margin + c0) * C, C, rowstep, C, wt, 0, KW * C, C, n, rows, channels,
        edges, drow)
    want = np.full_like(dst, np.float32(-7))
    for q in range(2):
        for k in range(n):
            for lane in range(channels):
                acc = None
                for r in range(rows):
                    for j in range(KW):
                        col = c0 + k + j
                        if not 0 <= col < W:
                            continue
                        xv = x[(q + r) * rowstep + (margin + col) * C + lane]
                        wv = wt[r * KW * C + j * C + lane]
                        acc = np.float32(xv * wv) if acc is None else _fma32(xv, wv, acc)
                want[3 + q * drow + k * C + lane] = acc
    np.testing.assert_array_equal(dst.view(np.uint32), want.view(np.uint32))
    assert not np.isnan(want).any()


@pytest.mark.parametrize("channels", [8, 56, 80])
@pytest.mark.parametrize("rows, cols", [(1, 1), (1, 3), (2, 4)])
def test_taps_window_sums_one_pixel_in_order(lanes, channels, rows, cols):
    taps_window = lanes("taps_window")

    @_once(simd.WIDE)
    def run(dst, d0, x, s0, rowstep, colstep, wt, w0, wrow, wstep, rows, cols, channels):
        taps_window(dst, d0, x, s0, rowstep, colstep, wt, w0, wrow, wstep, rows, cols, channels,
                    0)

    rng = np.random.default_rng(channels * 10 + rows)
    C = channels
    x = rng.standard_normal(60 * C).astype(np.float32)
    wt = rng.standard_normal(30 * C).astype(np.float32)
    dst = np.full(C + 20, np.float32(-7))
    s0, rowstep, colstep = 30 * C + 1, -9 * C, -C            # steps may be negative
    run(dst, 3, x, s0, rowstep, colstep, wt, 4, 5 * C, C, rows, cols, channels)
    want = np.full_like(dst, np.float32(-7))
    for lane in range(C):
        want[3 + lane] = _window_sum(x, s0, rowstep, colstep, wt, 4, 5 * C, C, rows, cols, lane)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("n", [1, 3, 9])
def test_streaming_stores_write_the_same_sums(lanes, n):
    """Non-temporal stores (results that would not stay in the caches): the same
    values at the same places, into a 64-byte-aligned row whose pixels and
    channel groups start on vector boundaries; nothing else written."""
    taps_rows, taps_window = lanes("taps_rows"), lanes("taps_window")
    together = simd.GROUPS

    @_once(simd.WIDE, together)
    def run(dst, d0, dstep, x, s0, wt, n, channels):
        taps_rows(dst, d0, dstep, x, s0, dstep, 50 * dstep, dstep, wt, 0, 3 * dstep, dstep, n, 2,
                  channels, 3, 1, None, 1, together, 0)
        # one more pixel after the row, its window cut to 2 x 2
        taps_window(dst, d0 + n * dstep, x, s0 + n * dstep, 50 * dstep, dstep, wt, 0,
                    3 * dstep, dstep, 2, 2, channels, 1)

    rng = np.random.default_rng(n)
    channels, C = 48, 64
    x = rng.standard_normal(200 * C).astype(np.float32)
    wt = rng.standard_normal(6 * C).astype(np.float32)
    dst = numbasep.empty_aligned((n + 3) * C, np.float32)
    dst[:] = -7
    run(dst, C, C, x, 2 * C, wt, n, channels)
    want = np.full(dst.shape, np.float32(-7))
    for k in range(n + 1):
        for lane in range(channels):
            want[C + k * C + lane] = _window_sum(x, 2 * C + k * C, 50 * C, C, wt, 0, 3 * C, C,
                                                 2, 3 if k < n else 2, lane)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("repeat", [1, 2, 4, 8])
def test_sum_groups_adds_each_channels_group_in_order(lanes, repeat):
    """Each result channel the sum of its ``repeat`` adjacent source elements,
    added in order (float32, as the scalar loop adds them), for channel counts
    of one and several vector groups and a last group of 8; nothing else
    written."""
    sum_groups = lanes("sum_groups")

    @_once(simd.WIDE, repeat)
    def run(dst, d0, dstep, src, s0, sstep, n, channels):
        sum_groups(dst, d0, dstep, src, s0, sstep, n, channels, repeat, 0)

    rng = np.random.default_rng(repeat)
    for channels in (8, 24, 40):
        for n in (1, 3):
            dstep, sstep = channels + 8, channels * repeat + 16
            src = rng.standard_normal(n * sstep + 40).astype(np.float32)
            dst = np.full(n * dstep + 20, np.float32(-7))
            run(dst, 5, dstep, src, 3, sstep, n, channels)
            want = np.full_like(dst, np.float32(-7))
            for k in range(n):
                for c in range(channels):
                    at = 3 + k * sstep + c * repeat
                    total = src[at]
                    for m in range(1, repeat):
                        total = np.float32(total + src[at + m])
                    want[5 + k * dstep + c] = total
            np.testing.assert_array_equal(dst, want)


def test_sum_groups_rounds_16_bit_results_and_streams(lanes):
    """16-bit results (bit patterns) rounded as :func:`.halves.narrow_into` rounds
    the float32 sums; non-temporal stores write the same sums as plain ones."""
    sum_groups = lanes("sum_groups")

    @_once(simd.WIDE)
    def run(dst, src, n, channels, bits):
        sum_groups(bits, 0, channels, src, 0, 4 * channels, n, channels, 4, 0)
        sum_groups(dst, 0, channels, src, 0, 4 * channels, n, channels, 4, 1)

    rng = np.random.default_rng(0)
    n, channels = 3, 48
    src = rng.standard_normal(n * channels * 4).astype(np.float32) * 100
    dst = numbasep.empty_aligned(n * channels, np.float32)
    bits = np.zeros(n * channels, np.uint16)
    run(dst, src, n, channels, bits)
    parts = src.reshape(-1, 4)
    want = parts[:, 0].copy()
    for m in range(1, 4):
        want = want + parts[:, m]
    np.testing.assert_array_equal(dst, want)
    np.testing.assert_array_equal(bits.view(ml_dtypes.bfloat16),
                                  want.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tap_sums_fold_each_taps_product_in_order(dtype):
    """The plane kernels' tap sums: each element the first product rounded alone,
    then each further one fused, in order of the taps (as the channels-last
    kernels sum), for runs of one and several 4-vector blocks plus single
    vectors, 0 to 11 taps at arbitrary source offsets; nothing else written."""
    @_once()
    def run(dst, d0, src, offs, wv, ntaps, length):
        simd.tap_sums(dst, d0, src, offs, wv, ntaps, length)

    rng = np.random.default_rng(5)
    src = rng.standard_normal(2000).astype(dtype)
    for length in (32, 96, 160):
        for ntaps in (0, 1, 2, 3, 4, 7, 11):
            offs = rng.integers(0, 2000 - length, max(ntaps, 1)).astype(np.int64)
            wv = rng.standard_normal(max(ntaps, 1)).astype(dtype)
            dst = np.full(length + 10, dtype(-7))
            run(dst, 3, src, offs, wv, ntaps, length)
            want = np.full_like(dst, dtype(-7))
            want[3:3 + length] = 0
            for k in range(ntaps):
                a = src[offs[k]:offs[k] + length]
                want[3:3 + length] = a * wv[k] if k == 0 else \
                    _fma_exact(a, wv[k], want[3:3 + length])
            np.testing.assert_array_equal(dst, want)


def _fma_pairs(a, b, c):
    """Elementwise ``a*b + c`` rounded once (as :func:`_fma_exact`, ``b`` an array)."""
    out = np.empty_like(c)
    for i in range(c.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        out[i] = c.dtype.type(float(exact))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tap_dots_fold_each_lane_in_order(dtype):
    """The plane filter gradient's dot products: per tap and lane, the products
    of every vector step fused in order into each of the step's vectors' sums,
    those added, and the total added to the lane's slot; 1 to 20 taps (groups of
    up to 9, sizes that differ by one), runs of 1 to 3 steps from an offset, and
    no slot beyond a vector's lanes or past the last tap written."""
    @_once()
    def run(part, src, offs, ntaps, g, i0, i1):
        simd.tap_dots(part, src, offs, ntaps, g, i0, i1)

    width = simd.WIDE // 2 if dtype == np.float64 else simd.WIDE
    units = 2 if simd.WIDE == 16 else 1
    slots = simd.DOT_SLOTS
    rng = np.random.default_rng(8)
    src = rng.standard_normal(3000).astype(dtype)
    g = rng.standard_normal(300).astype(dtype)
    for i0, i1 in ((0, 32), (64, 160), (32, 128)):
        for ntaps in (1, 2, 8, 9, 10, 17, 20):
            offs = rng.integers(0, 2000, ntaps).astype(np.int64)
            part = rng.standard_normal((ntaps + 1) * slots).astype(dtype)
            want = part.copy()
            run(part, src, offs, ntaps, g, i0, i1)
            for t in range(ntaps):
                chains = np.zeros((units, width), dtype)
                for i in range(i0, i1, units * width):
                    for u in range(units):
                        at = i + u * width
                        chains[u] = _fma_pairs(src[offs[t] + at:offs[t] + at + width],
                                               g[at:at + width], chains[u])
                total = chains[0]
                for u in range(1, units):
                    total = total + chains[u]
                want[t * slots:t * slots + width] += total
            np.testing.assert_array_equal(part, want)


def test_tap_dots_refuses_mixed_dtypes():
    """Its sums, source and weights are one float type: a float64 source with
    float32 sums is a typing error, not a misread buffer."""
    @numba.njit
    def run(part, src, offs, g):
        simd.tap_dots(part, src, offs, 1, g, 0, 32)

    with pytest.raises(numba.core.errors.TypingError):
        run(np.zeros(16, np.float32), np.zeros(64), np.zeros(1, np.int64),
            np.zeros(32, np.float32))


def _dots_want(acc, x, g, a0, arow, astep, s0, sstep, rowstep, colstep, g0, gstep, n, rows,
               cols, channels, inside=lambda k, j: True):
    """The filter-gradient sums in float64 (the intrinsics fuse, in pixel order),
    of the taps ``inside(pixel, tap column)`` says are inside the map."""
    want = acc.astype(np.float64)
    for r in range(rows):
        for j in range(cols):
            for k in range(n):
                if not inside(k, j):
                    continue
                xs = s0 + k * sstep + r * rowstep + j * colstep
                gs = g0 + k * gstep
                at = a0 + r * arow + j * astep
                want[at:at + channels] += (x[xs:xs + channels].astype(np.float64)
                                           * g[gs:gs + channels])
    return want


# 40 channels: groups in pairs and one alone (in 8 lanes: 2 pairs and 1; in 16:
# a pair, then a last 8); pixel steps of 1 and 2 column steps share input loads.
# Edges: the map's column -1 and its last column + 1 are real data in x, which
# the sums must leave out. Lines: 1, or 3 rows of pixels whose x and g lie 60 and 7
# pixels further on each, summed in the same registers. Rows of 7 pixels at a
# pixel step of one take a block of 7 (16 lanes, quiet). Asks: lines of all of x
# and g asked for across the blocks (where the blocks of pairs of groups take
# them: a loop of their own), which must leave the sums as they are.
@pytest.mark.parametrize("asks", [False, True], ids=["quiet", "asking"])
@pytest.mark.parametrize("channels", [8, 40])
@pytest.mark.parametrize("step", [1, 2, 3], ids=["shared", "stride2", "other"])
@pytest.mark.parametrize("n", [1, 6, 7])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("edges", [False, True], ids=["inside", "edges"])
@pytest.mark.parametrize("lines", [1, 3])
def test_dots_rows_adds_each_taps_sum(lanes, channels, step, n, rows, edges, lines, asks):
    dots_rows = lanes("dots_rows")

    @_once(simd.WIDE)
    def run(acc, a0, astep, x, s0, sstep, rowstep, colstep, g, g0, gstep, n, channels, rows,
            edges, lines, xline, gline, asks):
        if rows == 1:
            dots_rows(acc, a0, astep, x, s0, sstep, rowstep, colstep, g, g0, gstep, n,
                      channels, 1, 3, 1, edges, lines, xline, gline, asks)
        else:
            dots_rows(acc, a0, astep, x, s0, sstep, rowstep, colstep, g, g0, gstep, n,
                      channels, 3, 3, 1, edges, lines, xline, gline, asks)

    rng = np.random.default_rng(channels + 7 * n + rows + 100 * lines)
    C = channels + 8
    x = rng.standard_normal(400 * C).astype(np.float32)
    g = rng.standard_normal(30 * C).astype(np.float32)
    acc = rng.standard_normal(12 * C).astype(np.float32)
    colstep, rowstep = C, 50 * C
    sstep = step * colstep
    before = acc.copy()
    if edges:
        # pixel k's tap j at column k*step + j - 1 of a map (n-1)*step + 1 wide,
        # whose column 0 lies at x[10*C + 2]: pixel 0's tap 0 and the last
        # pixel's tap 2 fall outside
        width = (n - 1) * step + 1
        s0 = 2 + 9 * C

        def inside(k, j):
            return 0 <= k * step + j - 1 < width
        whole = [k for k in range(n) if inside(k, 0) and inside(k, 2)]
        lo, hi = (whole[0], whole[-1] + 1) if whole else (0, 0)
        spec = (lo, hi, -1, step, 1, width, C)
    else:
        s0, spec = 2, None

        def inside(k, j):
            return True
    want = acc
    for o in range(lines):
        want = _dots_want(want, x, g, 3, 3 * C, C, s0 + o * 60 * C, sstep, rowstep, colstep,
                          5 + o * 7 * C, C, n, rows, 3, channels, inside)
    run(acc, 3, C, x, s0, sstep, rowstep, colstep, g, 5, C, n, channels, rows, spec, lines,
        60 * C, 7 * C, (3, x.size, 0, g.size - 5) if asks else (0, 0, 0, 0))
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5)
    touched = np.zeros(acc.size, bool)
    for t in range(rows * 3):
        touched[3 + t * C:3 + t * C + channels] = True
    assert np.array_equal(acc[~touched], before[~touched])


@pytest.mark.parametrize("channels", [8, 72])
@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3)])
def test_dots_window_adds_one_pixels_products(lanes, channels, rows, cols):
    dots_window = lanes("dots_window")

    @_once(simd.WIDE)
    def run(acc, a0, arow, astep, x, s0, rowstep, colstep, g, g0, rows, cols, channels):
        dots_window(acc, a0, arow, astep, x, s0, rowstep, colstep, g, g0, rows, cols, channels,
                    1)

    rng = np.random.default_rng(channels + rows * 3 + cols)
    C = channels + 8
    x = rng.standard_normal(100 * C).astype(np.float32)
    g = rng.standard_normal(4 * C).astype(np.float32)
    acc = rng.standard_normal(12 * C).astype(np.float32)
    before = acc.copy()
    s0, rowstep, colstep = 60 * C + 1, -20 * C, -C
    want = _dots_want(acc, x, g, 2, 3 * C, C, s0, 0, rowstep, colstep, 3, 0, 1, rows, cols,
                      channels)
    run(acc, 2, 3 * C, C, x, s0, rowstep, colstep, g, 3, rows, cols, channels)
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5)
    touched = np.zeros(acc.size, bool)
    for r in range(rows):
        for j in range(cols):
            at = 2 + r * 3 * C + j * C
            touched[at:at + channels] = True
    assert np.array_equal(acc[~touched], before[~touched])


def test_fma_rounds_once():
    """``fma(a, b, c)`` is exact where ``a*b + c`` in two roundings is not."""
    @_once()
    def run(a, b, c):
        return simd.fma(a, b, c)

    a = np.float32(1 + 2.0 ** -12)
    c = np.float32(-(1 + 2.0 ** -11))
    got = run(a, a, c)                       # a*a = 1 + 2**-11 + 2**-24 exactly
    assert got == np.float32(2.0 ** -24) and np.float32(a * a) + c == 0
    assert run(2.0, 3.0, 1.0) == 7.0


@pytest.mark.parametrize("kind", ["float32", "float64", "float16 in", "bfloat16 in",
                                  "float16 out", "bfloat16 out"])
def test_copy_rows_widens_and_rounds_as_the_halves_do(kind):
    """Rows shorter than, equal to and longer than a vector (whole vectors plus an
    overlapping last one): every element copied, 16-bit bit patterns widened
    exactly or rounded as ``halves.narrow_into`` rounds (NaN and overflow
    included; NumPy's and ml_dtypes' casts are the reference); nothing outside
    the rows written."""
    @_once()
    def run(dst, d0, dstep, src, s0, sstep, rows, cols):
        simd.copy_rows(dst, d0, dstep, src, s0, sstep, rows, cols)

    rng = np.random.default_rng(3)
    half = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(kind.split()[0])
    wide = np.float64 if kind == "float64" else np.float32
    for cols in (1, 7, 15, 16, 17, 33, 56, 64):
        rows, sstep, dstep = 3, cols + 5, cols + 9
        values = (rng.standard_normal(rows * sstep + 4) * 3e4).astype(wide)
        values[::11] = np.nan
        if half is None:
            src, dst = values, np.full(rows * dstep + 6, -1, wide)
            run(dst, 2, dstep, src, 0, sstep, rows, cols)
        elif kind.endswith("in"):
            with np.errstate(over="ignore"):      # float16 overflows to Inf
                src = values.astype(half)
            dst = np.full(rows * dstep + 6, -1, wide)
            run(dst, 2, dstep, halves.bits(src), 0, sstep, rows, cols)
        else:
            src = values
            dst = np.full(rows * dstep + 6, -1, half)
            run(halves.bits(dst), 2, dstep, src, 0, sstep, rows, cols)
        want = np.full_like(dst, -1)
        with np.errstate(over="ignore"):          # float16 overflows to Inf
            for r in range(rows):
                want[2 + r * dstep:2 + r * dstep + cols] = src[r * sstep:r * sstep + cols]
        np.testing.assert_array_equal(np.asarray(dst, np.float64), np.asarray(want, np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint16])
def test_stream_copy_copies_whole_lines_and_nothing_else(dtype):
    @_once()
    def run(dst, d0, src, s0, n):
        simd.stream_copy(dst, d0, src, s0, n)
        simd.sfence()

    per = 64 // np.dtype(dtype).itemsize
    src = (np.arange(8 * per) * 3 + 1).astype(dtype)
    dst = numbasep.empty_aligned((8 * per,), dtype)
    dst[:] = 7
    run(dst, per, src, 5, 3 * per)        # from an unaligned source
    want = np.full(8 * per, 7, dtype)
    want[per:4 * per] = src[5:5 + 3 * per]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 3, 4, 6, 13, 17, 40])
@pytest.mark.parametrize("form", ["rows", "transposed"])
def test_pointwise_rows_sums_each_column_in_order(dtype, n, form):
    """The separable ops' small matrix products: every row (in blocks, 4s or
    singles, the last block overlapping) and column below J, the first product
    rounded alone and each further term's fused, in order of the terms;
    everything else untouched, the columns from J on neither stored nor needed
    (b's last row ends at its J-th column). One to four vectors of columns at
    once (``vecs``). "rows": a's rows are contiguous (the forward and input
    gradient); "transposed": a's terms are a row apart (the kernel gradient)."""
    @_once()
    def run(dst, d0, dstep, a, a0, astep, aloop, b, b0, bloop, J, K, n, vecs):
        simd.pointwise_rows(dst, d0, dstep, a, a0, astep, aloop, b, b0, bloop, J, K, n, vecs,
                            0)

    width = simd.WIDE // (2 if dtype == np.float64 else 1)
    rng = np.random.default_rng(n)
    fma = _fma32 if dtype == np.float32 else (
        lambda x, y, z: _fma_exact(np.full(1, x, dtype), y, np.full(1, z, dtype))[0])
    for K, J, vecs in ((1, 3, 1), (5, width, 1), (3, width + 1, 2), (4, 3 * width - 2, 3),
                       (2, 4 * width, 4), (3, 5 * width - 1, 3), (6, 2 * width - 3, 4)):
        if form == "rows":
            astep, aloop = K + 2, 1
        else:
            astep, aloop = 1, n + 3
        a = rng.standard_normal(7 + n * astep + K * aloop).astype(dtype)
        bloop = J + 2
        b = rng.standard_normal(5 + (K - 1) * bloop + J).astype(dtype)
        dstep = J + 5
        dst = np.full(11 + n * dstep + 4 * width, dtype(-7))
        run(dst, 11, dstep, a, 7, astep, aloop, b, 5, bloop, J, K, n, vecs)
        want = np.full_like(dst, dtype(-7))
        for k in range(n):
            for j in range(J):
                s = dtype(a[7 + k * astep] * b[5 + j])
                for i in range(1, K):
                    s = fma(a[7 + k * astep + i * aloop], b[5 + i * bloop + j], s)
                want[11 + k * dstep + j] = s
        np.testing.assert_array_equal(dst, want, err_msg=f"K={K} J={J} vecs={vecs}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 5, 13, 40])
def test_pointwise_rows_streams_whole_vectors(dtype, n):
    """With ``stream``, the whole vectors of columns go out as non-temporal
    stores (aligned rows: the fused separable forward's results), the last
    partial one masked as without: the same values, nothing else touched."""
    @_once()
    def run(dst, d0, dstep, a, b, J, K, n, vecs, stream):
        simd.pointwise_rows(dst, d0, dstep, a, 0, K, 1, b, 0, J, J, K, n, vecs, stream)
        if stream:
            simd.sfence()

    width = simd.WIDE // (2 if dtype == np.float64 else 1)
    rng = np.random.default_rng(n)
    for K, J, vecs in ((3, width, 1), (5, 4 * width, 4), (2, 3 * width - 5, 3),
                       (4, 2 * width + 1, 2)):
        a = rng.standard_normal(n * K).astype(dtype)
        b = rng.standard_normal(K * J).astype(dtype)
        dstep = -(-J // width) * width + width
        got = []
        for stream in (0, 1):
            dst = numbasep.empty_aligned(2 * width + n * dstep, dtype)
            dst[...] = -7
            run(dst, 2 * width, dstep, a, b, J, K, n, vecs, stream)
            got.append(dst)
        np.testing.assert_array_equal(got[1], got[0], err_msg=f"K={K} J={J}")
        rows = got[1][2 * width:].reshape(n, dstep)
        np.testing.assert_array_equal(got[1][:2 * width], -7)
        np.testing.assert_array_equal(rows[:, J:], -7)
        want = a.reshape(n, K).astype(np.float64) @ b.reshape(K, J).astype(np.float64)
        np.testing.assert_allclose(rows[:, :J], want, rtol=1e-5, atol=1e-5)
