"""Reused scratch buffers (numbasep/backends/cpu/scratch.py) never leak into results:
what an operator returns (or writes into ``out``) stays as it was while later calls
reuse the same thread's buffers, on every 16-bit path that uses them."""

import threading

import ml_dtypes
import numpy as np
import pytest

import numbasep as nb
from numbasep.backends.cpu import scratch

import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def _rand(rng, shape, dtype):
    return rng.uniform(-1, 1, shape).astype(dtype)


def _calls(x, k, pk, dy, ds, fmt):
    kw = dict(strides=1, padding="same", data_format=fmt)
    return {
        "forward": lambda: nb.depthwise_conv(x, k, **kw),
        "grad": lambda: nb.depthwise_conv_grad(x, k, dy, **kw),
        "separable": lambda: nb.separable_conv(x, k, pk, **kw),
        "separable_grad": lambda: nb.separable_conv_grad(x, k, pk, ds, **kw),
    }


# Every pair of (dtype, multiplier, layout) values once, not their product: each
# (dtype, multiplier) of the channels-last lane kernels is a compilation of its
# own (about 100 s for the four operators), and bfloat16 with a multiplier on the
# lanes is compiled for this test only. Every path through scratch is still taken:
# 16-bit widening in both layouts, with and without a multiplier.
@pytest.mark.parametrize("dtype, m, fmt", [
    (np.dtype(np.float16), 2, "channels_last"), (np.dtype(np.float16), 1, "channels_first"),
    (BF16, 1, "channels_last"), (BF16, 2, "channels_first"),
    (np.dtype(np.float32), 2, "channels_last"), (np.dtype(np.float32), 1, "channels_first")],
    ids=["float16-2-channels_last", "float16-1-channels_first", "bfloat16-1-channels_last",
         "bfloat16-2-channels_first", "float32-2-channels_last", "float32-1-channels_first"])
def test_results_survive_later_calls(dtype, m, fmt):
    """Including the separable ops, whose depthwise output and its gradient are
    intermediates in scratch (``CPUBackend.intermediate``)."""
    rng = np.random.default_rng(5)

    def data(*shape):     # shape given channels-last
        a = _rand(rng, shape, dtype)
        return a if fmt == "channels_last" else np.ascontiguousarray(np.moveaxis(a, -1, 1))
    x = data(2, 9, 9, 8)
    k = _rand(rng, (3, 3, 8, m), dtype)
    pk = _rand(rng, (1, 1, 8 * m, 5), dtype)
    dy = data(2, 9, 9, 8 * m)
    ds = data(2, 9, 9, 5)
    first = {name: call() for name, call in _calls(x, k, pk, dy, ds, fmt).items()}
    snapshot = {name: [np.array(a, copy=True) for a in (r if isinstance(r, tuple) else (r,))]
                for name, r in first.items()}
    # other data of the same shapes through every path again: same buffers
    x2, k2, dy2, ds2 = (_rand(rng, a.shape, dtype) for a in (x, k, dy, ds))
    for call in _calls(x2, k2, pk, dy2, ds2, fmt).values():
        call()
    for name, r in first.items():
        for got, was in zip(r if isinstance(r, tuple) else (r,), snapshot[name]):
            np.testing.assert_array_equal(got.view(np.uint16), was.view(np.uint16), name)
    # and they are right (float64 reference, 16-bit tolerance)
    x64, k64, pk64 = (a.astype(np.float64) for a in (x, k, pk))
    ds64 = ds.astype(np.float64)
    sep_grad = ref.keras_separable_grad(x64, k64, pk64, ds64, 1, "same", fmt)
    for name, want in (("forward", ref.keras_depthwise(x64, k64, 1, "same", fmt)),
                       ("separable", ref.keras_separable(x64, k64, pk64, 1, "same", fmt)),
                       *((f"separable_grad[{i}]", g) for i, g in enumerate(sep_grad))):
        got = first[name] if "[" not in name else first["separable_grad"][int(name[-2])]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=3e-2, atol=6e-2,
                                   err_msg=name)


def test_out_of_another_dtype_is_filled_through_scratch():
    rng = np.random.default_rng(6)
    x = _rand(rng, (1, 7, 7, 8), np.float32)
    k = _rand(rng, (3, 3, 8, 1), np.float32)
    out = np.empty((1, 8, 7, 7), np.float32).transpose(0, 2, 3, 1)   # not C-contiguous
    got = nb.depthwise_conv(x, k, 1, "same", out=out)
    keep = got.copy()
    nb.depthwise_conv(_rand(rng, x.shape, np.float32), k, 1, "same",
                      out=np.empty((1, 8, 7, 7), np.float32).transpose(0, 2, 3, 1))
    assert got is out
    np.testing.assert_array_equal(out, keep)
    np.testing.assert_allclose(out, ref.keras_depthwise(x.astype(np.float64),
                                                       k.astype(np.float64), 1, "same"),
                               rtol=1e-5, atol=1e-5)


def test_slots_are_per_thread_and_reused():
    a = scratch.empty(scratch.OPERAND_0, (4, 5), np.float32)
    b = scratch.empty(scratch.OPERAND_0, (2, 3), np.float64)
    c = scratch.empty(scratch.OPERAND_1, (4, 5), np.float32)
    assert np.shares_memory(a, b) and not np.shares_memory(a, c)
    assert b.shape == (2, 3) and b.dtype == np.float64 and b.flags.c_contiguous
    other = []
    t = threading.Thread(target=lambda: other.append(scratch.empty(scratch.OPERAND_0, (4, 5),
                                                                   np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(a, other[0])
    big = scratch.KEEP_BYTES // 4 + 1
    assert not np.shares_memory(scratch.empty(scratch.RESULT, (big,), np.float32),
                                scratch.empty(scratch.RESULT, (big,), np.float32))
    scratch.release()
    assert not np.shares_memory(a, scratch.empty(scratch.OPERAND_0, (4, 5), np.float32))


def test_repeated_requests_follow_the_buffer_as_it_grows():
    """A repeated request may get the view it got before, but never one of a buffer
    the slot has replaced: after the slot grows, every shape is a view of the new
    buffer (so the old one is not kept alive), and a view is only reused while it
    is exactly the shape and dtype asked for."""
    scratch.release()
    small = scratch.empty(scratch.PARTIALS, (3, 4), np.float32)
    assert scratch.empty(scratch.PARTIALS, (3, 4), np.float32) is small
    other = scratch.empty(scratch.PARTIALS, (4, 3), np.float32)
    assert other.shape == (4, 3) and np.shares_memory(small, other)
    wide = scratch.empty(scratch.PARTIALS, (3, 4), np.float64)
    assert wide.dtype == np.float64 and wide.shape == (3, 4)
    grown = scratch.empty(scratch.PARTIALS, (1000, 100), np.float32)
    again = scratch.empty(scratch.PARTIALS, (3, 4), np.float32)
    assert again.shape == (3, 4) and again.dtype == np.float32
    assert np.shares_memory(again, grown) and not np.shares_memory(again, small)
    assert scratch.empty(scratch.PARTIALS, (3, 4), np.float64).base is not wide.base
    for i in range(2 * scratch._VIEWS_MAX):          # many shapes: still the same buffer
        assert np.shares_memory(scratch.empty(scratch.PARTIALS, (i + 1,), np.float32), grown)
    scratch.release()
