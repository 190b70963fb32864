"""The plan cache of numbasep.shapes: a hit is the plan a fresh validation gives,
callers cannot corrupt it, and only plain values are ever cached."""

import numpy as np
import pytest

import numbasep
from numbasep import config, shapes


@pytest.fixture(autouse=True)
def empty_cache():
    shapes._PLAN_CACHE.clear()
    yield
    shapes._PLAN_CACHE.clear()


def _fresh(fn, *args, **kwargs):
    return fn.__wrapped__(*args, **kwargs)


@pytest.mark.parametrize("call", [
    (shapes.raw_forward, ((2, 9, 9, 3), (3, 3, 3, 2), [1, 2, 2, 1], "SAME"), {}),
    (shapes.raw_forward, ((2, 3, 9, 9), (3, 3, 3, 2), (1, 1, 2, 2), "EXPLICIT",
                          [0, 0, 0, 0, 1, 2, 0, 1], "NCHW"), {}),
    (shapes.raw_backprop_input, ([2, 9, 9, 3], (3, 3, 3, 1), (2, 5, 5, 3), [1, 2, 2, 1],
                                 "SAME"), {}),
    (shapes.raw_backprop_filter, ((2, 9, 9, 3), [3, 3, 3, 1], (2, 7, 7, 3), [1, 1, 1, 1],
                                  "VALID"), {}),
    (shapes.keras, ((2, 20, 3), (4, 3, 1)), {"strides": 2, "dilation_rate": 2}),
    (shapes.keras, ((2, 8, 8, 3), (3, 3, 3, 2)),
     {"padding": "same", "pointwise_shape": (1, 1, 6, 4)}),
])
def test_a_hit_equals_a_fresh_plan_and_typing_it_leaves_it_alone(call):
    fn, args, kwargs = call
    first = fn(*args, **kwargs)
    assert len(shapes._PLAN_CACHE) == 1
    typed = first.with_dtype(np.dtype(np.float64))   # what the operators do with a plan
    assert typed.dtype == np.float64 and typed is not first
    assert typed is first.with_dtype(np.dtype(np.float64))
    assert first.with_dtype(np.dtype(np.float32)).dtype == np.float32
    second = fn(*args, **kwargs)
    assert second is first and second.dtype is None
    assert second == _fresh(fn, *args, **kwargs)
    assert typed == _fresh(fn, *args, **kwargs).with_dtype(np.dtype(np.float64))
    assert len(shapes._PLAN_CACHE) == 1


def test_lists_and_tuples_share_an_entry_and_agree():
    a = shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), [1, 1, 1, 1], "SAME")
    b = shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), (1, 1, 1, 1), "SAME")
    assert a == b and len(shapes._PLAN_CACHE) == 1


@pytest.mark.parametrize("strides", [
    [True, 1, 1, True],                 # bool: rejected, whatever the cache holds
    [np.int64(1), 1, 1, 1],             # NumPy integers: validated every time
    [1.0, 1, 1, 1],
])
def test_non_plain_values_are_never_cached(strides):
    shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), [1, 1, 1, 1], "SAME")
    try:
        shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), strides, "SAME")
    except (numbasep.InvalidArgumentError, TypeError):
        pass
    assert len(shapes._PLAN_CACHE) == 1


def test_bool_strides_are_still_rejected_after_the_int_plan_is_cached():
    shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), [1, 1, 1, 1], "SAME")
    with pytest.raises(numbasep.InvalidArgumentError, match="strides"):
        shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), [True, 1, 1, True], "SAME")


def test_errors_are_not_cached():
    for _ in range(2):
        with pytest.raises(numbasep.InvalidArgumentError):
            shapes.raw_forward((1, 5, 5, 2), (3, 3, 2, 1), [1, 0, 1, 1], "SAME")
    assert not shapes._PLAN_CACHE


def test_default_data_format_is_part_of_the_key():
    x, k = (2, 3, 8, 8), (3, 3, 3, 1)
    with pytest.raises(numbasep.InvalidArgumentError):
        shapes.keras(x, k)            # channels_last: 8 channels vs the kernel's 3
    config.set_image_data_format("channels_first")
    try:
        p = shapes.keras(x, k)
        assert not p.channels_last and p.channels == 3
    finally:
        config.set_image_data_format("channels_last")
    with pytest.raises(numbasep.InvalidArgumentError):
        shapes.keras(x, k)


def test_the_cache_is_bounded():
    for n in range(shapes._PLAN_CACHE_MAX + 10):
        shapes.raw_forward((n + 1, 5, 5, 2), (3, 3, 2, 1), [1, 1, 1, 1], "SAME")
    assert len(shapes._PLAN_CACHE) <= shapes._PLAN_CACHE_MAX


# ------------------------------------------------- the operators' repeated-call path

from numbasep import ops  # noqa: E402


@pytest.fixture
def empty_fast():
    ops._FAST.clear()
    yield
    ops._FAST.clear()


def _fwd(x, w, **kw):
    return numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME", **kw)


def test_a_repeated_call_takes_the_cached_path_and_gives_the_same_result(empty_fast):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 1)).astype(np.float32)
    first = _fwd(x, w)
    assert len(ops._FAST) == 1
    np.testing.assert_array_equal(_fwd(x, w), first)
    np.testing.assert_array_equal(_fwd(x[:, ::-1], w), _fwd(np.ascontiguousarray(x[:, ::-1]), w))
    assert len(ops._FAST) == 2       # the reversed view: other strides, other key


def test_memory_limit_set_later_still_refuses(empty_fast, monkeypatch):
    x = np.ones((2, 6, 6, 3), np.float32)
    w = np.ones((3, 3, 3, 1), np.float32)
    _fwd(x, w)
    monkeypatch.setenv(shapes.MAX_BYTES_ENV, "64")
    with pytest.raises(numbasep.InvalidArgumentError, match="memory"):
        _fwd(x, w)


def test_a_read_only_out_is_refused_after_a_writable_one(empty_fast):
    x = np.ones((1, 4, 4, 2), np.float32)
    w = np.ones((3, 3, 2, 1), np.float32)
    out = np.empty((1, 4, 4, 2), np.float32)
    assert _fwd(x, w, out=out) is out
    out.flags.writeable = False
    with pytest.raises(numbasep.InvalidArgumentError, match="read-only"):
        _fwd(x, w, out=out)


def test_errors_and_lists_never_enter_the_cache(empty_fast):
    w = np.ones((3, 3, 2, 1), np.float32)
    for _ in range(2):
        with pytest.raises(TypeError):
            _fwd(np.ones((1, 4, 4, 2), np.float64), w)
    assert not ops._FAST
    _fwd([[[[1.0, 2.0]] * 4] * 4], w.astype(np.float64))
    assert not ops._FAST


def test_the_default_data_format_is_part_of_the_key(empty_fast):
    x = np.ones((1, 3, 8, 8), np.float32)
    k = np.ones((3, 3, 3, 1), np.float32)
    with pytest.raises(numbasep.InvalidArgumentError):
        numbasep.depthwise_conv(x, k)                  # channels_last: 8 channels
    config.set_image_data_format("channels_first")
    try:
        assert numbasep.depthwise_conv(x, k).shape == (1, 3, 6, 6)
    finally:
        config.set_image_data_format("channels_last")
    with pytest.raises(numbasep.InvalidArgumentError):
        numbasep.depthwise_conv(x, k)


def test_the_cpu_kernel_choice_is_made_once_per_plan(empty_fast, monkeypatch):
    from numbasep.backends.cpu import driver
    decided = []
    real = driver._filter_gradient_route

    def spy(plan):
        decided.append(plan)
        return real(plan)
    monkeypatch.setattr(driver, "_filter_gradient_route", spy)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7, 7, 5)).astype(np.float32)
    dy = rng.standard_normal((3, 7, 7, 5)).astype(np.float32)
    grads = [numbasep.depthwise_conv2d_native_backprop_filter(
        a, [3, 3, 5, 1], dy, [1, 1, 1, 1], "SAME") for a in (x, x, x.copy(), x[:, ::-1])]
    assert len(decided) == 1          # the strided view: another key, the same plan
    for g in grads[1:3]:
        np.testing.assert_array_equal(g, grads[0])
    assert not np.array_equal(grads[3], grads[0])


def _three_ops(layout):
    s = [1, 1, 1, 1]
    return {
        "fwd": lambda x, w, dy, out=None: numbasep.depthwise_conv2d_native(
            x, w, s, "SAME", data_format=layout, out=out),
        "bin": lambda x, w, dy, out=None: numbasep.depthwise_conv2d_native_backprop_input(
            list(x.shape), w, dy, s, "SAME", data_format=layout, out=out),
        "bfil": lambda x, w, dy, out=None: numbasep.depthwise_conv2d_native_backprop_filter(
            x, list(w.shape), dy, s, "SAME", data_format=layout, out=out),
    }


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("n", [1, 3])           # one partial filter, or several
@pytest.mark.parametrize("with_out", [False, True])
def test_a_repeated_call_bound_to_its_kernel_gives_the_general_paths_result(
        empty_fast, layout, dtype, n, with_out):
    """The second call runs what ``Backend.bind`` kept: for contiguous float32 and
    float64 NumPy arrays the kernel itself; the results must not change."""
    rng = np.random.default_rng(2)
    shape = (n, 6, 5, 9) if layout == "NHWC" else (n, 9, 6, 5)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((3, 3, 9, 1)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    for name, op in _three_ops(layout).items():
        like = w if name == "bfil" else x
        outs = [np.full_like(like, np.nan) if with_out else None for _ in range(3)]
        first = op(x, w, dy, out=outs[0])
        (run,) = [hit[1] for key, hit in ops._FAST.items() if key[0] == name]
        direct = run.__qualname__.startswith("_direct.")
        assert direct == (dtype != np.float16), (name, run.__qualname__)
        for out in outs[1:]:
            again = op(x, w, dy, out=out)
            assert again.dtype == dtype and again.shape == like.shape
            assert out is None or again is out
            np.testing.assert_array_equal(again, first)
        assert first is not again
