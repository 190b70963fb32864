"""The CPU separable gradient computed a chunk of the batch at a time
(``driver._gradient_images``): where the pointwise steps run on the small
products, intermediates of more than ``driver._GRAD_CHUNK_BYTES`` are computed
for a few images at a time, and the kernel gradients summed over the chunks.

The tests shrink the chunk size so that small problems take chunks of one, two
or three images with a shorter last one, check which chunks ran, and compare all
three gradients with the float64 reference of ``tests/reference.py`` under a
bound on the rounding error of their float32 (float64) sums.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import numbasep
from numbasep import shapes
from numbasep.backends.cpu import driver

import reference as R
import support

# one 16-bit type: the chunks treat both alike
DTYPES = (np.float32, np.float64, np.float16)
UNIT = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53,
        np.dtype(np.float16): 2.0 ** -11, np.dtype(ml_dtypes.bfloat16): 2.0 ** -8}


@pytest.fixture
def chunks(monkeypatch):
    """Sets the images per chunk; records the batch of each chunk's plan."""
    support.route_afresh(monkeypatch)
    ran = []
    make = driver._batch_plan

    def spy(plan, images):
        ran.append(images)
        return make(plan, images)
    monkeypatch.setattr(driver, "_batch_plan", spy)

    def images_per_chunk(out_shape, channels, dtype, images):
        acc = 8 if np.dtype(dtype) == np.float64 else 4
        image = int(np.prod(out_shape[1:-1])) * channels * acc
        monkeypatch.setattr(driver, "_GRAD_CHUNK_BYTES", images * image)
    return ran, images_per_chunk


def _operands(rng, shape, window, filters, dtype, multiplier=1):
    c = shape[-1]
    x = rng.uniform(-1, 1, shape).astype(dtype)
    dk = rng.uniform(-1, 1, window + (c, multiplier)).astype(dtype)
    pk = rng.uniform(-1, 1, (1,) * len(window) + (c * multiplier, filters)).astype(dtype)
    return x, dk, pk


def _check(got, operands, kw, dtype):
    """Each gradient within (terms + 4) unit roundoffs of float32 (float64) of
    the sum of its products' magnitudes, plus the rounding to a 16-bit dtype."""
    f64 = [np.asarray(a, np.float64) for a in operands]
    want = R.keras_separable_grad(*f64, **kw)
    mags = R.keras_separable_grad(*[np.abs(a) for a in f64], **kw)
    x, dk, pk, g = operands
    taps = int(np.prod(dk.shape[:-2]))
    pixels = int(np.prod(g.shape[:-1]))
    terms = taps * pk.shape[-1] + pixels * taps + pixels + 4
    unit = 2.0 ** -53 if np.dtype(dtype) == np.float64 else 2.0 ** -24
    for name, a, w, m in zip(("d_inputs", "d_depthwise", "d_pointwise"), got, want, mags):
        assert a.dtype == np.dtype(dtype), name
        assert a.shape == w.shape, name
        bound = terms * unit * m
        if np.dtype(dtype).itemsize == 2:
            bound += UNIT[np.dtype(dtype)] * (np.abs(w) + bound) + 2.0 ** -24
        err = np.abs(a.astype(np.float64) - w)
        assert np.all(err <= bound), (name, err.max(), bound[err > bound][:3])


@st.composite
def problems(draw):
    ndim = draw(st.sampled_from((1, 2)))
    # the chunks do not depend on the window; other windows are each kernels of
    # their own to compile, tested with every window in test_lanes.py
    window = (3,) * ndim
    sizes = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    batch = draw(st.integers(2, 5))
    channels = draw(st.integers(1, 20))
    filters = draw(st.integers(1, 20))
    strides = draw(st.integers(1, 2))
    dilation = 1 if strides > 1 else draw(st.integers(1, 2))
    padding = draw(st.sampled_from(("valid", "same")))
    # "valid" needs the (dilated) window inside the map
    sizes = tuple(max(s, (k - 1) * dilation + 1) for s, k in zip(sizes, window))
    images = draw(st.integers(1, batch - 1))
    dtype = draw(st.sampled_from(DTYPES))
    multiplier = draw(st.sampled_from((1, 1, 2)))
    return ((batch,) + sizes + (channels,), window, filters,
            dict(strides=strides, padding=padding, dilation_rate=dilation), images, dtype,
            multiplier)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(p=problems(), seed=st.integers(0, 2 ** 16))
def test_chunked_gradient_matches_the_reference(chunks, p, seed):
    ran, images_per_chunk = chunks
    ran.clear()    # the fixture is shared by the examples
    shape, window, filters, kw, images, dtype, multiplier = p
    rng = np.random.default_rng(seed)
    x, dk, pk = _operands(rng, shape, window, filters, dtype, multiplier)
    out_shape = numbasep.separable_conv(x, dk, pk, **kw).shape
    g = rng.uniform(-1, 1, out_shape).astype(dtype)
    images_per_chunk(out_shape, shape[-1] * multiplier, dtype, images)
    got = numbasep.separable_conv_grad(x, dk, pk, g, **kw)
    batch = shape[0]
    whole, rest = divmod(batch, images)
    assert ran == [images] * whole + ([rest] if rest else [])
    _check(got, (x, dk, pk, g), kw, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_out_and_strided_operands(chunks, dtype):
    """Chunks write into the caller's ``out=`` arrays (strided, 16-bit) and read
    strided operands: the same bits as the gradient into new arrays."""
    ran, images_per_chunk = chunks
    rng = np.random.default_rng(3)
    x, dk, pk = _operands(rng, (5, 7, 9, 12), (3, 3), 10, dtype)
    g = rng.uniform(-1, 1, (5, 7, 9, 10)).astype(dtype)
    images_per_chunk(g.shape, 12, dtype, 2)
    want = numbasep.separable_conv_grad(x, dk, pk, g, padding="same")
    assert ran == [2, 2, 1]
    xs = np.zeros((5, 7, 18, 12), dtype)[:, :, ::2]
    xs[...] = x
    gs = np.zeros((10, 7, 9, 10), dtype)[::2]
    gs[...] = g
    big = [np.full((2,) + a.shape, np.nan, dtype) for a in want]
    outs = tuple(b[1] for b in big[:2]) + (big[2].swapaxes(0, 1)[:, 1],)
    got = numbasep.separable_conv_grad(xs, dk, pk, gs, padding="same", out=outs)
    for o, a, w, b in zip(outs, got, want, big):
        assert a is o
        np.testing.assert_array_equal(a, w)
        # nothing written outside the view
        assert np.isnan(np.asarray(b, np.float64)).sum() == w.size
    _check(got, (x, dk, pk, g), dict(padding="same"), dtype)


def _plan(shape, filters, dtype=np.float32, data_format="channels_last"):
    c = shape[-1] if data_format == "channels_last" else shape[1]
    plan = shapes.keras(shape, (3, 3, c, 1), 1, "same", data_format, 1,
                        pointwise_shape=(1, 1, c, filters))
    return plan.with_dtype(np.dtype(dtype))


@pytest.mark.parametrize("shape, filters, dtype, images", [
    ((8, 147, 147, 64), 128, np.float32, 1),     # 5.5 MB an image
    ((32, 56, 56, 144), 24, np.float32, 4),      # 1.8 MB an image
    ((32, 56, 56, 144), 24, np.float16, 4),      # float32 intermediates
    ((32, 56, 56, 144), 24, np.float64, 2),
    ((4, 56, 56, 144), 24, np.float32, 4),       # 7.2 MB: the whole batch at once
    ((32, 19, 19, 728), 728, np.float32, 0),     # products on BLAS
    ((1, 300, 300, 64), 128, np.float32, 1),     # one image
    ((0, 56, 56, 144), 24, np.float32, 0),       # nothing to sum
    ((4, 56, 56, 144), 0, np.float32, 0),
])
def test_images_per_chunk(shape, filters, dtype, images):
    assert driver._gradient_images(_plan(shape, filters, dtype)) == images


def test_channels_first_is_not_chunked():
    plan = _plan((8, 64, 147, 147), 128, data_format="channels_first")
    assert driver._gradient_images(plan) == 0
