"""The fused separable forward (the lane kernels' ``separable_forward``): a few
depthwise rows at a time into a scratch row per part, then their pointwise sums
(numbasep/backends/cpu/simd.py ``pointwise_rows``) while they are in the cache.

It takes channels-last 1-D and 2-D problems whose depthwise forward runs on the
lane kernels (windows of ``lanes.WINDOWS``, a multiple of 8 channels, float32
sums, depth multipliers 1, 2, 4 and 8) with a padded pointwise kernel of at most
``driver._FUSED_PK_BYTES``. The tests check that every problem drawn does take
it, and compare with the float64 reference of ``tests/reference.py`` under a
bound on the rounding error (the float32 sums of both steps, and the rounding
of a 16-bit result): pixel blocks of every kind (rows shorter than 4 pixels,
shorter than a block, several blocks), one to four vectors of columns with
the padded columns masked off, rows cut by the map's edges, strides,
dilations, multipliers, 16-bit operands, ``out=`` and strided operands.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep.backends.cpu import driver

import reference as R
import support

DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16)
# unit roundoff of the result's rounding (float32: the sums' own)
UNIT = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11,
        np.dtype(ml_dtypes.bfloat16): 2.0 ** -8}


@pytest.fixture
def fused(monkeypatch):
    """The problems the fused kernel ran, as (x shape, pk shape)."""
    ran = []
    run = driver._run_fused_separable

    def spy(launch, plan, x, dk, pk, buf):
        ran.append((x.shape, pk.shape))
        return run(launch, plan, x, dk, pk, buf)
    monkeypatch.setattr(driver, "_run_fused_separable", spy)
    return ran


def _reference_and_bound(x, dk, pk, kw, dtype):
    """The float64 result and a bound on the error of a float32 computation
    rounded to ``dtype``: each step's float32 sums are off by at most (terms + 1)
    unit roundoffs of the sum of the magnitudes of their products."""
    f64 = [np.asarray(a, np.float64) for a in (x, dk, pk)]
    want = R.keras_separable(*f64, **kw)
    mags = R.keras_separable(*[np.abs(a) for a in f64], **kw)
    taps = int(np.prod(dk.shape[:-2]))
    terms = taps + pk.shape[-2] + 2
    bound = terms * 2.0 ** -24 * mags
    if np.dtype(dtype) != np.float32:
        bound += UNIT[np.dtype(dtype)] * (np.abs(want) + bound) + 2.0 ** -24
    return want, bound


def _check(y, want, bound, dtype):
    assert y.dtype == np.dtype(dtype)
    assert y.shape == want.shape
    err = np.abs(y.astype(np.float64) - want)
    assert np.all(err <= bound), (err.max(), bound[err > bound][:5])


@st.composite
def problems(draw):
    # Each window and multiplier is a kernel of its own to compile (for each
    # 16-bit type too): the row code they share with the forward is tested with
    # every window in test_lanes.py.
    ndim = draw(st.sampled_from((1, 2, 2)))
    window = (3,) if ndim == 1 else draw(st.sampled_from(((3, 3), (5, 5))))
    m = draw(st.sampled_from((1, 1, 2)))
    # cin * m channels of output, a multiple of 8
    cin = draw(st.sampled_from((8, 16, 24, 40))) // m
    strides = dilation = 1
    if m == 1:
        kind = draw(st.sampled_from(("plain", "strided", "dilated")))
        strides = 2 if kind == "strided" else 1
        dilation = 2 if kind == "dilated" else 1
    n = draw(st.integers(1, 3))
    spatial = tuple(draw(st.integers(1, 12 if ndim == 2 and d == 0 else 40))
                    for d in range(ndim))
    padding = draw(st.sampled_from(("same", "valid")))
    reach = [(k - 1) * dilation + 1 for k in window]
    if padding == "valid":
        spatial = tuple(max(s, r) for s, r in zip(spatial, reach))
    filters = draw(st.sampled_from((1, 3, 8, 16, 17, 24, 31, 33, 48, 50, 64, 70)))
    dtype = draw(st.sampled_from(DTYPES))
    return dict(n=n, spatial=spatial, cin=cin, m=m, window=window, strides=strides,
                dilation=dilation, padding=padding, filters=filters, dtype=dtype)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=problems(), seed=st.integers(0, 2 ** 16))
def test_fused_forward_matches_the_reference(fused, p, seed):
    fused.clear()    # the fixture is shared by the examples
    rng = np.random.default_rng(seed)
    dtype = p["dtype"]
    x = rng.uniform(-1, 1, (p["n"],) + p["spatial"] + (p["cin"],)).astype(dtype)
    dk = rng.uniform(-1, 1, p["window"] + (p["cin"], p["m"])).astype(dtype)
    pk = rng.uniform(-1, 1, (1,) * len(p["window"]) + (p["cin"] * p["m"], p["filters"]))
    pk = pk.astype(dtype)
    kw = dict(strides=p["strides"], padding=p["padding"], dilation_rate=p["dilation"])
    y = numbasep.separable_conv(x, dk, pk, **kw)
    assert fused == [(x.shape, pk.shape)], p
    want, bound = _reference_and_bound(x, dk, pk, kw, dtype)
    _check(y, want, bound, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_out_and_strided_operands(fused, dtype):
    """``out=`` gets the result (rounded into it when 16-bit); strided views of
    x and pk give what their contiguous copies give."""
    rng = np.random.default_rng(3)
    big = rng.uniform(-1, 1, (2, 9, 21, 32)).astype(dtype)
    x = big[:, :, ::2, :16]
    dk = rng.uniform(-1, 1, (3, 3, 16, 1)).astype(dtype)
    pk = np.asfortranarray(rng.uniform(-1, 1, (1, 1, 16, 20)).astype(dtype))
    out = np.full((2, 9, 11, 20), np.nan, dtype)
    got = numbasep.separable_conv(x, dk, pk, padding="same", out=out)
    assert got is out
    again = numbasep.separable_conv(np.ascontiguousarray(x), dk, np.ascontiguousarray(pk),
                                    padding="same")
    np.testing.assert_array_equal(out, again)
    assert len(fused) == 2
    want, bound = _reference_and_bound(x, dk, pk, dict(padding="same"), dtype)
    _check(out, want, bound, dtype)


def test_the_row_groups_of_a_part_cover_every_row(fused):
    """Rows many times a part's scratch (several groups per part, the last one
    short), and more parts than one per thread would give."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (3, 40, 70, 64)).astype(np.float32)
    dk = rng.uniform(-1, 1, (5, 5, 64, 1)).astype(np.float32)
    pk = rng.uniform(-1, 1, (1, 1, 64, 40)).astype(np.float32)
    y = numbasep.separable_conv(x, dk, pk, padding="same")
    assert len(fused) == 1
    want, bound = _reference_and_bound(x, dk, pk, dict(padding="same"), np.float32)
    _check(y, want, bound, np.float32)


@pytest.mark.parametrize("shape, filters, fuses", [
    ((1, 6, 6, 144), 24, True),          # 144 x 32 padded columns: 18 KB
    ((1, 6, 6, 64), 128, True),          # 64 x 128: 32 KB
    ((1, 5, 5, 728), 728, False),        # 2 MB: NumPy's BLAS
    ((1, 6, 6, 12), 24, False),          # not a multiple of 8 channels: no lanes
    ((1, 4, 6, 6, 16), 8, False),        # 3-D: no lanes
])
def test_which_problems_fuse(fused, shape, filters, fuses):
    """Pointwise kernels too large for the cache and depthwise problems off the
    lane kernels take the unfused path (and are still right)."""
    rng = np.random.default_rng(5)
    c = shape[-1]
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    dk = rng.uniform(-1, 1, (3,) * (len(shape) - 2) + (c, 1)).astype(np.float32)
    pk = rng.uniform(-1, 1, (1,) * (len(shape) - 2) + (c, filters)).astype(np.float32)
    y = numbasep.separable_conv(x, dk, pk, padding="same")
    assert bool(fused) == fuses
    want, bound = _reference_and_bound(x, dk, pk, dict(padding="same"), np.float32)
    _check(y, want, bound, np.float32)


def test_channels_first_and_float64_are_not_fused(fused):
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (2, 16, 8, 8)).astype(np.float32)
    dk = rng.uniform(-1, 1, (3, 3, 16, 1)).astype(np.float32)
    pk = rng.uniform(-1, 1, (1, 1, 16, 8)).astype(np.float32)
    numbasep.separable_conv(x, dk, pk, padding="same", data_format="channels_first")
    x64 = np.moveaxis(x, 1, -1).astype(np.float64)
    numbasep.separable_conv(x64, dk.astype(np.float64), pk.astype(np.float64), padding="same")
    assert fused == []


@pytest.mark.parametrize("shape, filters, dtype", [
    ((2, 9, 11, 16), 5, np.float32),      # fewer pixels than parts: one pixel per part
    ((3, 20, 21, 24), 40, np.float32),    # channels a vector and a half, several parts
    ((2, 13, 12, 8), 70, np.float64),     # five vectors of columns (of 8 lanes)
    ((1, 30, 9), 17, np.float16),         # 1-D, 16-bit
])
def test_the_gradient_takes_the_small_products(monkeypatch, shape, filters, dtype):
    """The channels-last pointwise steps of the gradient run on
    ``pointwise.gradients`` (the input gradient's products, and the kernel
    gradient's summed per part of the pixels, then over the parts) when the
    pointwise kernel is small; the three gradients match the reference within
    the bound of their float32 (float64) sums."""
    from numbasep.backends.cpu import pointwise
    ran = []
    for name in ("products", "transposed_products", "gradients"):
        kern = getattr(pointwise, name)
        monkeypatch.setattr(pointwise, name,
                            lambda *a, _k=kern, _n=name: ran.append(_n) or _k(*a))
    rng = np.random.default_rng(7)
    c = shape[-1]
    nd = len(shape) - 2
    x = rng.uniform(-1, 1, shape).astype(dtype)
    dk = rng.uniform(-1, 1, (3,) * nd + (c, 1)).astype(dtype)
    pk = rng.uniform(-1, 1, (1,) * nd + (c, filters)).astype(dtype)
    g = rng.uniform(-1, 1, shape[:-1] + (filters,)).astype(dtype)
    got = numbasep.separable_conv_grad(x, dk, pk, g, padding="same")
    assert ran == ["gradients"]
    f64 = [np.asarray(a, np.float64) for a in (x, dk, pk, g)]
    want = R.keras_separable_grad(*f64, padding="same")
    mags = R.keras_separable_grad(*[np.abs(a) for a in f64], padding="same")
    unit = 2.0 ** -53 if dtype == np.float64 else 2.0 ** -24
    pixels = int(np.prod(shape[:-1]))
    terms = 9 * filters + pixels * 9 + pixels + 4
    for name, a, w, m in zip(("d_inputs", "d_depthwise", "d_pointwise"), got, want, mags):
        assert a.dtype == np.dtype(dtype), name
        bound = terms * unit * m
        if dtype == np.float16:
            bound += 2.0 ** -11 * (np.abs(w) + bound) + 2.0 ** -24
        err = np.abs(a.astype(np.float64) - w)
        assert np.all(err <= bound), (name, err.max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pointwise_gradient_primitives_take_the_small_products(monkeypatch, dtype):
    """The CPU backend's pointwise gradient primitives, called on their own (the
    separable gradient runs both at once): ``products`` for the input's,
    ``transposed_products`` for the kernel's, against the float64 products."""
    from numbasep.backends.cpu import pointwise
    ran = []
    for name in ("products", "transposed_products"):
        kern = getattr(pointwise, name)
        monkeypatch.setattr(pointwise, name,
                            lambda *a, _k=kern, _n=name: ran.append(_n) or _k(*a))
    n, h, w, c, f = 3, 13, 11, 24, 37
    plan, z, dout, pk = support.pointwise_problem(np.random.default_rng(11), n, h, w, c, f,
                                                  dtype)
    be = driver.CPUBackend()
    dz = be.pointwise_backprop_input(plan, dout, pk)
    dpk = be.pointwise_backprop_filter(plan, z, dout)
    assert ran == ["products", "transposed_products"]
    z64, d64, pk64 = (np.asarray(a, np.float64) for a in (z, dout, pk))
    unit = 2.0 ** -53 if dtype == np.float64 else 2.0 ** -24
    for got, want, mags, terms in (
            (dz, R.pointwise_backprop_input(d64, pk64),
             R.pointwise_backprop_input(np.abs(d64), np.abs(pk64)), f),
            (dpk, R.pointwise_backprop_filter(z64, d64, pk.shape),
             R.pointwise_backprop_filter(np.abs(z64), np.abs(d64), pk.shape), n * h * w)):
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        bound = (terms + 4) * unit * mags
        if dtype == np.float16:
            bound += 2.0 ** -11 * (np.abs(want) + bound) + 2.0 ** -24
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= bound), err.max()


@pytest.mark.parametrize("shape, filters", [((2, 17, 19, 24), 32), ((3, 200, 16), 48)])
def test_large_results_are_streamed(monkeypatch, fused, shape, filters):
    """float32 results above ``driver._STREAM_BYTES`` with whole vectors of
    filters go out with non-temporal stores (made the rule for any size here):
    the same bits as plain stores, into an aligned result (results of 64 KB
    and more are allocated aligned); an unaligned ``out=`` takes the plain
    stores."""
    import support
    rng = np.random.default_rng(5)
    c = shape[-1]
    nd = len(shape) - 2
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    dk = rng.uniform(-1, 1, (3,) * nd + (c, 1)).astype(np.float32)
    pk = rng.uniform(-1, 1, (1,) * nd + (c, filters)).astype(np.float32)
    plain = numbasep.separable_conv(x, dk, pk, padding="same")
    support.route_afresh(monkeypatch)
    monkeypatch.setattr(driver, "_STREAM_BYTES", 0)
    kinds = []
    run = driver._launch

    def spy(kern, *args):
        kinds.append(kern)
        return run(kern, *args)
    monkeypatch.setattr(driver, "_launch", spy)
    streamed = numbasep.separable_conv(x, dk, pk, padding="same")
    np.testing.assert_array_equal(streamed, plain)
    unaligned = np.empty(plain.size + 1, np.float32)[1:].reshape(plain.shape)
    numbasep.separable_conv(x, dk, pk, padding="same", out=unaligned)
    np.testing.assert_array_equal(unaligned, plain)
    from numbasep.backends.cpu import lanes
    sets = lanes.kernels(3, 3) if nd == 2 else lanes.kernels(1, 3)
    streams = lanes.kernels(3, 3, stream=True) if nd == 2 else lanes.kernels(1, 3, stream=True)
    assert kinds == [streams.separable_forward, sets.separable_forward]
    assert len(fused) == 3
