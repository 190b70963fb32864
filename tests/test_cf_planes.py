"""The channels-first plane kernels (numbasep/backends/cpu/planes.py).

They take every 1-D/2-D channels-first problem with depth multiplier 1, so the
general sweeps already run through them; the tests here aim at what is theirs:
the phase split for strides and dilations, the padding and the extra columns they
compute and drop (which must never turn an Inf into a NaN the operator does not
have), the direct fallback, the fixed reduction order of the filter gradient, and
depth multipliers (one copy of each input plane for its output planes). The
stride-1 forwards and input gradients whose output rows are as long as the
input's read their planes in place instead (test_cf_inplace.py); here they stay
on the plane kernels, which serve them where the in-place kernels do not.
"""

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver, planes

import reference as R
import support

F = numbasep.depthwise_conv2d_native
BI = numbasep.depthwise_conv2d_native_backprop_input
BF = numbasep.depthwise_conv2d_native_backprop_filter


@pytest.fixture(autouse=True)
def _planes_not_in_place(monkeypatch):
    """Keep the forwards and input gradients the in-place kernels would take on
    the plane kernels (the routes are decided afresh where a test needs them)."""
    monkeypatch.setattr(driver, "_in_place_correlation", lambda plan, adjoint: False)
    support.route_afresh(monkeypatch)


@st.composite
def problems(draw, batch=(1, 3), channels=(1, 11), sides=(1, 13), windows=(1, 5),
             strides=(1, 4), dilations=(1, 3)):
    """An NCHW problem, each size drawn from its (low, high) range."""
    n = draw(st.integers(*batch))
    c = draw(st.integers(*channels))
    h, w = draw(st.integers(*sides)), draw(st.integers(*sides))
    kh, kw = draw(st.integers(*windows)), draw(st.integers(*windows))
    sh, sw = draw(st.integers(*strides)), draw(st.integers(*strides))
    rh, rw = draw(st.integers(*dilations)), draw(st.integers(*dilations))
    attrs = support.draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw)
    return (n, c, h, w), (kh, kw, c, 1), attrs


def _taken(monkeypatch):
    """Record which problems the plane kernels took."""
    return support.record_routing(monkeypatch, "_by_planes")


# Besides small problems: planes whose tap sums run in several pieces
# (planes._PIECE elements each), each piece copying in the input rows it reads and
# copying out the rows it completed; 2 x 9 planes, so that every task reuses its
# scratch for more than one plane and a row copied in too late would be read
# from the plane before.
@settings(max_examples=90, deadline=None)
@given(problems() | problems(batch=(2, 2), channels=(9, 9), sides=(24, 64), windows=(1, 7),
                             strides=(1, 3), dilations=(1, 2)),
       st.sampled_from([np.float32, np.float64]))
def test_all_three_ops_match_the_reference(problem, dtype):
    xs, fs, attrs = problem
    support.assert_three_ops_match_the_reference(xs, fs, attrs, dtype)


def test_the_plane_kernels_take_2d_and_1d_channels_first(monkeypatch):
    seen = _taken(monkeypatch)
    x = np.ones((2, 3, 9, 9), np.float32)
    F(x, np.ones((3, 3, 3, 1), np.float32), [1, 1, 2, 2], "SAME", data_format="NCHW")
    numbasep.depthwise_conv(np.ones((2, 3, 20), np.float32), np.ones((3, 3, 1), np.float32),
                            data_format="channels_first")
    assert seen and all(seen)
    seen.clear()
    # depth multiplier 2: the plane kernels take it where they take the problem
    # with its channels repeated
    F(x, np.ones((3, 3, 3, 2), np.float32), [1, 1, 1, 1], "SAME", data_format="NCHW")
    assert seen and all(seen)


@st.composite
def multiplier_problems(draw):
    n = draw(st.integers(1, 2))
    c = draw(st.integers(1, 4))
    m = draw(st.sampled_from([2, 3, 4]))
    h, w = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    kh, kw = draw(st.sampled_from([(3, 3), (1, 3), (2, 4)]))
    sh, sw = draw(st.sampled_from([(1, 1), (2, 2), (1, 3)]))
    rh, rw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    attrs = support.draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw)
    return (n, c, h, w), (kh, kw, c, m), attrs


def _three_ops(xs, fs, attrs, poison=None):
    """The three ops on random operands (``poison``: (array name, value) put into
    one element of x or w)."""
    rng = np.random.default_rng(abs(hash((xs, fs, str(attrs)))) % 2**32)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(fs).astype(np.float32)
    if poison is not None:
        (x if poison[0] == "x" else w).flat[poison[2] % (x.size if poison[0] == "x" else
                                                          w.size)] = poison[1]
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    return y, BI(list(xs), w, dy, **attrs), BF(x, list(fs), dy, **attrs)


@settings(max_examples=40, deadline=None)
@given(multiplier_problems(), st.none() | st.tuples(st.sampled_from(["x", "w"]),
                                                     st.sampled_from([np.inf, np.nan]),
                                                     st.integers(0, 1000)))
def test_depth_multipliers_copy_each_input_plane_once(problem, poison):
    """Channels-first depth multipliers on the plane kernels, each input plane
    copied once for its M output planes (the input gradient summed from them):
    the reference's values, and the bits (NaN and Inf where they are) of the
    plane kernels on the input repeated in memory. (Stride-1 problems with
    same-length rows, which read their planes in place otherwise, are kept on
    the plane kernels: in place, the input gradient sums its M planes' taps in
    one sum, not plane by plane.)"""
    xs, fs, attrs = problem
    attrs = dict(attrs, data_format="NCHW")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver, "_same_rows", lambda plan, taps: False)
        taken = []
        real = driver._multiplier_plane_route

        def spy(plan, op):
            launch = real(plan, op)
            taken.append(launch is not None)
            return launch
        patch.setattr(driver, "_multiplier_plane_route", spy)
        support.route_afresh(patch)
        if poison is None:
            support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
        got = _three_ops(xs, fs, attrs, poison)
        assert taken == [True] * len(taken) and taken
        # the same problems repeated in memory, on the plane kernels (not the tiles)
        patch.setattr(driver, "_multiplier_plane_route", lambda plan, op: None)
        patch.setattr(driver, "_tile_width", lambda plan, adjoint=False: 0)
        patch.setattr(driver, "_filter_tile_width", lambda plan: 0)
        patch.setattr(driver, "_in_place", lambda plan: False)
        want = _three_ops(xs, fs, attrs, poison)
    for g, v in zip(got, want):
        np.testing.assert_array_equal(g, v)


def test_huge_windows_go_to_the_row_kernels(monkeypatch):
    seen = _taken(monkeypatch)
    x = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    w = np.arange(1, 9, dtype=np.float32).reshape(2, 2, 2, 1)
    attrs = dict(strides=[1, 1, 1, 1], padding="EXPLICIT",
                 explicit_paddings=[0, 0, 0, 0, 0, 2**20, 0, 2**20], data_format="NCHW",
                 dilations=[1, 1, 2**20, 2**20])
    y = F(x, w, **attrs)
    assert seen and not any(seen)
    # only tap (0, 0) ever lands inside the input
    np.testing.assert_array_equal(y, x * w[0, 0, :, 0][None, :, None, None])
    np.testing.assert_array_equal(y, R.raw_forward(x.astype(np.float64),
                                                   w.astype(np.float64), **attrs))


@pytest.mark.parametrize("where", ["x", "w", "dy"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("padding,stride", [("SAME", 2), ("VALID", 2), ("SAME", 1)])
def test_non_finite_values_propagate_as_in_the_channels_last_kernels(where, value, padding,
                                                                     stride):
    """Padding products and dropped columns are not products of the operator: an Inf
    next to the padding must give exactly the NaN/Inf pattern of the NHWC kernels
    (which never multiply the padding)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 7, 9)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 1)).astype(np.float32)
    attrs = dict(strides=[1, 1, stride, 1], padding=padding, data_format="NCHW")
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    a = {"x": x, "w": w, "dy": dy}[where]
    a.flat[[0, a.size - 1, a.size // 2]] = value      # corners touch the padding
    last = dict(attrs, strides=[1, stride, 1, 1], data_format="NHWC")
    support.assert_same_non_finite_pattern(support.channels_first_vs_last(x, w, dy, attrs, last))


def test_filter_gradient_independent_of_thread_count():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((70, 5, 12, 10)).astype(np.float32)
    dy = rng.standard_normal((70, 5, 6, 10)).astype(np.float32)
    got = support.bytes_per_thread_count(
        lambda: BF(x, [3, 3, 5, 1], dy, [1, 1, 2, 1], "SAME", data_format="NCHW"))
    assert len(got) == 1


def test_one_task_per_thread_at_most_one_per_plane():
    old = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            assert planes._task_count(1000) == threads
            assert planes._task_count(1) == 1
            assert planes._task_count(0) == 1
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("stride", [1, 2])
def test_forward_and_input_gradient_independent_of_thread_count(stride):
    """Their task count is the thread count; each plane is computed on its own.
    (A 2x3 window: no tile kernels, so the planes take even small maps.)"""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 7, 12, 10)).astype(np.float32)
    w = rng.standard_normal((2, 3, 7, 1)).astype(np.float32)
    strides = [1, 1, stride, stride]
    dy = rng.standard_normal(F(x, w, strides, "SAME", data_format="NCHW").shape)
    dy = dy.astype(np.float32)
    for call in (lambda: F(x, w, strides, "SAME", data_format="NCHW"),
                 lambda: BI(list(x.shape), w, dy, strides, "SAME", data_format="NCHW")):
        assert len(support.bytes_per_thread_count(call)) == 1


# Rows of an input gradient at column stride 2: the even and the odd columns'
# sums side by side, interleaved as stored (simd.interleaved_sums), a row's last
# columns under a mask: both parities of width and of padding, rows shorter than
# a pair of vectors and longer than a block of them.
@pytest.mark.parametrize("width, pads", [(40, None), (37, None), (41, [1, 2, 3, 0]),
                                         (36, [0, 1, 0, 1]), (133, [1, 2, 3, 0]),
                                         (160, None), (7, [0, 0, 2, 1])])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride_2_rows_interleave_their_phases(monkeypatch, width, pads, dtype):
    seen = _taken(monkeypatch)
    attrs = dict(strides=[1, 1, 2, 2], padding="SAME" if pads is None else "EXPLICIT",
                 explicit_paddings=[] if pads is None else [0, 0, 0, 0] + pads,
                 data_format="NCHW", dilations=[1, 1, 1, 1])
    support.assert_three_ops_match_the_reference((2, 3, 9, width), (3, 3, 3, 1), attrs, dtype)
    assert seen and all(seen)


# Large results of the forward and of the strided input gradient: each plane
# assembled in a scratch plane and sent to the result with non-temporal stores
# (driver._STREAM_PLANES and _STREAM_ROWS, patched to 0 here), or at column
# stride 2, rows of whole 64-byte lines stored straight to the result, others
# sent on line by line as rows complete them (all at the end where cells no
# window reaches are cleared: explicit padding 0); the bits of the plain kernel,
# which takes unaligned results. (float64 streams through the same dtype-generic
# simd.stream_copy, which test_simd checks on its own.)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op, stride, pads, width", [
    ("input", 2, None, 16), ("input", 2, [1, 0, 0, 1], 16), ("input", 2, None, 24),
    ("input", 2, [0, 0, 0, 0], 16), ("input", 3, None, 16), ("forward", 1, None, 64),
    ("forward", 1, [1, 1, 0, 0], 64)])
def test_large_results_stream_their_planes(monkeypatch, dtype, op, stride, pads, width):
    import reference as R
    monkeypatch.setattr(driver, "_STREAM_PLANES", 0)
    monkeypatch.setattr(driver, "_STREAM_ROWS", 0)
    support.route_afresh(monkeypatch)
    used = []
    real = driver._kernel_for

    def spy(launch, buf):
        used.append(real(launch, buf))
        return used[-1]
    monkeypatch.setattr(driver, "_kernel_for", spy)
    # planes of whole 64-byte lines; the forward's on the plane kernels (smaller
    # maps take the tile kernels)
    shape = (2, 3, 16, width) if op == "forward" else (2, 3, 8, width)
    attrs = dict(strides=[1, 1, stride, stride],
                 padding="SAME" if pads is None else "EXPLICIT",
                 explicit_paddings=[] if pads is None else [0, 0, 0, 0] + pads,
                 data_format="NCHW")
    rng = np.random.default_rng(stride)
    w = rng.standard_normal((3, 3, 3, 1)).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    ys = F(x, w, **attrs).shape
    dy = rng.standard_normal(ys).astype(dtype)
    w64, x64, dy64 = (a.astype(np.float64) for a in (w, x, dy))
    if op == "forward":
        res, kernel = ys, planes.forward
        run = lambda out: F(x, w, out=out, **attrs)                      # noqa: E731
        want = R.raw_forward(x64, w64, **attrs)
    else:
        res, kernel = shape, planes.backprop_input
        run = lambda out: BI(list(shape), w, dy, out=out, **attrs)       # noqa: E731
        want = R.raw_backprop_input(list(shape), w64, dy64, **attrs)
    got = run(numbasep.empty_aligned(res, dtype))
    assert used[-1][0] is kernel and used[-1][1][-1] is True       # its stream flag
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=0,
                               atol={np.float16: 2e-2}.get(dtype, 1e-5) * np.abs(want).max())
    plain = run(numbasep.empty_aligned((np.prod(res) + 1,), dtype)[1:].reshape(res))
    assert used[-1][0] is kernel and used[-1][1][-1] is False
    assert np.array_equal(plain.view(np.uint8), got.view(np.uint8))


def test_24x24_planes_take_the_plane_kernels_in_several_pieces(monkeypatch):
    seen = _taken(monkeypatch)
    x = np.ones((2, 9, 24, 24), np.float32)
    F(x, np.ones((1, 1, 9, 1), np.float32), [1, 1, 1, 1], "VALID", data_format="NCHW")
    assert seen and all(seen)
    assert 24 * 24 >= 2 * planes._PIECE      # a 1x1 window's tap sums: two pieces


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.sampled_from([1, 3, 5, 7]),
       st.sampled_from([1, 2, 3]), st.integers(1, 2), st.integers(1, 2))
def test_stride_one_same_size_planes_match_the_reference(h, w, kh, kw, rh, rw):
    rng = np.random.default_rng(h * 1000 + w * 100 + kh * 10 + kw)
    x = rng.standard_normal((2, 5, h, w))
    k = rng.standard_normal((kh, kw, 5, 1))
    attrs = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW",
                 dilations=[1, 1, rh, rw])
    y = F(x, k, **attrs)
    np.testing.assert_allclose(y, R.raw_forward(x, k, **attrs), rtol=0, atol=1e-10)
    dy = rng.standard_normal(y.shape)
    np.testing.assert_allclose(BI(list(x.shape), k, dy, **attrs),
                               R.raw_backprop_input(list(x.shape), k, dy, **attrs),
                               rtol=0, atol=1e-10)
