"""The CUDA backend: every public operator on device arrays agrees with the CPU backend.

Runs on numba's CUDA simulator when no GPU is present (tests/conftest.py turns it
on), with tiny shapes: the simulator starts one OS thread per CUDA thread. With a
GPU (or NUMBASEP_TEST_GPU=1) the same tests run on the device with larger shapes.
"""

import os
import subprocess
import sys
import types

import ml_dtypes
import numpy as np
import pytest

# numba-cuda provides the CUDA target (and the simulator); without it numba.cuda
# would be numba's deprecated built-in target, which numbasep does not use.
pytest.importorskip("numba_cuda")
cuda = pytest.importorskip("numba.cuda")

import numbasep  # noqa: E402
from numbasep import backends  # noqa: E402
from numbasep.backends.cuda import transfer  # noqa: E402

import support  # noqa: E402

SIM = bool(cuda.config.ENABLE_CUDASIM)
BIG = not SIM   # larger shapes on a real device

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), BF16]
# |cuda - cpu| <= TOL * (1 + |cpu|): both backends accumulate in float32 (float64)
# and round once, so they differ by summation order and a last-place rounding.
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture(autouse=True, scope="module")
def _fast_simulator_barriers():
    """The simulator's block barrier polls under the GIL: shorten the switch interval.

    With the default 5 ms, every ``syncthreads`` costs milliseconds; at 0.1 ms the
    kernels with shared-memory reductions run about 5x faster.
    """
    old = sys.getswitchinterval()
    if SIM:
        sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(old)


# ------------------------------------------------------------------------ helpers

def rand(rng, shape, dtype):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def dev(a):
    # numba-cuda cannot copy bfloat16 arrays on a real GPU; transfer copies the bits.
    return transfer.to_device(np.ascontiguousarray(a))


def host(d):
    return d.copy_to_host()


def is_device_array(obj):
    return bool(getattr(type(obj), "__cuda_ndarray__", False))


def check(got, want, dtype=None):
    """``got`` is a device array equal (to the dtype's tolerance) to the CPU's ``want``."""
    assert is_device_array(got), type(got)
    h = host(got)
    assert h.shape == want.shape
    assert h.dtype == want.dtype
    tol = TOL[np.dtype(dtype or want.dtype).name]
    g64, w64 = h.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol)


def sizes(small, big):
    return big if BIG else small


# ------------------------------------------------------------------ raw TF ops

RAW_CASES = [
    # (NHWC input, filter [FH, FW, C, M], strides (h, w), padding, explicit, dilations)
    ((2, 5, 6, 3), (3, 3, 3, 1), (1, 1), "SAME", None, (1, 1)),
    ((2, 6, 5, 2), (2, 3, 2, 2), (2, 1), "VALID", None, (1, 2)),
    ((1, 5, 5, 2), (3, 2, 2, 3), (1, 2), "EXPLICIT", ((1, 2), (0, 3)), (2, 1)),
    ((2, 4, 7, 1), (1, 1, 1, 2), (3, 2), "SAME", None, (1, 1)),
]
RAW_CASES_BIG = [
    ((4, 17, 17, 48), (3, 1, 48, 4), (1, 1), "SAME", None, (1, 1)),
    ((3, 31, 33, 7), (3, 3, 7, 2), (2, 2), "VALID", None, (2, 1)),
    ((2, 29, 31, 3), (5, 4, 3, 2), (1, 3), "EXPLICIT", ((3, 2), (1, 0)), (2, 3)),
]


def raw_args(case, fmt):
    shape, fshape, (sh, sw), padding, explicit, (rh, rw) = case
    if fmt == "NCHW":
        shape = (shape[0], shape[3], shape[1], shape[2])
        strides, dil = [1, 1, sh, sw], [1, 1, rh, rw]
        expl = [0, 0, 0, 0, *explicit[0], *explicit[1]] if explicit else []
    else:
        strides, dil = [1, sh, sw, 1], [1, rh, rw, 1]
        expl = [0, 0, *explicit[0], *explicit[1], 0, 0] if explicit else []
    return shape, fshape, dict(strides=strides, padding=padding, explicit_paddings=expl,
                               data_format=fmt, dilations=dil)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", sizes(RAW_CASES, RAW_CASES_BIG), ids=str)
def test_raw_ops_match_cpu(case, fmt):
    rng = np.random.default_rng(0)
    shape, fshape, kw = raw_args(case, fmt)
    x = rand(rng, shape, np.float32)
    w = rand(rng, fshape, np.float32)
    y = numbasep.depthwise_conv2d_native(x, w, **kw)
    check(numbasep.depthwise_conv2d_native(dev(x), dev(w), **kw), y)
    dy = rand(rng, y.shape, np.float32)
    dx = numbasep.depthwise_conv2d_native_backprop_input(list(shape), w, dy, **kw)
    check(numbasep.depthwise_conv2d_native_backprop_input(list(shape), dev(w), dev(dy), **kw),
          dx)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(x, list(fshape), dy, **kw)
    check(numbasep.depthwise_conv2d_native_backprop_filter(dev(x), list(fshape), dev(dy),
                                                           **kw), dw)


def test_raw_ops_through_tf_names():
    x = np.arange(1, 13, dtype=np.float32).reshape(1, 2, 3, 2)
    w = np.arange(1, 17, dtype=np.float32).reshape(2, 2, 2, 2)
    y = numbasep.raw_ops.DepthwiseConv2dNative(input=dev(x), filter=dev(w),
                                               strides=[1, 1, 1, 1], padding="VALID")
    np.testing.assert_array_equal(host(y).ravel(),
                                  [196, 216, 272, 296, 252, 280, 344, 376])


# --------------------------------------------------------------- Keras-style ops

KERAS_CASES = [
    # (spatial, kernel, C, M, strides, dilation, padding)
    ((7,), (3,), 3, 2, 2, 1, "same"),
    ((8,), (3,), 2, 1, 1, 2, "causal"),
    ((5, 6), (3, 2), 2, 2, (2, 1), (1, 2), "valid"),
    ((5, 4), (2, 3), 3, 1, 1, 1, "same"),
    ((3, 4, 4), (2, 2, 3), 2, 1, (1, 2, 1), 1, "same"),
    ((4, 3, 5), (2, 1, 2), 1, 2, 1, (2, 1, 1), "valid"),
]
KERAS_CASES_BIG = [
    ((1024,), (5,), 16, 1, 1, 1, "same"),
    ((61,), (4,), 8, 3, 2, 3, "causal"),
    ((28, 30), (3, 3), 24, 2, (2, 1), (1, 2), "valid"),
    ((19, 19), (5, 5), 32, 1, 1, 1, "same"),
    ((6, 14, 14), (3, 3, 3), 8, 1, (1, 2, 2), 1, "same"),
    ((9, 8, 10), (2, 3, 2), 5, 2, 1, (2, 1, 3), "valid"),
]


def keras_arrays(case, channels_last, dtype, rng, filters=3):
    spatial, ks, c, m, st, dl, pad = case
    n = 2
    shape = (n, *spatial, c) if channels_last else (n, c, *spatial)
    x = rand(rng, shape, dtype)
    k = rand(rng, (*ks, c, m), dtype)
    pk = rand(rng, (1,) * len(spatial) + (c * m, filters), dtype)
    fmt = "channels_last" if channels_last else "channels_first"
    kw = dict(strides=st, padding=pad, data_format=fmt, dilation_rate=dl)
    return x, k, pk, kw


@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "cf"])
@pytest.mark.parametrize("case", sizes(KERAS_CASES, KERAS_CASES_BIG), ids=str)
def test_keras_ops_match_cpu(case, channels_last):
    rng = np.random.default_rng(1)
    x, k, pk, kw = keras_arrays(case, channels_last, np.float32, rng)
    y = numbasep.depthwise_conv(x, k, **kw)
    check(numbasep.depthwise_conv(dev(x), dev(k), **kw), y)
    dy = rand(rng, y.shape, np.float32)
    for got, want in zip(numbasep.depthwise_conv_grad(dev(x), dev(k), dev(dy), **kw),
                         numbasep.depthwise_conv_grad(x, k, dy, **kw)):
        check(got, want)
    s = numbasep.separable_conv(x, k, pk, **kw)
    check(numbasep.separable_conv(dev(x), dev(k), dev(pk), **kw), s)
    ds = rand(rng, s.shape, np.float32)
    for got, want in zip(numbasep.separable_conv_grad(dev(x), dev(k), dev(pk), dev(ds), **kw),
                         numbasep.separable_conv_grad(x, k, pk, ds, **kw)):
        check(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "cf"])
def test_dtypes_match_cpu(dtype, channels_last):
    """Every op in every dtype; results keep the dtype, 16-bit sums are float32."""
    rng = np.random.default_rng(2)
    case = sizes(((5, 4), (3, 2), 2, 2, (2, 1), (1, 2), "same"),
                 ((23, 21), (3, 3), 16, 2, (2, 1), (1, 2), "same"))
    x, k, pk, kw = keras_arrays(case, channels_last, dtype, rng, filters=4)
    y = numbasep.depthwise_conv(x, k, **kw)
    check(numbasep.depthwise_conv(dev(x), dev(k), **kw), y)
    dy = rand(rng, y.shape, dtype)
    for got, want in zip(numbasep.depthwise_conv_grad(dev(x), dev(k), dev(dy), **kw),
                         numbasep.depthwise_conv_grad(x, k, dy, **kw)):
        check(got, want)
    s = numbasep.separable_conv(x, k, pk, **kw)
    check(numbasep.separable_conv(dev(x), dev(k), dev(pk), **kw), s)
    ds = rand(rng, s.shape, dtype)
    for got, want in zip(numbasep.separable_conv_grad(dev(x), dev(k), dev(pk), dev(ds), **kw),
                         numbasep.separable_conv_grad(x, k, pk, ds, **kw)):
        check(got, want)


def ulp(a, dtype):
    """Spacing of ``dtype`` at each value of ``a`` (float64), for normal numbers."""
    mant = {"float16": 10, "bfloat16": 7}[np.dtype(dtype).name]
    e = np.floor(np.log2(np.maximum(np.abs(a), 2.0 ** -14)))
    return 2.0 ** (e - mant)


def test_16bit_rounds_once_from_float32():
    """A float16 / bfloat16 result is a float32 sum rounded once: within half an
    ulp (plus float32 summation error) of the exact value; accumulating in 16
    bits, or rounding twice, would not be."""
    rng = np.random.default_rng(3)
    x = rand(rng, (2, 9, 8, 3), np.float32)
    w = rand(rng, (5, 5, 3, 2), np.float32)
    for dt in (np.dtype(np.float16), BF16):
        xs, ws = x.astype(dt), w.astype(dt)
        exact = numbasep.depthwise_conv2d_native(xs.astype(np.float64), ws.astype(np.float64),
                                                 [1, 1, 1, 1], "SAME")
        got = host(numbasep.depthwise_conv2d_native(dev(xs), dev(ws), [1, 1, 1, 1], "SAME"))
        assert got.dtype == dt
        err = np.abs(got.astype(np.float64) - exact)
        bound = 0.5 * ulp(got.astype(np.float64), dt) + 1e-6 * (1 + np.abs(exact))
        assert (err <= bound).all(), float((err / bound).max())


def test_bfloat16_nan_inf_propagate():
    x = np.ones((1, 3, 3, 1), BF16)
    x[0, 0, 0, 0] = np.nan
    x[0, 2, 2, 0] = np.inf
    w = np.ones((1, 1, 1, 1), BF16)
    y = host(numbasep.depthwise_conv2d_native(dev(x), dev(w), [1, 1, 1, 1], "VALID"))
    assert np.isnan(y[0, 0, 0, 0]) and np.isinf(y[0, 2, 2, 0])
    assert (y.astype(np.float32)[np.isfinite(y.astype(np.float32))] == 1).all()


def test_transfers_copy_bfloat16_as_bits(monkeypatch):
    """numba-cuda refuses bfloat16 host arrays on a GPU; they go to the device as bits.

    ``support.refuse_bfloat16_buffers`` makes the simulator refuse them too, so a
    copy that hands numba-cuda a bfloat16 array fails here as it would on a device.
    """
    support.refuse_bfloat16_buffers(monkeypatch)
    rng = np.random.default_rng(11)
    for dtype in (BF16, np.dtype(np.float32)):
        a = rand(rng, (2, 3, 5), dtype)
        a[0, 0, :2] = [np.nan, -np.inf]
        d = transfer.to_device(a)
        assert is_device_array(d) and d.dtype == dtype and d.shape == a.shape
        back = d.copy_to_host()
        assert back.dtype == dtype
        assert back.tobytes() == a.tobytes()          # the same bits, NaN payloads too
        strided = d[:, ::2].copy_to_host()
        assert strided.tobytes() == np.ascontiguousarray(a[:, ::2]).tobytes()
    with pytest.raises(ValueError, match="'E'"):      # the stand-in does refuse
        cuda.to_device(rand(rng, (2,), BF16))
    with pytest.raises(ValueError, match="'E'"):
        transfer.to_device(rand(rng, (2,), BF16)).copy_to_host(np.empty(2, BF16))
    y = numbasep.depthwise_conv(transfer.to_device(rand(rng, (1, 4, 3), BF16)),
                                transfer.to_device(rand(rng, (3, 3, 1), BF16)), padding="same")
    assert y.copy_to_host().dtype == BF16


# --------------------------------------------------------------------------- out=

def test_out_is_filled_and_returned():
    rng = np.random.default_rng(4)
    x, k, pk, kw = keras_arrays(((5, 4), (3, 2), 2, 2, 1, 1, "same"), True, np.float32, rng)
    y = numbasep.depthwise_conv(x, k, **kw)
    o = cuda.device_array(y.shape, y.dtype)
    r = numbasep.depthwise_conv(dev(x), dev(k), **kw, out=o)
    assert r is o
    check(o, y)

    dy = rand(rng, y.shape, np.float32)
    dx, dk = numbasep.depthwise_conv_grad(x, k, dy, **kw)
    o1, o2 = cuda.device_array(dx.shape, dx.dtype), cuda.device_array(dk.shape, dk.dtype)
    r1, r2 = numbasep.depthwise_conv_grad(dev(x), dev(k), dev(dy), **kw, out=(o1, o2))
    assert r1 is o1 and r2 is o2
    check(o1, dx)
    check(o2, dk)

    s = numbasep.separable_conv(x, k, pk, **kw)
    o = cuda.device_array(s.shape, s.dtype)
    assert numbasep.separable_conv(dev(x), dev(k), dev(pk), **kw, out=o) is o
    check(o, s)

    ds = rand(rng, s.shape, np.float32)
    want = numbasep.separable_conv_grad(x, k, pk, ds, **kw)
    outs = (None, cuda.device_array(want[1].shape, np.float32),
            cuda.device_array(want[2].shape, np.float32))
    got = numbasep.separable_conv_grad(dev(x), dev(k), dev(pk), dev(ds), **kw, out=outs)
    assert got[1] is outs[1] and got[2] is outs[2]
    for g, w_ in zip(got, want):
        check(g, w_)

    shape, fshape, rkw = raw_args(RAW_CASES[1], "NCHW")
    x4, w4 = rand(rng, shape, np.float32), rand(rng, fshape, np.float32)
    y4 = numbasep.depthwise_conv2d_native(x4, w4, **rkw)
    dy4 = rand(rng, y4.shape, np.float32)
    for fn, args, want in (
        (numbasep.depthwise_conv2d_native, (dev(x4), dev(w4)), y4),
        (numbasep.depthwise_conv2d_native_backprop_input, (list(shape), dev(w4), dev(dy4)),
         numbasep.depthwise_conv2d_native_backprop_input(list(shape), w4, dy4, **rkw)),
        (numbasep.depthwise_conv2d_native_backprop_filter, (dev(x4), list(fshape), dev(dy4)),
         numbasep.depthwise_conv2d_native_backprop_filter(x4, list(fshape), dy4, **rkw)),
    ):
        o = cuda.device_array(want.shape, want.dtype)
        assert fn(*args, **rkw, out=o) is o
        check(o, want)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "cf"])
def test_strided_arguments_and_out(dtype, channels_last):
    """Non-contiguous device views as inputs and as out= (written in place)."""
    rng = np.random.default_rng(5)
    x, k, pk, kw = keras_arrays(((5, 4), (3, 2), 2, 1, 1, 1, "same"), channels_last, dtype,
                                rng)
    want = numbasep.separable_conv(x, k, pk, **kw)
    # Views taking every other element of a larger device array.
    xbig = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype)
    xbig[..., ::2] = x
    xd = dev(xbig)[:, :, :, ::2]   # (numba device arrays take no Ellipsis)
    obig = dev(np.zeros(want.shape[:1] + (2 * want.shape[1],) + want.shape[2:], dtype))
    o = obig[:, ::2]
    assert not o.is_c_contiguous() and not xd.is_c_contiguous()
    r = numbasep.separable_conv(xd, dev(k), dev(pk), **kw, out=o)
    assert r is o
    check(o, want)
    assert not host(obig)[:, 1::2].astype(np.float32).any()   # gaps untouched
    y = numbasep.depthwise_conv(x, k, **kw)
    ybig = dev(np.zeros(y.shape[:1] + (2 * y.shape[1],) + y.shape[2:], dtype))
    assert numbasep.depthwise_conv(xd, dev(k), **kw, out=ybig[:, ::2]) is not None
    check(ybig[:, ::2], y)


def test_out_errors():
    x = dev(np.ones((1, 4, 4, 2), np.float32))
    w = dev(np.ones((3, 3, 2, 1), np.float32))
    with pytest.raises(TypeError, match="out must be a CUDA array"):
        numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME",
                                         out=np.empty((1, 4, 4, 2), np.float32))
    with pytest.raises(ValueError, match="shape"):
        numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME",
                                         out=cuda.device_array((1, 4, 4, 3), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME",
                                         out=cuda.device_array((1, 4, 4, 2), np.float64))


def test_out_sharing_memory_with_an_argument_is_refused():
    x = dev(np.ones((1, 4, 4, 2), np.float32))
    w = dev(np.ones((3, 3, 2, 1), np.float32))
    with pytest.raises(numbasep.InvalidArgumentError, match="out shares memory with input"):
        numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME", out=x)
    assert (host(x) == 1).all()
    buf = cuda.to_device(np.ones((2, 4, 4, 2), np.float32))
    with pytest.raises(numbasep.InvalidArgumentError, match="out shares memory with input"):
        numbasep.depthwise_conv2d_native(buf[:1], w, [1, 1, 1, 1], "SAME", out=buf[:1])
    y = numbasep.depthwise_conv2d_native(buf[:1], w, [1, 1, 1, 1], "SAME", out=buf[1:])
    check(y, numbasep.depthwise_conv2d_native(np.ones((1, 4, 4, 2), np.float32),
                                              np.ones((3, 3, 2, 1), np.float32),
                                              [1, 1, 1, 1], "SAME"))


def test_results_stay_on_device(monkeypatch):
    """No host copy on the path: copying a device array to the host fails during the op."""
    rng = np.random.default_rng(6)
    x, k, pk, kw = keras_arrays(((5, 4), (3, 2), 2, 2, 1, 1, "same"), False, np.float32, rng)
    xd, kd, pkd = dev(x), dev(k), dev(pk)
    s = numbasep.separable_conv(x, k, pk, **kw)
    dsd = dev(rand(rng, s.shape, np.float32))

    def no_host(*a, **k):
        raise AssertionError("device array copied to the host")

    monkeypatch.setattr(type(xd), "copy_to_host", no_host)
    got = numbasep.separable_conv_grad(xd, kd, pkd, dsd, **kw)
    got2 = numbasep.separable_conv(xd, kd, pkd, **kw)
    monkeypatch.undo()
    assert all(is_device_array(g) for g in got + (got2,))


def test_empty_problems():
    x = dev(np.ones((0, 4, 4, 2), np.float32))
    w = dev(np.ones((3, 3, 2, 2), np.float32))
    y = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
    assert host(y).shape == (0, 4, 4, 4)
    dw = numbasep.depthwise_conv2d_native_backprop_filter(
        x, [3, 3, 2, 2], dev(np.ones((0, 4, 4, 4), np.float32)), [1, 1, 1, 1], "SAME")
    np.testing.assert_array_equal(host(dw), np.zeros((3, 3, 2, 2), np.float32))
    # Output size 0 (n=1, k=4, s=2, VALID).
    y = numbasep.depthwise_conv2d_native(dev(np.ones((1, 1, 5, 1), np.float32)),
                                         dev(np.ones((4, 1, 1, 1), np.float32)),
                                         [1, 2, 1, 1], "VALID")
    assert host(y).shape == (1, 0, 5, 1)


# -------------------------------------------------------------- determinism

@pytest.mark.parametrize("channels_last", [True, False], ids=["cl", "cf"])
def test_filter_gradient_is_deterministic(channels_last):
    """Partial sums are reduced in a fixed order: repeated runs agree bitwise."""
    rng = np.random.default_rng(7)
    case = sizes(((9, 8), (3, 3), 2, 1, 1, 1, "same"), ((112, 112), (3, 3), 32, 1, 1, 1, "same"))
    x, k, pk, kw = keras_arrays(case, channels_last, np.float32, rng)
    dy = rand(rng, numbasep.depthwise_conv(x, k, **kw).shape, np.float32)
    xd, kd, dyd = dev(x), dev(k), dev(dy)
    first = host(numbasep.depthwise_conv_grad(xd, kd, dyd, **kw)[1])
    for _ in range(2):
        again = host(numbasep.depthwise_conv_grad(xd, kd, dyd, **kw)[1])
        np.testing.assert_array_equal(again, first)
    s = numbasep.separable_conv(x, k, pk, **kw)
    ds = dev(rand(rng, s.shape, np.float32))
    a = host(numbasep.separable_conv_grad(xd, kd, dev(pk), ds, **kw)[2])
    b = host(numbasep.separable_conv_grad(xd, kd, dev(pk), ds, **kw)[2])
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------- foreign CUDA arrays

class ForeignArray:
    """Exposes only ``__cuda_array_interface__``, like CuPy or PyTorch (numba-cuda's test idiom).

    It wraps a device array; on the simulator, whose arrays have no interface,
    it describes the simulated (host) memory, which is what a CUDA pointer is there.
    """

    def __init__(self, darr):
        self._darr = darr

    @property
    def __cuda_array_interface__(self):
        if SIM:
            a = self._darr._ary
            ai = a.__array_interface__
            return {"shape": a.shape, "typestr": a.dtype.str, "data": ai["data"],
                    "strides": None if a.flags.c_contiguous else a.strides,
                    "version": 3, "stream": None}
        return self._darr.__cuda_array_interface__

    @property
    def dtype(self):
        return self._darr.dtype


def test_foreign_arrays_are_accepted_without_copy():
    rng = np.random.default_rng(8)
    x, k, pk, kw = keras_arrays(((5, 4), (3, 2), 2, 2, 1, 1, "same"), True, np.float32, rng)
    y = numbasep.depthwise_conv(x, k, **kw)
    assert backends.backend_name(ForeignArray(dev(x))) == "cuda"
    got = numbasep.depthwise_conv(ForeignArray(dev(x)), ForeignArray(dev(k)), **kw)
    check(got, y)   # an unknown producer gets a numba device array back
    od = cuda.device_array(y.shape, y.dtype)
    fo = ForeignArray(od)
    assert numbasep.depthwise_conv(ForeignArray(dev(x)), dev(k), **kw, out=fo) is fo
    check(od, y)    # written through the interface's pointer, no copy
    # A strided foreign view.
    big = dev(np.zeros(y.shape[:1] + (2 * y.shape[1],) + y.shape[2:], y.dtype))
    fo = ForeignArray(big[:, ::2])
    assert numbasep.depthwise_conv(dev(x), dev(k), **kw, out=fo) is fo
    check(big[:, ::2], y)


def test_foreign_bfloat16_described_as_void():
    """bfloat16 has no interface type code ('<V2'): the object's dtype tells."""
    rng = np.random.default_rng(9)
    x = rand(rng, (1, 4, 4, 2), BF16)
    w = rand(rng, (3, 3, 2, 1), BF16)
    want = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")
    got = numbasep.depthwise_conv2d_native(ForeignArray(dev(x)), ForeignArray(dev(w)),
                                           [1, 1, 1, 1], "SAME")
    check(got, want)


def _fake_module_array(module):
    cls = type("Tensor", (ForeignArray,), {"__module__": module})
    return cls


def test_wrap_returns_cupy_and_torch_kinds(monkeypatch):
    """Results go back through cupy.asarray / torch.as_tensor, imported only for their inputs."""
    calls = []

    class Wrapped:
        def __init__(self, kind, a):
            self.kind, self.array, self.dtype = kind, a, a.dtype

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.asarray = lambda a: calls.append(("cupy", None)) or Wrapped("cupy-array", a)
    fake_torch = types.ModuleType("torch")
    fake_torch.as_tensor = lambda a, device=None: calls.append(("torch", device)) or \
        Wrapped("torch-tensor", a)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    x = np.ones((1, 4, 4, 2), np.float32)
    w = np.ones((3, 3, 2, 1), np.float32)
    want = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME")

    CupyArray = _fake_module_array("cupy._core.core")
    r = numbasep.depthwise_conv2d_native(CupyArray(dev(x)), CupyArray(dev(w)),
                                         [1, 1, 1, 1], "SAME")
    assert r.kind == "cupy-array" and calls[-1][0] == "cupy"
    check(r.array, want)

    TorchTensor = _fake_module_array("torch")
    TorchTensor.device = "cuda:0"
    r = numbasep.depthwise_conv2d_native(TorchTensor(dev(x)), TorchTensor(dev(w)),
                                         [1, 1, 1, 1], "SAME")
    assert r.kind == "torch-tensor" and calls[-1] == ("torch", "cuda:0")
    check(r.array, want)


def test_numba_input_imports_no_array_library():
    code = (
        "import sys, numpy as np, numbasep\n"
        "from numba import cuda\n"
        "x = cuda.to_device(np.ones((1, 4, 4, 2), np.float32))\n"
        "w = cuda.to_device(np.ones((3, 3, 2, 1), np.float32))\n"
        "numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], 'SAME')\n"
        "print(sorted(m for m in ('cupy', 'torch') if m in sys.modules))\n"
    )
    env = dict(os.environ)
    if SIM:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


class _Unshareable:
    """A PyTorch-like tensor whose interface raises (requires_grad, or on the CPU)."""

    __module__ = "torch"

    def __init__(self, exc, device="cuda:0"):
        self._exc = exc
        self.device = device

    @property
    def __cuda_array_interface__(self):
        raise self._exc


def test_torch_tensor_that_requires_grad_gives_clear_typeerror():
    w = dev(np.ones((3, 3, 2, 1), np.float32))
    t = _Unshareable(RuntimeError("Can't get __cuda_array_interface__ on Variable that "
                                  "requires grad"))
    with pytest.raises(TypeError, match=r"input \(torch\..*detach\(\)"):
        numbasep.depthwise_conv2d_native(t, w, [1, 1, 1, 1], "SAME")


def test_torch_cpu_tensor_gives_clear_typeerror():
    w = dev(np.ones((3, 3, 2, 1), np.float32))
    t = _Unshareable(AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor"),
                     device="cpu")
    with pytest.raises(TypeError, match=r"filter .*not a CUDA array.*numpy\(\)"):
        numbasep.depthwise_conv2d_native(w, t, [1, 1, 1, 1], "SAME")


# ------------------------------------------------------------- installation

def test_missing_numba_cuda_says_what_to_install(monkeypatch):
    import importlib.util

    import numbasep.backends.cuda as cuda_backend
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba_cuda" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install numbasep\[cuda\]"):
        cuda_backend.backend()


def test_kernels_type_check_as_ptx():
    """Compile the kernels to PTX for sm_90 (catches typing errors the simulator
    cannot see: it runs kernels as Python); skipped without the CUDA toolkit wheels.

    The float32 and bfloat16 signatures by default (about a minute on 2 busy
    cores); NUMBASEP_FULL_PTX=1 compiles all of them (float16 and float64 too).
    """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    args = [sys.executable, "-m", "numbasep.backends.cuda.ptxcheck", "--cc", "9.0"]
    if os.environ.get("NUMBASEP_FULL_PTX") != "1":
        args.append("--quick")
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode == 77:
        pytest.skip(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_size_one_axes_inserted_into_strided_views():
    """The stride arithmetic the device path uses to view strided arrays as 5-D
    (the simulator reshapes through NumPy instead), checked against NumPy."""
    from numbasep.backends.cuda.driver import _strides_inserting_ones
    base = np.zeros((3, 8, 5, 6), np.float32)
    for view, new in ((base[:, ::2, 1:, ::3], (3, 1, 4, 4, 2)),
                      (base[:, ::2, 1:, ::3], (3, 4, 1, 4, 2)),
                      (base[::-1, :, :2, 0], (3, 1, 1, 8, 2)),
                      (base[:, 0, :, :], (3, 5, 1, 1, 6))):
        want = view.reshape(new)
        assert np.shares_memory(want, view)
        got = _strides_inserting_ones(view.shape, view.strides, new, view.itemsize)
        assert [s for s, n in zip(got, new) if n != 1] == \
            [s for s, n in zip(want.strides, new) if n != 1]
    with pytest.raises(ValueError, match="cannot view"):
        _strides_inserting_ones((3, 4), (16, 4), (3, 2, 2), 4)
