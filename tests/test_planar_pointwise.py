"""The channels-first pointwise (1x1) steps of the separable convolutions on
``pointwise.planar_products`` and ``pointwise.planar_kernel_gradient``
(numbasep/backends/cpu/pointwise.py) instead of NumPy's BLAS, where the
pointwise kernel is small (the driver's ``_by_products``).

The products vectorise along each image's pixels and sum in order of the
channels, as the channels-last products sum theirs, so a separable forward gives
the same bits in either layout; the kernel gradient sums each piece of
``PLANAR_PIXELS`` pixels in order and adds the pieces in order. The tests check
which kernels run (and that no BLAS product does), compare with the float64
reference of ``tests/reference.py`` under a bound on the float32 (float64) sums'
rounding error, and compare the layouts' bits: pixel counts below one vector,
above one piece and not a multiple of either, one channel, one filter, more
filters than one pass of column vectors, several images, 16-bit operands.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep import shapes
from numbasep.backends.cpu import driver, pointwise

import reference as R
import support

UNIT = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53,
        np.dtype(np.float16): 2.0 ** -24, np.dtype(ml_dtypes.bfloat16): 2.0 ** -24}
# the rounding of a 16-bit result
ROUNDED = {np.dtype(np.float16): 2.0 ** -11, np.dtype(ml_dtypes.bfloat16): 2.0 ** -8}


@pytest.fixture
def ran(monkeypatch):
    """The planar kernels run, by name; NumPy's products refuse to run."""
    names = []
    for name in ("planar_products", "planar_kernel_gradient"):
        kern = getattr(pointwise, name)
        monkeypatch.setattr(pointwise, name,
                            lambda *a, _k=kern, _n=name: names.append(_n) or _k(*a))

    def refuse(*a, **k):
        raise AssertionError("a BLAS product ran")
    monkeypatch.setattr(driver.np, "matmul", refuse)
    monkeypatch.setattr(driver.np, "einsum", refuse)
    return names


def _within(got, want, mags, terms, dtype):
    bound = (terms + 4) * UNIT[np.dtype(dtype)] * mags
    if np.dtype(dtype) in ROUNDED:
        bound += ROUNDED[np.dtype(dtype)] * (np.abs(want) + bound) + 2.0 ** -24
    assert got.dtype == np.dtype(dtype) and got.shape == want.shape
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), err.max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n, h, w, c, f", [
    (1, 3, 4, 5, 3),        # 12 pixels: less than one vector
    (2, 17, 19, 24, 70),    # 323 pixels: a piece and a part of one; 70 filters
    (3, 1, 1, 1, 1),        # one pixel, one channel, one filter
    (1, 16, 16, 8, 33),     # exactly one piece
])
def test_the_primitives_run_on_the_planar_kernels(ran, dtype, n, h, w, c, f):
    """The CPU backend's three pointwise primitives on channels-first operands,
    against the float64 products."""
    plan, z, dout, pk = support.pointwise_problem(np.random.default_rng(n * 1000 + h * 10 + f),
                                                  n, h, w, c, f, dtype, channels_first=True)
    be = driver.CPUBackend()
    y = be.pointwise_forward(plan, z, pk)
    dz = be.pointwise_backprop_input(plan, dout, pk)
    dpk = be.pointwise_backprop_filter(plan, z, dout)
    assert ran == ["planar_products", "planar_products", "planar_kernel_gradient"]
    z64, d64 = (R.to_last(np.asarray(a, np.float64), True) for a in (z, dout))
    pk64 = np.asarray(pk, np.float64)
    for got, want, mags, terms in (
            (y, R.pointwise(z64, pk64), R.pointwise(np.abs(z64), np.abs(pk64)), c),
            (dz, R.pointwise_backprop_input(d64, pk64),
             R.pointwise_backprop_input(np.abs(d64), np.abs(pk64)), f)):
        _within(got, R.to_first(want, True), R.to_first(mags, True), terms, dtype)
    _within(dpk, R.pointwise_backprop_filter(z64, d64, pk.shape),
            R.pointwise_backprop_filter(np.abs(z64), np.abs(d64), pk.shape), n * h * w, dtype)


def test_the_separable_gradient_takes_them(ran, monkeypatch):
    """The whole channels-first separable gradient, 16-bit, runs its pointwise
    steps there and matches the reference within its rounding."""
    rng = np.random.default_rng(5)
    dtype, f = ml_dtypes.bfloat16, 20
    x = rng.uniform(-1, 1, (2, 12, 15, 9)).astype(dtype)
    dk = rng.uniform(-1, 1, (3, 3, 12, 1)).astype(dtype)
    pk = rng.uniform(-1, 1, (1, 1, 12, f)).astype(dtype)
    g = rng.uniform(-1, 1, (2, f, 15, 9)).astype(dtype)
    got = numbasep.separable_conv_grad(x, dk, pk, g, padding="same",
                                       data_format="channels_first")
    assert sorted(ran) == ["planar_kernel_gradient", "planar_products"]
    monkeypatch.undo()    # the reference's own products
    f64 = [np.asarray(a, np.float64) for a in (x, dk, pk, g)]
    kw = dict(padding="same", data_format="channels_first")
    want = R.keras_separable_grad(*f64, **kw)
    mags = R.keras_separable_grad(*[np.abs(a) for a in f64], **kw)
    # the widest sums: the kernel gradients' over 2*15*9 pixels, through 9 taps
    # and f filters of the intermediate gradient
    terms = 9 * f + 2 * 15 * 9 * 9 + 2 * 15 * 9
    for a, w, m in zip(got, want, mags):
        _within(a, w, m, terms, dtype)


def test_large_kernels_stay_on_blas():
    """Only kernels within the fused forward's size take the planar kernels:
    MobileNetV2's 144 -> 24 does, Xception's 728 -> 728 stays a GEMM."""
    def takes(c, f, hw):
        plan = shapes.keras((1, c, hw, hw), (3, 3, c, 1), 1, "same", "channels_first", 1,
                            pointwise_shape=(1, 1, c, f)).with_dtype(np.dtype(np.float32))
        return driver._by_products(plan)
    assert takes(144, 24, 56) and takes(64, 128, 147)
    assert not takes(728, 728, 19) and not takes(1024, 1024, 7)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 20)), draw(st.integers(1, 30))
    c = draw(st.sampled_from((1, 3, 8, 16, 24)))
    f = draw(st.sampled_from((1, 5, 16, 17, 40)))
    dtype = draw(st.sampled_from((np.float32, np.float64, ml_dtypes.bfloat16)))
    strides = draw(st.sampled_from((1, 2)))
    return n, h, w, c, f, dtype, strides


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=problems(), seed=st.integers(0, 2 ** 16))
def test_the_layouts_give_the_same_forward_bits(p, seed):
    """With a small pointwise kernel, a separable forward gives the same floats
    channels-first as channels-last: the depthwise kernels agree bit for bit
    (test_layout_bits.py), and both pointwise products sum in order of the
    channels, the first product rounded alone and each further one fused."""
    n, h, w, c, f, dtype, s = p
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, h, w, c)).astype(dtype)
    dk = rng.uniform(-1, 1, (3, 3, c, 1)).astype(dtype)
    pk = rng.uniform(-1, 1, (1, 1, c, f)).astype(dtype)
    last = numbasep.separable_conv(x, dk, pk, strides=s, padding="same")
    first = numbasep.separable_conv(np.ascontiguousarray(R.to_first(x, True)), dk, pk,
                                    strides=s, padding="same", data_format="channels_first")
    assert first.dtype == last.dtype == np.dtype(dtype)
    assert np.array_equal(np.ascontiguousarray(R.to_last(first, True)).view(np.uint8),
                          last.view(np.uint8))
