"""Memory: repeated calls do not grow the process, and one call's footprint is bounded.

Footprint of one call (CPU backend)
-----------------------------------
With ``E(a)`` the element count of an array, ``item`` the size of the arguments'
dtype and ``acc`` that of the accumulation dtype (4 bytes for float16, bfloat16
and float32, 8 for float64), one call allocates at most:

* every result: ``E × item``, plus ``E × acc`` when the dtype is 16-bit (the kernel
  writes a float32 buffer that is rounded once into the result) or when the result
  goes into a caller's ``out`` that is 16-bit or not C-contiguous (``E × acc``
  only, then);
* filter gradients: per-chunk partial sums, ``chunks × E(filter) × acc`` with
  ``chunks = min(rows, 64, 2**22 // E(filter))`` (at least 1) — never more than
  ``max(E(filter), min(64 × E(filter), 2**22)) × acc``; they make the reduction
  order independent of the thread count, so they do not grow with threads;
* every 16-bit or non-C-contiguous array argument: one C-contiguous copy,
  ``E × acc`` (16-bit data widened to float32);
* ``separable_conv``: the depthwise intermediate ``z``, ``E(output) × acc``;
  ``separable_conv_grad``: ``z``, its gradient ``dz`` and the pointwise filter
  gradient's temporaries, at most ``3 × E(output) × acc`` more;
* depth multipliers above 1: the input with each channel repeated M times (for the
  forward and filter gradient) or the input gradient of such an input (for the
  input gradient), ``M × E(input) × acc``, twice that for channels-first problems
  (in case the repeated problem is computed channels-last);
* channels-first problems may be computed as channels-last (the CPU backend does
  so for maps of 16 columns or fewer): then every array argument in the data
  layout is copied (``E × acc``, once, whatever its dtype or strides), every
  data-layout result has a channels-last buffer (``E × acc``, which a 16-bit
  result has anyway), and the intermediates above count twice.

That is what numbasep counts before allocating anything, refusing with an
``InvalidArgumentError`` any call whose count exceeds the machine's physical
memory (or ``NUMBASEP_MAX_BYTES``). ``test_one_call_footprint_is_bounded``
measures the allocations of one call with ``tracemalloc`` (NumPy reports its
buffers to it; the kernels allocate nothing) and checks them against both the
formula above and numbasep's own count.

Growth
------
After a warm-up, 10 000 small calls and 100 larger ones (a few MiB each) cycling
through every operator must not grow the resident set size (``/proc/self/statm``)
by more than a small bound: nothing is cached per call, and freed buffers are
reused by the allocator.
"""

import gc
import os
import re
import tracemalloc

import ml_dtypes
import numba
import numpy as np
import pytest

import numbasep

import support

BF16 = np.dtype(ml_dtypes.bfloat16)
ONES = [1, 1, 1, 1]
MiB = 1 << 20


_cuda_missing = support.cuda_missing


def rss():
    """Resident set size in bytes, from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                reason="needs /proc/self/statm (Linux)")


def rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def E(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# ----------------------------------------------------------------- one call

def _case(name, dtype, cf=False, strided=False, with_out=False, narrow=False):
    """(call, documented bound in bytes, result bytes) for one operator call."""
    dt = np.dtype(dtype)
    item = dt.itemsize
    acc = 8 if dt == np.float64 else 4
    wide = item != acc
    N, H, W, C, M, F = 4, 40, (12 if narrow else 36), 8, 2, 12
    x_shape = (N, C, H, W) if cf else (N, H, W, C)
    x = rand(x_shape, dt, 1)
    if strided:
        big = rand(x_shape[:-1] + (2 * x_shape[-1],), dt, 1)
        x = big[..., ::2]
    w = rand((3, 3, C, M), dt, 2)
    fmt = "NCHW" if cf else "NHWC"
    kfmt = "channels_first" if cf else "channels_last"
    y_shape = (N, C * M, H, W) if cf else (N, H, W, C * M)
    dy = rand(y_shape, dt, 3)
    pk = rand((1, 1, C * M, F), dt, 4)
    o_shape = (N, F, H, W) if cf else (N, H, W, F)
    g = rand(o_shape, dt, 5)

    data = {id(a) for a in (x, dy, g)}

    def copies(*arrays):
        return sum(E(a.shape) * acc for a in arrays
                   if wide or not a.flags.c_contiguous or (cf and id(a) in data))

    def result(shape, given=False, in_layout=False):
        n = E(shape)
        if given:
            return n * acc
        return n * item + (n * acc if wide or (cf and in_layout) else 0)

    t = 2 if cf else 1          # intermediates: channels-last and channels-first copies
    # the CPU backend computes M > 1 on the input with its channels repeated M times
    ws = E(x_shape) * M * acc * t

    fsize = E(w.shape)
    parts = max(fsize, min(64 * fsize, 1 << 22)) * acc
    out = None
    if name == "fwd":
        if with_out:
            out = np.empty(y_shape, dt)
        call = lambda: numbasep.depthwise_conv2d_native(  # noqa: E731
            x, w, ONES, "SAME", data_format=fmt, out=out)
        bound = ws + result(y_shape, with_out, True) + copies(x, w)
        res = 0 if with_out else E(y_shape) * item
    elif name == "bi":
        call = lambda: numbasep.depthwise_conv2d_native_backprop_input(  # noqa: E731
            list(x_shape), w, dy, ONES, "SAME", data_format=fmt)
        bound = ws + result(x_shape, in_layout=True) + copies(w, dy)
        res = E(x_shape) * item
    elif name == "bf":
        call = lambda: numbasep.depthwise_conv2d_native_backprop_filter(  # noqa: E731
            x, list(w.shape), dy, ONES, "SAME", data_format=fmt)
        bound = ws + result(w.shape) + copies(x, dy) + parts
        res = E(w.shape) * item
    elif name == "sc":
        call = lambda: numbasep.separable_conv(  # noqa: E731
            x, w, pk, padding="same", data_format=kfmt)
        bound = ws + result(o_shape) + copies(x, w, pk) + t * E(y_shape) * acc
        res = E(o_shape) * item
    elif name == "dcg":
        call = lambda: numbasep.depthwise_conv_grad(  # noqa: E731
            x, w, dy, padding="same", data_format=kfmt)
        bound = ws + result(x_shape, in_layout=True) + result(w.shape) + copies(x, w, dy) + parts
        res = (E(x_shape) + E(w.shape)) * item
    else:  # scg
        call = lambda: numbasep.separable_conv_grad(  # noqa: E731
            x, w, pk, g, padding="same", data_format=kfmt)
        bound = ws + (result(x_shape, in_layout=True) + result(w.shape) + result(pk.shape)
                 + copies(x, w, pk, g) + parts + 3 * t * E(y_shape) * acc)
        res = (E(x_shape) + E(w.shape) + E(pk.shape)) * item
    return call, bound, res


def _numbasep_count(call, monkeypatch):
    """The byte count numbasep's memory refusal computes for ``call``."""
    monkeypatch.setenv("NUMBASEP_MAX_BYTES", "1")
    try:
        with pytest.raises(numbasep.InvalidArgumentError, match=r"would need") as e:
            call()
    finally:
        monkeypatch.delenv("NUMBASEP_MAX_BYTES")
    return int(re.search(r"\((\d+) bytes\)", str(e.value)).group(1))


@pytest.mark.parametrize("name", ["fwd", "bi", "bf", "sc", "dcg", "scg"])
@pytest.mark.parametrize("dtype,cf,strided,with_out,narrow", [
    (np.float32, False, False, False, False),
    (np.float64, True, False, False, False),
    (np.float16, False, True, False, False),
    (BF16, True, False, False, False),
    (np.float32, True, True, True, False),
    (np.float16, False, False, True, False),
    (np.float32, True, False, False, True),
    (np.float16, True, False, False, True),
], ids=["f32", "f64_cf", "f16_strided", "bf16_cf", "f32_cf_strided_out", "f16_out",
        "f32_cf_narrow", "f16_cf_narrow"])
def test_one_call_footprint_is_bounded(monkeypatch, name, dtype, cf, strided, with_out,
                                       narrow):
    monkeypatch.delenv("NUMBASEP_MAX_BYTES", raising=False)
    call, bound, result_bytes = _case(name, dtype, cf, strided, with_out, narrow)
    call()                                  # compile, and warm every cache
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = call()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del r
    slack = 64 << 10                         # Python objects, shape tuples, views
    assert peak >= result_bytes * 0.99, "tracemalloc does not see the arrays"
    assert peak <= bound + slack, f"one call allocated {peak} bytes, documented bound {bound}"
    counted = _numbasep_count(call, monkeypatch)
    assert peak <= counted + slack, (
        f"numbasep's memory refusal counts {counted} bytes but the call allocated {peak}")


# ----------------------------------------------------------------- growth

def _ops(scale):
    s = scale
    x = rand((2, 6 * s, 5 * s, 3), np.float32, 1)
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    w = rand((3, 3, 3, 2), np.float32, 2)
    dy = rand((2, 6 * s, 5 * s, 6), np.float32, 3)
    dyc = np.ascontiguousarray(np.moveaxis(dy, -1, 1))
    pk = rand((1, 1, 6, 4), np.float32, 4)
    g = rand((2, 6 * s, 5 * s, 4), np.float32, 5)
    x16 = x.astype(np.float16)
    w16 = w.astype(np.float16)
    out = np.empty((2, 6 * s, 5 * s, 6), np.float32)
    return [
        lambda: numbasep.depthwise_conv2d_native(x, w, ONES, "SAME", out=out),
        lambda: numbasep.depthwise_conv2d_native(xc, w, ONES, "VALID", data_format="NCHW"),
        lambda: numbasep.depthwise_conv2d_native(x16, w16, [1, 2, 2, 1], "SAME"),
        lambda: numbasep.depthwise_conv2d_native_backprop_input(list(x.shape), w, dy, ONES,
                                                                "SAME"),
        lambda: numbasep.depthwise_conv2d_native_backprop_filter(xc, [3, 3, 3, 2], dyc, ONES,
                                                                 "SAME", data_format="NCHW"),
        lambda: numbasep.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=[3, 3, 3, 2], out_backprop=dy, strides=ONES,
            padding="SAME"),
        lambda: numbasep.separable_conv(x, w, pk, padding="same"),
        lambda: numbasep.depthwise_conv_grad(x, w, dy, padding="same"),
        lambda: numbasep.separable_conv_grad(x, w, pk, g, padding="same"),
        lambda: _rejected(x, w),
    ]


def _rejected(x, w):
    try:
        numbasep.depthwise_conv2d_native(x, w, [1, 0, 1, 1], "SAME")
    except numbasep.InvalidArgumentError:
        return None
    raise AssertionError("not rejected")


def _growth(ops, calls, warm):
    for i in range(warm):
        ops[i % len(ops)]()
    gc.collect()
    before = rss()
    for i in range(calls):
        ops[i % len(ops)]()
    gc.collect()
    return rss() - before


@needs_proc
def test_rss_stable_over_10000_small_calls():
    # One Numba thread: on an oversubscribed machine GNU OpenMP's spin-waiting makes
    # each parallel launch cost milliseconds; the per-call allocations, which are
    # what is measured, do not depend on the thread count.
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        growth = _growth(_ops(1), 10_000, warm=500)
    finally:
        numba.set_num_threads(old)
    assert growth <= 4 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over 10 000 small calls"


@needs_proc
def test_rss_stable_over_100_large_calls():
    ops = _ops(24)                       # inputs of about 1.6 MiB, results up to 3.3 MiB
    one = max(_case_bytes(op) for op in ops)
    growth = _growth(ops, 100, warm=20)
    assert growth <= 2 * one + 8 * MiB, (
        f"RSS grew by {growth / MiB:.1f} MiB over 100 calls of at most "
        f"{one / MiB:.1f} MiB each")


def _case_bytes(op):
    tracemalloc.start()
    try:
        op()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@needs_proc
@pytest.mark.skipif(bool(_cuda_missing()), reason=str(_cuda_missing()))
def test_cuda_rss_stable_over_repeated_calls():
    """Device calls (the simulator's device memory is host memory) do not accumulate."""
    from numba import cuda
    x = cuda.to_device(rand((1, 5, 5, 2), np.float32, 1))
    w = cuda.to_device(rand((2, 2, 2, 1), np.float32, 2))
    dy = cuda.to_device(rand((1, 4, 4, 2), np.float32, 3))
    ops = [
        lambda: numbasep.depthwise_conv2d_native(x, w, ONES, "VALID"),
        lambda: numbasep.depthwise_conv2d_native_backprop_input([1, 5, 5, 2], w, dy, ONES,
                                                                "VALID"),
        lambda: numbasep.depthwise_conv2d_native_backprop_filter(x, [2, 2, 2, 1], dy, ONES,
                                                                 "VALID"),
    ]
    calls = 30 if cuda.config.ENABLE_CUDASIM else 3000
    growth = _growth(ops, calls, warm=6)
    assert growth <= 4 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over {calls} device calls"
    if not cuda.config.ENABLE_CUDASIM:
        free0 = cuda.current_context().get_memory_info()[0]
        _growth(ops, calls, warm=0)
        assert free0 - cuda.current_context().get_memory_info()[0] <= 16 * MiB
