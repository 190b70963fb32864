"""The channels-first forward and input gradient that take output rows in blocks
(``inplace.rows``, ``simd.plane_rows``).

Where the in-place kernels take a problem (stride 1, output rows as long as the
input's) with a 5x5 or 7x7 window of dilation 1 in rows, on rows of three or
more vectors, each input row's vector serves a block of output rows. Each sum
adds the same terms in the same order as the runs of pixels (``inplace.correlate``),
so the tests hold the two to the bit, and both to the float64 reference: on
rows cut at every lane remainder, blocks of rows cut short, windows reaching
past the map's top and bottom, column dilation, Inf and NaN beside the padding,
16-bit bit patterns and float64, and nothing written outside the result.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver, inplace, simd

import reference as R
import support

F = numbasep.depthwise_conv2d_native
BI = numbasep.depthwise_conv2d_native_backprop_input


def _in_place(patch):
    """Decide each call afresh, reading in place also the small maps in the caches
    that the tiles keep otherwise; returns the list of kernels launched."""
    support.route_afresh(patch)
    patch.setattr(driver, "_IN_PLACE_PIXELS", 0)
    patch.setattr(driver, "_IN_PLACE_CORRELATION_BYTES", 0)
    ran = []
    real = driver._launch
    patch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a))[1])
    return ran


def _both(patch, call):
    """``call()`` through the row blocks and through the runs of pixels, with the
    kernels each ran."""
    ran = _in_place(patch)
    rows = call()
    patch.setattr(driver, "_ROW_VECTORS", 1 << 30)
    runs = call()
    return rows, runs, ran


@st.composite
def row_problems(draw):
    """An NCHW stride-1 problem the row blocks take: a 5x5 or 7x7 window, rows
    of 3 to 5 vectors of float32 lanes (16 with AVX-512, 8 with AVX2) filled at
    least to 85 %, SAME or explicit pads whose columns add up to the window's
    reach."""
    k = draw(st.sampled_from([5, 7]))
    vectors = draw(st.integers(3, 5))
    lanes = simd.plane_lanes.py_func(4)
    w = draw(st.integers(-(-85 * vectors * lanes // 100), vectors * lanes))
    h = draw(st.integers(1, 34))
    rw = draw(st.integers(1, 2))
    reach = (k - 1) * rw
    if draw(st.booleans()):
        attrs = dict(padding="SAME", explicit_paddings=[])
    else:
        left = draw(st.integers(0, reach))
        top, bottom = draw(st.integers(0, k + 1)), draw(st.integers(0, k + 1))
        bottom += max(0, k - h - top - bottom)
        attrs = dict(padding="EXPLICIT",
                     explicit_paddings=[0, 0, 0, 0, top, bottom, left, reach - left])
    attrs.update(strides=[1, 1, 1, 1], data_format="NCHW", dilations=[1, 1, 1, rw])
    return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w), (k, k), attrs


@settings(max_examples=40, deadline=None)
@given(row_problems(), st.integers(0, 2**32 - 1))
def test_row_blocks_give_the_runs_bits_and_the_reference(problem, seed):
    xs, (kh, kw), attrs = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((kh, kw, xs[1], 1)).astype(np.float32)
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    with pytest.MonkeyPatch.context() as patch:
        rows, runs, ran = _both(patch, lambda: (F(x, w, **attrs), BI(list(xs), w, dy, **attrs)))
    assert ran[:2] == [inplace.rows(kh, kw, False), inplace.rows(kh, kw, True)]
    assert ran[2:] == [inplace.correlate] * 2
    for got, other in zip(rows, runs):
        np.testing.assert_array_equal(got.view(np.uint32), other.view(np.uint32))
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    for got, want in ((rows[0], R.raw_forward(x64, w64, **attrs)),
                      (rows[1], R.raw_backprop_input(list(xs), w64, dy64, **attrs))):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * kh * kw
                                   * (1 + np.abs(want).max(initial=0)))


@settings(max_examples=20, deadline=None)
@given(row_problems(), st.sampled_from(["x", "dy", "w"]), st.sampled_from([np.inf, np.nan]),
       st.integers(0, 10**6))
def test_non_finite_values_beside_the_padding_stay_where_they_belong(problem, where, value,
                                                                      at):
    """An Inf or NaN at a row's end, where the next row's taps wrap to it in
    memory, or in a corner tap: NaN and Inf where the channels-last kernels have
    them, none from the padding."""
    xs, (kh, kw), attrs = problem
    rng = np.random.default_rng(at)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((kh, kw, xs[1], 1)).astype(np.float32)
    dy = rng.standard_normal(F(x, w, **attrs).shape).astype(np.float32)
    if where == "w":
        w[(at % 2) * (kh - 1), (at // 2 % 2) * (kw - 1), at % xs[1], 0] = value
    else:
        target = x if where == "x" else dy
        target[at % xs[0], at % xs[1], (at // 7) % target.shape[2],
               0 if at % 2 else target.shape[3] - 1] = value
    with pytest.MonkeyPatch.context() as patch:
        ran = _in_place(patch)
        got = [F(x, w, **attrs), BI(list(xs), w, dy, **attrs)]
    assert ran == [inplace.rows(kh, kw, False), inplace.rows(kh, kw, True)]
    last = dict(attrs, data_format="NHWC", dilations=[1, 1, attrs["dilations"][3], 1],
                explicit_paddings=attrs["explicit_paddings"]
                and [0, 0] + attrs["explicit_paddings"][4:] + [0, 0])
    xl, dyl = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    want = [np.moveaxis(F(xl, w, **last), -1, 1),
            np.moveaxis(BI(list(xl.shape), w, dyl, **last), -1, 1)]
    support.assert_same_non_finite_pattern(list(zip(got, want)))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_other_dtypes_give_the_runs_bits(dtype):
    """16-bit operands read and results written as bit patterns (rounded as
    stored), and float64 in vectors of 8: a 5x5 window on rows of 47 and 45,
    where float64's rows are six vectors."""
    rng = np.random.default_rng(7)
    for xs in ((2, 3, 19, 47), (1, 2, 5, 45)):
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal((5, 5, xs[1], 1)).astype(dtype)
        attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW")
        dy = rng.standard_normal(xs).astype(dtype)
        with pytest.MonkeyPatch.context() as patch:
            rows, runs, ran = _both(patch, lambda: (F(x, w, **attrs),
                                                    BI(list(xs), w, dy, **attrs)))
        assert ran[:2] == [inplace.rows(5, 5, False), inplace.rows(5, 5, True)]
        bits = np.uint64 if dtype == np.float64 else np.uint16
        for got, other in zip(rows, runs):
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.view(bits), other.view(bits))
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        tol = 1e-12 if dtype == np.float64 else 6e-2
        np.testing.assert_allclose(rows[0].astype(np.float64), R.raw_forward(x64, w64, **attrs),
                                   rtol=0, atol=tol * 25)


@pytest.mark.parametrize("adjoint", [False, True])
def test_rows_write_each_plane_once_and_nothing_around_them(adjoint):
    """The kernel itself, on 3 planes of 9 rows of 29 pixels (blocks of rows
    cut short, rows ending mid-vector) with a 5x5 window dilated across columns
    and rows padded 3 / 0: every element the reference's, the buffer before and
    after the result untouched."""
    rng = np.random.default_rng(int(adjoint))
    N, C, H, W = 1, 3, 9, 29
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((5, 5, C)).astype(np.float32)
    # rows padded 3 / 1 (a reach of 4), columns 4 / 4 (a reach of 8 at dilation 2)
    y = support.written_in_place((N, C, H, W), np.float32, lambda y: inplace.rows(
        5, 5, adjoint)(x, w, y, *inplace.row_masks(W, 5, 2, 3, 4, 4, adjoint)))
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT", data_format="NCHW",
                 explicit_paddings=[0, 0, 0, 0, 3, 1, 4, 4], dilations=[1, 1, 1, 2])
    np.testing.assert_allclose(y, support.correlation_reference(x, w, adjoint, attrs),
                               rtol=0, atol=1e-5)


def test_row_masks_say_which_columns_each_tap_reads():
    """:func:`inplace.row_masks` against a loop over pixels: per vector of a row,
    the pixels that exist, those whose tap column kw lies inside the row, and
    those with any tap column inside; the adjoint's columns read backwards."""
    for W, KW, rw, pw, adjoint in ((29, 3, 1, 1, False), (40, 5, 2, 5, True),
                                   (16, 7, 1, 6, False)):
        bits, coffs, P = inplace.row_masks(W, KW, rw, 2, pw, 4, adjoint)
        assert P == (-2 if adjoint else 2)
        lanes = simd.plane_lanes.py_func(4)
        nvec = -(-W // lanes)
        assert bits.shape == (nvec * (KW + 2),)
        for j in range(nvec):
            for lane in range(lanes):
                c = j * lanes + lane
                cols = [c + (pw - kw * rw if adjoint else kw * rw - pw) for kw in range(KW)]
                inside = [c < W and 0 <= i < W for i in cols]
                want = inside + [c < W, any(inside)]
                got = [bool(bits[j * (KW + 2) + m] >> lane & 1) for m in range(KW + 2)]
                assert got == want, (W, KW, j, lane)
        assert list(coffs) == [(pw - kw * rw if adjoint else kw * rw - pw) for kw in range(KW)]


def test_which_problems_take_row_blocks(monkeypatch):
    """Of what the in-place kernels take: 5x5 and 7x7 windows of row
    dilation 1, rows of at least three vectors filled to 85 %, not the input
    gradient of a depth multiplier (its planes' taps read as one window); the
    others keep the runs of pixels."""
    _in_place(monkeypatch)
    taken = []
    real = driver._row_blocks
    monkeypatch.setattr(driver, "_row_blocks",
                        lambda *a: (taken.append(real(*a)), taken[-1])[1])
    lanes = simd.plane_lanes.py_func(4)
    fill = -(-85 * 3 * lanes // 100)        # the narrowest row of 3 vectors taken
    for shape, k, rh, m, want in (((1, 2, 9, 3 * lanes), 5, 1, 1, True),
                                  ((1, 2, 9, fill), 7, 1, 1, True),
                                  ((1, 2, 9, fill - 1), 7, 1, 1, False),    # < 85 %
                                  ((1, 2, 9, 2 * lanes), 5, 1, 1, False),   # two vectors
                                  ((1, 2, 9, 48), 3, 1, 1, False),
                                  ((1, 2, 9, 48), 5, 2, 1, False),      # row dilation
                                  ((1, 2, 9, 48), 9, 1, 1, ()),         # not in place
                                  ((1, 2, 9, 48), 5, 1, 2, None)):      # forward only
        x = np.ones(shape, np.float32)
        w = np.ones((k, k, shape[1], m), np.float32)
        attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW",
                     dilations=[1, 1, rh, 1])
        taken.clear()
        F(x, w, **attrs)
        BI(list(shape), w, np.ones((1, 2 * m, 9, shape[3]), np.float32), **attrs)
        expected = {None: [True, False], (): []}.get(want, [want, want])
        assert taken == expected, (shape, k, rh, m)
