"""16-bit operands read as bit patterns by the channels-last row and lane kernels
(``halves.value``; the driver's ``_Launch.raw16``, 2-D 3x3 and 5x5 windows) and
by the channels-first plane and tile kernels, and 16-bit results written as bit
patterns by the lane, plane and tile kernels (``writes16``): results bit for bit
those of the widened-copy path, which test_keras_ops / test_raw_ops check
against the float64 reference, on every op, stride, dilation, padding and
multiplier; and the routes that take them."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numbasep as nb
import support
from numbasep.backends.cpu import (driver, halves, inplace, kernels, lanes, planes, pointwise,
                                   tiles)

import reference as ref

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


@pytest.fixture
def row_kernels(monkeypatch):
    """Route channels-last problems to the row kernels (not lanes or tiles), decided
    afresh per call; returns a switch for the 16-bit bit-pattern path."""
    monkeypatch.setattr(driver, "_by_lanes", lambda plan, adjoint: False)
    monkeypatch.setattr(driver, "_filter_tile_width", lambda plan: 0)
    monkeypatch.setattr(driver, "_tile_width", lambda plan, adjoint=False: 0)
    support.route_afresh(monkeypatch)
    return _bits_switch(monkeypatch)


def _bits_switch(monkeypatch, taken=None):
    """switch(raw): the driver gets 16-bit bit patterns (raw) or None from
    ``halves.bits`` (then widened copies and float32 results); ``switch.seen``
    records whether each request got bits; ``switch.taken``: ``taken``, a spy's
    record of the routes."""
    seen = []
    bits = halves.bits

    def switch(raw):
        def spy(a):
            r = bits(a) if raw else None
            seen.append(r is not None)
            return r
        monkeypatch.setattr(halves, "bits", spy)
    switch.seen, switch.taken = seen, taken
    return switch


def _all_ops(x, k, dy, kw):
    y = nb.depthwise_conv(x, k, **kw)
    gx, gk = nb.depthwise_conv_grad(x, k, dy, **kw)
    return y, gx, gk


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_bit_patterns_give_the_widened_results(row_kernels, dtype, data):
    spatial = tuple(data.draw(st.integers(1, 9), label="size") for _ in range(2))
    ks = data.draw(st.sampled_from([(3, 3), (5, 5)]), label="window")
    c = data.draw(st.integers(1, 12), label="channels")
    m = data.draw(st.sampled_from([1, 1, 2]), label="multiplier")
    n = data.draw(st.integers(1, 2), label="batch")
    padding = data.draw(st.sampled_from(["valid", "same"]), label="padding")
    strided = data.draw(st.booleans(), label="strided")
    strides = tuple(data.draw(st.integers(1, 3)) for _ in spatial) if strided else 1
    dil = 1 if strided else tuple(data.draw(st.integers(1, 2)) for _ in spatial)
    kw = dict(strides=strides, padding=padding, data_format="channels_last",
              dilation_rate=dil)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = rng.uniform(-2, 2, (n, *spatial, c)).astype(dtype)
    k = rng.uniform(-2, 2, (*ks, c, m)).astype(dtype)
    try:
        out_shape = nb.depthwise_conv(x, k, **kw).shape
    except nb.InvalidArgumentError:
        return            # e.g. a window larger than a "valid" input: refused either way
    dy = rng.uniform(-2, 2, out_shape).astype(dtype)
    row_kernels.seen.clear()
    row_kernels(True)
    raw = _all_ops(x, k, dy, kw)
    used_bits = any(row_kernels.seen)
    row_kernels(False)
    wide = _all_ops(x, k, dy, kw)
    if halves.HARDWARE_HALF or dtype != np.float16:
        assert used_bits
    for name, a, b in zip(("forward", "input gradient", "filter gradient"), raw, wide):
        assert a.dtype == dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), name)
    want = ref.keras_depthwise(x.astype(np.float64), k.astype(np.float64), **kw)
    np.testing.assert_allclose(raw[0].astype(np.float64), want, rtol=0.1, atol=0.1 * c)


@pytest.fixture
def lane_kernels(monkeypatch):
    """Route every problem the lane kernels are built for to them, decided afresh
    per call; returns the switch of :func:`row_kernels` and the decisions."""
    monkeypatch.setattr(driver, "_by_lanes", lambda plan, adjoint: (
        plan.channels_last and driver._flat(plan) and plan.kernel[1:] in lanes.WINDOWS
        and plan.channels % 8 == 0
        and not (adjoint and plan.strides[1:] != (1, 1) and plan.dilations[1:] != (1, 1))))
    support.route_afresh(monkeypatch)
    taken = []
    real = driver._correlation

    def spy(plan, adjoint):
        r = real(plan, adjoint)
        taken.append(r is not None and r.writes16)
        return r
    monkeypatch.setattr(driver, "_correlation", spy)
    return _bits_switch(monkeypatch, taken)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_lanes_read_and_write_bit_patterns_as_the_widened_path_rounds(lane_kernels, dtype,
                                                                      data):
    """Every sum rounded once, to nearest even, as ``halves.narrow_into`` rounds:
    also overflow to Inf, NaN and results near the subnormal range (large and tiny
    scales), with ``out=`` and without."""
    spatial = tuple(data.draw(st.integers(1, 12), label="size") for _ in range(2))
    ks = data.draw(st.sampled_from([(3, 3), (5, 5)]), label="window")
    c = data.draw(st.sampled_from([8, 16, 24, 40]), label="channels")
    padding = data.draw(st.sampled_from(["valid", "same"]), label="padding")
    # strided: the input gradient's phases (dilation 1)
    stride = data.draw(st.sampled_from([1, 1, 2]), label="stride")
    dil = tuple(data.draw(st.integers(1, 2 if stride == 1 else 1)) for _ in spatial)
    scale = data.draw(st.sampled_from([1.0, 2.0 ** -12, 2.0 ** 7]), label="scale")
    kw = dict(strides=stride, padding=padding, data_format="channels_last", dilation_rate=dil)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = (rng.uniform(-2, 2, (1, *spatial, c)) * scale).astype(dtype)
    k = rng.uniform(-2, 2, (*ks, c, 1)).astype(dtype)
    if data.draw(st.booleans(), label="nan"):
        x.reshape(-1)[rng.integers(x.size)] = np.nan
    try:
        out_shape = nb.depthwise_conv(x, k, **kw).shape
    except nb.InvalidArgumentError:
        return
    dy = (rng.uniform(-2, 2, out_shape) * scale).astype(dtype)
    _assert_bits_round_as_widened(lane_kernels, dtype, lambda: _ops_with_out(x, k, dy, kw)[:3])


def _ops_with_out(x, k, dy, kw):
    """The forward (also into an ``out``) and both gradients."""
    y = nb.depthwise_conv(x, k, **kw)
    y_out = np.full(y.shape, 7, y.dtype)
    nb.depthwise_conv(x, k, out=y_out, **kw)
    return (y, y_out) + tuple(nb.depthwise_conv_grad(x, k, dy, **kw))


def _assert_bits_round_as_widened(switch, dtype, run):
    """``run()``'s results with bit patterns (the switch's routes taking them,
    where the CPU converts this dtype) and with widened copies: the same bits."""
    got = {}
    for raw in (True, False):
        switch.seen.clear()
        switch.taken.clear()
        switch(raw)
        got[raw] = run()
        if raw and (halves.HARDWARE_HALF or dtype != np.float16):
            assert any(switch.seen) and all(switch.taken)
    for name, a, b in zip(("forward", "forward into out", "input gradient",
                           "filter gradient"), got[True], got[False]):
        assert a.dtype == dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), name)


def test_an_out_that_shares_the_input_is_refused_before_the_lanes_run(lane_kernels):
    """The lanes write 16-bit results straight into ``out`` while they read the
    input: an ``out`` that is the input is refused, and the input left intact."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-2, 2, (1, 9, 9, 16)).astype(np.float16)
    k = rng.uniform(-2, 2, (3, 3, 16, 1)).astype(np.float16)
    lane_kernels(True)
    before = x.copy()
    with pytest.raises(nb.InvalidArgumentError, match="out shares memory with inputs"):
        nb.depthwise_conv(x, k, 1, "same", out=x)
    np.testing.assert_array_equal(x.view(np.uint16), before.view(np.uint16))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_non_finite_values_read_from_bit_patterns(row_kernels, dtype):
    x = np.ones((1, 6, 6, 4), dtype)
    x[0, 2, 3, 1] = np.inf
    x[0, 4, 0, 2] = np.nan
    k = np.ones((3, 3, 4, 1), dtype)
    row_kernels(True)
    y = nb.depthwise_conv(x, k, 1, "same")
    yf = y.astype(np.float32)
    assert np.isposinf(yf[0, 1:4, 2:5, 1]).all() and np.isnan(yf[0, 3:6, 0:2, 2]).all()
    assert np.isfinite(yf[0, :, :, [0, 3]]).all() and (yf[0, 2, 2, 0] == 9)


def test_which_routes_read_bit_patterns():
    """The channels-last row kernels do on 3x3 and 5x5 windows, and the plane
    kernels on any window; other channels-last windows take widened copies."""
    x = np.zeros((1, 40, 40, 8), np.float16)
    k = np.zeros((3, 3, 8, 1), np.float16)
    plans = []
    orig = driver._correlation

    def spy(plan, adjoint):
        r = orig(plan, adjoint)
        plans.append((plan.channels_last, r.raw16 if r is not None else None))
        return r
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(driver, "_correlation", spy)
        support.route_afresh(mp)
        nb.depthwise_conv(x, k, 1, "same", "channels_last")
        nb.depthwise_conv(np.zeros((1, 8, 40, 40), np.float16), k, 1, "same", "channels_first")
        nb.depthwise_conv(x, np.zeros((2, 2, 8, 1), np.float16), 1, "same", "channels_last")
    finally:
        mp.undo()
    assert plans == [(True, True), (False, True), (True, False)]


@pytest.fixture
def plane_kernels(monkeypatch):
    """Route every channels-first problem the plane kernels take to them (not the
    tiles), decided afresh per call; returns the switch of :func:`row_kernels`,
    with ``taken``: the plane kernels each call ran."""
    monkeypatch.setattr(driver, "_filter_tile_width", lambda plan: 0)
    monkeypatch.setattr(driver, "_tile_width", lambda plan, adjoint=False: 0)
    support.route_afresh(monkeypatch)
    taken = []
    real = driver._launch

    def spy(kern, *args):
        # not the filter gradient's last step, nor a separable convolution's
        # pointwise steps
        if kern not in (kernels.sum_partials, pointwise.planar_products,
                        pointwise.planar_kernel_gradient):
            # (stride-1 problems with same-length rows read their planes in
            # place, from the same bit patterns)
            taken.append(kern in (planes.forward, planes.backprop_input,
                                  planes.backprop_filter, inplace.backprop_filter,
                                  inplace.correlate))
        return real(kern, *args)
    monkeypatch.setattr(driver, "_launch", spy)
    return _bits_switch(monkeypatch, taken)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_planes_read_and_write_bit_patterns_as_the_widened_path_rounds(plane_kernels, dtype,
                                                                       data):
    """Channels-first 1-D and 2-D problems on the plane kernels, any window,
    stride, dilation and multiplier: the three ops' bits those of widened copies
    and float32 results rounded once (overflow to Inf, NaN, results near the
    subnormal range; ``out=`` and without); non-finite taps go through the
    direct loops, which read and round alike."""
    rank = data.draw(st.sampled_from([1, 2, 2]), label="rank")
    spatial = tuple(data.draw(st.integers(1, 14), label="size") for _ in range(rank))
    ks = tuple(data.draw(st.integers(1, 5), label="window") for _ in range(rank))
    c = data.draw(st.integers(1, 10), label="channels")
    m = data.draw(st.sampled_from([1, 1, 2, 3]), label="multiplier")
    padding = data.draw(st.sampled_from(["valid", "same"]), label="padding")
    strided = data.draw(st.booleans(), label="strided")
    strides = tuple(data.draw(st.integers(1, 3)) for _ in spatial) if strided else 1
    dil = 1 if strided else tuple(data.draw(st.integers(1, 3)) for _ in spatial)
    kw = dict(strides=strides, padding=padding, data_format="channels_first",
              dilation_rate=dil)
    operands = _channels_first_operands(data, dtype, (2, c, *spatial), (*ks, c, m), kw)
    if operands:
        _assert_bits_round_as_widened(plane_kernels, dtype,
                                      lambda: _ops_with_out(*operands, kw))


def _mixes(kernel):
    """The signatures of a plane kernel that mix 16-bit bit patterns and float32
    among its data operands and result (the filter gradient: its two data
    operands)."""
    ops = 2 if kernel in (planes.backprop_filter, inplace.backprop_filter) else 3
    # a task's (inplace) signatures start with its index and the number of tasks
    skip = 2 if hasattr(kernel, "task") else 0
    mixed = []
    for sig in getattr(kernel, "task", kernel).signatures:
        sig = sig[skip:]
        kinds = {a.dtype.bitwidth == 16 for a in (sig[0], sig[2] if ops == 3 else sig[1])}
        if len(kinds) > 1:
            mixed.append(sig)
    return mixed


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 2])
def test_plane_kernels_widen_16_bit_data_beside_float32(plane_kernels, dtype, m):
    """A 16-bit channels-first separable convolution hands the depthwise steps
    float32 intermediates (the depthwise output, wide; its gradient): the plane
    kernels then take widened copies rather than being compiled again for each
    mix of 16-bit and float32 operands (about a minute each on CI), with the
    results of the float64 reference."""
    kw = dict(strides=1, padding="same", data_format="channels_first")
    rng = np.random.default_rng(m)
    x = rng.uniform(-2, 2, (2, 3, 9, 11)).astype(dtype)
    dk = rng.uniform(-2, 2, (3, 3, 3, m)).astype(dtype)
    pk = rng.uniform(-2, 2, (1, 1, 3 * m, 4)).astype(dtype)
    dout = rng.uniform(-2, 2, (2, 4, 9, 11)).astype(dtype)
    plane_kernels.taken.clear()
    got = (nb.separable_conv(x, dk, pk, **kw),) + nb.separable_conv_grad(x, dk, pk, dout, **kw)
    assert plane_kernels.taken and all(plane_kernels.taken)
    for kernel in (planes.forward, planes.backprop_input, planes.backprop_filter,
                   inplace.correlate, inplace.backprop_filter):
        assert not _mixes(kernel), kernel.py_func.__name__
    f64 = [a.astype(np.float64) for a in (x, dk, pk, dout)]
    want = (ref.keras_separable(*f64[:3], **kw),) + ref.keras_separable_grad(*f64, **kw)
    for name, a, b in zip(("output", "dx", "ddk", "dpk"), got, want):
        assert a.dtype == dtype, name
        scale = np.abs(b).max()
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=0.05, atol=0.02 * scale,
                                   err_msg=name)


def _channels_first_operands(data, dtype, x_shape, k_shape, kw):
    """(x, k, dy) of ``dtype`` for a channels-first problem, scaled to reach
    overflow or the subnormal range, a NaN drawn into x or k or neither; None
    when the problem is invalid."""
    scale = data.draw(st.sampled_from([1.0, 2.0 ** -12, 2.0 ** 7]), label="scale")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = (rng.uniform(-2, 2, x_shape) * scale).astype(dtype)
    k = rng.uniform(-2, 2, k_shape).astype(dtype)
    poison = data.draw(st.sampled_from([None, "x", "k"]), label="nan")
    if poison:
        a = x if poison == "x" else k
        a.reshape(-1)[rng.integers(a.size)] = np.nan
    try:
        out_shape = nb.depthwise_conv(x, k, **kw).shape
    except nb.InvalidArgumentError:
        return None
    return x, k, (rng.uniform(-2, 2, out_shape) * scale).astype(dtype)


@pytest.fixture
def tile_kernels(monkeypatch):
    """Route every channels-first 3x3 problem the tile kernels can take to them
    (64 channels per tile at stride 1, 16 when strided; a strided input gradient
    stays on the planes), decided afresh per call; returns the switch of
    :func:`row_kernels`, with ``taken``: whether each kernel run was a tile or
    plane kernel, and ``tiled``: whether it was a tile kernel."""
    real = driver._by_planes

    def width(plan, adjoint=False):
        if not (real(plan) and plan.kernel[1:] in tiles.WINDOWS and plan.multiplier == 1):
            return 0
        if plan.strides != (1, 1, 1):
            return 0 if adjoint else tiles.NARROW
        return tiles.WIDE
    monkeypatch.setattr(driver, "_tile_width", width)
    monkeypatch.setattr(driver, "_filter_tile_width", width)
    support.route_afresh(monkeypatch)
    taken, tiled = [], []
    real_launch = driver._launch

    def spy(kern, *args):
        if kern is not kernels.sum_partials:
            tiled.append(getattr(kern, "task", kern).py_func.__module__ == tiles.__name__)
            taken.append(tiled[-1] or kern is planes.backprop_input)
        return real_launch(kern, *args)
    monkeypatch.setattr(driver, "_launch", spy)
    switch = _bits_switch(monkeypatch, taken)
    switch.tiled = tiled
    return switch


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_tiles_read_and_write_bit_patterns_as_the_widened_path_rounds(tile_kernels, dtype,
                                                                      data):
    """Channels-first 3x3 problems on the tile kernels: blocks of channels cut at
    every remainder (tiles of 64 and 16), strides, dilations, paddings; the three
    ops' bits those of widened copies and float32 results rounded once (overflow,
    results near the subnormal range, ``out=`` and without); a NaN tap or input
    goes through the direct loops, which read and round alike."""
    h, w = data.draw(st.integers(1, 9), label="h"), data.draw(st.integers(1, 9), label="w")
    c = data.draw(st.sampled_from([1, 8, 9, 17, 64, 65, 71]), label="channels")
    strides = data.draw(st.sampled_from([1, 1, 2, (1, 2)]), label="strides")
    dil = data.draw(st.sampled_from([1, 2, (1, 3)]), label="dilation") if strides == 1 else 1
    padding = data.draw(st.sampled_from(["valid", "same"]), label="padding")
    kw = dict(strides=strides, padding=padding, data_format="channels_first",
              dilation_rate=dil)
    operands = _channels_first_operands(data, dtype, (2, c, h, w), (3, 3, c, 1), kw)
    if not operands:
        return
    tile_kernels.tiled.clear()
    _assert_bits_round_as_widened(tile_kernels, dtype, lambda: _ops_with_out(*operands, kw))
    assert sum(tile_kernels.tiled) >= (3 if strides == 1 else 2) * 2   # both runs
