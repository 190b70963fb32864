"""SPEC section 9 as named regression tests: one test per advisory, issue or bad-input family.

Each test is named after the TensorFlow security advisory, CVE, TensorFlow / Keras
issue or pull request whose input crashed or misbehaved in the reference
implementation, and asserts the exact outcome numbasep documents: a clear
``InvalidArgumentError`` (or ``TypeError``) naming the argument, raised before any
kernel runs, or the documented result (zeros for an empty reduction, never
uninitialised memory). Calls that could crash or hang the process if a regression
came back (empty tensors with huge other dimensions, the shapes that aborted
TensorFlow's oneDNN path) run in the crash-isolating worker of ``tests/_worker.py``
with a timeout. Array cases run on every available backend (CPU, and CUDA on the
simulator when there is no GPU).

``tests/test_raw_validation.py`` checks the validation rules one by one; this file is
the named record of the reference's failures.
"""

import re

import numpy as np
import pytest

import _worker as W
import numbasep

import support
import reference as ref
from _worker import Arr, Case
from numbasep import InvalidArgumentError as IAE

BF = numbasep.depthwise_conv2d_native_backprop_filter
BI = numbasep.depthwise_conv2d_native_backprop_input
FW = numbasep.depthwise_conv2d_native
ONES = [1, 1, 1, 1]


_cuda_missing = support.cuda_missing


BACKENDS = [pytest.param("cpu"),
            pytest.param("cuda", marks=pytest.mark.skipif(bool(_cuda_missing()),
                                                          reason=str(_cuda_missing())))]


def arr(shape, backend="cpu", dtype=np.float32, fill=None, seed=0):
    a = np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype) if fill is None \
        else np.full(shape, fill, dtype)
    if backend == "cuda":
        from numba import cuda
        return cuda.to_device(a)
    return a


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else a


@pytest.fixture(scope="module")
def worker():
    w = W.Worker(env={"NUMBASEP_MAX_BYTES": str(64 << 20)})
    w.start()
    yield w
    w.stop()


def isolated(worker, op, timeout=60.0, **kwargs):
    """Run a call in the worker: ("ok", ...) or ("raise", type, message, is_iae, ...);
    a crash or a hang fails the test with the reproducer."""
    case = Case(op, kwargs)
    outcome = worker.run(case, timeout=timeout, retry_timeout=180.0)
    assert outcome[0] in ("ok", "raise"), f"{case!r}: {outcome[0]}: {outcome[1:3]}"
    return outcome


# ----------------------------------------------------------------- TFSA-2022-071

def test_tfsa_2022_071_filter_sizes_overflow():
    """BackpropFilter with 13 filter_sizes of 1879048192 overflowed the element count
    (CHECK failure). numbasep: the length is wrong, and 4 such entries overflow int64."""
    x, dy = arr((1, 4, 4, 2)), arr((1, 3, 3, 2))
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries, got "
                                  r"\[1879048192(, 1879048192){12}\]"):
        BF(x, [1879048192] * 13, dy, ONES, "VALID")
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries"):
        BF(x, np.full(13, 1879048192, np.uint32), dy, ONES, "VALID")
    with pytest.raises(IAE, match=r"filter_sizes \[1879048192, 1879048192, 1879048192, "
                                  r"1879048192\] has more elements than fit in int64"):
        BF(x, [1879048192] * 4, dy, ONES, "VALID")


# ----------------------------------------------------------------- TF issue 58180

def test_tf_58180_scalar_input_empty_filter_sizes_nchw_short_dilations():
    """BackpropFilter: scalar input and out_backprop, filter_sizes=[], strides
    [1, 1, 128, 128], NCHW, dilations of length 3 (crashed TensorFlow). The first rule
    broken in SPEC section 4's order is reported: dilations."""
    s = np.float32(1)
    with pytest.raises(IAE, match=r"dilations must have 4 entries, one per dimension of "
                                  r"NCHW, got \[1, 1, 1\]"):
        BF(s, [], s, [1, 1, 128, 128], "VALID", data_format="NCHW", dilations=[1, 1, 1])
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries, got \[\]"):
        BF(s, [], s, [1, 1, 128, 128], "VALID", data_format="NCHW")
    with pytest.raises(IAE, match=r"input must be 4-D, got shape \[\] \(rank 0\)"):
        BF(s, [1, 1, 1, 1], s, [1, 1, 128, 128], "VALID", data_format="NCHW")


# ----------------------------------------------------------------- TF issue 85258

def test_tf_85258_uint32_filter_sizes_array_scalars_empty_strides():
    """BackpropFilter: filter_sizes a uint32 array of shape (13, 2, 5, 4), scalar
    tensors, strides=[] (crashed TensorFlow)."""
    s = np.float32(2)
    fs = np.ones((13, 2, 5, 4), np.uint32)
    with pytest.raises(IAE, match=r"strides must have 4 entries, one per dimension of "
                                  r"NHWC, got \[\]"):
        BF(s, fs, s, [], "VALID")
    with pytest.raises(IAE, match=r"filter_sizes must be 1-D, got an array of shape "
                                  r"\(13, 2, 5, 4\)"):
        BF(s, fs, s, ONES, "VALID")
    # a well-formed uint32 filter_sizes is accepted like any integer sequence
    dw = BF(arr((1, 3, 3, 1)), np.array([2, 2, 1, 1], np.uint32), arr((1, 2, 2, 1)), ONES,
            "VALID")
    assert dw.shape == (2, 2, 1, 1)


# ----------------------------------------------------------------- TF issue 104881

def test_tf_104881_rank1_filter_short_strides():
    """BackpropInput: input_sizes=[1, 2, 2, 1], a rank-1 filter, strides=[1, 1]."""
    w, dy = arr((3,)), arr((1, 2, 2, 1))
    with pytest.raises(IAE, match=r"strides must have 4 entries, one per dimension of "
                                  r"NHWC, got \[1, 1\]"):
        BI([1, 2, 2, 1], w, dy, [1, 1], "VALID")
    with pytest.raises(IAE, match=r"filter must be 4-D, got shape \[3\] \(rank 1\)"):
        BI([1, 2, 2, 1], w, dy, ONES, "VALID")


# ----------------------------------------------------------------- TF issue 60201

def test_tf_60201_zero_stride_long_dilations_short_input_sizes():
    """BackpropInput: strides with a 0, dilations of length 5, input_sizes of length 3,
    out_backprop [1, 0, 0, 1]. Reported in SPEC section 4's order, then each fault alone."""
    w, dy = arr((1, 1, 1, 1)), arr((1, 0, 0, 1))
    with pytest.raises(IAE, match=r"strides must be > 0, got \[1, 0, 1, 1\]"):
        BI([1, 2, 2], w, dy, [1, 0, 1, 1], "VALID", dilations=[1, 1, 1, 1, 1])
    with pytest.raises(IAE, match=r"dilations must have 4 entries.*\[1, 1, 1, 1, 1\]"):
        BI([1, 2, 2], w, dy, ONES, "VALID", dilations=[1, 1, 1, 1, 1])
    with pytest.raises(IAE, match=r"input_sizes must have 4 entries, got \[1, 2, 2\]"):
        BI([1, 2, 2], w, dy, ONES, "VALID")
    with pytest.raises(IAE, match=re.escape(
            "Number of rows of out_backprop doesn't match computed: actual = 0, computed = 2")):
        BI([1, 2, 2, 1], w, dy, ONES, "VALID")


# ----------------------------------------------------------------- TF PR 126484

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_tf_pr_126484_empty_out_backprop_gives_zeros(backend, dtype):
    """TensorFlow's BackpropFilter returned uninitialised memory for an empty
    out_backprop. numbasep: exactly zeros of shape filter_sizes, also into an ``out``
    full of garbage, and also for the Keras gradients' kernel results."""
    x = arr((0, 5, 5, 3), backend, dtype)
    dy = arr((0, 3, 3, 6), backend, dtype)
    for _ in range(3):   # recycled allocations must not leak old values
        dw = host(BF(x, [3, 3, 3, 2], dy, ONES, "VALID"))
        assert dw.shape == (3, 3, 3, 2) and dw.dtype == dtype
        assert np.array_equal(dw, np.zeros((3, 3, 3, 2), dtype))
    garbage = arr((3, 3, 3, 2), backend, dtype, fill=np.nan)
    got = BF(x, [3, 3, 3, 2], dy, ONES, "VALID", out=garbage)
    assert got is garbage
    assert np.array_equal(host(got), np.zeros((3, 3, 3, 2), dtype))
    # spatially empty out_backprop (batch 1): also zeros
    dw = host(BF(arr((1, 2, 2, 3), backend, dtype), [3, 3, 3, 1],
                 arr((1, 0, 0, 3), backend, dtype), ONES, "VALID"))
    assert np.array_equal(dw, np.zeros((3, 3, 3, 1), dtype))
    # the Keras gradients
    xk, k = arr((0, 6, 6, 2), backend, dtype), arr((3, 3, 2, 2), backend, dtype)
    dx, dk = numbasep.depthwise_conv_grad(xk, k, arr((0, 4, 4, 4), backend, dtype))
    assert host(dx).shape == (0, 6, 6, 2)
    assert np.array_equal(host(dk), np.zeros((3, 3, 2, 2), dtype))
    pk = arr((1, 1, 4, 3), backend, dtype)
    dx, ddk, dpk = numbasep.separable_conv_grad(xk, k, pk, arr((0, 4, 4, 3), backend, dtype))
    assert np.array_equal(host(ddk), np.zeros((3, 3, 2, 2), dtype))
    assert np.array_equal(host(dpk), np.zeros((1, 1, 4, 3), dtype))


# ----------------------------------------------------------------- CVE-2021-29524

def test_cve_2021_29524_zero_size_tensors_huge_strides():
    """A division by zero in TensorFlow: input [0, 0, 1, 0], filter_sizes [1, 1, 1, 1],
    out_backprop [0, 0, 1, 1], strides [1, 66, 18, 1]. numbasep: the depths disagree
    (0 input channels, filter_sizes says 1), and the consistent call is computed."""
    x, dy = arr((0, 0, 1, 0)), arr((0, 0, 1, 1))
    with pytest.raises(IAE, match=r"input and filter_sizes must have the same depth: input "
                                  r"has 0 channels"):
        BF(x, [1, 1, 1, 1], dy, [1, 66, 18, 1], "VALID")
    dw = BF(x, [1, 1, 0, 1], arr((0, 0, 1, 0)), [1, 66, 18, 1], "VALID")
    assert dw.shape == (1, 1, 0, 1)
    dx = BI([0, 0, 1, 0], arr((1, 1, 0, 1)), arr((0, 0, 1, 0)), [1, 66, 18, 1], "VALID")
    assert dx.shape == (0, 0, 1, 0)
    y = FW(x, arr((1, 1, 0, 1)), [1, 66, 18, 1], "VALID")
    assert y.shape == (0, 0, 1, 0)


# Every zero-size family (batch, channels, spatial, multiplier, filter taps), with the
# other extents huge: empty results or zeros, fast (a kernel looping over the huge
# extents would hang; run in the worker with a timeout).
B = 2**31 - 1
ZERO_SIZE = [
    # (label, input NHWC, filter, explicit paddings or None)
    ("batch_0", (0, B, 3, 2), (1, 1, 2, 1), None),
    ("channels_0", (1, B, 3, 0), (1, 1, 0, 3), None),
    ("rows_0", (2, 0, B, 3), (1, 1, 3, 1), None),
    ("cols_0_huge_rows", (1, 2**30, 0, 2), (1, 1, 2, 2), None),
    ("multiplier_0", (1, 4, 4, 2), (2, 2, 2, 0), None),
    ("empty_input_padded_output", (1, 0, 0, 2), (1, 1, 2, 1), (2, 1, 1, 2)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["fwd", "bi", "bf"])
@pytest.mark.parametrize("label,xs,ws,ex", ZERO_SIZE, ids=[c[0] for c in ZERO_SIZE])
def test_cve_2021_29524_family_every_zero_size_tensor(worker, backend, op, label, xs, ws, ex):
    kind = "device" if backend == "cuda" else "ndarray"
    padding = "EXPLICIT" if ex else "VALID"
    explicit = [0, 0, *ex, 0, 0] if ex else []
    g = ref.raw_geometry(xs, ws, ONES, padding, explicit)
    out_shape = g["output_shape"]
    common = dict(strides=ONES, padding=padding, explicit_paddings=explicit)
    if op == "fwd":
        r = isolated(worker, "depthwise_conv2d_native", input=Arr(xs, kind=kind),
                     filter=Arr(ws, kind=kind), **common)
        want = out_shape
    elif op == "bi":
        r = isolated(worker, "depthwise_conv2d_native_backprop_input", input_sizes=list(xs),
                     filter=Arr(ws, kind=kind), out_backprop=Arr(out_shape, kind=kind),
                     **common)
        want = xs
    else:
        r = isolated(worker, "depthwise_conv2d_native_backprop_filter", input=Arr(xs, kind=kind),
                     filter_sizes=list(ws), out_backprop=Arr(out_shape, kind=kind), **common)
        want = ws
    assert r[0] == "ok", r[1:3]
    (kind_, dt, shape, vals, _), = r[2]
    assert (kind_, dt, shape) == (kind, "float32", tuple(want))
    if op != "bf" or label != "multiplier_0":
        assert not np.any(vals), "an empty reduction must give zeros"
    else:   # multiplier 0 makes the filter gradient itself empty
        assert vals.size == 0


# ----------------------------------------------------------------- huge values

def test_spec9_huge_strides_paddings_negative_and_inconsistent_sizes():
    """Huge strides (65536 and 2**31 - 1 computed, 2**31 refused), huge paddings,
    negative sizes and filter_sizes inconsistent with the tensors."""
    x = arr((2, 5, 6, 2), dtype=np.float64)
    w = arr((1, 2, 2, 2), dtype=np.float64)
    for s in (65536, 2**31 - 1):
        for padding in ("VALID", "SAME"):
            y = FW(x, w, [1, s, s, 1], padding)
            # (the sums are fused multiply-adds: within an ulp of the terms, about
            # 1, of the reference's)
            np.testing.assert_allclose(y, ref.raw_forward(x, w, [1, s, s, 1], padding),
                                       rtol=0, atol=1e-14)
    with pytest.raises(IAE, match=r"strides must be < 2\*\*31 .*\[1, 2147483648, 1, 1\]"):
        FW(x, w, [1, 2**31, 1, 1], "VALID")
    with pytest.raises(IAE, match=r"explicit_paddings must be < 2\*\*31"):
        FW(x, w, ONES, "EXPLICIT", [0, 0, 2**31, 0, 0, 0, 0, 0])
    with pytest.raises(IAE, match=r"explicit_paddings must be non-negative"):
        FW(x, w, ONES, "EXPLICIT", [0, 0, -1, 0, 0, 0, 0, 0])
    y = FW(arr((0, 1, 1, 2)), arr((1, 1, 2, 1)), ONES, "EXPLICIT",
           [0, 0, 2**31 - 1, 2**31 - 1, 0, 0, 0, 0])
    assert y.shape == (0, 2**32 - 1, 1, 2)
    with pytest.raises(IAE, match=r"input_sizes must be non-negative, got \[1, 4, -4, 2\]"):
        BI([1, 4, -4, 2], arr((2, 2, 2, 1)), arr((1, 3, 3, 2)), ONES, "VALID")
    with pytest.raises(IAE, match=r"filter_sizes must be non-negative"):
        BF(arr((1, 4, 4, 2)), [2, -2, 2, 1], arr((1, 3, 3, 2)), ONES, "VALID")
    with pytest.raises(IAE, match=r"same depth.*filter_sizes"):
        BF(arr((1, 4, 4, 2)), [2, 2, 3, 1], arr((1, 3, 3, 2)), ONES, "VALID")
    with pytest.raises(IAE, match=r"out_backprop must have C\*M = 2\*2 = 4 channels"):
        BF(arr((1, 4, 4, 2)), [2, 2, 2, 2], arr((1, 3, 3, 2)), ONES, "VALID")
    with pytest.raises(IAE, match=r"Number of cols of out_backprop doesn't match computed: "
                                  r"actual = 3, computed = 2"):
        BF(arr((1, 4, 4, 2)), [2, 3, 2, 1], arr((1, 3, 3, 2)), ONES, "VALID")


def test_spec9_valid_result_too_big_for_memory_is_refused_up_front(monkeypatch):
    """A valid request whose result cannot fit in memory is refused before allocating."""
    monkeypatch.delenv("NUMBASEP_MAX_BYTES", raising=False)
    with pytest.raises(IAE, match=r"this call would need 4\.0 TiB .* input gradient of "
                                  r"shape \(1, 1048576, 1048576, 1\).*check input_sizes"):
        BI([1, 2**20, 2**20, 1], arr((1, 1, 1, 1)), arr((1, 1, 1, 1)),
           [1, 2**20, 2**20, 1], "VALID")
    monkeypatch.setenv("NUMBASEP_MAX_BYTES", str(1 << 20))
    with pytest.raises(IAE, match=r"more than the limit of 1\.0 MiB \(set by "
                                  r"NUMBASEP_MAX_BYTES\)"):
        FW(arr((1, 4, 4, 1)), arr((1, 1, 1, 1)), ONES, "EXPLICIT",
           [0, 0, 300, 300, 300, 300, 0, 0])


# ----------------------------------------------------------------- oneDNN aborts

@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_spec9_rank3_tensors_and_short_strides_never_abort(worker, fmt):
    """Rank-3 tensors and strides of length 2 or 3 aborted the process on TensorFlow's
    oneDNN path; here: InvalidArgumentError, and the process survives."""
    x4 = Arr((1, 4, 4, 2) if fmt == "NHWC" else (1, 2, 4, 4))
    calls = []
    for strides in ([1, 1], [1, 1, 1]):
        calls.append(("depthwise_conv2d_native", dict(input=x4, filter=Arr((2, 2, 2, 1)),
                                                      strides=strides), "strides must have 4"))
        calls.append(("depthwise_conv2d_native_backprop_input",
                      dict(input_sizes=list(x4.shape), filter=Arr((2, 2, 2, 1)),
                           out_backprop=Arr((1, 3, 3, 2)), strides=strides),
                      "strides must have 4"))
    calls.append(("depthwise_conv2d_native", dict(input=Arr((4, 4, 2)), filter=Arr((2, 2, 2, 1)),
                                                  strides=ONES), r"input must be 4-D.*rank 3"))
    calls.append(("depthwise_conv2d_native_backprop_input",
                  dict(input_sizes=list(x4.shape), filter=Arr((2, 2, 2)),
                       out_backprop=Arr((1, 3, 3, 2)), strides=ONES),
                  r"filter must be 4-D.*rank 3"))
    calls.append(("depthwise_conv2d_native_backprop_filter",
                  dict(input=x4, filter_sizes=[2, 2, 2, 1], out_backprop=Arr((3, 3, 2)),
                       strides=ONES), r"out_backprop must be 4-D.*rank 3"))
    for op, kw, pattern in calls:
        r = isolated(worker, op, padding="VALID", data_format=fmt, **kw)
        assert r[0] == "raise" and r[3], r[1:3]
        assert re.search(pattern, r[2]), r[2]


# ----------------------------------------------------------------- TF issues 19992, 56498, 58351
# (SPEC section 5: TensorFlow's backprop ops silently ignore dilations)

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_tf_19992_56498_58351_backprop_dilations_are_honoured(backend, fmt):
    cf = fmt == "NCHW"
    xs = (2, 3, 7, 8) if cf else (2, 7, 8, 3)
    dil = [1, 1, 2, 3] if cf else [1, 2, 3, 1]
    w = arr((2, 3, 3, 2), dtype=np.float64, seed=1)
    x = arr(xs, dtype=np.float64, seed=2)
    y = ref.raw_forward(x, w, ONES, "SAME", data_format=fmt, dilations=dil)
    dy = arr(y.shape, dtype=np.float64, seed=3)
    if backend == "cuda":
        from numba import cuda
        dev = cuda.to_device
    else:
        def dev(a):
            return a
    dx = host(BI(list(xs), dev(w), dev(dy), ONES, "SAME", data_format=fmt, dilations=dil))
    dw = host(BF(dev(x), [2, 3, 3, 2], dev(dy), ONES, "SAME", data_format=fmt, dilations=dil))
    np.testing.assert_allclose(
        dx, ref.raw_backprop_input(xs, w, dy, ONES, "SAME", data_format=fmt, dilations=dil),
        rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        dw, ref.raw_backprop_filter(x, [2, 3, 3, 2], dy, ONES, "SAME", data_format=fmt,
                                    dilations=dil), rtol=1e-12, atol=1e-12)
    # the adjoint identity <dy, conv(x)> = <dx(dy), x> = <dw(dy), w>
    lhs = float(np.vdot(dy, y))
    assert abs(lhs - float(np.vdot(dx, x))) <= 1e-10 * (1 + abs(lhs))
    assert abs(lhs - float(np.vdot(dw, w))) <= 1e-10 * (1 + abs(lhs))


# ----------------------------------------------------------------- Keras 22496, 22515

KERAS_OPS = ("depthwise_conv", "separable_conv", "depthwise_conv_grad", "separable_conv_grad")


def _keras_call(op, x, k, backend="cpu", **kw):
    nd = x.ndim - 2
    c, m = k.shape[-2], k.shape[-1]
    args = [arr(x.shape, backend), arr(k.shape, backend)]
    if op.startswith("separable"):
        args.append(arr((1,) * nd + (c * m, 2), backend))
    if op.endswith("_grad"):
        args.append(arr((x.shape[0],) + (1,) * nd + (c * m if op.startswith("depth") else 2,),
                        backend))
    return getattr(numbasep, op)(*args, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", KERAS_OPS)
@pytest.mark.parametrize("xs,ks,dil", [
    ((2, 3, 4), (4, 4, 1), 1),                  # 1-D: input 3 < kernel 4
    ((1, 5, 5, 2), (3, 3, 2, 1), 3),            # 2-D: effective kernel 7 > 5
    ((1, 4, 2, 3, 1), (1, 3, 2, 1, 2), (1, 1, 2)),   # 3-D: one dim too small
])
def test_keras_22496_22515_valid_padding_input_smaller_than_effective_kernel(backend, op, xs,
                                                                             ks, dil):
    """Keras backends returned garbage or a silent empty result; numbasep refuses with the
    SPEC section 3 message naming the input shape, kernel shape, strides and dilation."""
    with pytest.raises(IAE, match=r"Computed output size would be zero or negative: -?\d+ in "
                                  r"spatial dimension \d \[inputs shape: .*kernel shape: .*"
                                  r"strides: .*dilation_rate: .*padding: 'valid'\]"):
        _keras_call(op, np.empty(xs), np.empty(ks), backend, dilation_rate=dil)
    # same padding computes it
    r = _keras_call(op, np.empty(xs), np.empty(ks), backend, dilation_rate=dil, padding="same") \
        if not op.endswith("_grad") else None
    if r is not None:
        assert host(r).shape[1:-1] == xs[1:-1]


@pytest.mark.parametrize("op", KERAS_OPS)
def test_keras_22496_22515_wrong_length_strides_and_dilation_zero_and_negative(op):
    x, k = np.empty((1, 6, 6, 2)), np.empty((2, 2, 2, 1))
    for bad, name in (((1, 1, 1), "strides"), ((2,), "strides"), ((1, 1, 1), "dilation_rate")):
        with pytest.raises(IAE, match=rf"{name} must be an int or a tuple of 2 ints"):
            _keras_call(op, x, k, **{name: bad})
    for bad in (0, -1, (1, 0), (0, 2)):
        for name in ("strides", "dilation_rate"):
            with pytest.raises(IAE, match=rf"{name} must be positive"):
                _keras_call(op, x, k, **{name: bad})
