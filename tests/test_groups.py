"""Depth multipliers on the CPU: the channel-group kernels (numbasep/backends/cpu/groups.py)
and the routing of multiplier-M problems to the multiplier-1 kernels.

Correctness of the operators with M > 1 against the float64 reference is swept by
test_raw_ops.py and test_keras_ops.py (and the lanes' own path by test_lanes.py);
here: the two helper kernels element by element, and which M > 1 calls of the
three ops repeat the input in memory for the multiplier-1 path (the others run
on the lane or plane kernels without the repeated input).
"""

import numpy as np
import pytest

import numbasep
from numbasep.backends.cpu import driver, groups

import support


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_repeat_and_sum_groups_element_by_element(dtype, m):
    rng = np.random.default_rng(m)
    src = rng.standard_normal((13, 7)).astype(dtype)
    rep = np.full((13, 7 * m), np.nan, dtype)
    groups.repeat(src, rep)
    np.testing.assert_array_equal(rep, np.repeat(src, m, axis=1))
    wide = rng.standard_normal((13, 7 * m)).astype(dtype)
    got = np.full((13, 7), np.nan, dtype)
    groups.sum_groups(wide, got)
    want = wide[:, 0::m].copy()
    for k in range(1, m):
        want += wide[:, k::m]                  # the same order: bit for bit
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("data_format, dtype, channels, expect", [
    ("NHWC", np.float64, 3, "all"), ("NCHW", np.float64, 3, "none"),
    ("NHWC", np.float32, 3, "all"), ("NHWC", np.float32, 4, "summed"),
    ("NHWC", np.float32, 8, "none")])
def test_ops_with_a_multiplier_repeat_the_input_unless_the_lanes_or_planes_take_them(
        monkeypatch, data_format, dtype, channels, expect):
    """The three ops run on the multiplier-1 kernels from the input with its
    channels repeated in memory (the input gradient summed from the repeated
    input's), unless the lane kernels take them (channels-last float32: the
    forward and filter gradient with 8k output channels, the input gradient with
    8k input channels) or the plane kernels do (channels-first)."""
    seen = []
    repeated, summed = driver._repeated, driver.CPUBackend._sum_repeated

    def spy_repeated(plan, a):
        seen.append(("repeated", plan.multiplier, a.shape))
        return repeated(plan, a)

    def spy_summed(self, plan, *args):
        seen.append(("summed", plan.multiplier))
        return summed(self, plan, *args)
    monkeypatch.setattr(driver, "_repeated", spy_repeated)
    monkeypatch.setattr(driver.CPUBackend, "_sum_repeated", spy_summed)
    support.route_afresh(monkeypatch)
    rng = np.random.default_rng(0)
    xs = (2, 5, 6, channels) if data_format == "NHWC" else (2, channels, 5, 6)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((3, 3, channels, 4)).astype(dtype)
    y = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME", data_format=data_format)
    numbasep.depthwise_conv2d_native_backprop_input(list(x.shape), w, y, [1, 1, 1, 1], "SAME",
                                                    data_format=data_format)
    numbasep.depthwise_conv2d_native_backprop_filter(x, list(w.shape), y, [1, 1, 1, 1], "SAME",
                                                     data_format=data_format)
    rep = ("repeated", 4, xs)
    assert seen == {"all": [rep, ("summed", 4), rep], "summed": [("summed", 4)],
                    "none": []}[expect]
