"""64-byte-aligned arrays (numbasep/aligned.py): the public ``empty_aligned``, the
CPU backend's results and temporaries, and the benchmark's inputs."""

import ml_dtypes
import numpy as np
import pytest

import numbasep
from numbasep import aligned, suite
from numbasep.backends.cpu import scratch
from numbasep.peers import _harness


def address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16,
                                   np.uint8])
@pytest.mark.parametrize("shape", [7, (0,), (3, 5), (2, 0, 4), (8, 56, 56, 3)])
def test_empty_aligned(shape, dtype):
    a = numbasep.empty_aligned(shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert a.shape == want and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    if a.size:
        assert address(a) % 64 == 0
    a[...] = 1                       # the whole view is writable memory
    assert (a == 1).all()


def test_contiguous_copies_only_what_is_not():
    a = np.arange(40000, dtype=np.float32).reshape(200, 200)
    assert aligned.contiguous(a) is a
    t = aligned.contiguous(a.T)
    np.testing.assert_array_equal(t, a.T)
    assert t.flags.c_contiguous and address(t) % 64 == 0
    h = aligned.contiguous(a, np.float16)
    assert h.dtype == np.float16 and address(h) % 64 == 0
    np.testing.assert_array_equal(h, a.astype(np.float16))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_cpu_results_from_64_kb_on_are_aligned(fmt, dtype):
    x = np.ones((2, 24, 24, 64) if fmt == "NHWC" else (2, 64, 24, 24), dtype)
    w = np.ones((3, 3, 64, 1), dtype)
    y = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME", data_format=fmt)
    assert y.nbytes >= 1 << 16 and address(y) % 64 == 0
    dx = numbasep.depthwise_conv2d_native_backprop_input(list(x.shape), w, y, [1, 1, 1, 1],
                                                        "SAME", data_format=fmt)
    assert address(dx) % 64 == 0


def test_scratch_views_are_aligned():
    for n in (10, 1000, 100000):
        v = scratch.empty(scratch.OPERAND_1, (n,), np.float32)
        assert address(v) % 64 == 0


def test_benchmark_inputs_are_aligned_for_numbasep_and_the_peers():
    c = suite.make_case("backprop_input", 2, 9, 24, 3)
    arrays, _ = suite.make_inputs(c, 0)
    assert all(address(a) % 64 == 0 for a in arrays.values() if a is not None)
    r = _harness.random_array(np.random.default_rng(0), (3, 5, 7))
    assert address(r) % 64 == 0 and r.dtype == np.float32 and r.shape == (3, 5, 7)
    assert np.isfinite(r).all() and r.std() > 0.3
