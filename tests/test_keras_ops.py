"""The Keras-style N-D operators against the float64 reference (GitHub issue 3).

``depthwise_conv``, ``separable_conv``, ``depthwise_conv_grad`` and
``separable_conv_grad`` in 1-D, 2-D and 3-D, both data formats, the four dtypes,
valid / same / causal padding, any stride with any dilation. Expected values
come from ``tests/reference.py`` (independent float64 code) evaluated on the
inputs *after* they were cast to the dtype under test, or from identities that
need no reference at all (adjoints, finite differences, causality).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import numbasep
from numbasep import config

import reference as ref

DTYPES = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
# SPEC section 6: atol = rtol, as TensorFlow's own tests use.
TOL = {"float16": 4e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
FORMATS = ("channels_last", "channels_first")
FUNCS = ("depthwise_conv", "separable_conv", "depthwise_conv_grad", "separable_conv_grad")


# ------------------------------------------------------------------------- helpers

@pytest.fixture
def image_format():
    """Hands out ``config.set_image_data_format`` and restores the old value afterwards."""
    old = config.image_data_format()
    yield config.set_image_data_format
    config.set_image_data_format(old)


def tolerance(dtype_name, terms):
    """SPEC section 6; float32 gets 1e-4 when a result sums many terms."""
    if dtype_name == "float32" and terms > 256:
        return 1e-4
    return TOL[dtype_name]


def assert_close(actual, expected, dtype_name, terms=1, what=""):
    assert isinstance(actual, np.ndarray), what
    assert actual.dtype == DTYPES[dtype_name], (what, actual.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    tol = tolerance(dtype_name, terms)
    np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=tol, atol=tol,
                               err_msg=what)


def layout(shape_last, fmt):
    """A channels-last shape ``(N, *S, C)`` in ``fmt``."""
    if fmt == "channels_last":
        return tuple(shape_last)
    return (shape_last[0], shape_last[-1]) + tuple(shape_last[1:-1])


def make_inputs(rng, n, spatial, c, kernel, m, f, fmt, dtype_name, contiguous=True):
    """Random ``x`` (in ``fmt``), ``dk``, ``pk`` cast to the dtype under test.

    With ``contiguous=False`` channels-first inputs are a transposed view of a
    channels-last buffer and channels-last ones a strided slice.
    """
    dt = DTYPES[dtype_name]
    ndim = len(spatial)
    x = rng.uniform(-1, 1, (n, *spatial, c))
    if fmt == "channels_first":
        x = np.moveaxis(x, -1, 1)
    x = x.astype(dt)
    if contiguous:
        x = np.ascontiguousarray(x)
    elif fmt == "channels_last":
        wide = np.zeros(x.shape[:-1] + (2 * c,), dt)
        wide[..., ::2] = x
        x = wide[..., ::2]
    dk = rng.uniform(-1, 1, (*kernel, c, m)).astype(dt)
    pk = rng.uniform(-1, 1, (1,) * ndim + (c * m, f)).astype(dt)
    return x, dk, pk


def f64(a):
    return np.asarray(a).astype(np.float64)


def spatial_of(shape, fmt):
    return shape[1:-1] if fmt == "channels_last" else shape[2:]


def check_all_four(rng, x, dk, pk, strides, padding, fmt, dilation, dtype_name):
    """Every output of the four operators against the reference at SPEC tolerances."""
    kw = dict(strides=strides, padding=padding, data_format=fmt, dilation_rate=dilation)
    x64, dk64, pk64 = f64(x), f64(dk), f64(pk)
    ndim = x.ndim - 2
    n = x.shape[0]
    ktaps = math.prod(dk.shape[:ndim])
    cm = pk.shape[-2]
    dt = DTYPES[dtype_name]

    y = numbasep.depthwise_conv(x, dk, **kw)
    y_ref = ref.keras_depthwise(x64, dk64, **kw)
    assert_close(y, y_ref, dtype_name, ktaps, "depthwise_conv")
    out_pos = n * math.prod(spatial_of(y_ref.shape, fmt))

    s = numbasep.separable_conv(x, dk, pk, **kw)
    s_ref = ref.keras_separable(x64, dk64, pk64, **kw)
    assert_close(s, s_ref, dtype_name, ktaps * cm, "separable_conv")

    g = rng.uniform(-1, 1, y_ref.shape).astype(dt)
    dx, ddk = numbasep.depthwise_conv_grad(x, dk, g, **kw)
    dx_ref, ddk_ref = ref.keras_depthwise_grad(x64, dk64, f64(g), **kw)
    assert_close(dx, dx_ref, dtype_name, ktaps * dk.shape[-1], "depthwise_conv_grad d_inputs")
    assert_close(ddk, ddk_ref, dtype_name, out_pos, "depthwise_conv_grad d_kernel")

    g = rng.uniform(-1, 1, s_ref.shape).astype(dt)
    dx, ddk, dpk = numbasep.separable_conv_grad(x, dk, pk, g, **kw)
    dx_ref, ddk_ref, dpk_ref = ref.keras_separable_grad(x64, dk64, pk64, f64(g), **kw)
    f = pk.shape[-1]
    assert_close(dx, dx_ref, dtype_name, ktaps * cm * f, "separable_conv_grad d_inputs")
    assert_close(ddk, ddk_ref, dtype_name, out_pos * f, "separable_conv_grad d_depthwise")
    assert_close(dpk, dpk_ref, dtype_name, out_pos * ktaps, "separable_conv_grad d_pointwise")


# ------------------------------------------------------------------ SPEC section 8 shapes

B = 2
KERAS_DEPTHWISE_SHAPES = [
    # (inputs channels-last, kernel, strides, padding, dilation, expected channels-last)
    ((B, 20, 3), (4, 3, 1), 1, "valid", 1, (B, 17, 3)),
    ((B, 20, 3), (4, 3, 1), 1, "same", 1, (B, 20, 3)),
    ((B, 20, 3), (4, 3, 1), 2, "valid", 2, (B, 7, 3)),
    ((B, 10, 10, 3), (2, 2, 3, 1), 1, "valid", 1, (B, 9, 9, 3)),
    ((B, 10, 10, 3), (2, 2, 3, 1), (1, 2), "same", 1, (B, 10, 5, 3)),
    ((B, 10, 10, 3), (2, 2, 3, 1), 2, "valid", (2, 1), (B, 4, 5, 3)),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", KERAS_DEPTHWISE_SHAPES, ids=lambda c: f"{c[0]}-{c[3]}")
def test_keras_depthwise_shape_table(case, fmt):
    in_shape, k_shape, strides, padding, dilation, expected = case
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, layout(in_shape, fmt))
    dk = rng.uniform(-1, 1, k_shape)
    kw = dict(strides=strides, padding=padding, data_format=fmt, dilation_rate=dilation)
    y = numbasep.depthwise_conv(x, dk, **kw)
    assert y.shape == layout(expected, fmt)
    np.testing.assert_allclose(y, ref.keras_depthwise(x, dk, **kw), rtol=1e-12, atol=1e-12)
    dx, ddk = numbasep.depthwise_conv_grad(x, dk, np.ones(y.shape), **kw)
    assert dx.shape == x.shape and ddk.shape == dk.shape


@pytest.mark.parametrize("fmt", FORMATS)
def test_keras_separable_shape_table(fmt):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, layout((B, 10, 10, 3), fmt))
    dk = rng.uniform(-1, 1, (2, 2, 3, 2))
    pk = rng.uniform(-1, 1, (1, 1, 6, 5))
    kw = dict(strides=2, padding="valid", data_format=fmt, dilation_rate=(2, 1))
    y = numbasep.separable_conv(x, dk, pk, **kw)
    assert y.shape == layout((B, 4, 5, 5), fmt)
    np.testing.assert_allclose(y, ref.keras_separable(x, dk, pk, **kw), rtol=1e-12, atol=1e-12)
    grads = numbasep.separable_conv_grad(x, dk, pk, np.ones(y.shape), **kw)
    assert [g.shape for g in grads] == [x.shape, dk.shape, pk.shape]


def test_hand_checked_values():
    """Values worked out by hand, so that a wrong reference cannot hide a wrong operator."""
    x = np.ones((1, 5, 1))
    k = np.array([1.0, 10.0, 100.0]).reshape(3, 1, 1)
    # same, k=3: pad 1 each side -> [110, 111, 111, 111, 11]
    y = numbasep.depthwise_conv(x, k, padding="same")
    np.testing.assert_array_equal(y[0, :, 0], [110, 111, 111, 111, 11])
    # causal: left pad 2 -> [100, 110, 111, 111, 111]
    y = numbasep.depthwise_conv(x, k, padding="causal")
    np.testing.assert_array_equal(y[0, :, 0], [100, 110, 111, 111, 111])
    # causal, dilation 2, stride 2: left pad 4, outputs at 0, 2, 4
    y = numbasep.depthwise_conv(x, k, strides=2, padding="causal", dilation_rate=2)
    np.testing.assert_array_equal(y[0, :, 0], [100, 110, 111])
    # channels-first 2-D, multiplier 2, x[c] = c+1, kernel 1x1: y[c*M + m] = (c+1) * w[c, m]
    x = np.stack([np.full((3, 3), 1.0), np.full((3, 3), 2.0)])[None]
    k = np.array([[2.0, 3.0], [5.0, 7.0]]).reshape(1, 1, 2, 2)
    y = numbasep.depthwise_conv(x, k, data_format="channels_first")
    np.testing.assert_array_equal(y[0, :, 1, 1], [2, 3, 10, 14])
    pk = np.array([1.0, 1.0, 1.0, -1.0]).reshape(1, 1, 4, 1)
    s = numbasep.separable_conv(x, k, pk, data_format="channels_first")
    np.testing.assert_array_equal(s[0, 0], np.full((3, 3), 2 + 3 + 10 - 14))


# ------------------------------------------------------------ every rank, format, dtype

GEOMETRIES = {
    1: dict(n=2, spatial=(9,), c=3, kernel=(3,), m=2, f=4, cases=[
        (1, "valid", 1), (2, "same", 2), (3, "causal", 2), (2, "VALID", 3)]),
    2: dict(n=2, spatial=(7, 6), c=3, kernel=(3, 2), m=2, f=4, cases=[
        (1, "valid", 1), ((2, 1), "same", (1, 2)), ((1, 3), "valid", (2, 1)), (2, "Same", 2)]),
    3: dict(n=2, spatial=(5, 6, 4), c=2, kernel=(2, 3, 2), m=2, f=3, cases=[
        (1, "valid", 1), ((2, 1, 2), "same", (1, 2, 1)), (1, "same", 2), ((1, 2, 1), "valid", 2)]),
}


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_against_reference(ndim, fmt, dtype_name):
    g = GEOMETRIES[ndim]
    rng = np.random.default_rng(10 * ndim + len(fmt))
    for strides, padding, dilation in g["cases"]:
        x, dk, pk = make_inputs(rng, g["n"], g["spatial"], g["c"], g["kernel"], g["m"], g["f"],
                                fmt, dtype_name)
        check_all_four(rng, x, dk, pk, strides, padding, fmt, dilation, dtype_name)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_separable_16bit_intermediate_is_float32(fmt, dtype_name):
    """The depthwise intermediate z of a 16-bit separable conv is kept in float32.

    x = [1, 1, 0] in both channels, kernel taps [1, tiny] and [1, 0]: z = [1 + tiny, 1]
    and [1, 1]; the pointwise kernel [1, -1] gives y = [tiny, 0]. Every input and
    result is exact in the 16-bit type, but 1 + tiny is not: an intermediate
    rounded to 16 bits would give y = [0, 0]. Likewise, with g = [1, -1] the
    pointwise-kernel gradient is [tiny, 0] only if z stays in float32.
    """
    dt = DTYPES[dtype_name]
    tiny = 2.0 ** -10 if dtype_name == "bfloat16" else 2.0 ** -12
    x = np.ascontiguousarray(ref.to_first(
        np.array([1.0, 1.0, 0.0]).reshape(1, 3, 1).repeat(2, axis=2),
        fmt == "channels_first")).astype(dt)
    dk = np.array([[1.0, 1.0], [tiny, 0.0]]).reshape(2, 2, 1).astype(dt)
    pk = np.array([1.0, -1.0]).reshape(1, 2, 1).astype(dt)
    y = numbasep.separable_conv(x, dk, pk, data_format=fmt)
    assert y.dtype == dt
    assert y.shape == layout((1, 2, 1), fmt)
    np.testing.assert_array_equal(y.astype(np.float64).ravel(), [tiny, 0.0])
    g = np.array([1.0, -1.0]).reshape(y.shape).astype(dt)
    _, _, dpk = numbasep.separable_conv_grad(x, dk, pk, g, data_format=fmt)
    assert dpk.dtype == dt
    np.testing.assert_array_equal(dpk.astype(np.float64).ravel(), [tiny, 0.0])


# ------------------------------------------------------------------- hypothesis sweeps

@st.composite
def problems(draw, dtypes=tuple(DTYPES)):
    ndim = draw(st.integers(1, 3))
    fmt = draw(st.sampled_from(FORMATS))
    paddings = ["valid", "same"] + (["causal"] if ndim == 1 else [])
    padding = draw(st.sampled_from(paddings))
    kernel = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    strides = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    dilation = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
    spatial = []
    for k, r in zip(kernel, dilation):
        eff = (k - 1) * r + 1
        lo = eff if padding == "valid" else 1
        spatial.append(draw(st.integers(lo, lo + (5 if ndim < 3 else 3))))
    # an int when all dims agree, sometimes, to exercise both spellings
    if len(set(strides)) == 1 and draw(st.booleans()):
        strides = strides[0]
    if len(set(dilation)) == 1 and draw(st.booleans()):
        dilation = dilation[0]
    return dict(
        ndim=ndim, fmt=fmt, padding=draw(st.sampled_from([padding, padding.upper()])),
        kernel=kernel, strides=strides, dilation=dilation, spatial=tuple(spatial),
        n=draw(st.integers(1, 2)), c=draw(st.integers(1, 3)), m=draw(st.integers(1, 3)),
        f=draw(st.integers(1, 4)), dtype_name=draw(st.sampled_from(dtypes)),
        contiguous=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
    )


@given(problems())
def test_sweep_against_reference(p):
    rng = np.random.default_rng(p["seed"])
    x, dk, pk = make_inputs(rng, p["n"], p["spatial"], p["c"], p["kernel"], p["m"], p["f"],
                            p["fmt"], p["dtype_name"], p["contiguous"])
    check_all_four(rng, x, dk, pk, p["strides"], p["padding"], p["fmt"], p["dilation"],
                   p["dtype_name"])


# ------------------------------------------------------------------------- gradients

def _vdot(a, b):
    return float(np.vdot(f64(a), f64(b)))


def _assert_same_number(a, b, scale):
    assert abs(a - b) <= 1e-11 * max(1.0, scale), (a, b)


@given(problems(dtypes=("float64",)))
def test_adjoint_identities(p):
    """For maps linear in one argument: <f(.., a, ..), g> = <a, d_a> for every argument a."""
    rng = np.random.default_rng(p["seed"])
    x, dk, pk = make_inputs(rng, p["n"], p["spatial"], p["c"], p["kernel"], p["m"], p["f"],
                            p["fmt"], "float64", p["contiguous"])
    kw = dict(strides=p["strides"], padding=p["padding"], data_format=p["fmt"],
              dilation_rate=p["dilation"])

    y = numbasep.depthwise_conv(x, dk, **kw)
    g = rng.standard_normal(y.shape)
    lhs = _vdot(y, g)
    dx, ddk = numbasep.depthwise_conv_grad(x, dk, g, **kw)
    scale = np.abs(y).sum() * np.abs(g).max()
    _assert_same_number(lhs, _vdot(x, dx), scale)
    _assert_same_number(lhs, _vdot(dk, ddk), scale)

    s = numbasep.separable_conv(x, dk, pk, **kw)
    g = rng.standard_normal(s.shape)
    lhs = _vdot(s, g)
    dx, ddk, dpk = numbasep.separable_conv_grad(x, dk, pk, g, **kw)
    scale = np.abs(s).sum() * np.abs(g).max() + 1.0
    _assert_same_number(lhs, _vdot(x, dx), scale)
    _assert_same_number(lhs, _vdot(dk, ddk), scale)
    _assert_same_number(lhs, _vdot(pk, dpk), scale)


FD_CASES = [
    # ndim, spatial, kernel, strides, padding, dilation
    (1, (7,), (3,), 2, "causal", 2),
    (1, (8,), (2,), 3, "same", 1),
    (2, (5, 6), (2, 3), (2, 1), "same", (1, 2)),
    (2, (6, 5), (3, 2), (1, 2), "valid", (2, 1)),
    (3, (4, 3, 5), (2, 1, 2), (1, 1, 2), "same", (2, 1, 1)),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", FD_CASES, ids=lambda c: f"{c[0]}d-{c[4]}")
def test_finite_differences(case, fmt):
    """Central differences of L = <f(args), g> in float64 for every returned gradient."""
    ndim, spatial, kernel, strides, padding, dilation = case
    rng = np.random.default_rng(7)
    x, dk, pk = make_inputs(rng, 2, spatial, 2, kernel, 2, 3, fmt, "float64")
    kw = dict(strides=strides, padding=padding, data_format=fmt, dilation_rate=dilation)
    eps = 1e-3

    def check(loss, args, grads, name):
        for i, (a, grad) in enumerate(zip(args, grads)):
            assert grad.shape == a.shape and grad.dtype == a.dtype
            # a handful of coordinates plus two random directions
            flat = rng.choice(a.size, size=min(a.size, 6), replace=False)
            dirs = [np.eye(1, a.size, j).reshape(a.shape) for j in flat]
            dirs += [rng.standard_normal(a.shape) for _ in range(2)]
            for v in dirs:
                plus = list(args)
                minus = list(args)
                plus[i] = a + eps * v
                minus[i] = a - eps * v
                fd = (loss(*plus) - loss(*minus)) / (2 * eps)
                an = _vdot(grad, v)
                assert abs(fd - an) <= 1e-7 * (1 + abs(an)), (name, i, fd, an)

    y = numbasep.depthwise_conv(x, dk, **kw)
    g = rng.standard_normal(y.shape)
    check(lambda a, b: _vdot(numbasep.depthwise_conv(a, b, **kw), g), (x, dk),
          numbasep.depthwise_conv_grad(x, dk, g, **kw), "depthwise_conv_grad")

    s = numbasep.separable_conv(x, dk, pk, **kw)
    g = rng.standard_normal(s.shape)
    check(lambda a, b, c: _vdot(numbasep.separable_conv(a, b, c, **kw), g), (x, dk, pk),
          numbasep.separable_conv_grad(x, dk, pk, g, **kw), "separable_conv_grad")


# ------------------------------------------------------------- data_format / padding

def test_data_format_none_follows_config(image_format):
    rng = np.random.default_rng(3)
    x_last = rng.standard_normal((2, 6, 5, 3))
    x_first = np.ascontiguousarray(np.moveaxis(x_last, -1, 1))
    dk = rng.standard_normal((3, 2, 3, 2))
    pk = rng.standard_normal((1, 1, 6, 4))

    assert config.image_data_format() == "channels_last"
    y = numbasep.depthwise_conv(x_last, dk, padding="same")
    np.testing.assert_array_equal(
        y, numbasep.depthwise_conv(x_last, dk, padding="same", data_format="channels_last"))
    assert y.shape == (2, 6, 5, 6)

    image_format("channels_first")
    assert config.image_data_format() == "channels_first"
    kw = dict(strides=(2, 1), padding="same", dilation_rate=(1, 2))
    explicit = dict(kw, data_format="channels_first")
    y = numbasep.depthwise_conv(x_first, dk, **kw)
    assert y.shape == (2, 6, 3, 5)
    np.testing.assert_array_equal(y, numbasep.depthwise_conv(x_first, dk, **explicit))
    np.testing.assert_allclose(y, ref.keras_depthwise(x_first, dk, **explicit), atol=1e-12)
    s = numbasep.separable_conv(x_first, dk, pk, **kw)
    np.testing.assert_array_equal(s, numbasep.separable_conv(x_first, dk, pk, **explicit))
    assert s.shape == (2, 4, 3, 5)
    for a, b in zip(numbasep.depthwise_conv_grad(x_first, dk, y, **kw),
                    numbasep.depthwise_conv_grad(x_first, dk, y, **explicit)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(numbasep.separable_conv_grad(x_first, dk, pk, s, **kw),
                    numbasep.separable_conv_grad(x_first, dk, pk, s, **explicit)):
        np.testing.assert_array_equal(a, b)
    # read as channels-first, the (2, 6, 5, 3) array has 6 channels, not the kernel's 3
    with pytest.raises(numbasep.InvalidArgumentError, match="input channels"):
        numbasep.depthwise_conv(x_last, dk)

    image_format("channels_last")
    assert numbasep.depthwise_conv(x_last, dk).shape == (2, 4, 4, 6)


def test_set_image_data_format_rejects_bad_values(image_format):
    with pytest.raises(numbasep.InvalidArgumentError, match="data_format"):
        image_format("NHWC")
    assert config.image_data_format() == "channels_last"
    image_format("Channels_First")
    assert config.image_data_format() == "channels_first"


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_padding_is_case_insensitive(ndim):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1,) + (5,) * ndim + (2,))
    dk = rng.standard_normal((3,) * ndim + (2, 1))
    pk = rng.standard_normal((1,) * ndim + (2, 3))
    spellings = {"valid": ["VALID", "Valid", "vALiD"], "same": ["SAME", "Same", "sAmE"]}
    if ndim == 1:
        spellings["causal"] = ["CAUSAL", "Causal"]
    for lower, others in spellings.items():
        y = numbasep.depthwise_conv(x, dk, padding=lower)
        s = numbasep.separable_conv(x, dk, pk, padding=lower)
        dy = numbasep.depthwise_conv_grad(x, dk, np.ones(y.shape), padding=lower)
        for p in others:
            np.testing.assert_array_equal(numbasep.depthwise_conv(x, dk, padding=p), y)
            np.testing.assert_array_equal(numbasep.separable_conv(x, dk, pk, padding=p), s)
            for a, b in zip(numbasep.depthwise_conv_grad(x, dk, np.ones(y.shape), padding=p),
                            dy):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n, k, s, r", [(9, 3, 1, 1), (9, 3, 2, 2), (10, 4, 3, 1),
                                        (7, 2, 4, 3), (2, 3, 1, 1), (1, 4, 2, 2)])
def test_causal_1d(n, k, s, r, fmt):
    """Left padding (k-1)*r, output length ceil(n/s), output o sees only x[: o*s + 1]."""
    rng = np.random.default_rng(n * 100 + k * 10 + s)
    c, m = 2, 2
    x_last = rng.standard_normal((2, n, c))
    dk = rng.standard_normal((k, c, m))
    x = np.ascontiguousarray(ref.to_first(x_last, fmt == "channels_first"))
    y = numbasep.depthwise_conv(x, dk, strides=s, padding="causal", data_format=fmt,
                                dilation_rate=r)
    out = -(-n // s)
    assert y.shape == layout((2, out, c * m), fmt)
    # the same result by padding by hand and doing a valid convolution
    padded = np.concatenate([np.zeros((2, (k - 1) * r, c)), x_last], axis=1)
    by_hand = ref.forward(padded, dk, (s,), (r,), (0,), (out,))
    y_last = ref.to_last(y, fmt == "channels_first")
    np.testing.assert_allclose(y_last, by_hand, rtol=1e-12, atol=1e-12)
    # causality: changing x at position i changes no output before ceil(i/s)
    for i in range(n):
        x2 = x_last.copy()
        x2[:, i, :] += 1.0
        y2 = ref.to_last(numbasep.depthwise_conv(
            np.ascontiguousarray(ref.to_first(x2, fmt == "channels_first")), dk, strides=s,
            padding="causal", data_format=fmt, dilation_rate=r), fmt == "channels_first")
        first = -(-i // s)
        np.testing.assert_array_equal(y2[:, :first], y_last[:, :first])
    # gradients of the causal op agree with the reference
    g = rng.standard_normal(y.shape)
    dx, ddk = numbasep.depthwise_conv_grad(x, dk, g, strides=s, padding="causal",
                                           data_format=fmt, dilation_rate=r)
    dx_ref, ddk_ref = ref.keras_depthwise_grad(x, dk, g, strides=s, padding="causal",
                                               data_format=fmt, dilation_rate=r)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ddk, ddk_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("ndim", [2, 3])
def test_causal_rejected_beyond_1d(ndim, func):
    x = np.zeros((1,) + (4,) * ndim + (2,))
    dk = np.zeros((2,) * ndim + (2, 1))
    pk = np.zeros((1,) * ndim + (2, 3))
    args = {
        "depthwise_conv": (x, dk),
        "separable_conv": (x, dk, pk),
        "depthwise_conv_grad": (x, dk, np.zeros((1,) + (4,) * ndim + (2,))),
        "separable_conv_grad": (x, dk, pk, np.zeros((1,) + (4,) * ndim + (3,))),
    }[func]
    with pytest.raises(numbasep.InvalidArgumentError, match=f"causal.*1-D.*{ndim}-D"):
        getattr(numbasep, func)(*args, padding="causal")


# --------------------------------------------------------------------------- out=

@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_out_argument(fmt, dtype_name):
    rng = np.random.default_rng(5)
    dt = DTYPES[dtype_name]
    x, dk, pk = make_inputs(rng, 2, (6, 5), 3, (3, 2), 2, 4, fmt, dtype_name)
    kw = dict(strides=(2, 1), padding="same", data_format=fmt, dilation_rate=(1, 2))
    y = numbasep.depthwise_conv(x, dk, **kw)
    s = numbasep.separable_conv(x, dk, pk, **kw)

    # contiguous and strided outs, pre-filled with NaN: every element is overwritten
    def outs_like(a):
        plain = np.full(a.shape, np.nan, dt)
        strided = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, dt)[..., 1::2]
        return [plain, strided]

    for o in outs_like(y):
        r = numbasep.depthwise_conv(x, dk, **kw, out=o)
        assert r is o
        np.testing.assert_array_equal(o, y)
    for o in outs_like(s):
        r = numbasep.separable_conv(x, dk, pk, **kw, out=o)
        assert r is o
        np.testing.assert_array_equal(o, s)

    g = rng.uniform(-1, 1, y.shape).astype(dt)
    want = numbasep.depthwise_conv_grad(x, dk, g, **kw)
    for which in range(2):
        outs = [None, None]
        outs[which] = outs_like(want[which])[1]
        got = numbasep.depthwise_conv_grad(x, dk, g, **kw, out=tuple(outs))
        assert got[which] is outs[which]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)

    g = rng.uniform(-1, 1, s.shape).astype(dt)
    want = numbasep.separable_conv_grad(x, dk, pk, g, **kw)
    outs = [np.full(w.shape, np.nan, dt) for w in want]
    got = numbasep.separable_conv_grad(x, dk, pk, g, **kw, out=outs)
    for a, b, o in zip(got, want, outs):
        assert a is o
        np.testing.assert_array_equal(a, b)
    got = numbasep.separable_conv_grad(x, dk, pk, g, **kw, out=(None, outs[1], None))
    assert got[1] is outs[1]


def test_out_argument_rejected():
    x = np.zeros((1, 5, 2), np.float32)
    dk = np.zeros((3, 2, 1), np.float32)
    pk = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(numbasep.InvalidArgumentError, match=r"out must have shape \(1, 3, 2\)"):
        numbasep.depthwise_conv(x, dk, out=np.zeros((1, 5, 2), np.float32))
    with pytest.raises(TypeError, match="out must have dtype float32, got float64"):
        numbasep.depthwise_conv(x, dk, out=np.zeros((1, 3, 2)))
    with pytest.raises(TypeError, match="out must be a numpy.ndarray"):
        numbasep.depthwise_conv(x, dk, out=[[0.0, 0.0]] * 3)
    with pytest.raises(numbasep.InvalidArgumentError, match=r"out must have shape \(1, 3, 4\)"):
        numbasep.separable_conv(x, dk, pk, out=np.zeros((1, 3, 2), np.float32))
    g = np.zeros((1, 3, 2), np.float32)
    with pytest.raises(numbasep.InvalidArgumentError, match="tuple of 2"):
        numbasep.depthwise_conv_grad(x, dk, g, out=np.zeros((1, 5, 2), np.float32))
    with pytest.raises(numbasep.InvalidArgumentError, match=r"out\[1\] must have shape"):
        numbasep.depthwise_conv_grad(x, dk, g, out=(None, np.zeros((3, 2, 2), np.float32)))
    with pytest.raises(numbasep.InvalidArgumentError, match="tuple of 3"):
        numbasep.separable_conv_grad(x, dk, pk, np.zeros((1, 3, 4), np.float32),
                                     out=(None, None))


def test_out_sharing_memory_with_an_argument_is_refused():
    """Every kernel reads its arguments while it writes: an ``out`` that overlaps one
    is refused before anything is written, on the checking path and on the
    repeated-call path alike. Views that interleave in one buffer do not overlap."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (2, 6, 6, 8)).astype(np.float32)
    k = rng.uniform(-1, 1, (3, 3, 8, 1)).astype(np.float32)
    g = rng.uniform(-1, 1, (2, 6, 6, 8)).astype(np.float32)
    kw = dict(padding="same", data_format="channels_last")
    want = numbasep.depthwise_conv(x, k, **kw)
    # the first call with this key passes the checks and is remembered; the second
    # (same shapes, strides and dtypes) takes the repeated-call path
    numbasep.depthwise_conv(x, k, **kw, out=np.empty_like(x))
    for attempt in range(2):
        xs = x.copy()
        with pytest.raises(numbasep.InvalidArgumentError, match="out shares memory with inputs"):
            numbasep.depthwise_conv(xs, k, **kw, out=xs)
        np.testing.assert_array_equal(xs, x)
    with pytest.raises(numbasep.InvalidArgumentError,
                       match="out shares memory with out_backprop"):
        gs = g.copy()
        numbasep.depthwise_conv2d_native_backprop_input(
            list(x.shape), k, gs, [1, 1, 1, 1], "SAME", out=gs)
    with pytest.raises(numbasep.InvalidArgumentError, match="out shares memory with input"):
        xs = x.copy()
        numbasep.depthwise_conv2d_native_backprop_filter(
            xs, list(k.shape), g, [1, 1, 1, 1], "SAME",
            out=xs.reshape(-1)[:k.size].reshape(k.shape))
    # the two gradients' outs carved from one buffer, overlapping each other
    flat = np.empty(x.size + k.size, np.float32)
    with pytest.raises(numbasep.InvalidArgumentError,
                       match=r"out\[1\] shares memory with out\[0\]"):
        numbasep.depthwise_conv_grad(x, k, g, **kw, out=(flat[:x.size].reshape(x.shape),
                                                          flat[4:4 + k.size].reshape(k.shape)))
    # ... and side by side: accepted
    dx, dk = numbasep.depthwise_conv_grad(x, k, g, **kw, out=(
        flat[:x.size].reshape(x.shape), flat[x.size:].reshape(k.shape)))
    ref_dx, ref_dk = numbasep.depthwise_conv_grad(x, k, g, **kw)
    np.testing.assert_array_equal(dx, ref_dx)
    np.testing.assert_array_equal(dk, ref_dk)
    # the input and the output interleaved channel by channel in one buffer
    buf = np.empty(x.shape[:-1] + (2 * x.shape[-1],), np.float32)
    buf[..., ::2] = x
    got = numbasep.depthwise_conv(buf[..., ::2], k, **kw, out=buf[..., 1::2])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(buf[..., ::2], x)
    pk = rng.uniform(-1, 1, (1, 1, 8, 8)).astype(np.float32)
    with pytest.raises(numbasep.InvalidArgumentError, match="out shares memory with inputs"):
        numbasep.separable_conv(x, k, pk, **kw, out=x)
    with pytest.raises(numbasep.InvalidArgumentError,
                       match=r"out\[2\] shares memory with pointwise_kernel"):
        numbasep.separable_conv_grad(x, k, pk, g, **kw, out=(None, None, pk))


# ------------------------------------------------------------------ special values, sizes

@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_and_inf_propagate(fmt):
    x_last = np.ones((1, 8, 1))
    x_last[0, 3, 0] = np.nan
    x_last[0, 6, 0] = np.inf
    x = np.ascontiguousarray(ref.to_first(x_last, fmt == "channels_first"))
    dk = np.ones((3, 1, 1))
    y = ref.to_last(numbasep.depthwise_conv(x, dk, padding="same", data_format=fmt),
                    fmt == "channels_first")[0, :, 0]
    # output o sees inputs o-1..o+1: NaN reaches 2..4, +inf (and no NaN) 5..7
    assert np.isnan(y[2:5]).all()
    assert np.isposinf(y[5:8]).all()
    np.testing.assert_array_equal(y[:2], [2.0, 3.0])
    pk = np.ones((1, 1, 1))
    s = numbasep.separable_conv(x, dk, pk, padding="same", data_format=fmt)
    np.testing.assert_array_equal(np.isnan(s).ravel(), np.isnan(y))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shapes", [
    # inputs (channels-last), depthwise kernel, pointwise kernel
    ((0, 5, 5, 3), (3, 3, 3, 2), (1, 1, 6, 4)),     # batch 0
    ((2, 5, 5, 0), (3, 3, 0, 2), (1, 1, 0, 4)),     # channels 0
    ((2, 5, 5, 3), (3, 3, 3, 0), (1, 1, 0, 4)),     # multiplier 0
    ((2, 5, 5, 3), (3, 3, 3, 1), (1, 1, 3, 0)),     # filters 0
    ((2, 0, 5, 3), (3, 3, 3, 1), (1, 1, 3, 4)),     # spatial 0 (same padding)
], ids=["batch0", "chan0", "mult0", "filters0", "spatial0"])
def test_zero_size(shapes, fmt):
    x_shape, k_shape, p_shape = shapes
    x = np.ones(layout(x_shape, fmt), np.float32)
    dk = np.ones(k_shape, np.float32)
    pk = np.ones(p_shape, np.float32)
    kw = dict(padding="same", data_format=fmt)
    y = numbasep.depthwise_conv(x, dk, **kw)
    y_ref = ref.keras_depthwise(x, dk, **kw)
    assert y.shape == y_ref.shape
    s = numbasep.separable_conv(x, dk, pk, **kw)
    s_ref = ref.keras_separable(x, dk, pk, **kw)
    assert s.shape == s_ref.shape
    np.testing.assert_array_equal(s, s_ref)
    dx, ddk = numbasep.depthwise_conv_grad(x, dk, np.ones(y.shape, np.float32), **kw)
    for a, b in zip((dx, ddk), ref.keras_depthwise_grad(x, dk, np.ones(y.shape), **kw)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    got = numbasep.separable_conv_grad(x, dk, pk, np.ones(s.shape, np.float32), **kw)
    for a, b in zip(got, ref.keras_separable_grad(x, dk, pk, np.ones(s.shape), **kw)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
