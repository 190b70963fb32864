"""The channels-first kernels that read planes in place (numbasep/backends/cpu/inplace.py).

They take channels-first stride-1 problems whose output rows are as long as the
input's, reading each tap's pixels at a fixed offset from the output pixel and
leaving out, by lane masks, the pixels whose tap lies outside the map: the
filter gradient, and the forward and input gradient (one kernel, the input
gradient through the masks of the adjoint's geometry). The tests aim at what is
theirs: the masks (against a loop over pixels), the row wraps and the padding
they leave out (an Inf or NaN there must not make a NaN), planes cut at every
lane remainder and written no further, chunks of images, 16-bit bit patterns,
and which problems they take.
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
BF = numbasep.depthwise_conv2d_native_backprop_filter


def _spy(monkeypatch, everywhere=True):
    """Record which problems the in-place kernels took: (filter gradients, and
    (adjoint, taken) of the forwards and input gradients); ``everywhere``: also
    the small maps in the caches that the tiles keep otherwise, and filter
    gradients of more than 9 taps (several groups of taps)."""
    if everywhere:
        monkeypatch.setattr(driver, "_IN_PLACE_PIXELS", 0)
        monkeypatch.setattr(driver, "_IN_PLACE_BYTES", 0)
        monkeypatch.setattr(driver, "_IN_PLACE_CORRELATION_BYTES", 0)
        monkeypatch.setattr(driver, "_IN_PLACE_TAPS", 49)
    filters = support.record_routing(monkeypatch, "_in_place")
    correlations = []
    real = driver._in_place_correlation

    def spy(plan, adjoint):
        correlations.append((adjoint, real(plan, adjoint)))
        return correlations[-1][1]
    monkeypatch.setattr(driver, "_in_place_correlation", spy)
    return filters, correlations


def _all_three_taken(filters, correlations):
    return (True in filters and (False, True) in correlations
            and (True, True) in correlations)


def _nhwc(attrs):
    """The channels-last attributes of the channels-first ``attrs``."""
    pads = attrs.get("explicit_paddings", [])
    return dict(attrs, data_format="NHWC", dilations=[1, *attrs["dilations"][2:], 1],
                explicit_paddings=pads and [0, 0] + pads[4:] + [0, 0])


@st.composite
def same_row_problems(draw):
    """An NCHW stride-1 problem whose output rows are as long as the input's: SAME,
    or explicit column pads adding up to the window's reach (rows: any pads)."""
    n = draw(st.integers(1, 3))
    c = draw(st.integers(1, 9))
    h, w = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    kh, kw = draw(st.sampled_from([(3, 3), (5, 5), (1, 3), (2, 4), (7, 7), (3, 1)]))
    rh, rw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    reach = (kw - 1) * rw
    if draw(st.booleans()):
        attrs = dict(padding="SAME", explicit_paddings=[])
    else:
        left = draw(st.integers(0, reach))
        top, bottom = draw(st.integers(0, 4)), draw(st.integers(0, 4))
        if h + top + bottom < (kh - 1) * rh + 1:
            bottom += (kh - 1) * rh + 1 - h - top - bottom
        attrs = dict(padding="EXPLICIT",
                     explicit_paddings=[0, 0, 0, 0, top, bottom, left, reach - left])
    attrs.update(strides=[1, 1, 1, 1], data_format="NCHW", dilations=[1, 1, rh, rw])
    return (n, c, h, w), (kh, kw, c, 1), attrs


@settings(max_examples=60, deadline=None)
@given(same_row_problems(), st.sampled_from([np.float32, np.float64]))
def test_three_ops_match_the_reference(problem, dtype):
    xs, fs, attrs = problem
    with pytest.MonkeyPatch.context() as patch:
        seen = _spy(patch)
        support.assert_three_ops_match_the_reference(xs, fs, attrs, dtype)
    assert _all_three_taken(*seen)


@settings(max_examples=40, deadline=None)
@given(same_row_problems(), st.sampled_from(["x", "dy", "w"]),
       st.sampled_from([np.inf, np.nan]), st.integers(0, 10**6))
def test_non_finite_values_next_to_the_padding_stay_where_they_belong(problem, where, value,
                                                                       at):
    """An Inf or NaN in x, dy or a tap of the filter: in all three ops, NaN and
    Inf where the channels-last kernels (which never multiply the padding) have
    them, and no NaN from the padding or a row's wrap."""
    xs, fs, attrs = problem
    rng = np.random.default_rng(at)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(fs).astype(np.float32)
    dy = rng.standard_normal(F(x, w, **attrs).shape).astype(np.float32)
    if where == "w":
        # a corner tap, which the border pixels leave out
        w[(at % 2) * (fs[0] - 1), (at // 2 % 2) * (fs[1] - 1), at % xs[1], 0] = value
    else:
        target = x if where == "x" else dy
        # a border pixel, where the window's taps reach into the padding or wrap
        n, c = at % xs[0], at % xs[1]
        oh = (at // 7) % target.shape[2]
        ow = 0 if at % 2 else target.shape[3] - 1
        target[n, c, oh, ow] = value
    with pytest.MonkeyPatch.context() as patch:
        seen = _spy(patch)
        got = [F(x, w, **attrs), BI(list(xs), w, dy, **attrs), BF(x, list(fs), dy, **attrs)]
    assert _all_three_taken(*seen)
    last = _nhwc(attrs)
    xl, dyl = np.moveaxis(x, 1, -1), np.moveaxis(dy, 1, -1)
    want = [np.moveaxis(F(xl, w, **last), -1, 1),
            np.moveaxis(BI(list(xl.shape), w, dyl, **last), -1, 1),
            BF(xl, list(fs), dyl, **last)]
    support.assert_same_non_finite_pattern(list(zip(got, want)))


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("geometry", [(7, 7, 7, 3, 3, 1, 1, 1, 1), (14, 14, 14, 5, 5, 1, 1, 2, 2),
                                      (5, 9, 3, 3, 3, 2, 1, 0, 1), (1, 33, 1, 1, 5, 1, 3, 0, 6),
                                      (6, 4, 9, 2, 4, 3, 1, 3, 0), (40, 40, 40, 3, 3, 1, 1, 1, 1)])
def test_masks_say_which_pixels_each_tap_reads_inside_the_map(itemsize, geometry):
    """Bit j of mask (t, v): output pixel v*L + j exists and its tap t lies in the map,
    checked pixel by pixel; the tap offsets say which input pixel that is; the
    column masks, what lies in each window column; and the vectors [v0, v1), read
    without masks, read inside the plane at every lane and tap, where each tap's
    mask is its column's; the last masks, the pixels with any tap inside."""
    H, W, OH, KH, KW, rh, rw, ph, pw = geometry
    OW = W
    bits, toffs, v0, v1 = inplace.masks(H, W, OH, OW, KH, KW, rh, rw, ph, pw, itemsize)
    lanes = simd.plane_lanes(itemsize)
    nvec = -(-OH * OW // lanes)
    assert bits.shape == ((KH * KW + 2 + KW) * nvec,) and bits.dtype == np.uint16
    assert 0 <= v0 <= v1 <= nvec
    for q in range(nvec * lanes):
        v, j = divmod(q, lanes)
        assert bool(bits[v] >> j & 1) == (q < OH * OW)
        some = False
        for kw in range(KW):
            iw = q % OW + kw * rw - pw
            column = q < OH * OW and 0 <= iw < W
            assert bool(bits[(KH * KW + 1 + kw) * nvec + v] >> j & 1) == column
        for t in range(KH * KW):
            kh, kw = divmod(t, KW)
            ih, iw = q // OW + kh * rh - ph, q % OW + kw * rw - pw
            inside = q < OH * OW and 0 <= ih < H and 0 <= iw < W
            tap = bits[(t + 1) * nvec + v] >> j & 1
            assert bool(tap) == inside, (q, t)
            some = some or inside
            if inside:
                assert q + toffs[t] == ih * W + iw
            if v0 <= v < v1:
                assert q < OH * OW and 0 <= q + toffs[t] < H * W
                assert tap == bits[(KH * KW + 1 + kw) * nvec + v] >> j & 1
        assert bool(bits[(KH * KW + 1 + KW) * nvec + v] >> j & 1) == some
    if (H, W) == (40, 40):
        assert v1 - v0 >= nvec - 2 * 50 // lanes - 2      # all but the first and last rows


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16_bit_operands_are_read_as_their_bits(monkeypatch, dtype):
    """float16 and bfloat16 x, w and dy read in place (widened as loaded), and the
    forward's and input gradient's results written as bits (rounded as stored),
    against the reference on the same values; planes of 49 and 196 pixels cut
    vectors short."""
    filters, correlations = _spy(monkeypatch)
    rng = np.random.default_rng(3)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW")
    tol = 2e-2 if dtype == np.float16 else 2e-1
    for xs, k in (((3, 19, 7, 7), 3), ((2, 5, 14, 14), 5)):
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal((k, k, xs[1], 1)).astype(dtype)
        dy = rng.standard_normal(xs).astype(dtype)
        x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
        for got, want in ((F(x, w, **attrs), R.raw_forward(x64, w64, **attrs)),
                          (BI(list(xs), w, dy, **attrs),
                           R.raw_backprop_input(list(xs), w64, dy64, **attrs)),
                          (BF(x, list(w.shape), dy, **attrs),
                           R.raw_backprop_filter(x64, list(w.shape), dy64, **attrs))):
            assert got.dtype == dtype
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                                       atol=tol * np.abs(want).max())
    assert filters and all(filters)
    assert sorted(set(correlations)) == [(False, True), (True, True)]


def test_filter_gradient_independent_of_thread_count(monkeypatch):
    """Jobs depend on the problem only: 1 thread and all give the same bits (70
    images: one partial filter, jobs of channels; 1 image: jobs of one channel)."""
    seen, _ = _spy(monkeypatch)
    rng = np.random.default_rng(5)
    for n, c in ((70, 13), (1, 40)):
        x, dy = rng.standard_normal((2, n, c, 15, 12)).astype(np.float32)
        got = support.bytes_per_thread_count(
            lambda: BF(x, [3, 3, c, 1], dy, [1, 1, 1, 1], "SAME", data_format="NCHW"))
        assert len(got) == 1
    assert seen and all(seen)


def test_filter_gradient_sums_into_one_partial_filter(monkeypatch):
    """The kernel sizes its blocks of channels to make its jobs, so it sums every
    image into one partial filter, the result itself (no partials to add), and
    still spreads over the threads: 70 images of 130 channels, 64 jobs."""
    seen, _ = _spy(monkeypatch)
    launched = []
    real = driver._launch

    def spy(kern, *args):
        launched.append((kern, args))
        return real(kern, *args)
    monkeypatch.setattr(driver, "_launch", spy)
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((2, 70, 130, 15, 12)).astype(np.float32)
    got = BF(x, [3, 3, 130, 1], dy, [1, 1, 1, 1], "SAME", data_format="NCHW")
    assert seen and all(seen)
    assert [k for k, _ in launched] == [inplace.backprop_filter]
    parts, block = launched[0][1][2], launched[0][1][-1]
    assert parts.shape[0] == 1 and -(-130 // block) >= inplace.GROUPS // 2
    want = R.raw_backprop_filter(x.astype(np.float64), [3, 3, 130, 1], dy.astype(np.float64),
                                 [1, 1, 1, 1], "SAME", data_format="NCHW")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_which_problems_they_take(monkeypatch):
    """Stride 1 with output rows as long as the input's, on what the plane kernels
    take; not strided or VALID problems, channels-last ones or depth multipliers."""
    seen, correlations = _spy(monkeypatch)
    x = np.ones((2, 3, 9, 9), np.float32)
    w = np.ones((3, 3, 3, 1), np.float32)
    cases = [(dict(strides=[1, 1, 1, 1], padding="SAME"), True),
             (dict(strides=[1, 1, 1, 1], padding="EXPLICIT",
                   explicit_paddings=[0, 0, 0, 0, 0, 3, 2, 0]), True),
             (dict(strides=[1, 1, 2, 2], padding="SAME"), False),
             (dict(strides=[1, 1, 1, 1], padding="VALID"), False)]
    for attrs, taken in cases:
        seen.clear()
        dy = np.ones(F(x, w, data_format="NCHW", **attrs).shape, np.float32)
        correlations.clear()
        BF(x, [3, 3, 3, 1], dy, data_format="NCHW", **attrs)
        F(x, w, data_format="NCHW", **attrs)
        BI(list(x.shape), w, dy, data_format="NCHW", **attrs)
        assert seen[-1] is taken, attrs
        assert correlations == [(False, taken), (True, taken)], attrs
    seen.clear()
    correlations.clear()
    x = np.ones((2, 9, 9, 3), np.float32)
    BF(x, [3, 3, 3, 1], x, [1, 1, 1, 1], "SAME")
    F(x, w, [1, 1, 1, 1], "SAME")
    BI(list(x.shape), w, x, [1, 1, 1, 1], "SAME")
    F(np.ones((2, 3, 9, 9), np.float32), np.ones((3, 3, 3, 2), np.float32), [1, 1, 1, 1],
      "SAME", data_format="NCHW")
    assert True not in seen and (False, True) not in correlations


def test_small_maps_in_the_caches_stay_on_the_tiles(monkeypatch):
    """Without the test's thresholds: maps the tiles take stay there unless they
    are at least 14 x 14 and, but for 3x3 windows, their data at least 24 MB
    (filter gradients) or 16 MB (forwards and input gradients); larger maps
    read in place, but not for filter gradients of more than 9 taps or other
    ops' of more than 49."""
    seen, correlations = _spy(monkeypatch, everywhere=False)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW")
    for shape, k, taken, correlated in (((2, 3, 9, 9), 3, False, False),
                                        ((1, 2, 13, 13), 3, False, False),
                                        ((1, 2, 14, 14), 3, True, True),
                                        ((1, 2, 14, 14), 5, False, False),
                                        ((1, 2, 28, 28), 7, False, False),
                                        ((1, 2, 64, 64), 3, True, True),
                                        ((1, 2, 64, 64), 5, False, True),
                                        ((1, 2, 64, 64), 9, False, False)):
        x = np.ones(shape, np.float32)
        w = np.ones((k, k, shape[1], 1), np.float32)
        correlations.clear()
        BF(x, list(w.shape), x, **attrs)
        F(x, w, **attrs)
        BI(list(shape), w, x, **attrs)
        assert seen[-1] is taken, (shape, k)
        assert correlations == [(False, correlated), (True, correlated)], (shape, k)
    assert driver._IN_PLACE_PIXELS == 196 and driver._IN_PLACE_BYTES == 24 << 20
    assert driver._IN_PLACE_CORRELATION_BYTES == 16 << 20 and driver._IN_PLACE_WINDOW == 49


@pytest.mark.parametrize("CB", [1, 5, 64])
@pytest.mark.parametrize("P", [1, 3])
def test_jobs_of_any_block_and_chunk_sum_every_plane_once(CB, P):
    """The kernel itself, on blocks of channels cut at every remainder (13 channels)
    and chunks of images: each partial filter the sum over its chunk's images,
    against the reference on those images."""
    rng = np.random.default_rng(CB * 10 + P)
    N, C, H, W = 5, 13, 9, 11
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    dy = rng.standard_normal((N, C, H, W)).astype(np.float32)
    parts = np.full((P, 3, 3, C), np.nan, np.float32)
    inplace.backprop_filter(x, dy, parts, *inplace.masks(H, W, H, W, 3, 3, 1, 1, 1, 1, 4), CB)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW")
    for p in range(P):
        n0, n1 = p * N // P, (p + 1) * N // P
        want = R.raw_backprop_filter(x[n0:n1].astype(np.float64), [3, 3, C, 1],
                                     dy[n0:n1].astype(np.float64), **attrs)
        np.testing.assert_allclose(parts[p], want[..., 0], rtol=0, atol=1e-4)
    assert inplace.block(1, 32) == 1 and inplace.block(32, 960) == inplace.BLOCK


@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_correlate_writes_each_plane_once_and_nothing_around_them(adjoint, dtype):
    """The forward and input-gradient kernel itself, on 7 planes of 13 x 11 pixels
    (planes starting at every lane of a vector) with a 3 x 5 window dilated
    across columns: every element of the result the reference's, and the
    elements of the buffer before and after the result left as they were."""
    rng = np.random.default_rng(int(adjoint) + dtype().itemsize)
    N, C, H, W = 2, 7, 13, 11
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    w = rng.standard_normal((3, 5, C)).astype(dtype)
    make = inplace.adjoint_masks if adjoint else inplace.masks
    # rows padded 2 / 0 and columns 4 / 4 (a reach of 8): output rows of 11
    y = support.written_in_place((N, C, H, W), dtype, lambda y: inplace.correlate(
        x, w, y, *make(H, W, H - 2 + 2, W, 3, 5, 1, 2, 2, 4, x.itemsize)))
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT", data_format="NCHW",
                 explicit_paddings=[0, 0, 0, 0, 2, 0, 4, 4], dilations=[1, 1, 1, 2])
    want = support.correlation_reference(x, w, adjoint, attrs)
    assert want.shape == y.shape
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 if dtype == np.float32 else 1e-12)


@settings(max_examples=30, deadline=None)
@given(same_row_problems(), st.integers(2, 4), st.sampled_from([np.float32, np.float16]))
def test_depth_multipliers_read_each_plane_in_place(problem, M, dtype):
    """With depth multiplier M, the forward reads input plane c in place for its
    output planes c*M .. c*M + M-1, each with its own taps, and the input
    gradient of plane c sums those M planes' taps in one sum: against the
    reference, on the in-place kernel."""
    xs, fs, attrs = problem
    rng = np.random.default_rng(M + xs[1] * 10)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(fs[:3] + (M,)).astype(dtype)
    with pytest.MonkeyPatch.context() as patch:
        support.route_afresh(patch)
        ran = []
        real = driver._launch
        patch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
        y = F(x, w, **attrs)
        dy = rng.standard_normal(y.shape).astype(dtype)
        dx = BI(list(xs), w, dy, **attrs)
    assert ran == [inplace.correlate] * 2
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    tol = 2e-2 if dtype == np.float16 else 1e-5
    for got, want in ((y, R.raw_forward(x64, w64, **attrs)),
                      (dx, R.raw_backprop_input(list(xs), w64, dy64, **attrs))):
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                                   atol=tol * max(1.0, np.abs(want).max()))


def test_repeated_masks_read_m_planes_as_one_window():
    """:func:`inplace.repeated`: M copies of each tap's masks, the column masks
    and the taps-inside masks once, and tap offsets one plane further for each
    copy."""
    bits, toffs, v0, v1 = inplace.masks(6, 5, 6, 5, 3, 3, 1, 1, 1, 1, 4)
    nvec = bits.shape[0] // (9 + 2 + 3)
    got, offs = inplace.repeated(bits, toffs, 3, 2, 30)
    assert got.shape[0] == (18 + 2 + 3) * nvec
    assert np.array_equal(got[:nvec], bits[:nvec])
    for m in range(2):
        assert np.array_equal(got[(1 + 9 * m) * nvec:(10 + 9 * m) * nvec], bits[nvec:10 * nvec])
        assert np.array_equal(offs[9 * m:9 * (m + 1)], toffs + 30 * m)
    assert np.array_equal(got[19 * nvec:], bits[10 * nvec:])
