"""The channels-last forward, input gradient and filter gradient on the lane
kernels (numbasep/backends/cpu/lanes.py).

Channels-last float32 (and 16-bit) problems with the windows of
``lanes.WINDOWS`` and a multiple of 8 channels compute each row 16 (then 8)
channels at a time across the row; rows whose window reaches past the top or
the bottom of the map sum only the window rows inside it, and the side columns
sum only the window columns inside it (in blocks with the taps outside masked
off, or one pixel at a time). Strided input gradients (dilation 1) are computed
by phases: per input row and column phase, a stride-1 gather of a sub-window,
over pixels a stride apart, in chunks on long rows. The tests aim at what is
theirs: every count of window rows cut off (paddings up to 4, dilations, maps
shorter than the window), strides 2 and 3 (every count of phase taps), chunked
rows, both ways of computing side pixels, channel counts of one and several
8-lane groups, agreement with the row kernels to the bit, non-finite values
next to the padding, and which problems they take. Routing is forced both ways,
so that the row kernels keep their coverage of the same problems.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver, lanes, simd

import reference as R
import support

F = numbasep.depthwise_conv2d_native
BI = numbasep.depthwise_conv2d_native_backprop_input
BF = numbasep.depthwise_conv2d_native_backprop_filter


@pytest.fixture
def route(monkeypatch):
    """route(True): every problem the lane kernels are built for (windows of
    ``lanes.WINDOWS``, a multiple of 8 channels, float32, dilation 1 for a strided
    input gradient) goes to them, whatever its size; route(False): none does.
    Returns the decisions taken."""
    seen = []

    def set_route(on):
        def by_lanes(plan, adjoint):
            ok = (on and plan.channels_last and driver._flat(plan)
                  and plan.kernel[1:] in lanes.WINDOWS and plan.channels % 8 == 0
                  and plan.dtype == np.float32
                  and not (adjoint and plan.strides[1:] != (1, 1)
                           and (plan.dilations[1:] != (1, 1)
                                or not lanes.phases_fit(plan.kernel[2], plan.strides[2]))))
            seen.append(ok)
            return ok
        monkeypatch.setattr(driver, "_by_lanes", by_lanes)
        # channels-last filter gradients of small maps go to the tiles first
        tile = driver._filter_tile_width
        monkeypatch.setattr(driver, "_filter_tile_width",
                            lambda plan: 0 if plan.channels_last else tile(plan))
        support.route_afresh(monkeypatch)
        return seen
    return set_route


@st.composite
def problems(draw):
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([8, 16, 24, 72]))
    kh, kw = draw(st.sampled_from(sorted(lanes.WINDOWS)))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    sh, sw = draw(st.sampled_from([(1, 1), (1, 1), (2, 2), (1, 3), (2, 1)]))
    rh, rw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs = support.draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw)
    ep = attrs["explicit_paddings"]
    attrs = dict(attrs, data_format="NHWC", strides=[1, sh, sw, 1], dilations=[1, rh, rw, 1],
                 explicit_paddings=[0, 0] + ep[4:] + [0, 0] if ep else [])
    return (n, h, w, c), (kh, kw, c, 1), attrs


@pytest.mark.parametrize("on", [True, False], ids=["lanes", "rows"])
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems())
def test_forward_and_input_gradient_match_the_reference(route, on, problem):
    seen = route(on)
    seen.clear()
    xs, fs, attrs = problem
    support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
    assert seen and any(seen) == on


@pytest.mark.parametrize("k", [(5, 5), (7, 7), (1, 5), (3, 3)])
@pytest.mark.parametrize("strides", [(2, 1), (3, 1)])
def test_strided_input_gradients_with_wide_column_phases(monkeypatch, k, strides):
    """A window more than 4 columns wide at column stride 1 has column phases that
    the strided lane kernel does not sum (it took them as 4 columns wide): such
    input gradients run elsewhere and match the reference; narrower ones stay."""
    attrs = dict(strides=[1, *strides, 1], padding="SAME", data_format="NHWC")
    xs, fs = (2, 11, 13, 16), (*k, 16, 1)
    support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
    w = np.ones(fs, np.float32)
    dy = np.ones(F(np.zeros(xs, np.float32), w, **attrs).shape, np.float32)
    seen = support.record_routing(monkeypatch, "_by_lanes")
    BI(list(xs), w, dy, **attrs)
    assert seen == [k[1] <= 4]


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems())
def test_the_lanes_give_the_row_kernels_bits(route, problem):
    """Same products, same order, unfused: the same floats as the row kernels."""
    _assert_lanes_give_row_bits(route, *problem, seed=5)


def _assert_lanes_give_row_bits(route, xs, fs, attrs, seed):
    """The forward and the input gradient, lanes and row kernels: the same bits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(fs).astype(np.float32)
    got = {}
    for on in (True, False):
        route(on)
        y = F(x, w, **attrs)
        dy = np.cos(np.arange(y.size, dtype=np.float32)).reshape(y.shape)
        got[on] = (y, BI(list(xs), w, dy, **attrs))
    for a, b in zip(got[True], got[False]):
        np.testing.assert_array_equal(a, b)


def _assert_on_lanes(route, xs, fs, attrs, seed, every=False):
    """The three ops routed to the lanes (every call with ``every``, else at least
    one): the reference's values, and the row kernels' bits for the forward and
    the input gradient."""
    seen = route(True)
    seen.clear()
    support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
    assert all(seen) if every else any(seen)
    _assert_lanes_give_row_bits(route, xs, fs, attrs, seed=seed)


@pytest.mark.parametrize("k, strides, width", [
    ((3, 3), (2, 2), 235), ((5, 5), (2, 2), 238), ((7, 7), (2, 2), 241), ((1, 5), (1, 3), 236),
    ((3, 3), (3, 3), 242)])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_long_strided_input_gradient_rows_in_chunks(route, k, strides, width, padding):
    """Rows longer than ``lanes._CHUNKED_ROW`` elements: each phase in chunks, the
    last one overlapping the one before; the reference's values and the row
    kernels' bits."""
    assert width * 72 > lanes._CHUNKED_ROW
    xs, fs = (1, 5, width, 72), k + (72, 1)
    attrs = dict(strides=[1, *strides, 1], padding=padding)
    seen = route(True)
    seen.clear()
    support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
    assert all(seen)
    rng = np.random.default_rng(width)
    w = rng.standard_normal(fs).astype(np.float32)
    y = F(np.zeros(xs, np.float32), w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = [None, None]
    for on in (True, False):
        route(on)
        got[on] = BI(list(xs), w, dy, **attrs)
    np.testing.assert_array_equal(got[True], got[False])


@pytest.mark.parametrize("k, width, dilations, padding", [
    ((3, 3), 150, (1, 1), "SAME"), ((3, 3), 150, (1, 1), "VALID"),
    ((5, 5), 141, (2, 2), "SAME"), ((1, 5), 300, (1, 1), "SAME")])
def test_long_rows_in_chunks(route, k, width, dilations, padding):
    """Stride-1 rows longer than ``lanes._LONG_ROW`` elements: in chunks of pixels,
    the last one overlapping the one before, the sides' pixels where they fall;
    the reference's values and the row kernels' bits."""
    channels = 120
    assert width * channels > lanes._LONG_ROW
    assert width % (lanes._LONG_ROW_CHUNK // channels) != 0     # an overlapping last chunk
    xs, fs = (1, 4, width, channels), k + (channels, 1)
    attrs = dict(strides=[1, 1, 1, 1], padding=padding, dilations=[1, *dilations, 1])
    _assert_on_lanes(route, xs, fs, attrs, seed=width, every=True)


def test_long_rows_in_chunks_with_a_depth_multiplier(monkeypatch):
    """A depth multiplier's long rows: every chunk's blocks masked where the map's
    sides cut them (the multiplier forward computes side pixels in blocks)."""
    xs, fs = (1, 3, 150, 64), (3, 3, 64, 2)
    assert 150 * 128 > lanes._LONG_ROW
    for padding in ("SAME", "VALID"):
        _assert_multiplier_in_registers(monkeypatch, xs, fs,
                                        dict(strides=[1, 1, 1, 1], padding=padding),
                                        np.float32)


@pytest.mark.parametrize("size, k, channels, masked", [
    (7, 5, 72, True), (12, 7, 24, True), (6, 3, 64, False), (14, 3, 64, False)])
def test_edge_pixels_in_masked_blocks_or_one_at_a_time(route, size, k, channels, masked):
    """Both ways of computing the pixels whose window a side cuts (``lanes._run``
    chooses): in blocks with the taps outside masked off, or one at a time; the
    reference's values and the row kernels' bits either way."""
    span = lanes._run.py_func(size, -(k // 2), 1, 1, k, size, channels)
    assert span == ((0, size) if masked else (k // 2, size - k // 2))
    xs, fs = (2, size, size, channels), (k, k, channels, 1)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME")
    _assert_on_lanes(route, xs, fs, attrs, seed=size)


@pytest.mark.parametrize("size, k, padding", [
    (7, 3, "SAME"), (14, 3, "SAME"), (9, 3, "VALID"), (21, 5, "SAME"), (28, 7, "SAME"),
    (13, 7, "VALID"), (14, 5, "SAME"), (28, 3, "SAME")])
def test_rows_in_blocks_of_seven(route, size, k, padding):
    """Rows of 7 and 14 output pixels, and multiples of 7 for windows
    ``simd.SEVEN_TAPS`` wide or more, go in blocks of ``simd.SEVEN_BLOCK`` pixels
    (the last row here in blocks of 4): the reference's values and the row
    kernels' bits, edges masked or not, with a last group of 8 channels (in
    blocks of 4)."""
    out = size - k + 1 if padding == "VALID" else size
    sevens = out % 7 == 0 and (out in (7, 14) or k >= simd.SEVEN_TAPS)
    assert sevens == ((size, k) != (28, 3))
    xs, fs = (2, size, size, 40), (k, k, 40, 1)
    attrs = dict(strides=[1, 1, 1, 1], padding=padding)
    _assert_on_lanes(route, xs, fs, attrs, seed=size + k)


@pytest.mark.parametrize("k, channels, multiplier, width", [
    (3, 40, 1, 24), (3, 64, 1, 14), (5, 16, 1, 24), (7, 24, 1, 24), (3, 16, 2, 24)])
@pytest.mark.parametrize("height", [9, 12])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_rows_in_pairs(route, monkeypatch, k, channels, multiplier, width, height, padding):
    """The forward's and the stride-1 input gradient's rows whose windows lie
    inside the map, two at a time (``simd.taps_row_pairs``): an odd or even
    count of them per image, the rows the top and bottom cut one at a time,
    side pixels masked or (14 pixels of 64 channels) one at a time, a last
    group of 8 channels, a depth multiplier (the forward's); the reference's
    values and the row kernels' bits (a multiplier's: those of its input
    repeated)."""
    xs, fs = (2, height, width, channels), (k, k, channels, multiplier)
    attrs = dict(strides=[1, 1, 1, 1], padding=padding)
    if multiplier > 1:
        _assert_multiplier_in_registers(monkeypatch, xs, fs, attrs, np.float32)
        return
    _assert_on_lanes(route, xs, fs, attrs, seed=height + k)


@pytest.mark.parametrize("k, height, strides, dilations, padding", [
    ((3, 3), 9, (1, 1), (1, 1), "SAME"), ((3, 3), 9, (1, 1), (1, 1), "VALID"),
    ((3, 3), 10, (2, 2), (1, 1), "SAME"), ((3, 3), 11, (1, 1), (2, 2), "SAME"),
    ((3, 3), 7, (2, 1), (2, 1), "VALID"), ((1, 3), 6, (1, 1), (1, 1), "SAME")])
@pytest.mark.parametrize("partials", [1, 2, 7])
def test_filter_gradient_sums_rows_several_at_a_time(route, monkeypatch, k, height, strides,
                                                     dilations, padding, partials):
    """The filter gradient's rows whose windows lie inside the map go through
    ``simd.dots_rows`` several at a time (``lanes._LINES``): runs that stop at an
    image's last such row and at a partial filter's last row (7 partials end
    inside images), strides and dilations in rows, a last group of 8 channels:
    the reference's values."""
    monkeypatch.setattr(driver, "_lane_partials", lambda plan, channels: partials)
    xs, fs = (5, height, 12, 40), k + (40, 1)
    attrs = dict(strides=[1, *strides, 1], padding=padding, dilations=[1, *dilations, 1])
    seen = route(True)
    seen.clear()
    rng = np.random.default_rng(height * partials)
    x = rng.standard_normal(xs).astype(np.float32)
    y = F(x, rng.standard_normal(fs).astype(np.float32), **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = BF(x, list(fs), dy, **attrs)
    assert any(seen)
    want = R.raw_backprop_filter(x.astype(np.float64), list(fs), dy.astype(np.float64),
                                 **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k, channels, strides, dilations", [
    ((5, 5), 520, (1, 1), (1, 1)), ((7, 7), 264, (1, 1), (1, 2)), ((5, 5), 496, (2, 2), (1, 1))])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_filters_larger_than_l1(route, k, channels, strides, dilations, padding):
    """Filters of more than 48 KB, channel counts that end in a group of 8: the
    reference's values and the row kernels' bits."""
    xs, fs = (2, 9, 15, channels), k + (channels, 1)
    attrs = dict(strides=[1, *strides, 1], padding=padding, dilations=[1, *dilations, 1])
    _assert_on_lanes(route, xs, fs, attrs, seed=channels)


def _result(shape, aligned, skip):
    """A float32 array of ``shape``: 64-byte aligned, or ``skip`` elements past a
    64-byte boundary."""
    if aligned:
        return numbasep.empty_aligned(shape)
    return numbasep.empty_aligned(math.prod(shape) + skip)[skip:].reshape(shape)


@pytest.mark.skipif(not numbasep.backends.cpu.simd.STREAMS, reason="x86 only")
@pytest.mark.parametrize("k, strides", [((3, 3), (1, 1)), ((5, 5), (2, 2)), ((7, 7), (1, 1))])
def test_large_results_written_with_streaming_stores(route, monkeypatch, k, strides):
    """Results above ``driver._STREAM_BYTES`` (lowered here to 0) go through the
    non-temporal-store kernels when their array is 64-byte aligned, and through
    the plain ones when it is not: the same bits either way."""
    seen = route(True)
    monkeypatch.setattr(driver, "_STREAM_BYTES", 0)
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(3)
    xs = (2, 11, 13, 2 * numbasep.backends.cpu.simd.WIDE * 3)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(k + (xs[-1], 1)).astype(np.float32)
    attrs = dict(strides=[1, *strides, 1], padding="SAME")
    streaming = lanes.kernels(*k, stream=True)
    plain = lanes.kernels(*k)
    y_plain = F(x, w, **attrs)
    dy = rng.standard_normal(y_plain.shape).astype(np.float32)
    dx_plain = BI(list(xs), w, dy, **attrs)
    for aligned in (True, False):
        ran.clear()
        y, dx = _result(y_plain.shape, aligned, 4), _result(xs, aligned, 4)
        F(x, w, **attrs, out=y)
        BI(list(xs), w, dy, **attrs, out=dx)
        np.testing.assert_array_equal(y, y_plain)
        np.testing.assert_array_equal(dx, dx_plain)
        want = streaming if aligned else plain
        bin_name = "backprop_input" if strides == (1, 1) else "backprop_input_strided"
        assert ran == [want.forward, getattr(want, bin_name)]
    assert all(seen)


@pytest.mark.skipif(not numbasep.backends.cpu.simd.STREAMS, reason="x86 only")
def test_multiplier_input_gradients_stream_large_results(monkeypatch):
    """A depth multiplier's input gradient above ``driver._STREAM_BYTES`` (lowered
    to 0) is summed into the result with non-temporal stores when its array is
    64-byte aligned, with plain ones when not: the same bits either way."""
    monkeypatch.setattr(driver, "_STREAM_BYTES", 0)
    support.route_afresh(monkeypatch)
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(4)
    xs = (2, 7, 9, 2 * numbasep.backends.cpu.simd.WIDE)
    w = rng.standard_normal((3, 3, xs[-1], 2)).astype(np.float32)
    dy = rng.standard_normal(xs[:3] + (xs[-1] * 2,)).astype(np.float32)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME")
    want = R.raw_backprop_input(list(xs), w.astype(np.float64), dy.astype(np.float64), **attrs)
    got = {}
    for aligned in (True, False):
        ran.clear()
        dx = numbasep.empty_aligned(xs) if aligned else \
            numbasep.empty_aligned(math.prod(xs) + 4)[4:].reshape(xs)
        BI(list(xs), w, dy, **attrs, out=dx)
        kernels = lanes.kernels(3, 3, stream=aligned, multiplier=2)
        assert ran == [kernels.backprop_input]
        got[aligned] = dx
    np.testing.assert_array_equal(got[True], got[False])
    np.testing.assert_allclose(got[True], want, rtol=1e-5, atol=1e-5 * (1 + np.abs(want).max()))


@pytest.mark.skipif(not numbasep.backends.cpu.simd.STREAMS, reason="x86 only")
@pytest.mark.parametrize("k, multiplier, width", [((3, 3), 1, 13), ((3, 3), 2, 13),
                                                   ((3, 3), 1, 12)])
def test_pixels_ending_in_a_group_of_8_stream_in_halves(route, monkeypatch, k, multiplier,
                                                        width):
    """Results above ``driver._STREAM_BYTES`` and ``driver._HALVES_BYTES``
    (lowered to 0) whose pixels end in a group of 8 channels: on Zen 4
    (``simd.ZEN``, set here) the forward and the stride-1 input gradient store
    each vector in two halves, non-temporal, into a 64-byte-aligned result (odd
    widths: half the rows start mid-line), and plainly below
    ``_HALVES_BYTES``; the
    strided input gradient assembles each row in a scratch row and streams it
    whole where its rows are whole lines (even widths), and stores plainly
    elsewhere, as does any kernel into an unaligned result. The bits are those
    of the plain kernels, and the values the reference's."""
    wide = numbasep.backends.cpu.simd.WIDE
    seen = route(True)
    monkeypatch.setattr(driver, "_STREAM_BYTES", 0)
    monkeypatch.setattr(driver, "_HALVES_BYTES", 0)
    monkeypatch.setattr(driver.simd, "ZEN", True)
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(5)
    channels = wide + 8            # (AVX2: a multiple of the vector, streamed whole)
    xs = (2, 9, width, channels)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(k + (channels, multiplier)).astype(np.float32)
    plain = lanes.kernels(*k, multiplier=multiplier)
    rows_whole = width * channels % 16 == 0

    def streaming(result_channels):
        return lanes.kernels(*k, stream=1 if result_channels % wide == 0 else 2,
                             multiplier=multiplier)
    for strides in ((1, 1), (2, 2)) if multiplier == 1 else ((1, 1),):
        attrs = dict(strides=[1, *strides, 1], padding="SAME")
        with monkeypatch.context() as unpatched:
            unpatched.setattr(driver, "_STREAM_BYTES", 1 << 62)
            y_plain = F(x, w, **attrs)
            dy = rng.standard_normal(y_plain.shape).astype(np.float32)
            dx_plain = BI(list(xs), w, dy, **attrs)
        args64 = [a.astype(np.float64) for a in (x, w, dy)]
        y_ref = R.raw_forward(args64[0], args64[1], **attrs)
        dx_ref = R.raw_backprop_input(list(xs), args64[1], args64[2], **attrs)
        np.testing.assert_allclose(y_plain, y_ref, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(dx_plain, dx_ref, rtol=1e-5, atol=1e-4)
        for aligned, halves in ((True, True), (False, True), (True, False)):
            monkeypatch.setattr(driver, "_HALVES_BYTES", 0 if halves else 1 << 62)
            ran.clear()
            y, dx = _result(y_plain.shape, aligned, 8), _result(xs, aligned, 8)
            y[...] = np.nan
            dx[...] = np.nan
            F(x, w, **attrs, out=y)
            BI(list(xs), w, dy, **attrs, out=dx)
            np.testing.assert_array_equal(y.view(np.uint32), y_plain.view(np.uint32))
            np.testing.assert_array_equal(dx.view(np.uint32), dx_plain.view(np.uint32))

            def stores(result_channels):
                """The kernels writing a result of that many channels."""
                if aligned and (halves or result_channels % wide == 0):
                    return streaming(result_channels)
                return plain
            fwd = stores(channels * multiplier).forward
            if strides != (1, 1):
                whole = aligned and (channels % wide == 0 or rows_whole)
                bin_kernel = (streaming(channels) if whole else plain).backprop_input_strided
            else:
                bin_kernel = stores(channels).backprop_input
            assert ran == [fwd, bin_kernel]
    assert all(seen)


_MULTIPLIER_ROUTES = {"_multiplier_forward_route": driver._multiplier_forward_route,
                      "_multiplier_input_route": driver._multiplier_input_route,
                      "_multiplier_filter_route": driver._multiplier_filter_route}


@st.composite
def multiplier_problems(draw):
    n = draw(st.integers(1, 2))
    m = draw(st.sampled_from([2, 4, 8, 3]))
    c = draw(st.sampled_from([1, 2, 4, 6, 8, 16]))
    # two windows: each (window, multiplier) is a kernel to compile
    kh, kw = draw(st.sampled_from([(3, 3), (1, 3)]))
    h, w = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    rh, rw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs = support.draw_padding(draw, h, w, kh, kw, 1, 1, rh, rw)
    ep = attrs["explicit_paddings"]
    attrs = dict(attrs, data_format="NHWC", strides=[1, 1, 1, 1], dilations=[1, rh, rw, 1],
                 explicit_paddings=[0, 0] + ep[4:] + [0, 0] if ep else [])
    return (n, h, w, c), (kh, kw, c, m), attrs


def _assert_multiplier_in_registers(monkeypatch, xs, fs, attrs, dtype):
    """The forward, input gradient and filter gradient of a depth-multiplier
    problem: the reference's values, and for the forward and the input gradient
    the bits of the multiplier-1 kernels on the input repeated in memory (and
    its gradient summed afterwards); each runs on the lanes without the
    repeated input in memory exactly when they take it (the input gradient: a
    multiple of 8 input channels)."""
    taken = {name: [] for name in _MULTIPLIER_ROUTES}

    def spy(name):
        def route(plan):
            launch = _MULTIPLIER_ROUTES[name](plan)
            taken[name].append(launch is not None)
            return launch
        return route
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(fs).astype(dtype)
    # (hypothesis keeps a test's monkeypatch from one example to the next)
    with monkeypatch.context() as patch:
        for name in _MULTIPLIER_ROUTES:
            patch.setattr(driver, name, spy(name))
        support.route_afresh(patch)
        if dtype == np.float32:
            support.assert_three_ops_match_the_reference(xs, fs, attrs, dtype)
        got = F(x, w, **attrs)
        dy = rng.standard_normal(got.shape).astype(dtype)
        dx = BI(list(xs), w, dy, **attrs)
        dw = BF(x, list(fs), dy, **attrs)
    c, m = fs[2], fs[3]
    for name in _MULTIPLIER_ROUTES:
        takes = m in (2, 4, 8) and c * m % 8 == 0
        if name == "_multiplier_input_route":
            takes = takes and c % 8 == 0
        assert any(taken[name]) == takes, name
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    # float32 sums of 16-bit products, rounded once to 16 bits
    tol = 1e-5 if dtype == np.float32 else 2.0 ** -7
    for g, want in ((got, R.raw_forward(x64, w64, **attrs)),
                    (dx, R.raw_backprop_input(list(xs), w64, dy64, **attrs)),
                    (dw, R.raw_backprop_filter(x64, list(fs), dy64, **attrs))):
        scale = 1.0 + np.abs(want).max(initial=0.0)
        np.testing.assert_allclose(g.astype(np.float64), want, rtol=tol,
                                   atol=tol * scale * fs[0] * fs[1] * m)
    with monkeypatch.context() as patch:
        patch.setattr(driver, "_multiplier_forward_route", lambda plan: None)
        patch.setattr(driver, "_multiplier_input_route", lambda plan: None)
        support.route_afresh(patch)
        want = F(x, w, **attrs)
        want_dx = BI(list(xs), w, dy, **attrs)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(dx.view(np.uint8), want_dx.view(np.uint8))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=multiplier_problems())
def test_depth_multipliers_repeat_the_input_in_registers(monkeypatch, problem):
    """Forwards and filter gradients with depth multipliers 2, 4 and 8 read each
    input vector once and repeat its channels in registers for their output
    channels; input gradients (a multiple of 8 input channels) sum each row's
    gradient of the repeated input from a scratch row (multiplier 3, and output
    channels not a multiple of 8, repeat the input in memory)."""
    _assert_multiplier_in_registers(monkeypatch, *problem, np.float32)


@pytest.mark.parametrize("dtype, c, m", [(np.float16, 24, 2), (ml_dtypes.bfloat16, 8, 8),
                                         (ml_dtypes.bfloat16, 6, 8)],
                         ids=["float16", "bfloat16", "bfloat16-6-channels"])
def test_depth_multipliers_in_registers_read_16_bit_patterns(monkeypatch, dtype, c, m):
    """16-bit inputs read as bit patterns, widened, then repeated in registers (and
    forward results and input gradients rounded as stored)."""
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME")
    _assert_multiplier_in_registers(monkeypatch, (2, 6, 9, c), (3, 3, c, m),
                                    attrs, np.dtype(dtype))


@pytest.mark.parametrize("where", ["x", "w"])
@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_non_finite_values_propagate_as_in_the_row_kernels(route, where, value):
    """The lanes never multiply the padding: an Inf weight or an Inf at the map's
    corner gives exactly the row kernels' NaN/Inf pattern."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 7, 6, 16)).astype(np.float32)
    w = rng.standard_normal((3, 3, 16, 1)).astype(np.float32)
    if where == "x":
        x[0, 0, 0, 3] = x[1, -1, -1, 15] = x[1, 3, 2, 8] = value
    else:
        w[0, 0, 3, 0] = w[2, 1, 9, 0] = value
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME")
    dy = rng.standard_normal((2, 7, 6, 16)).astype(np.float32)
    pairs = []
    for on in (True, False):
        seen = route(on)
        seen.clear()
        pairs.append((F(x, w, **attrs), BI(list(x.shape), w, dy, **attrs)))
        assert seen and all(seen) == on
    support.assert_same_non_finite_pattern(list(zip(pairs[0], pairs[1])))


def test_which_problems_the_lane_kernels_take(monkeypatch):
    seen = []
    real = driver._by_lanes

    def spy(plan, adjoint):
        ok = real(plan, adjoint)
        seen.append((adjoint, ok))
        return ok
    monkeypatch.setattr(driver, "_by_lanes", spy)
    monkeypatch.setattr(driver.simd, "KEEPS_UP", False)
    support.route_afresh(monkeypatch)

    def taken(shape, k=3, strides=(1, 1, 1, 1), dtype=np.float32, dilations=(1, 1, 1, 1)):
        seen.clear()
        x = np.ones(shape, dtype)
        w = np.ones((k, k, shape[-1], 1), dtype)
        y = F(x, w, list(strides), "SAME", dilations=list(dilations))
        BI(list(shape), w, y, list(strides), "SAME", dilations=list(dilations))
        return dict(seen)

    assert taken((1, 7, 7, 960)) == {False: True, True: True}
    assert taken((1, 28, 28, 240), k=5) == {False: True, True: True}
    assert taken((1, 19, 19, 728)) == {False: True, True: True}
    assert taken((1, 56, 56, 144)) == {False: True, True: True}
    assert taken((1, 14, 14, 384), k=7) == {False: True, True: True}
    # rows of 18816 elements, in chunks: when the operands fit the caches
    assert taken((1, 147, 147, 128)) == {False: True, True: True}
    assert taken((4, 147, 147, 128)) == {False: False, True: False}
    # ... or wherever the host's prefetchers keep up
    monkeypatch.setattr(driver.simd, "KEEPS_UP", True)
    assert taken((4, 147, 147, 128)) == {False: True, True: True}
    monkeypatch.setattr(driver.simd, "KEEPS_UP", False)
    # ... or are 16-bit (the row kernels would round a float32 result afterwards)
    assert taken((4, 147, 147, 128), dtype=np.float16) == {False: True, True: True}
    assert taken((1, 19, 19, 1456)) == {False: True, True: True}     # ... but only 19 pixels
    assert taken((1, 7, 7, 12)) == {False: False, True: False}       # not whole 8s
    assert taken((1, 7, 7, 16), k=2) == {False: False, True: False}  # no 2x2 lanes
    assert taken((1, 7, 7, 16), dtype=np.float64) == {False: False, True: False}
    assert taken((1, 14, 14, 16), strides=(1, 2, 2, 1)) == {False: True, True: True}
    assert taken((1, 56, 56, 16), strides=(1, 2, 2, 1)) == {False: True, True: True}
    assert taken((1, 112, 112, 96), strides=(1, 2, 2, 1)) == {False: True, True: True}
    # strided forwards: rows of at most 64 pixels and 8192 elements
    assert taken((1, 130, 130, 16), strides=(1, 2, 2, 1)) == {False: False, True: True}
    assert taken((1, 112, 112, 160), strides=(1, 2, 2, 1)) == {False: False, True: False}
    # strided input gradients by phases: dilation 1 only
    assert taken((1, 14, 14, 16), strides=(1, 2, 2, 1),
                 dilations=(1, 1, 2, 1)) == {False: True, True: False}


def test_filter_gradient_independent_of_thread_count():
    """The partial filters split the output rows by the problem alone."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((9, 14, 14, 136)).astype(np.float32)
    dy = rng.standard_normal((9, 14, 14, 136)).astype(np.float32)
    BF = numbasep.depthwise_conv2d_native_backprop_filter
    seen = []
    real = driver._by_lanes

    def spy(plan, adjoint):
        ok = real(plan, adjoint)
        seen.append(ok)
        return ok
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(driver, "_by_lanes", spy)
        support.route_afresh(mp)
        got = support.bytes_per_thread_count(lambda: BF(x, [3, 3, 136, 1], dy, [1, 1, 1, 1],
                                                        "SAME"))
    finally:
        mp.undo()
    assert any(seen) and len(got) == 1



def test_filter_gradient_partials_split_evenly_over_threads(monkeypatch):
    """The lane filter gradient runs one task per partial filter, and Numba gives
    each thread one contiguous run of tasks: the count is 1, 2 or a multiple of 4,
    so that 2 and 4 threads get equal runs (7x7x16 at N=8 would take 5: one
    thread 3, the other 2)."""
    counts = {}
    real = driver._launch
    lane = lanes.kernels(3, 3).backprop_filter

    def spy(kern, *a):
        if kern is lane:
            counts[a[0].shape[0]] = a[2].shape[0]
        return real(kern, *a)
    monkeypatch.setattr(driver, "_launch", spy)
    support.route_afresh(monkeypatch)
    rng = np.random.default_rng(7)
    for n in (1, 5, 8, 31, 64):
        x = rng.standard_normal((n, 7, 7, 16)).astype(np.float32)
        dy = rng.standard_normal((n, 7, 7, 16)).astype(np.float32)
        got = numbasep.depthwise_conv2d_native_backprop_filter(x, [3, 3, 16, 1], dy,
                                                               [1, 1, 1, 1], "SAME")
        want = R.raw_backprop_filter(x.astype(np.float64), [3, 3, 16, 1],
                                     dy.astype(np.float64), [1, 1, 1, 1], "SAME")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * n)
    assert set(counts) == {1, 5, 8, 31, 64}, counts
    assert all(c in (1, 2) or c % 4 == 0 for c in counts.values()), counts
    assert counts[8] == 4 and max(counts.values()) > 4, counts

def _images_past_prefetch(image_bytes):
    """Images enough that operands of ``image_bytes`` an image pass
    ``lanes._PREFETCH_BYTES`` (the host's), with parts that cross images."""
    return lanes._PREFETCH_BYTES // image_bytes + 2


@pytest.mark.parametrize("k, stride", [(3, 1), (3, 2), (5, 1)])
def test_forward_of_operands_from_memory(monkeypatch, k, stride):
    """Operands above ``lanes._PREFETCH_BYTES``: the forward asks for each job's
    next input rows ahead where the host's prefetchers want it
    (``lanes._PREFETCH_FORWARD``; parts that cross from one image to the next,
    windows that reach into the padding, strides 1 and 2); the float64 sums,
    within float32 rounding."""
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(k + stride)
    size, c = 40, 128
    out = -(-size // stride)
    n = _images_past_prefetch((size * size + out * out) * c * 4)
    x = numbasep.empty_aligned((n, size, size, c))
    x[...] = rng.uniform(-1, 1, x.shape)
    w = rng.uniform(-1, 1, (k, k, c, 1)).astype(np.float32)
    # an unaligned result: the plain kernel, not the streaming one
    got = numbasep.empty_aligned(n * out * out * c + 4)[4:].reshape(n, out, out, c)
    F(x, w, [1, stride, stride, 1], "SAME", out=got)
    assert x.nbytes + got.nbytes > lanes._PREFETCH_BYTES
    assert ran == [lanes.kernels(k, k).forward]
    before = max((out - 1) * stride + k - size, 0) // 2
    xp = np.zeros((n, size + 2 * k, size + 2 * k, c))
    xp[:, before:before + size, before:before + size] = x
    want = np.zeros(got.shape)
    bound = np.zeros(got.shape)
    for i in range(k):
        for j in range(k):
            terms = xp[:, i:i + stride * out:stride, j:j + stride * out:stride] * w[i, j, :, 0]
            want += terms
            bound += np.abs(terms)
    assert np.all(np.abs(got - want) <= 1e-5 * bound)


# 5x5 rows that take pieces of their pixels, and 5x5 rows from memory whose
# channel pieces are cut: with 8 lanes (AVX2) a row's channels split into twice
# the pieces, so those rows are twice as long there
_LONG = 1 if simd.WIDE == 16 else 2


@pytest.mark.parametrize("k, stride, size, c, m, beyond, by_channels", [
    (3, 1, 40, 128, 1, False, True), (3, 1, 40, 128, 1, True, True),
    (3, 2, 40, 128, 1, True, True), (5, 1, 40 * _LONG, 128, 1, False, False),
    (3, 1, 40, 136, 2, True, True), (3, 1, 14, 392, 1, False, True),
    (5, 1, 28 * _LONG, 200, 1, True, True), (3, 1, 14, 384, 2, False, True),
    (3, 2, 40, 24, 1, True, True)])
def test_filter_gradient_of_operands_from_memory(monkeypatch, k, stride, size, c, m,
                                                 beyond, by_channels):
    """Operands above ``lanes._PREFETCH_FILTER_BYTES`` (strided:
    ``lanes._PREFETCH_BYTES``): the filter gradient asks for each job's next
    rows ahead. With operands above ``lanes._SPLIT_BYTES`` too (``beyond``),
    rows of whole 3x3 windows with at least a pair of channel groups, at
    strides 1 and 2, are one piece that asks across its blocks
    (:func:`.simd.dots_rows` ``asks``, ``lanes._ASKS_INSIDE``); the others
    (below it, 5x5 windows, 24 channels in 16 lanes) are summed in pieces of
    their pixels or, for rows that want few pieces for their channels, of its
    channels (``lanes._CHANNEL_PIECES``; 3x3 windows ``lanes._WINDOW_CHANNEL_PIECES``, at
    strides above 1 ``lanes._STRIDED_CHANNEL_PIECES``), and with operands above
    ``lanes._SPLIT_BYTES`` too (``beyond``) each piece of the channels cut into
    pieces of the row's pixels; parts that cross from one image to the next,
    windows that reach into the padding, strides 1 and 2, a last piece with a
    group of 8 channels, one window row a pass, a depth multiplier. The float64
    sums, within float32 rounding of 10^5 terms. ``by_channels``: the way the
    row takes on hosts that cut the asks into pieces (AMD Zen); elsewhere each
    row is one piece of all its channels (and on hosts whose filter gradient
    does not ask, ``lanes._FILTER_ASKS``, the rows are summed as below the
    limit)."""
    out = -(-size // stride)
    wanted = lanes._piece_count(max(size * stride * c // m, out * c), 4)
    units = lanes._channel_units(c)
    limit = lanes._PREFETCH_BYTES if stride > 1 else lanes._PREFETCH_FILTER_BYTES
    inside = (lanes._ASKS_INSIDE and k == 3 and c >= 2 * simd.WIDE
              and (beyond or limit >= lanes._SPLIT_BYTES))
    if lanes._ZEN and not inside:
        if k == 3:
            bound = lanes._STRIDED_CHANNEL_PIECES if stride > 1 else lanes._WINDOW_CHANNEL_PIECES
        else:
            bound = lanes._CHANNEL_PIECES
        assert (wanted <= bound * units) == by_channels
        # (the channel pieces of the rows from memory are cut, 3x3 rows in
        # lanes._WINDOW_CUTS or more)
        cuts = (2 * wanted + units) // (2 * units)
        assert not (beyond and by_channels) or cuts >= (lanes._WINDOW_CUTS if k == 3 else 2)
    elif not inside:
        assert wanted == 1
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(stride + c + m)
    image = (size * size // m + out * out) * c * 4
    n = (limit if not beyond else max(limit, lanes._SPLIT_BYTES)) // image + 2
    x = numbasep.empty_aligned((n, size, size, c // m))
    x[...] = rng.uniform(-1, 1, x.shape)
    dy = numbasep.empty_aligned((n, out, out, c))
    dy[...] = rng.uniform(-1, 1, dy.shape)
    assert x.nbytes + dy.nbytes > limit
    assert (x.nbytes + dy.nbytes > lanes._SPLIT_BYTES) == (beyond or limit >= lanes._SPLIT_BYTES)
    got = BF(x, [k, k, c // m, m], dy, [1, stride, stride, 1], "SAME")
    assert ran[0] is lanes.kernels(k, k, multiplier=m).backprop_filter
    before = max((out - 1) * stride + k - size, 0) // 2
    xp = np.zeros((n, size + k, size + k, c))
    # output channel q reads input channel q // m
    xp[:, before:before + size, before:before + size] = np.repeat(x, m, axis=3)
    dy64 = dy.astype(np.float64)
    for i in range(k):
        for j in range(k):
            taps = xp[:, i:i + stride * out:stride, j:j + stride * out:stride]
            want = np.einsum("nhwc,nhwc->c", taps, dy64)
            bound = 1e-5 * np.einsum("nhwc,nhwc->c", np.abs(taps), np.abs(dy64))
            assert np.all(np.abs(got[i, j].reshape(c) - want) <= bound), (i, j)


@pytest.mark.parametrize("k", [3, 5])
def test_input_gradient_of_operands_from_memory(monkeypatch, k):
    """Operands above ``lanes._PREFETCH_BYTES``: the stride-1 input gradient asks
    for each job's next output-gradient row ahead, with windows of at least
    ``lanes._PREFETCH_INPUT_ROWS`` rows (parts that cross from one image to the
    next, rows whose window reaches into the padding); the float64 sums, within
    float32 rounding."""
    ran = []
    real = driver._launch
    monkeypatch.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(7)
    size, c = 40, 160
    n = _images_past_prefetch(2 * size * size * c * 4)
    w = rng.uniform(-1, 1, (k, k, c, 1)).astype(np.float32)
    dy = numbasep.empty_aligned((n, size, size, c))
    dy[...] = rng.uniform(-1, 1, dy.shape)
    assert 2 * dy.nbytes > lanes._PREFETCH_BYTES
    # an unaligned result: the plain kernel (an aligned one above 32 MB streams)
    got = numbasep.empty_aligned(dy.size + 4)[4:].reshape(dy.shape)
    BI([n, size, size, c], w, dy, [1, 1, 1, 1], "SAME", out=got)
    assert ran == [lanes.kernels(k, k).backprop_input]
    # dx[ih, iw] = sum over taps of w[i, j] * dy[ih + p - i, iw + p - j] (SAME: p each side)
    p = k // 2
    dyp = np.zeros((n, size + k - 1, size + k - 1, c))
    dyp[:, p:p + size, p:p + size] = dy
    want = np.zeros(dy.shape)
    bound = np.zeros(dy.shape)
    for i in range(k):
        for j in range(k):
            terms = w[i, j, :, 0].astype(np.float64) * dyp[:, k - 1 - i:k - 1 - i + size,
                                                          k - 1 - j:k - 1 - j + size]
            want += terms
            bound += np.abs(terms)
    assert np.all(np.abs(got - want) <= 1e-5 * bound)


@pytest.mark.parametrize("op", ["forward", "input gradient"])
@pytest.mark.parametrize("height, width, k, dilation", [
    (24, 40, 3, 1), (16, 24, 5, 2), (40, 3, 5, 1), (12, 2, 7, 1)])
def test_rows_asked_for_in_pieces_keep_each_image_its_bits(route, op, height, width, k,
                                                             dilation):
    """Operands above ``lanes._PREFETCH_BYTES``: the forward and the stride-1
    input gradient compute each row in pieces, asking for a share of the next
    row's lines before each (``lanes._PIECE_LINES``), or, where no pixel is in
    a block (maps narrower than the window), ask for them all at once. Each
    image's result is the one it gets alone (operands below the limit, whole
    rows), to the bit."""
    route(True)
    ran = []
    real = driver._launch
    mp = pytest.MonkeyPatch()
    mp.setattr(driver, "_launch", lambda kern, *a: (ran.append(kern), real(kern, *a)))
    rng = np.random.default_rng(height * width + k)
    c = 128
    n = _images_past_prefetch(2 * height * width * c * 4)
    a = numbasep.empty_aligned((n, height, width, c))
    a[...] = rng.uniform(-1, 1, a.shape)
    w = rng.uniform(-1, 1, (k, k, c, 1)).astype(np.float32)
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", dilations=[1, dilation, dilation, 1])
    if op == "forward":
        def run(b):
            return F(b, w, **attrs)
    else:
        def run(b):
            return BI(list(b.shape), w, b, **attrs)
    try:
        got = run(a)
    finally:
        mp.undo()
    assert 2 * a.nbytes > lanes._PREFETCH_BYTES
    # (plain or streaming stores)
    kerns = [lanes.kernels(k, k, stream=s) for s in (False, True)]
    assert len(ran) == 1
    assert ran[0] in [m.forward if op == "forward" else m.backprop_input for m in kerns]
    for i in (0, 1, n // 2, n - 1):
        alone = run(np.ascontiguousarray(a[i:i + 1]))
        np.testing.assert_array_equal(got[i:i + 1].view(np.uint32), alone.view(np.uint32))
