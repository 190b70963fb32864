"""The TensorFlow raw-op family against the float64 reference (tests/reference.py).

Covers SPEC sections 1-3, 5, 6 and 8 for ``numbasep.depthwise_conv2d_native``,
``..._backprop_input``, ``..._backprop_filter`` and their ``numbasep.raw_ops``
spellings: TensorFlow's own configurations, hypothesis sweeps over geometry and
dtypes, adjoint identities, layouts of the argument arrays, empty tensors,
NaN/Inf propagation, ``out=`` and the thread-count independence of the filter
gradient.

Inputs are drawn at random, cast to the dtype under test, and the reference is
fed those *quantised* values (as float64), so the comparison measures the
operator's arithmetic, not the rounding of its inputs.
"""

import subprocess
import sys
import textwrap
from functools import lru_cache

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import numbasep
import reference as ref
from numbasep import InvalidArgumentError, raw_ops

FMTS = ("NHWC", "NCHW")
OPS = ("forward", "backprop_input", "backprop_filter")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64))
DTYPE_IDS = [d.name for d in DTYPES]

# SPEC section 6: atol = rtol, TensorFlow's own test tolerances.
TOL = {"float16": 4e-2, "bfloat16": 1e-2, "float32": 1e-5, "float64": 1e-12}
# Unit roundoff of the accumulation type (float32 for everything but float64).
ACC_EPS = {"float16": 2.0**-24, "bfloat16": 2.0**-24, "float32": 2.0**-24, "float64": 2.0**-53}


def tolerance(dtype, padding="SAME", large_sums=False):
    t = TOL[np.dtype(dtype).name]
    if np.dtype(dtype) == BF16 and padding == "EXPLICIT":
        t = 2e-2
    if np.dtype(dtype) == np.float32 and large_sums:
        t = 1e-4
    return t


# ------------------------------------------------------------------ helpers

def to_nchw(a):
    return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def to_nhwc(a):
    return np.ascontiguousarray(np.transpose(a, (0, 2, 3, 1)))


def attrs(fmt, strides=(1, 1), dilations=(1, 1), pads=None):
    """(strides, dilations, explicit_paddings) lists in data_format order.

    ``pads`` is ((top, bottom), (left, right)) or None.
    """
    (sh, sw), (rh, rw) = strides, dilations
    if fmt == "NHWC":
        s4, d4 = [1, sh, sw, 1], [1, rh, rw, 1]
        e8 = [] if pads is None else [0, 0, *pads[0], *pads[1], 0, 0]
    else:
        s4, d4 = [1, 1, sh, sw], [1, 1, rh, rw]
        e8 = [] if pads is None else [0, 0, 0, 0, *pads[0], *pads[1]]
    return s4, d4, e8


def layout_shape(nhwc_shape, fmt):
    n, h, w, c = nhwc_shape
    return (n, h, w, c) if fmt == "NHWC" else (n, c, h, w)


def rand(rng, shape, dtype, lo=-1.0, hi=1.0):
    """Random values already rounded to ``dtype`` (the reference reads them as float64)."""
    if 0 in shape:      # empty, possibly with huge other dimensions
        return np.zeros(shape, dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def f64(a):
    return np.asarray(a).astype(np.float64)


def run_op(op, fmt, x, w, dy, s4, padding, e8, d4, **kw):
    """Call one of the three operators on (x, w, dy); the unused one only gives a shape."""
    if op == "forward":
        return numbasep.depthwise_conv2d_native(x, w, s4, padding, e8, fmt, d4, **kw)
    if op == "backprop_input":
        return numbasep.depthwise_conv2d_native_backprop_input(
            list(x.shape), w, dy, s4, padding, e8, fmt, d4, **kw)
    return numbasep.depthwise_conv2d_native_backprop_filter(
        x, list(w.shape), dy, s4, padding, e8, fmt, d4, **kw)


def ref_op(op, fmt, x, w, dy, s4, padding, e8, d4):
    if op == "forward":
        return ref.raw_forward(f64(x), f64(w), s4, padding, e8, fmt, d4)
    if op == "backprop_input":
        return ref.raw_backprop_input(x.shape, f64(w), f64(dy), s4, padding, e8, fmt, d4)
    return ref.raw_backprop_filter(f64(x), w.shape, f64(dy), s4, padding, e8, fmt, d4)


def assert_close(got, want, tol, extra=0.0, what=""):
    """|got - want| <= tol * (1 + |want|) + extra, elementwise (NaN fails)."""
    got = f64(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != reference {want.shape}"
    err = np.abs(got - want)
    bound = tol * (1.0 + np.abs(want)) + extra
    bad = ~(err <= bound)
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), got.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.size} elements out of tolerance; worst at "
            f"{tuple(int(v) for v in i)}: got {got[i]!r}, reference {want[i]!r}, "
            f"bound {np.broadcast_to(bound, got.shape)[i]!r}")


# ------------------------------------------------------------------ SPEC section 8

CONFIGS = [
    ([4, 5, 5, 48],    [1, 1, 48, 2], [4, 5, 5, 96],     1, "SAME",  None),
    ([4, 8, 8, 84],    [1, 3, 84, 1], [4, 8, 8, 84],     1, "SAME",  None),
    ([4, 17, 17, 48],  [3, 1, 48, 4], [4, 17, 17, 192],  1, "SAME",  None),
    ([4, 9, 27, 8],    [3, 3, 8, 1],  [4, 9, 27, 8],     1, "SAME",  None),
    ([4, 31, 31, 7],   [3, 3, 7, 1],  [4, 31, 31, 7],    1, "SAME",  None),
    ([4, 35, 35, 2],   [5, 5, 2, 1],  [4, 35, 35, 2],    1, "SAME",  None),
    ([4, 147, 147, 2], [3, 3, 2, 8],  [4, 49, 49, 16],   3, "VALID", None),
    ([3, 299, 299, 3], [3, 2, 3, 8],  [3, 150, 150, 24], 2, "SAME",  None),
    ([5, 183, 183, 1], [5, 5, 1, 2],  [5, 92, 92, 2],    2, "SAME",  None),
    ([5, 183, 183, 1], [5, 5, 1, 2],  [5, 183, 183, 2],  1, "SAME",  [2, 2]),
    ([5, 41, 35, 2],   [4, 7, 2, 2],  [5, 32, 23, 4],    1, "VALID", [3, 2]),
]
CONFIGS_EXPLICIT = [  # padding given as [[top, bottom], [left, right]]
    ([4, 5, 5, 48],    [1, 1, 48, 2], [4, 8, 12, 96],    1, [[1, 2], [3, 4]],     None),
    ([4, 1, 1, 3],     [3, 3, 3, 2],  [4, 29, 39, 6],    1, [[10, 20], [15, 25]], None),
    ([4, 9, 27, 8],    [3, 3, 8, 1],  [4, 14, 31, 8],    1, [[3, 4], [4, 2]],     None),
    ([4, 31, 31, 7],   [3, 3, 7, 1],  [4, 29, 29, 7],    1, [[0, 0], [0, 0]],     None),
    ([3, 299, 299, 3], [3, 2, 3, 8],  [3, 150, 153, 24], 2, [[1, 2], [3, 5]],     None),
    ([5, 183, 183, 1], [5, 5, 1, 2],  [5, 62, 60, 2],    3, [[3, 2], [1, 0]],     None),
    ([5, 29, 31, 1],   [5, 4, 1, 2],  [5, 26, 23, 2],    1, [[3, 2], [1, 0]],     [2, 3]),
    ([4, 5, 5, 48],    [3, 3, 48, 1], [4, 5, 5, 48],     1, [[0, 2], [0, 2]],     None),
    ([1, 8, 7, 2],     [8, 7, 2, 1],  [1, 8, 7, 2],      1, [[0, 7], [3, 3]],     None),
    ([2, 4, 3, 2],     [3, 2, 2, 1],  [2, 4, 3, 2],      1, [[2, 0], [1, 0]],     None),
]
ALL_CONFIGS = CONFIGS + CONFIGS_EXPLICIT
CONFIG_IDS = [f"cfg{i}-{'x'.join(map(str, c[0]))}-{'x'.join(map(str, c[1]))}"
              for i, c in enumerate(ALL_CONFIGS)]


def config_attrs(i, fmt):
    _, _, _, stride, padding, dil = ALL_CONFIGS[i]
    pads = None
    if not isinstance(padding, str):
        pads, padding = padding, "EXPLICIT"
    s4, d4, e8 = attrs(fmt, (stride, stride), tuple(dil or (1, 1)), pads)
    return s4, padding, e8, d4


@lru_cache(maxsize=None)
def config_data(i):
    """float32 NHWC operands of configuration ``i`` and the float64 reference results."""
    in_shape, f_shape, out_shape = ALL_CONFIGS[i][:3]
    rng = np.random.default_rng(1000 + i)
    x = rand(rng, in_shape, np.float32)
    w = rand(rng, f_shape, np.float32)
    dy = rand(rng, out_shape, np.float32)
    s4, padding, e8, d4 = config_attrs(i, "NHWC")
    y = ref.raw_forward(f64(x), f64(w), s4, padding, e8, "NHWC", d4)
    dx = ref.raw_backprop_input(in_shape, f64(w), f64(dy), s4, padding, e8, "NHWC", d4)
    dw = ref.raw_backprop_filter(f64(x), f_shape, f64(dy), s4, padding, e8, "NHWC", d4)
    # sum of |products| per filter element: the scale of float32 accumulation error
    dw_abs = ref.raw_backprop_filter(np.abs(f64(x)), f_shape, np.abs(f64(dy)), s4, padding,
                                     e8, "NHWC", d4)
    return x, w, dy, {"forward": y, "backprop_input": dx, "backprop_filter": dw,
                      "backprop_filter_abs": dw_abs}


@pytest.mark.parametrize("i", range(len(ALL_CONFIGS)), ids=CONFIG_IDS)
def test_reference_reproduces_tensorflow_output_shapes(i):
    """The reference's geometry gives the output shapes TensorFlow's tests state."""
    x, w, dy, want = config_data(i)
    assert want["forward"].shape == tuple(ALL_CONFIGS[i][2])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("i", range(len(ALL_CONFIGS)), ids=CONFIG_IDS)
def test_tensorflow_configurations_float32(i, fmt, op):
    x, w, dy, want = config_data(i)
    want = want[op]
    s4, padding, e8, d4 = config_attrs(i, fmt)
    if fmt == "NCHW":
        x, dy = to_nchw(x), to_nchw(dy)
        if op != "backprop_filter":
            want = to_nchw(want)
    got = run_op(op, fmt, x, w, dy, s4, padding, e8, d4)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    extra = 0.0
    if op == "backprop_filter":
        # N*OH*OW terms (up to 67500) of both signs: where they cancel, |reference| is
        # small but float32 rounding scales with the sum of |terms|. Allow a few units of
        # float32 roundoff of that sum on top of SPEC's "large sums" 1e-4 (a lost product
        # of these O(1) values is still far outside the bound).
        extra = 8 * ACC_EPS["float32"] * config_data(i)[3]["backprop_filter_abs"]
    tol = tolerance(np.float32, padding, large_sums=(op == "backprop_filter"))
    assert_close(got, want, tol, extra, what=f"{op} {fmt}")


@pytest.mark.parametrize("fmt", FMTS)
def test_hand_checked_forward_case(fmt):
    x = np.arange(1, 13, dtype=np.float32).reshape(1, 2, 3, 2)
    w = np.arange(1, 17, dtype=np.float32).reshape(2, 2, 2, 2)
    expected = np.array([196, 216, 272, 296, 252, 280, 344, 376], np.float32)
    s4, d4, _ = attrs(fmt)
    xin = x if fmt == "NHWC" else to_nchw(x)
    y = numbasep.depthwise_conv2d_native(xin, w, s4, "VALID", data_format=fmt)
    assert y.shape == layout_shape((1, 1, 2, 4), fmt)
    y = y if fmt == "NHWC" else to_nhwc(y)
    np.testing.assert_array_equal(y.ravel(), expected)
    y2 = raw_ops.DepthwiseConv2dNative(input=xin, filter=w, strides=s4, padding="VALID",
                                       data_format=fmt, name="hand_checked")
    y2 = y2 if fmt == "NHWC" else to_nhwc(y2)
    np.testing.assert_array_equal(y2.ravel(), expected)
    # and the reference agrees with the hand-checked numbers
    np.testing.assert_array_equal(ref.raw_forward(x, w, [1, 1, 1, 1], "VALID").ravel(),
                                  expected)


# Common filter shapes, each through the interior and the borders of the input, with
# unit and non-unit strides and dilations (kernels may specialise on the filter shape).
FILTER_SHAPES = [(1, 1), (1, 3), (3, 1), (1, 5), (2, 2), (3, 3), (5, 5), (7, 7)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("k", FILTER_SHAPES, ids=[f"{a}x{b}" for a, b in FILTER_SHAPES])
def test_common_filter_shapes(k, fmt, op):
    rng = np.random.default_rng(k[0] * 10 + k[1])
    x = rand(rng, layout_shape((2, 13, 12, 3), fmt), np.float32)
    w = rand(rng, (*k, 3, 1), np.float32)
    for strides, dil, padding, pads in (((1, 1), (1, 1), "SAME", None),
                                        ((2, 1), (1, 2), "EXPLICIT", ((1, 3), (2, 0))),
                                        ((1, 3), (2, 1), "VALID", None)):
        s4, d4, e8 = attrs(fmt, strides, dil, pads)
        g = ref.raw_geometry(x.shape, w.shape, s4, padding, e8, fmt, d4)
        dy = rand(rng, g["output_shape"], np.float32)
        got = run_op(op, fmt, x, w, dy, s4, padding, e8, d4)
        want = ref_op(op, fmt, x, w, dy, s4, padding, e8, d4)
        assert_close(got, want, tolerance(np.float32, padding, op == "backprop_filter"),
                     what=f"{op} {fmt} {k} {strides} {dil} {padding}")


# ------------------------------------------------------------------ hypothesis sweeps

class Problem:
    """One randomly drawn raw-op problem (NHWC sizes; laid out per ``fmt``)."""

    def __init__(self, fmt, padding, n, h, w, c, m, kh, kw, sh, sw, rh, rw, pads, dtype, seed):
        self.fmt, self.padding, self.dtype, self.seed = fmt, padding, dtype, seed
        self.n, self.h, self.w, self.c, self.m = n, h, w, c, m
        self.kh, self.kw = kh, kw
        self.s4, self.d4, self.e8 = attrs(fmt, (sh, sw), (rh, rw),
                                          pads if padding == "EXPLICIT" else None)
        self.input_shape = layout_shape((n, h, w, c), fmt)
        self.filter_shape = (kh, kw, c, m)
        self.geom = ref.raw_geometry(self.input_shape, self.filter_shape, self.s4, padding,
                                     self.e8, fmt, self.d4)

    @property
    def valid(self):
        return self.geom["output_shape"] is not None

    def args(self):
        return self.s4, self.padding, self.e8, self.d4

    def operands(self, dtype=None):
        dtype = dtype or self.dtype
        rng = np.random.default_rng(self.seed)
        x = rand(rng, self.input_shape, dtype)
        w = rand(rng, self.filter_shape, dtype)
        dy = rand(rng, self.geom["output_shape"], dtype)
        return x, w, dy

    def terms(self, op):
        """Upper bound on the number of products summed into one result element."""
        if op == "forward":
            return self.kh * self.kw
        if op == "backprop_input":
            return self.kh * self.kw * self.m
        oh, ow = self.geom["out_sizes"]
        return max(1, self.n * oh * ow)

    def __repr__(self):
        return (f"Problem({self.fmt}, {self.padding}, input={self.input_shape}, "
                f"filter={self.filter_shape}, strides={self.s4}, dilations={self.d4}, "
                f"explicit={self.e8}, dtype={np.dtype(self.dtype).name}, seed={self.seed})")


@st.composite
def problems(draw, dtypes=DTYPES, batch=st.integers(1, 2)):
    fmt = draw(st.sampled_from(FMTS))
    padding = draw(st.sampled_from(("SAME", "VALID", "EXPLICIT")))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rh, rw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    pads = ((draw(st.integers(0, 3)), draw(st.integers(0, 3))),
            (draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    return Problem(fmt, padding, draw(batch), h, w, draw(st.integers(1, 3)),
                   draw(st.integers(1, 3)), kh, kw, sh, sw, rh, rw, pads,
                   draw(st.sampled_from(dtypes)), draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("op", OPS)
@given(p=problems())
def test_sweep_against_reference(op, p):
    if not p.valid:
        # A negative output size is an error for every op, before out_backprop is read.
        x = np.zeros(p.input_shape, p.dtype)
        w = np.zeros(p.filter_shape, p.dtype)
        dy = np.zeros(layout_shape((p.n, 0, 0, p.c * p.m), p.fmt), p.dtype)
        with pytest.raises(InvalidArgumentError, match="Computed output size would be negative"):
            run_op(op, p.fmt, x, w, dy, *p.args())
        return
    x, w, dy = p.operands()
    got = run_op(op, p.fmt, x, w, dy, *p.args())
    assert isinstance(got, np.ndarray)
    assert got.dtype == p.dtype, f"result dtype {got.dtype} != input dtype {p.dtype}"
    want = ref_op(op, p.fmt, x, w, dy, *p.args())
    # Accumulation error bound (terms * unit roundoff * sum of |products|) on top of
    # SPEC section 6's atol = rtol tolerance; it is tiny for these small problems.
    wabs = ref_op(op, p.fmt, np.abs(f64(x)), np.abs(f64(w)), np.abs(f64(dy)), *p.args())
    extra = p.terms(op) * ACC_EPS[np.dtype(p.dtype).name] * wabs
    assert_close(got, want, tolerance(p.dtype, p.padding), extra, what=f"{op} {p!r}")


@given(p=problems(dtypes=(np.dtype(np.float64),)))
def test_adjoint_identities_float64(p):
    """<fwd(x, w), dy> = <x, bwd_input(dy, w)> = <w, bwd_filter(x, dy)>."""
    assume(p.valid)
    x, w, dy = p.operands()
    s4, padding, e8, d4 = p.args()
    y = numbasep.depthwise_conv2d_native(x, w, s4, padding, e8, p.fmt, d4)
    dx = numbasep.depthwise_conv2d_native_backprop_input(x.shape, w, dy, s4, padding, e8,
                                                         p.fmt, d4)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(x, w.shape, dy, s4, padding, e8,
                                                          p.fmt, d4)
    a, b, c = np.vdot(y, dy), np.vdot(x, dx), np.vdot(w, dw)
    # Every inner product is the same triple sum of x*w*dy; bound by the sum of |x*w*dy|.
    scale = np.vdot(np.abs(x), numbasep.depthwise_conv2d_native_backprop_input(
        x.shape, np.abs(w), np.abs(dy), s4, padding, e8, p.fmt, d4))
    tol = 1e-10 * scale + 1e-300
    assert abs(a - b) <= tol, (a, b, scale)
    assert abs(a - c) <= tol, (a, c, scale)
    assert abs(b - c) <= tol, (b, c, scale)


@pytest.mark.parametrize("fmt", FMTS)
def test_adjoint_identity_catches_a_real_problem(fmt):
    """The adjoint check is not vacuous: on a fixed problem the triple sum is far from 0
    and a perturbed gradient breaks the identity."""
    p = Problem(fmt, "EXPLICIT", 2, 7, 8, 3, 2, 3, 2, 2, 1, 2, 3, ((1, 2), (3, 0)),
                np.dtype(np.float64), 7)
    x, w, dy = p.operands()
    s4, padding, e8, d4 = p.args()
    y = numbasep.depthwise_conv2d_native(x, w, s4, padding, e8, fmt, d4)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(x, w.shape, dy, s4, padding, e8,
                                                          fmt, d4)
    a, c = np.vdot(y, dy), np.vdot(w, dw)
    tol = 1e-10 * np.vdot(np.abs(y), np.abs(dy))      # as in the sweep (a lower bound)
    assert abs(a) > 1e3 * tol
    assert abs(a - c) <= tol
    dw_bad = dw.copy()
    dw_bad[0, 0, 0, 0] += 1e-6
    assert abs(a - np.vdot(w, dw_bad)) > tol


# ------------------------------------------------------------------ 16-bit accumulation

@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS)
def test_16bit_inputs_accumulate_in_float32(op, dtype):
    """SPEC section 5: one rounding at the end, not 16-bit partial sums (TensorFlow's CPU
    kernel is off by 7 % / 75 % here). Sums of hundreds of positive terms must land within
    one 16-bit rounding of the exact sum of the quantised inputs."""
    rng = np.random.default_rng(5)
    fmt = "NHWC"
    if op == "forward":
        x_shape, f_shape = (1, 20, 20, 2), (15, 15, 2, 1)
    elif op == "backprop_input":
        x_shape, f_shape = (1, 20, 20, 2), (8, 8, 2, 4)
    else:
        x_shape, f_shape = (16, 16, 16, 2), (1, 1, 2, 1)
    s4, d4, e8 = attrs(fmt)
    x = rand(rng, x_shape, dtype, 0.5, 1.0)
    w = rand(rng, f_shape, dtype, 0.5, 1.0)
    out_shape = ref.raw_geometry(x_shape, f_shape, s4, "VALID", e8, fmt, d4)["output_shape"]
    dy = rand(rng, out_shape, dtype, 0.5, 1.0)
    got = run_op(op, fmt, x, w, dy, s4, "VALID", e8, d4)
    assert got.dtype == dtype
    want = ref_op(op, fmt, x, w, dy, s4, "VALID", e8, d4)
    assert want.max() > 100  # the sums really are large
    unit = 2.0**-11 if dtype == np.float16 else 2.0**-8   # half an ulp, relative
    # one final rounding + float32 accumulation of <= 4096 positive terms
    rel = unit + 4096 * 2.0**-24
    assert_close(got, want, 0.0, rel * np.abs(want), what=f"{op} {dtype.name}")


# ------------------------------------------------------------------ argument layouts

def _layout_problem(fmt, dtype):
    rng = np.random.default_rng(11)
    x = rand(rng, layout_shape((2, 7, 6, 3), fmt), dtype)
    w = rand(rng, (3, 2, 3, 2), dtype)
    s4, d4, e8 = attrs(fmt, (2, 1), (1, 2), ((1, 0), (2, 1)))
    return x, w, s4, d4, e8


def _variants(a, kind, fmt):
    """``a``'s values as a non-contiguous or read-only array."""
    if kind == "strided":       # every other row of a taller array
        ax = 1 if fmt == "NHWC" else 2
        shape = list(a.shape)
        shape[ax] *= 2
        big = np.full(shape, np.nan, a.dtype)
        sl = [slice(None)] * 4
        sl[ax] = slice(None, None, 2)
        big[tuple(sl)] = a
        v = big[tuple(sl)]
    elif kind == "transposed":  # an axis-permuted view of a buffer in another layout
        buf = np.ascontiguousarray(np.transpose(a, (0, 2, 3, 1)))
        v = np.transpose(buf, (0, 3, 1, 2))
    elif kind == "reversed":    # negative strides
        buf = np.ascontiguousarray(a[:, ::-1, :, ::-1])
        v = buf[:, ::-1, :, ::-1]
    elif kind == "fortran":
        v = np.asfortranarray(a)
    elif kind == "readonly":
        v = a.copy()
        v.flags.writeable = False
    else:
        raise AssertionError(kind)
    assert np.array_equal(v, a)
    if kind != "readonly":
        assert not v.flags.c_contiguous
    return v


@pytest.mark.parametrize("kind", ["strided", "transposed", "reversed", "fortran", "readonly"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fmt", FMTS)
def test_non_contiguous_and_read_only_arguments(fmt, dtype, kind):
    x, w, s4, d4, e8 = _layout_problem(fmt, dtype)
    y = numbasep.depthwise_conv2d_native(x, w, s4, "EXPLICIT", e8, fmt, d4)
    rng = np.random.default_rng(3)
    dy = rand(rng, y.shape, dtype)
    dx = numbasep.depthwise_conv2d_native_backprop_input(x.shape, w, dy, s4, "EXPLICIT", e8,
                                                         fmt, d4)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(x, w.shape, dy, s4, "EXPLICIT", e8,
                                                          fmt, d4)
    # the contiguous results are right to begin with
    tol = tolerance(dtype, "EXPLICIT")
    assert_close(y, ref.raw_forward(f64(x), f64(w), s4, "EXPLICIT", e8, fmt, d4), tol)
    xv, wv, dyv = (_variants(a, kind, fmt) for a in (x, w, dy))
    before = [a.copy() for a in (xv, wv, dyv)]
    y2 = numbasep.depthwise_conv2d_native(xv, wv, s4, "EXPLICIT", e8, fmt, d4)
    dx2 = numbasep.depthwise_conv2d_native_backprop_input(np.array(x.shape), wv, dyv, s4,
                                                          "EXPLICIT", e8, fmt, d4)
    dw2 = numbasep.depthwise_conv2d_native_backprop_filter(xv, tuple(w.shape), dyv, s4,
                                                           "EXPLICIT", e8, fmt, d4)
    for got, want in ((y2, y), (dx2, dx), (dw2, dw)):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # the arguments are left untouched
    for a, b in zip((xv, wv, dyv), before):
        np.testing.assert_array_equal(a, b)


def test_python_sequences_are_read_as_arrays():
    x = np.arange(24, dtype=np.float64).reshape(1, 4, 3, 2) / 7
    w = np.arange(8, dtype=np.float64).reshape(2, 2, 2, 1) / 3
    y = numbasep.depthwise_conv2d_native(x.tolist(), w.tolist(), (1, 1, 1, 1), "SAME")
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert_close(y, ref.raw_forward(x, w, [1, 1, 1, 1], "SAME"), 1e-12)


# ------------------------------------------------------------------ empty tensors

# (name, NHWC input shape, filter shape, strides, padding, pads); every op is run.
EMPTY_CASES = [
    ("batch0", (0, 5, 5, 2), (3, 3, 2, 1), (1, 1), "SAME", None),
    ("channels0", (2, 5, 5, 0), (3, 3, 0, 2), (1, 1), "SAME", None),
    ("multiplier0", (2, 5, 4, 2), (3, 3, 2, 0), (1, 1), "SAME", None),
    ("rows0", (2, 0, 5, 2), (3, 3, 2, 1), (1, 1), "SAME", None),
    ("cols0_valid_k1", (2, 4, 0, 2), (1, 1, 2, 2), (1, 2), "VALID", None),
    ("out0", (1, 1, 1, 2), (4, 4, 2, 1), (2, 2), "VALID", None),     # out == 0 is legal
    ("input0_padded", (1, 0, 0, 2), (2, 2, 2, 1), (1, 1), "EXPLICIT", ((2, 1), (1, 1))),
    ("cve_2021_29524", (0, 0, 1, 0), (1, 1, 0, 1), (66, 18), "VALID", None),
    ("huge_pads_batch0", (0, 1, 1, 1), (1, 1, 1, 1), (1, 1), "EXPLICIT",
     ((2**31 - 1, 2**31 - 1), (0, 0))),
]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16)],
                         ids=["float32", "float16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("case", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
def test_empty_tensors(case, fmt, op, dtype):
    name, in_nhwc, f_shape, strides, padding, pads = case
    s4, d4, e8 = attrs(fmt, strides, (1, 1), pads)
    in_shape = layout_shape(in_nhwc, fmt)
    geom = ref.raw_geometry(in_shape, f_shape, s4, padding, e8, fmt, d4)
    out_shape = geom["output_shape"]
    assert out_shape is not None and 0 in in_shape + f_shape + out_shape
    rng = np.random.default_rng(0)
    x = rand(rng, in_shape, dtype)
    w = rand(rng, f_shape, dtype)
    dy = rand(rng, out_shape, dtype)
    result_shape = {"forward": out_shape, "backprop_input": in_shape,
                    "backprop_filter": f_shape}[op]
    want = ref_op(op, fmt, x, w, dy, s4, padding, e8, d4)
    assert want.shape == tuple(result_shape)
    got = run_op(op, fmt, x, w, dy, s4, padding, e8, d4)
    assert got.shape == tuple(result_shape) and got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    # a NaN-filled preallocated result is overwritten (no uninitialised memory returned)
    out = np.full(result_shape, np.nan, dtype)
    got2 = run_op(op, fmt, x, w, dy, s4, padding, e8, d4, out=out)
    assert got2 is out
    np.testing.assert_array_equal(out, want)


def test_empty_out_backprop_gives_zero_filter_gradient():
    """TF PR #126484: an empty out_backprop must give zeros of shape filter_sizes."""
    for fmt in FMTS:
        x = np.ones(layout_shape((0, 6, 6, 3), fmt), np.float32)
        dy = np.ones(layout_shape((0, 6, 6, 6), fmt), np.float32)
        s4, d4, _ = attrs(fmt)
        for _ in range(2):      # twice: a second call may reuse freed memory
            out = np.full((3, 3, 3, 2), np.nan, np.float32)
            dw = numbasep.depthwise_conv2d_native_backprop_filter(
                x, [3, 3, 3, 2], dy, s4, "SAME", data_format=fmt, out=out)
            assert dw is out
            np.testing.assert_array_equal(dw, np.zeros((3, 3, 3, 2), np.float32))
            dw = numbasep.depthwise_conv2d_native_backprop_filter(
                x, [3, 3, 3, 2], dy, s4, "SAME", data_format=fmt)
            np.testing.assert_array_equal(dw, np.zeros((3, 3, 3, 2), np.float32))


_HUGE_EMPTY_SCRIPT = textwrap.dedent("""
    import faulthandler, numpy as np, numbasep
    f32 = np.float32
    # warm up (compile or load) the kernels the cases below use, untimed
    numbasep.depthwise_conv2d_native(np.ones((1, 2, 2, 1), f32), np.ones((1, 1, 1, 1), f32),
                                     [1, 1, 1, 1], "VALID")
    numbasep.depthwise_conv2d_native_backprop_input(
        [1, 2, 2, 1], np.ones((1, 1, 1, 1), f32), np.ones((1, 2, 2, 1), f32), [1, 1, 1, 1],
        "VALID")
    numbasep.depthwise_conv2d_native_backprop_filter(
        np.ones((1, 2, 2, 1), f32), [1, 1, 1, 1], np.ones((1, 2, 2, 1), f32), [1, 1, 1, 1],
        "VALID")
    print("warm", flush=True)
    # from here on, nothing may take long: a watchdog kills the process after LIMIT s
    faulthandler.dump_traceback_later(LIMIT, exit=True)
    B = 2**30
    # empty tensors (zero channels) whose other dimensions are huge: nothing to compute
    x = np.empty((B, B, 1, 0), f32)
    y = numbasep.depthwise_conv2d_native(x, np.empty((1, 1, 0, 1), f32), [1, 1, 1, 1],
                                         "VALID")
    assert y.shape == (B, B, 1, 0), y.shape
    print("forward ok", flush=True)
    dx = numbasep.depthwise_conv2d_native_backprop_input(
        [B, B, 1, 0], np.empty((1, 1, 0, 1), f32), np.empty((B, B, 1, 0), f32),
        [1, 1, 1, 1], "VALID")
    assert dx.shape == (B, B, 1, 0), dx.shape
    print("backprop_input ok", flush=True)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(
        x, [1, 1, 0, 1], np.empty((B, B, 1, 0), f32), [1, 1, 1, 1], "VALID")
    assert dw.shape == (1, 1, 0, 1), dw.shape
    print("backprop_filter ok", flush=True)
    # an empty filter with a huge spatial size: the input gradient is all zeros
    try:
        dx = numbasep.depthwise_conv2d_native_backprop_input(
            [1, 1, 1, 1], np.empty((2**40, 1, 1, 0), f32), np.empty((1, 1, 1, 0), f32),
            [1, 1, 1, 1], "SAME")
        assert dx.shape == (1, 1, 1, 1) and not dx.any(), dx
    except numbasep.InvalidArgumentError as e:   # rejecting the size is fine too
        assert "filter" in str(e), e
    print("empty filter ok", flush=True)
    faulthandler.cancel_dump_traceback_later()
""")


def test_huge_empty_tensors_do_not_hang():
    """SPEC section 9, zero-size tensors: an empty operand must give the documented (empty
    or zero) result or a clear error at once, not loop over its other, huge, dimensions.
    Runs in a subprocess whose watchdog turns a hang into a failure (after 20 s)."""
    script = _HUGE_EMPTY_SCRIPT.replace("LIMIT", "20")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (
        f"an empty tensor with huge dimensions hung or failed; stdout: {proc.stdout!r}; "
        f"stderr (last lines): {proc.stderr[-1500:]}")
    assert proc.stdout.split() == ["warm", "forward", "ok", "backprop_input", "ok",
                                   "backprop_filter", "ok", "empty", "filter", "ok"]


# ------------------------------------------------------------------ NaN / Inf

NAN_CASES = [  # (name, filter shape, strides, dilations, padding, pads)
    ("3x3_same", (3, 3, 2, 1), (1, 1), (1, 1), "SAME", None),
    ("2x3_m2_strided_dilated", (2, 3, 2, 2), (2, 1), (2, 2), "SAME", None),
    ("1x1_stride2_skips", (1, 1, 2, 1), (2, 2), (1, 1), "VALID", None),
    ("3x2_explicit", (3, 2, 2, 3), (1, 2), (1, 1), "EXPLICIT", ((2, 1), (0, 3))),
]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("case", NAN_CASES, ids=[c[0] for c in NAN_CASES])
def test_nan_and_inf_propagate_exactly_to_touching_outputs(case, fmt):
    name, f_shape, strides, dil, padding, pads = case
    s4, d4, e8 = attrs(fmt, strides, dil, pads)
    rs4, rd4, re8 = attrs("NHWC", strides, dil, pads)      # the reference works in NHWC
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 1.5, (2, 9, 8, 2)).astype(np.float32)   # NHWC, positive
    w = rng.uniform(0.5, 1.5, f_shape).astype(np.float32)
    nan_at, inf_at = (0, 5, 3, 1), (1, 3, 2, 0)   # odd rows: read by every case but one
    if name == "1x1_stride2_skips":
        nan_at = (0, 3, 5, 1)   # odd row and column: no window reads it
    x[nan_at] = np.nan
    x[inf_at] = np.inf
    ind_nan = np.zeros(x.shape)
    ind_nan[nan_at] = 1
    ind_inf = np.zeros(x.shape)
    ind_inf[inf_at] = 1
    ones_w = np.ones(f_shape)

    # forward: exactly the outputs whose window reads a NaN / Inf
    nan_mask = ref.raw_forward(ind_nan, ones_w, rs4, padding, re8, "NHWC", rd4) > 0
    inf_mask = (ref.raw_forward(ind_inf, ones_w, rs4, padding, re8, "NHWC", rd4) > 0) \
        & ~nan_mask
    if name == "1x1_stride2_skips":
        assert not nan_mask.any()
    else:
        assert nan_mask.any() and inf_mask.any()
    xin = x if fmt == "NHWC" else to_nchw(x)
    y = numbasep.depthwise_conv2d_native(xin, w, s4, padding, e8, fmt, d4)
    y = y if fmt == "NHWC" else to_nhwc(y)
    np.testing.assert_array_equal(np.isnan(y), nan_mask)
    np.testing.assert_array_equal(np.isposinf(y), inf_mask)   # positive weights: +Inf
    assert np.isfinite(y[~nan_mask & ~inf_mask]).all()

    # filter gradient: NaN / Inf in the input reach exactly the taps that read them
    dy = rng.uniform(0.5, 1.5, nan_mask.shape).astype(np.float32)
    ones_dy = np.ones(dy.shape)
    dw_nan = ref.raw_backprop_filter(ind_nan, f_shape, ones_dy, rs4, padding, re8, "NHWC",
                                     rd4) > 0
    dw_inf = (ref.raw_backprop_filter(ind_inf, f_shape, ones_dy, rs4, padding, re8, "NHWC",
                                      rd4) > 0) & ~dw_nan
    dyin = dy if fmt == "NHWC" else to_nchw(dy)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(xin, f_shape, dyin, s4, padding,
                                                          e8, fmt, d4)
    np.testing.assert_array_equal(np.isnan(dw), dw_nan)
    np.testing.assert_array_equal(np.isposinf(dw), dw_inf)
    assert np.isfinite(dw[~dw_nan & ~dw_inf]).all()

    # input gradient: a NaN in out_backprop reaches exactly the inputs of its window
    dy2 = dy.copy()
    ind_dy = np.zeros(dy.shape)
    if nan_mask.any():
        at = tuple(int(v) for v in np.argwhere(nan_mask)[0])
        dy2[at] = np.nan
        ind_dy[at] = 1
    dx_nan = ref.raw_backprop_input(x.shape, ones_w, ind_dy, rs4, padding, re8, "NHWC",
                                    rd4) > 0
    assert dx_nan.any() == nan_mask.any()
    dyin2 = dy2 if fmt == "NHWC" else to_nchw(dy2)
    dx = numbasep.depthwise_conv2d_native_backprop_input(xin.shape, w, dyin2, s4, padding,
                                                         e8, fmt, d4)
    dx = dx if fmt == "NHWC" else to_nhwc(dx)
    np.testing.assert_array_equal(np.isnan(dx), dx_nan)
    assert np.isfinite(dx[~dx_nan]).all()


# ------------------------------------------------------------------ out=

@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), BF16],
                         ids=["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", FMTS)
def test_out_argument(fmt, op, dtype):
    rng = np.random.default_rng(4)
    x = rand(rng, layout_shape((2, 6, 5, 3), fmt), dtype)
    w = rand(rng, (3, 3, 3, 2), dtype)
    s4, d4, e8 = attrs(fmt, (1, 2), (2, 1))
    y_shape = ref.raw_geometry(x.shape, w.shape, s4, "SAME", e8, fmt, d4)["output_shape"]
    dy = rand(rng, y_shape, dtype)
    shape = {"forward": y_shape, "backprop_input": x.shape, "backprop_filter": w.shape}[op]
    want = run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4)
    assert_close(want, ref_op(op, fmt, x, w, dy, s4, "SAME", e8, d4), tolerance(dtype))

    out = np.full(shape, np.nan, dtype)
    got = run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=out)
    assert got is out
    np.testing.assert_array_equal(out, want)

    # a non-contiguous out is filled in place too
    big = np.full(shape[:-1] + (2 * shape[-1],), np.nan, dtype)
    view = big[..., ::2]
    got = run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=view)
    assert got is view
    np.testing.assert_array_equal(view, want)
    assert np.isnan(big[..., 1::2].astype(np.float64)).all()   # nothing written outside

    bad_shape = tuple(s + 1 for s in shape)
    with pytest.raises(InvalidArgumentError, match=r"out must have shape"):
        run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=np.zeros(bad_shape, dtype))
    other = np.float32 if dtype != np.float32 else np.float64
    with pytest.raises(TypeError, match=rf"out must have dtype {dtype.name}, got "
                                        rf"{np.dtype(other).name}"):
        run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=np.zeros(shape, other))
    ro = np.zeros(shape, dtype)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=ro)
    with pytest.raises(TypeError, match="out must be a numpy.ndarray, got list"):
        run_op(op, fmt, x, w, dy, s4, "SAME", e8, d4, out=np.zeros(shape, dtype).tolist())


# ------------------------------------------------------------------ determinism

@pytest.mark.parametrize("f_shape", [(3, 3, 3, 1), (2, 4, 3, 2)], ids=["3x3m1", "2x4m2"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)],
                         ids=["float32", "float64"])
@pytest.mark.parametrize("fmt", FMTS)
def test_filter_gradient_is_bitwise_independent_of_thread_count(fmt, dtype, f_shape):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs numba to allow 2 threads")
    rng = np.random.default_rng(9)
    x = rand(rng, layout_shape((9, 40, 37, 3), fmt), dtype)
    s4, d4, e8 = attrs(fmt)
    y_shape = ref.raw_geometry(x.shape, f_shape, s4, "SAME", e8, fmt, d4)["output_shape"]
    dy = rand(rng, y_shape, dtype)
    old = numba.get_num_threads()
    results = []
    try:
        for n in (1, 2, 1):
            numba.set_num_threads(n)
            results.append(numbasep.depthwise_conv2d_native_backprop_filter(
                x, f_shape, dy, s4, "SAME", e8, fmt, d4))
    finally:
        numba.set_num_threads(old)
    assert results[0].tobytes() == results[1].tobytes() == results[2].tobytes()
    assert_close(results[0], ref_op("backprop_filter", fmt, x, np.zeros(f_shape), dy, s4,
                                    "SAME", e8, d4), tolerance(dtype, large_sums=True))


# ------------------------------------------------------------------ numbasep.raw_ops

@pytest.mark.parametrize("fmt", FMTS)
def test_raw_ops_names_match_the_functions(fmt):
    rng = np.random.default_rng(6)
    x = rand(rng, layout_shape((2, 8, 7, 2), fmt), np.float32)
    w = rand(rng, (3, 2, 2, 3), np.float32)
    s4, d4, e8 = attrs(fmt, (2, 1), (1, 2), ((1, 2), (0, 1)))
    kw = dict(strides=s4, padding="EXPLICIT", explicit_paddings=e8, data_format=fmt,
              dilations=d4, name="op")
    y = raw_ops.DepthwiseConv2dNative(input=x, filter=w, **kw)
    want_y = ref.raw_forward(f64(x), f64(w), s4, "EXPLICIT", e8, fmt, d4)
    assert_close(y, want_y, 1e-5)
    np.testing.assert_array_equal(
        y, numbasep.depthwise_conv2d_native(x, w, s4, "EXPLICIT", e8, fmt, d4))
    dy = rand(rng, y.shape, np.float32)
    dx = raw_ops.DepthwiseConv2dNativeBackpropInput(input_sizes=list(x.shape), filter=w,
                                                    out_backprop=dy, **kw)
    assert_close(dx, ref.raw_backprop_input(x.shape, f64(w), f64(dy), s4, "EXPLICIT", e8,
                                            fmt, d4), 1e-5)
    np.testing.assert_array_equal(dx, numbasep.depthwise_conv2d_native_backprop_input(
        x.shape, w, dy, s4, "EXPLICIT", e8, fmt, d4))
    dw = raw_ops.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=list(w.shape),
                                                     out_backprop=dy, **kw)
    assert_close(dw, ref.raw_backprop_filter(f64(x), w.shape, f64(dy), s4, "EXPLICIT", e8,
                                             fmt, d4), 1e-5)
    np.testing.assert_array_equal(dw, numbasep.depthwise_conv2d_native_backprop_filter(
        x, w.shape, dy, s4, "EXPLICIT", e8, fmt, d4))


def test_raw_ops_defaults_and_keyword_only():
    x = np.ones((1, 4, 4, 2), np.float32)
    w = np.ones((2, 2, 2, 1), np.float32)
    y = raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 1, 1], padding="VALID")
    np.testing.assert_array_equal(y, np.full((1, 3, 3, 2), 4, np.float32))
    with pytest.raises(TypeError):
        raw_ops.DepthwiseConv2dNative(x, w, [1, 1, 1, 1], "VALID")
    with pytest.raises(TypeError):
        raw_ops.DepthwiseConv2dNativeBackpropInput([1, 4, 4, 2], w, y, [1, 1, 1, 1], "VALID")
    with pytest.raises(TypeError):
        raw_ops.DepthwiseConv2dNativeBackpropFilter(x, [2, 2, 2, 1], y, [1, 1, 1, 1], "VALID")
    with pytest.raises(TypeError):      # a required argument missing
        raw_ops.DepthwiseConv2dNative(input=x, filter=w, padding="VALID")
    dx = raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=[1, 4, 4, 2], filter=w, out_backprop=y, strides=[1, 1, 1, 1],
        padding="VALID", name=None)
    # each input pixel is covered by (number of windows) * 4
    counts = np.array([1, 2, 2, 1], np.float32)
    np.testing.assert_array_equal(dx[0, :, :, 0], 4 * np.outer(counts, counts))
    dw = raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=x, filter_sizes=np.array([2, 2, 2, 1], np.int32), out_backprop=y,
        strides=[1, 1, 1, 1], padding="VALID", name="grad")
    np.testing.assert_array_equal(dw, np.full((2, 2, 2, 1), 36, np.float32))


def test_raw_ops_validate_like_the_functions():
    x = np.ones((1, 4, 4, 2), np.float32)
    w = np.ones((2, 2, 2, 1), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"strides must have 4 entries.*\[1, 1\]"):
        raw_ops.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1], padding="VALID")
    with pytest.raises(InvalidArgumentError,
                       match=r"Number of rows of out_backprop doesn't match computed: "
                             r"actual = 2, computed = 3"):
        raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=[2, 2, 2, 1], out_backprop=np.ones((1, 2, 3, 2), np.float32),
            strides=[1, 1, 1, 1], padding="VALID")
