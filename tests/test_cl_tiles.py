"""The channels-last filter gradient on the tile kernels (numbasep/backends/cpu/tiles.py).

Channels-last float32 filter gradients of small stride-1 maps (3x3 windows up to
14 x 14, 5x5 up to 8 x 8) run on the tile kernels: each task copies a block of 64
channels of one image, with its padding as zeros, into a tile, and reads the
output gradient where it lies, 8 channels at a time. The tests aim at what is
theirs: channel counts cut at every remainder of 64 and of 8 (the last group of a
short block goes through a buffer so that no lane reads past the array), bands of
one and several rows, dilations and asymmetric paddings, batches split into
partial filters, non-finite values next to the padding (the tile multiplies the
padding; the result must not show it), and which problems they take. Routing is
forced both ways, so that the row kernels keep their coverage of the same problems.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver, tiles

import support

F = numbasep.depthwise_conv2d_native
BF = numbasep.depthwise_conv2d_native_backprop_filter


def _last(attrs):
    """NCHW raw-op attributes as the NHWC ones of the same problem."""
    s, r, ep = attrs["strides"], attrs.get("dilations", [1, 1, 1, 1]), attrs["explicit_paddings"]
    return dict(attrs, data_format="NHWC", strides=[1, s[2], s[3], 1],
                dilations=[1, r[2], r[3], 1],
                explicit_paddings=[0, 0] + ep[4:] + [0, 0] if ep else [])


@pytest.fixture
def route(monkeypatch):
    """route(True): every channels-last filter gradient the tile kernels are built
    for (windows of ``tiles.WINDOWS``) goes to them; route(False): none does.
    Returns the routing decisions taken for channels-last plans."""
    seen = []

    def set_route(on):
        real = driver._filter_tile_width

        def width(plan):
            if not plan.channels_last:
                return real(plan)
            ok = on and driver._flat(plan) and plan.kernel[1:] in tiles.WINDOWS
            seen.append(ok)
            return tiles.WIDE if ok else 0
        monkeypatch.setattr(driver, "_filter_tile_width", width)
        support.route_afresh(monkeypatch)
        return seen
    return set_route


@st.composite
def small_problems(draw):
    n = draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 3, 8, 9, 15, 64, 65, 71, 130]))
    h, w = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    rh, rw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    attrs = support.draw_padding(draw, h, w, 3, 3, 1, 1, rh, rw)
    return (n, h, w, c), (3, 3, c, 1), _last(attrs)


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "rows"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=small_problems(), band=st.sampled_from([1, 700, 1 << 15]))
def test_filter_gradient_matches_the_reference(route, monkeypatch, tiled, problem, band):
    """``band``: tile elements per band; 1 and 700 cut these maps into bands of one
    or a few output rows."""
    monkeypatch.setattr(driver, "_TILE_BAND", band)
    seen = route(tiled)
    seen.clear()
    xs, fs, attrs = problem
    support.assert_three_ops_match_the_reference(xs, fs, attrs, np.float32)
    assert seen and any(seen) == tiled


@pytest.mark.parametrize("where", ["x", "dy"])
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("padding", ["SAME", "VALID", "EXPLICIT"])
def test_non_finite_values_propagate_as_in_the_row_kernels(route, where, value, padding):
    """An Inf next to a tile's zero padding must give exactly the NaN/Inf pattern of
    the row kernels, which never multiply the padding; the channels hit are in the
    first block, the second block and its short last group (channels 64 and 69 of 70)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 7, 6, 70)).astype(np.float32)
    w = rng.standard_normal((3, 3, 70, 1)).astype(np.float32)
    ep = [0, 0, 2, 0, 1, 3, 0, 0] if padding == "EXPLICIT" else []
    attrs = dict(strides=[1, 1, 1, 1], padding=padding, explicit_paddings=ep)
    dy = rng.standard_normal(F(x, w, **attrs).shape).astype(np.float32)
    a = {"x": x, "dy": dy}[where]
    a[0, 0, 0, 0] = a[1, -1, -1, 69] = a[2, 0, -1, 64] = value   # corners touch the padding
    a[1, a.shape[1] // 2, a.shape[2] // 2, 3] = value            # and one that does not
    seen = route(True)
    got = BF(x, list(w.shape), dy, **attrs)
    assert seen and all(seen)
    route(False)
    want = BF(x, list(w.shape), dy, **attrs)
    assert np.isnan(want).any() or np.isinf(want).any()
    support.assert_same_non_finite_pattern([(got, want)])


def test_which_problems_the_tile_kernels_take(monkeypatch):
    seen = []
    real = driver._filter_tile_width

    def spy(plan):
        width = real(plan)
        if plan.channels_last:
            seen.append(width)
        return width
    monkeypatch.setattr(driver, "_filter_tile_width", spy)
    support.route_afresh(monkeypatch)

    def widths(shape, window, strides=(1, 1, 1, 1), dtype=np.float32, dilations=(1, 1, 1, 1)):
        seen.clear()
        x = np.ones(shape, dtype)
        w = np.ones(window + (shape[-1], 1), dtype)
        y = F(x, w, list(strides), "SAME", dilations=list(dilations))
        BF(x, list(w.shape), y, list(strides), "SAME", dilations=list(dilations))
        return set(seen)

    wide = tiles.WIDE
    assert widths((2, 7, 7, 12), (3, 3)) == {wide}
    assert widths((2, 14, 14, 12), (3, 3)) == {wide}
    assert widths((2, 14, 14, 12), (3, 3), dtype=np.float16) == {wide}   # sums in float32
    assert widths((2, 7, 7, 16), (3, 3)) == {0}                   # whole 8s: the lanes
    assert widths((2, 19, 19, 12), (3, 3)) == {0}                 # larger maps: rows
    assert widths((2, 8, 8, 16), (5, 5)) == {wide}
    assert widths((2, 14, 14, 16), (5, 5)) == {0}
    assert widths((2, 7, 7, 16), (3, 3), dtype=np.float64) == {0}
    assert widths((2, 14, 14, 16), (3, 3), strides=(1, 2, 2, 1)) == {0}
    assert widths((2, 7, 7, 16), (2, 3)) == {0}                   # no 2x3 tile kernels
    assert widths((1, 5, 5, 16), (3, 3), dilations=(1, 100, 100, 1)) == {0}   # tile too big


def test_filter_gradient_independent_of_thread_count():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 7, 7, 130)).astype(np.float32)
    dy = rng.standard_normal((70, 7, 7, 130)).astype(np.float32)
    got = support.bytes_per_thread_count(lambda: BF(x, [3, 3, 130, 1], dy, [1, 1, 1, 1], "SAME"))
    assert len(got) == 1


def test_unrolled_5x5_window_on_a_7x7_map_matches_the_reference():
    """The suite's 7x7x1152 5x5 rows run the unrolled 5x5 tile kernels."""
    support.assert_three_ops_match_the_reference(
        (2, 7, 7, 70), (5, 5, 70, 1), dict(strides=[1, 1, 1, 1], padding="SAME"), np.float32)
