"""Depth multipliers on the CPU: the channel-group kernels (numbasep/backends/cpu/groups.py)
and the routing of multiplier-M problems to the multiplier-1 kernels.

Correctness of the operators with M > 1 against the float64 reference is swept by
test_raw_ops.py and test_keras_ops.py; here: the two helper kernels element by
element, and that every M > 1 call of the three ops reaches the multiplier-1 path.
"""

import numpy as np
import pytest

import numbasep
from numbasep.backends.cpu import driver, groups


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


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_every_op_with_a_multiplier_runs_on_multiplier_one_kernels(monkeypatch, data_format):
    seen = []
    real = driver._single_plan

    def spy(plan):
        p = real(plan)
        seen.append((plan.multiplier, p.multiplier, p.channels))
        return p
    monkeypatch.setattr(driver, "_single_plan", spy)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 6, 3) if data_format == "NHWC" else (2, 3, 5, 6))
    w = rng.standard_normal((3, 3, 3, 4))
    y = numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "SAME", data_format=data_format)
    numbasep.depthwise_conv2d_native_backprop_input(list(x.shape), w, y, [1, 1, 1, 1], "SAME",
                                                    data_format=data_format)
    numbasep.depthwise_conv2d_native_backprop_filter(x, list(w.shape), y, [1, 1, 1, 1], "SAME",
                                                     data_format=data_format)
    assert seen == [(4, 1, 12)] * 3
