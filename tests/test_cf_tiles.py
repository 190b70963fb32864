"""The channels-first tile kernels (numbasep/backends/cpu/tiles.py).

They take channels-first problems on stride-1 maps up to 19 x 19 for 3x3 windows, 28 x 28
for 5x5 and 7x7 (1-D windows: 64 pixels), and strided
forward and filter-gradient problems (larger maps in bands of output rows),
transposing blocks of channels into channels-last tiles with 8 x 8 register
transposes (tested in test_simd.py). The tests aim at what is theirs: strides,
blocks and 8-groups cut at every remainder (channels and pixels), bands of one
and several rows, dilations and asymmetric paddings inside the tile, the generic
(not unrolled) windows, non-finite values next to the padding, and which
problems they take. Routing is forced both ways, so that the plane kernels keep
their own coverage of the same small problems.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver, tiles

import support

F = numbasep.depthwise_conv2d_native
BI = numbasep.depthwise_conv2d_native_backprop_input
BF = numbasep.depthwise_conv2d_native_backprop_filter


@pytest.fixture
def route(monkeypatch):
    """route(True): every problem the plane kernels take goes to the tiles (64
    channels per tile at stride 1, 16 when strided; strided input gradients stay on
    the planes); route(False): none does. Returns the routing decisions taken."""
    seen = []

    def set_route(on):
        real = driver._by_planes

        def tile_width(plan, adjoint=False):
            ok = on and real(plan) and plan.kernel[1:] in tiles.WINDOWS
            if plan.strides != (1, 1, 1):
                ok = ok and not adjoint
                width = tiles.NARROW
            else:
                width = tiles.WIDE
            seen.append(ok)
            return width if ok else 0
        monkeypatch.setattr(driver, "_tile_width", tile_width)
        support.route_afresh(monkeypatch)
        return seen
    return set_route


@st.composite
def small_problems(draw):
    n = draw(st.integers(1, 2))
    c = draw(st.sampled_from([1, 3, 8, 9, 15, 64, 65, 71, 130]))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    sh, sw = draw(st.sampled_from([(1, 1), (1, 1), (2, 2), (1, 2), (3, 2)]))
    # each window shape is a compilation: the suite's 3x3, and 2x3, which has no tile
    # kernels (it must stay on the planes even when routing is forced)
    kh, kw = draw(st.sampled_from([(3, 3), (3, 3), (2, 3)]))
    rh, rw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    attrs = support.draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw)
    return (n, c, h, w), (kh, kw, c, 1), attrs


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "planes"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=small_problems(), dtype=st.sampled_from([np.float32, np.float64]),
       band=st.sampled_from([1, 700, 1 << 15]))
def test_all_three_ops_match_the_reference(route, monkeypatch, tiled, problem, dtype, band):
    """``band``: tile elements per band; 1 and 700 cut these small maps into bands of
    one or a few output rows."""
    monkeypatch.setattr(driver, "_TILE_BAND", band)
    seen = route(tiled)
    seen.clear()                       # the fixture's list outlives one example
    xs, fs, attrs = problem
    support.assert_three_ops_match_the_reference(xs, fs, attrs, dtype)
    assert seen and (any(seen) == (tiled and fs[:2] == (3, 3)))


@pytest.mark.parametrize("where", ["x", "w", "dy"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("padding", ["SAME", "VALID", "EXPLICIT"])
def test_non_finite_values_propagate_as_in_the_channels_last_kernels(route, where, value,
                                                                     padding):
    """An Inf next to the zero padding of a tile must give exactly the NaN/Inf
    pattern of the NHWC kernels (which never multiply the padding)."""
    seen = route(True)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 70, 7, 6)).astype(np.float32)
    w = rng.standard_normal((3, 3, 70, 1)).astype(np.float32)
    ep = [0, 0, 0, 0, 2, 0, 1, 3] if padding == "EXPLICIT" else []
    attrs = dict(strides=[1, 1, 1, 1], padding=padding, explicit_paddings=ep,
                 data_format="NCHW")
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    a = {"x": x, "w": w, "dy": dy}[where]
    second_block = 65 if where == "w" else 65 * a.shape[2] * a.shape[3]
    a.flat[[0, a.size - 1, a.size // 2, second_block]] = value   # corners touch the padding
    last = dict(attrs, data_format="NHWC",
                explicit_paddings=[0, 0] + ep[4:] + [0, 0] if ep else [])
    support.assert_same_non_finite_pattern(support.channels_first_vs_last(x, w, dy, attrs, last))
    assert True in seen


def test_which_problems_the_tile_kernels_take(monkeypatch):
    seen = []
    real = driver._tile_width

    def spy(plan, adjoint=False):
        width = real(plan, adjoint)
        seen.append(width)
        return width
    monkeypatch.setattr(driver, "_tile_width", spy)
    support.route_afresh(monkeypatch)
    w = np.ones((3, 3, 16, 1), np.float32)

    def widths(shape, strides, data_format="NCHW"):
        seen.clear()
        x = np.ones(shape, np.float32)
        y = F(x, w, strides, "SAME", data_format=data_format)
        BI(list(shape), w, y, strides, "SAME", data_format=data_format)
        BF(x, list(w.shape), y, strides, "SAME", data_format=data_format)
        return list(seen)

    wide, narrow = tiles.WIDE, tiles.NARROW
    assert set(widths((2, 16, 7, 7), [1, 1, 1, 1])) == {wide}           # small map
    assert set(widths((2, 16, 19, 19), [1, 1, 1, 1])) == {wide}
    # 3x3 windows on maps up to 28 x 28 while the input is small enough
    assert set(widths((2, 16, 28, 28), [1, 1, 1, 1])) == {wide}
    assert set(widths((2, 16, 29, 28), [1, 1, 1, 1])) == {0}
    monkeypatch.setattr(driver, "_TILE_3X3_ELEMS", 2 * 16 * 20 * 20 - 1)   # larger inputs
    assert set(widths((2, 16, 20, 20), [1, 1, 1, 1])) == {wide}        # up to 400 pixels
    assert set(widths((2, 16, 21, 21), [1, 1, 1, 1])) == {0}
    assert set(widths((2, 16, 28, 28), [1, 1, 1, 1])) == {0}
    # strided 3x3 on a mid-sized map: forward and filter gradient, not input gradient
    assert 0 in widths((2, 16, 56, 56), [1, 1, 2, 2]) and narrow in seen
    assert set(widths((1, 16, 112, 112), [1, 1, 2, 2])) == {narrow, 0}  # in bands
    assert set(widths((2, 7, 7, 16), [1, 1, 1, 1], "NHWC")) <= {0}     # channels-last
    w = np.ones((5, 5, 16, 1), np.float32)                # 5x5 and 7x7: up to 28 x 28
    assert set(widths((2, 16, 28, 28), [1, 1, 1, 1])) == {wide}
    assert set(widths((2, 16, 29, 28), [1, 1, 1, 1])) == {0}
    assert set(widths((2, 16, 56, 56), [1, 1, 2, 2])) == {narrow, 0}    # strided: any window
    w = np.ones((1, 5, 16, 1), np.float32)                # 1-D windows: up to 64 pixels
    assert set(widths((2, 16, 1, 64), [1, 1, 1, 1])) == {wide}
    assert set(widths((2, 16, 1, 65), [1, 1, 1, 1])) == {0}
    w = np.ones((2, 3, 16, 1), np.float32)                              # no 2x3 tile kernels
    assert set(widths((2, 16, 7, 7), [1, 1, 1, 1])) == {0}


def test_filter_gradient_independent_of_thread_count():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 130, 7, 7)).astype(np.float32)
    dy = rng.standard_normal((70, 130, 7, 7)).astype(np.float32)
    got = support.bytes_per_thread_count(
        lambda: BF(x, [3, 3, 130, 1], dy, [1, 1, 1, 1], "SAME", data_format="NCHW"))
    assert len(got) == 1


def test_forward_and_input_gradient_independent_of_thread_count():
    """They run one task per thread (``per_thread`` launches): 1 task of 48 jobs
    with 1 thread, 2 of 24 with 2 (16 images x 3 blocks)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 130, 7, 7)).astype(np.float32)
    w = rng.standard_normal((3, 3, 130, 1)).astype(np.float32)
    for call in (lambda: F(x, w, [1, 1, 1, 1], "SAME", data_format="NCHW"),
                 lambda: BI([16, 130, 7, 7], w, x, [1, 1, 1, 1], "SAME", data_format="NCHW")):
        assert len(support.bytes_per_thread_count(call)) == 1


def test_tile_kernels_launch_one_task_per_thread():
    first, last = tiles.kernels(3, 3, tiles.WIDE), tiles.kernels(3, 3, tiles.WIDE, CL=True)
    assert first.correlate.per_thread and first.backprop_filter.per_thread
    assert last.correlate is None and last.backprop_filter.per_thread


def test_unrolled_5x5_window_on_a_7x7_map_matches_the_reference():
    """The suite's 7x7x1152 5x5 rows run the unrolled 5x5 tile kernels."""
    support.assert_three_ops_match_the_reference(
        (2, 70, 7, 7), (5, 5, 70, 1),
        dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW"), np.float32)


@pytest.mark.parametrize("attrs", [
    dict(padding="SAME"),
    dict(padding="VALID", dilations=[1, 1, 2, 1]),
    dict(padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 4, 1, 0, 3]),
    dict(padding="SAME", strides=[1, 1, 2, 2]),
    dict(padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 0, 3, 2, 1], strides=[1, 1, 3, 2],
         dilations=[1, 1, 1, 2]),
], ids=["same", "valid-dilated", "explicit", "strided", "strided-dilated"])
def test_5x5_windows_on_28x28_maps_in_bands_match_the_reference(monkeypatch, attrs):
    """5x5 and 7x7 windows run on the tiles on maps up to 28 x 28 (strided forwards
    and filter gradients on larger ones too), a band of a few output rows at a time:
    bands of 5x5 windows (four rows read below each band) in the forward, the input
    gradient (stride 1; strided, the planes) and the filter gradient."""
    seen = []
    real = driver._tile_width

    def spy(plan, adjoint=False):
        seen.append(real(plan, adjoint))
        return seen[-1]
    monkeypatch.setattr(driver, "_tile_width", spy)
    monkeypatch.setattr(driver, "_TILE_BAND", 5000)        # bands of 1-2 rows of 64 lanes
    support.route_afresh(monkeypatch)
    strided = "strides" in attrs
    attrs = dict(dict(strides=[1, 1, 1, 1], data_format="NCHW"), **attrs)
    support.assert_three_ops_match_the_reference((2, 70, 28, 27), (5, 5, 70, 1), attrs,
                                                 np.float32)
    assert seen and set(seen) == ({tiles.NARROW, 0} if strided else {tiles.WIDE})


def test_filter_gradient_takes_as_few_partials_as_leave_sixteen_jobs(route, monkeypatch):
    """The 64-channel tiles' filter gradient runs (partial filter, block of channels)
    jobs: as few partials as leave ``driver._TILE_FILTER_JOBS`` jobs, one from 16
    blocks of channels on, never more than one per image; the narrow (strided)
    tiles one per image. Each result against the float64 reference."""
    import reference as R
    route(True)
    parts = []
    real = driver._launch

    def spy(kern, *args):
        if getattr(kern, "py_func", None) is not None and \
                kern.py_func.__name__ == "backprop_filter" and args[2].ndim == 4:
            parts.append(args[2].shape[0])
        return real(kern, *args)
    monkeypatch.setattr(driver, "_launch", spy)
    rng = np.random.default_rng(7)
    for n, c, hw, s, want in ((70, 130, 7, 1, 5), (3, 16, 7, 1, 3), (9, 16, 7, 1, 9),
                              (20, 1030, 7, 1, 1), (6, 144, 20, 2, 6)):
        x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
        oh = -(-hw // s)
        dy = rng.standard_normal((n, c, oh, oh)).astype(np.float32)
        parts.clear()
        got = BF(x, [3, 3, c, 1], dy, [1, 1, s, s], "SAME", data_format="NCHW")
        assert parts == [want], (n, c, hw, s, parts)
        ref = R.raw_backprop_filter(x.astype(np.float64), [3, 3, c, 1], dy.astype(np.float64),
                                    strides=[1, 1, s, s], padding="SAME", data_format="NCHW")
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
