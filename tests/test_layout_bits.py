"""Channels-first and channels-last give the same bits.

Every route of the forward and the input gradient, in either layout (the lane,
row, tile and plane kernels, the transposes), sums an output's taps the same
way: in (kh, kw) order, the first product rounded alone and each further one
fused, the taps in the padding left out; 16-bit operands widened exactly and
the sums rounded once. So a model gives the same floats whichever layout it
keeps its activations in, and these tests compare bits, not tolerances. (The
filter gradient sums over images and pixels, in orders that differ by layout
and route; the reference checks it elsewhere.)
"""

import ml_dtypes
import numpy as np
from hypothesis import given, settings, strategies as st

import numbasep

import reference as R
import support

F = numbasep.depthwise_conv2d_native
BI = numbasep.depthwise_conv2d_native_backprop_input

_DTYPES = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 3))
    c = draw(st.sampled_from([1, 3, 8, 16, 24]))
    m = draw(st.sampled_from([1, 1, 2, 3]))
    h, w = draw(st.integers(1, 20)), draw(st.integers(1, 20))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rh, rw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    attrs = support.draw_padding(draw, h, w, kh, kw, sh, sw, rh, rw)
    return (n, c, h, w), (kh, kw, c, m), attrs


def _last(attrs):
    """The channels-last attributes of channels-first ``attrs``."""
    s, r, ep = attrs["strides"], attrs["dilations"], attrs["explicit_paddings"]
    return dict(strides=[1, s[2], s[3], 1], padding=attrs["padding"],
                explicit_paddings=ep and [0, 0] + ep[4:] + [0, 0], data_format="NHWC",
                dilations=[1, r[2], r[3], 1])


def _assert_same_bits(got, want):
    """Equal values, NaN where NaN, and the sign of every other value (zeros
    included; a NaN's sign depends on how the hardware made it)."""
    got, want = (np.asarray(a).astype(np.float64) for a in (got, want))
    np.testing.assert_array_equal(got, want)
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[keep]), np.signbit(want[keep]))


@settings(max_examples=80, deadline=None)
@given(problems(), st.sampled_from(_DTYPES),
       st.sampled_from([None, ("x", np.nan), ("x", np.inf), ("w", np.inf), ("w", -np.inf),
                        ("w", np.nan), ("dy", np.nan)]), st.integers(0, 2**31))
def test_forward_and_input_gradient_bits_do_not_depend_on_the_layout(problem, dtype, poison,
                                                                    seed):
    xs, fs, attrs = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(fs).astype(dtype)
    y = F(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(dtype)
    if poison is not None:
        name, value = poison
        a = {"x": x, "w": w, "dy": dy}[name]
        a.reshape(-1)[rng.integers(0, a.size)] = value
        y = F(x, w, **attrs)
    last = _last(attrs)
    xl, dyl = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (x, dy))
    _assert_same_bits(np.moveaxis(F(xl, w, **last), -1, 1), y)
    _assert_same_bits(np.moveaxis(BI(list(xl.shape), w, dyl, **last), -1, 1),
                      BI(list(xs), w, dy, **attrs))


def test_sums_of_no_taps_are_positive_zero():
    """An output whose window lies wholly in the padding, and an input no window
    reads, have empty sums: +0 in both layouts (the channels-first kernels compute
    such cells from the padding's zeros, whose products with negative taps are
    -0). The cells are found from the reference's tap counts (all-ones operands)."""
    cases = [((2, 16, 3, 9), (1, 3, 16, 1), dict(strides=[1, 1, 1, 1], padding="EXPLICIT",
                                                 explicit_paddings=[0, 0, 0, 0, 2, 0, 0, 3],
                                                 dilations=[1, 1, 1, 1])),
             ((1, 8, 11, 10), (1, 2, 8, 2), dict(strides=[1, 1, 3, 3], padding="VALID",
                                                 explicit_paddings=[],
                                                 dilations=[1, 1, 1, 1]))]
    seen = {"forward": 0, "input": 0}
    for xs, fs, attrs in cases:
        attrs = dict(attrs, data_format="NCHW")
        x = np.full(xs, 0.5, np.float32)
        w = -np.ones(fs, np.float32)
        ones = R.raw_forward(np.ones(xs), np.ones(fs), **attrs)
        dy = np.full(ones.shape, 0.25, np.float32)
        reach = R.raw_backprop_input(list(xs), np.ones(fs), np.ones(ones.shape), **attrs)
        last = _last(attrs)
        xl, dyl = (np.ascontiguousarray(np.moveaxis(a, 1, -1)) for a in (x, dy))
        for op, got, taps in (("forward", F(x, w, **attrs), ones),
                              ("forward", np.moveaxis(F(xl, w, **last), -1, 1), ones),
                              ("input", BI(list(xs), w, dy, **attrs), reach),
                              ("input", np.moveaxis(BI(list(xl.shape), w, dyl, **last), -1, 1),
                               reach)):
            empty = taps == 0
            seen[op] += int(empty.sum())
            assert not np.signbit(got[empty]).any()
            assert (got[empty] == 0).all() and (got[~empty] < 0).all()
    assert seen["forward"] > 0 and seen["input"] > 0


@st.composite
def keras_problems(draw):
    """1-D and 3-D problems (the 2-D ones are the raw ops' above): Keras attributes,
    strides or dilations above 1 (Keras takes one or the other)."""
    rank = draw(st.sampled_from([1, 3]))
    n, c, m = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 8, 16])), \
        draw(st.sampled_from([1, 2]))
    spatial = draw(st.lists(st.integers(1, 9 if rank == 3 else 30), min_size=rank,
                            max_size=rank))
    kernel = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    padding = draw(st.sampled_from(["valid", "same"] + (["causal"] if rank == 1 else [])))
    if draw(st.booleans()):
        strides, dilation = draw(st.integers(1, 3)), 1
    else:
        strides, dilation = 1, draw(st.integers(1, 3))
    if padding == "valid" and any(s < (k - 1) * dilation + 1 for s, k in zip(spatial, kernel)):
        padding = "same"
    return (n, *spatial, c), (*kernel, c, m), dict(strides=strides, padding=padding,
                                                   dilation_rate=dilation)


@settings(max_examples=30, deadline=None)
@given(keras_problems(), st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31))
def test_1d_and_3d_bits_do_not_depend_on_the_layout(problem, dtype, seed):
    xs, ks, attrs = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(dtype)
    k = rng.standard_normal(ks).astype(dtype)
    y = numbasep.depthwise_conv(x, k, data_format="channels_last", **attrs)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = numbasep.depthwise_conv_grad(x, k, dy, data_format="channels_last", **attrs)[0]
    xf, dyf = (np.ascontiguousarray(np.moveaxis(a, -1, 1)) for a in (x, dy))
    _assert_same_bits(np.moveaxis(numbasep.depthwise_conv(xf, k, data_format="channels_first",
                                                          **attrs), 1, -1), y)
    _assert_same_bits(np.moveaxis(numbasep.depthwise_conv_grad(
        xf, k, dyf, data_format="channels_first", **attrs)[0], 1, -1), dx)
