"""Unit tests of the raw-op arithmetic in numbasep.shapes (SPEC section 3).

Only shapes and integers here: no arrays, no kernels. The expected values come from
``tests/reference.py`` (``tf_output_exact``, ``raw_geometry``), which implements the
published formulas independently of numbasep.
"""

import math
import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import reference as ref
from numbasep import InvalidArgumentError, shapes

INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------ truncating division

@pytest.mark.parametrize("a, b, q", [
    (7, 2, 3), (-7, 2, -3), (-1, 2, 0), (1, 2, 0), (0, 5, 0), (-6, 3, -2), (-5, 3, -1),
    (6, 3, 2), (-(2**64) - 1, 2**32, -(2**32)),
])
def test_trunc_div_examples(a, b, q):
    assert shapes.trunc_div(a, b) == q


@given(st.integers(-10**30, 10**30), st.integers(1, 10**15))
def test_trunc_div_rounds_toward_zero(a, b):
    q = shapes.trunc_div(a, b)
    assert q == int(Fraction(a, b))          # int() of a Fraction truncates toward zero
    assert abs(q * b) <= abs(a) < (abs(q) + 1) * b
    assert q == 0 or (q > 0) == (a > 0)


# ------------------------------------------------------------------ output sizes and pads

def _plan(n_rows, n_cols, k_rows, k_cols, s, r, padding, pads=((0, 0), (0, 0)),
          fmt="NHWC", batch=2, c=3, m=2):
    if fmt == "NHWC":
        in_shape = (batch, n_rows, n_cols, c)
        s4, d4 = [1, s[0], s[1], 1], [1, r[0], r[1], 1]
        e8 = [0, 0, *pads[0], *pads[1], 0, 0]
    else:
        in_shape = (batch, c, n_rows, n_cols)
        s4, d4 = [1, 1, s[0], s[1]], [1, 1, r[0], r[1]]
        e8 = [0, 0, 0, 0, *pads[0], *pads[1]]
    if padding != "EXPLICIT":
        e8 = []
    f_shape = (k_rows, k_cols, c, m)
    return in_shape, f_shape, s4, d4, e8


@pytest.mark.parametrize("n, k, s, r, out, before, after", [
    (5, 4, 1, 1, 5, 1, 2),      # need 3: the odd pixel goes after
    (10, 3, 2, 1, 5, 0, 1),     # need 1: all of it after
    (4, 2, 2, 1, 2, 0, 0),      # need 0
    (7, 1, 3, 1, 3, 0, 0),      # need would be negative: 0
    (6, 3, 1, 2, 6, 2, 2),      # eff 5: need 4
    (1, 4, 2, 1, 1, 1, 2),      # a window larger than the input
    (0, 3, 1, 1, 0, 1, 1),      # empty input: empty output (the formula still pads)
    (9, 4, 3, 3, 3, 3, 4),      # eff 10: need 6 + 10 - 9 = 7
])
def test_same_padding_split(n, k, s, r, out, before, after):
    eff = (k - 1) * r + 1
    want_out = math.ceil(n / s)
    need = max(0, (want_out - 1) * s + eff - n)
    assert (out, before, after) == (want_out, need // 2, need - need // 2)
    assert ref.tf_output_exact(n, k, s, r, "SAME") == (want_out, need // 2, need - need // 2)
    for fmt in ("NHWC", "NCHW"):
        in_shape, f_shape, s4, d4, e8 = _plan(n, 5, k, 1, (s, 1), (r, 1), "SAME", fmt=fmt)
        plan = shapes.raw_forward(in_shape, f_shape, s4, "SAME", e8, fmt, d4)
        assert plan.out_sizes[1] == want_out
        assert plan.pads[1] == need // 2            # only the pad before is stored
        assert plan.out_sizes[2] == 5 and plan.pads[2] == 0


def test_same_padding_odd_pixel_goes_after_both_dims():
    # rows: n=6, k=4, s=1 -> need 3 -> (1, 2); cols: n=7, k=2, s=2 -> out 4, need 1 -> (0, 1)
    plan = shapes.raw_forward((1, 6, 7, 1), (4, 2, 1, 1), [1, 1, 2, 1], "SAME")
    assert plan.out_sizes == (1, 6, 4)
    assert plan.pads == (0, 1, 0)


@pytest.mark.parametrize("n, k, s, r, out", [
    (1, 4, 2, 1, 0),    # trunc(-0.5) = 0: legal, empty (floor would be -1: an error)
    (3, 4, 2, 1, 0),    # trunc(0.5)
    (5, 4, 2, 1, 1),    # trunc(1.5)
    (1, 2, 3, 1, 0),    # trunc(2/3)
    (2, 2, 5, 2, 0),    # eff 3: trunc(4/5)
    (0, 1, 1, 1, 0),    # empty input, 1x1 filter
    (10, 3, 3, 2, 2),   # eff 5: trunc(8/3)
])
def test_valid_output_size_truncates(n, k, s, r, out):
    assert ref.tf_output_exact(n, k, s, r, "VALID")[0] == out
    plan = shapes.raw_forward((1, n, 1, 1), (k, 1, 1, 1), [1, s, 1, 1], "VALID",
                              dilations=[1, r, 1, 1])
    assert plan.out_sizes[1] == out
    assert plan.output_shape == (1, out, 1, 1)
    assert plan.pads == (0, 0, 0)


@pytest.mark.parametrize("n, k, s, r, out", [
    (1, 5, 2, 1, -1), (3, 7, 1, 1, -3), (4, 2, 1, 5, -1), (0, 2, 1, 1, -1),
])
def test_valid_negative_output_is_rejected(n, k, s, r, out):
    eff = (k - 1) * r + 1
    msg = re.escape(f"Computed output size would be negative: {out} [input_size: {n}, "
                    f"effective_filter_size: {eff}, stride: {s}]")
    with pytest.raises(InvalidArgumentError, match=msg):
        shapes.raw_forward((1, n, 1, 1), (k, 1, 1, 1), [1, s, 1, 1], "VALID",
                           dilations=[1, r, 1, 1])


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_explicit_paddings_in_data_format_order(fmt):
    # rows padded (1, 2), cols (3, 4); n = (5, 6), k = (2, 3), strides (1, 2)
    in_shape, f_shape, s4, d4, e8 = _plan(5, 6, 2, 3, (1, 2), (1, 1), "EXPLICIT",
                                          ((1, 2), (3, 4)), fmt)
    assert e8 == ([0, 0, 1, 2, 3, 4, 0, 0] if fmt == "NHWC" else [0, 0, 0, 0, 1, 2, 3, 4])
    plan = shapes.raw_forward(in_shape, f_shape, s4, "EXPLICIT", e8, fmt, d4)
    rows = 5 + 1 + 2 - 2 + 1
    cols = (6 + 3 + 4 - 3 + 2) // 2
    assert plan.out_sizes == (1, rows, cols)
    assert plan.pads == (0, 1, 3)
    assert plan.strides == (1, 1, 2)
    assert plan.output_shape == ((2, rows, cols, 6) if fmt == "NHWC" else (2, 6, rows, cols))


def test_explicit_paddings_may_exceed_the_filter():
    plan = shapes.raw_forward((4, 1, 1, 3), (3, 3, 3, 2), [1, 1, 1, 1], "EXPLICIT",
                              [0, 0, 10, 20, 15, 25, 0, 0])
    assert plan.output_shape == (4, 29, 39, 6)      # SPEC section 8, CONFIGS_EXPLICIT[1]
    assert plan.pads == (0, 10, 15)


def test_explicit_negative_output_message():
    # n=2, pads (1, 1), eff 9, s=2: trunc((2 + 2 - 9 + 2) / 2) = trunc(-1.5) = -1
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "Computed output size would be negative: -1 [input_size: 2, "
            "effective_filter_size: 9, stride: 2]")):
        shapes.raw_forward((1, 2, 3, 1), (9, 1, 1, 1), [1, 2, 1, 1], "EXPLICIT",
                           [0, 0, 1, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_strides_and_dilations_are_read_in_data_format_order(fmt):
    if fmt == "NHWC":
        s4, d4, in_shape = [1, 2, 3, 1], [1, 4, 5, 1], (1, 40, 50, 2)
    else:
        s4, d4, in_shape = [1, 1, 2, 3], [1, 1, 4, 5], (1, 2, 40, 50)
    plan = shapes.raw_forward(in_shape, (2, 3, 2, 1), s4, "VALID", (), fmt, d4)
    assert plan.strides == (1, 2, 3)
    assert plan.dilations == (1, 4, 5)
    assert plan.in_sizes == (1, 40, 50)
    assert plan.kernel == (1, 2, 3)
    # rows: eff 5, trunc((40 - 5 + 2) / 2) = 18; cols: eff 11, trunc((50 - 11 + 3) / 3) = 14
    assert plan.out_sizes == (1, 18, 14)
    assert plan.channels_last == (fmt == "NHWC")
    assert (plan.batch, plan.channels, plan.multiplier) == (1, 2, 1)


def test_plan_shapes_in_both_layouts():
    for fmt, in_shape in (("NHWC", (3, 7, 8, 4)), ("NCHW", (3, 4, 7, 8))):
        s4 = [1, 2, 1, 1] if fmt == "NHWC" else [1, 1, 2, 1]
        plan = shapes.raw_forward(in_shape, (3, 2, 4, 5), s4, "SAME", (), fmt)
        assert plan.ndim == 2
        assert plan.input_shape == in_shape
        assert plan.filter_shape == (3, 2, 4, 5)
        assert plan.out_channels == 20
        want_out = (3, 4, 8, 20) if fmt == "NHWC" else (3, 20, 4, 8)
        assert plan.output_shape == want_out
        # canonical 5-D forms: a leading size-1 depth dimension
        assert plan.filter_shape5 == (1, 3, 2, 4, 5)
        assert plan.input_shape5 == ((3, 1, 7, 8, 4) if fmt == "NHWC" else (3, 4, 1, 7, 8))
        assert plan.output_shape5 == ((3, 1, 4, 8, 20) if fmt == "NHWC" else (3, 20, 1, 4, 8))


def test_the_three_ops_plan_the_same_problem():
    args = ([1, 1, 2, 1], "EXPLICIT", [0, 0, 0, 0, 1, 0, 2, 1], "NCHW", [1, 1, 1, 2])
    fwd = shapes.raw_forward((2, 3, 9, 8), (3, 3, 3, 2), *args)
    out = fwd.output_shape
    bi = shapes.raw_backprop_input([2, 3, 9, 8], (3, 3, 3, 2), out, *args)
    bf = shapes.raw_backprop_filter((2, 3, 9, 8), [3, 3, 3, 2], out, *args)
    assert fwd == bi == bf
    assert fwd.key() == bi.key() == bf.key()


def test_output_element_count_overflow_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"the output shape .* int64"):
        shapes.raw_forward((2**40, 2**40, 1, 1), (1, 1, 1, 1), [1, 1, 1, 1], "VALID")


def test_out_backprop_shape_is_checked():
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "Number of cols of out_backprop doesn't match computed: actual = 4, computed = 3")):
        shapes.raw_backprop_filter((1, 5, 5, 1), [3, 3, 1, 1], (1, 3, 4, 1), [1, 1, 1, 1],
                                   "VALID")
    plan = shapes.raw_backprop_filter((1, 5, 5, 1), [3, 3, 1, 1], (1, 3, 3, 1),
                                      [1, 1, 1, 1], "VALID")
    assert plan.filter_shape == (3, 3, 1, 1)


# ------------------------------------------------------------------ hypothesis

sizes = st.one_of(st.integers(0, 40), st.integers(0, 2**40))
kernels = st.one_of(st.integers(1, 8), st.integers(1, 2**20))
steps = st.one_of(st.integers(1, 4), st.integers(1, INT32_MAX))
pads = st.one_of(st.integers(0, 5), st.integers(0, INT32_MAX))


@given(fmt=st.sampled_from(["NHWC", "NCHW"]),
       padding=st.sampled_from(["SAME", "VALID", "EXPLICIT"]),
       n=st.tuples(sizes, sizes), k=st.tuples(kernels, kernels),
       s=st.tuples(steps, steps), r=st.tuples(steps, steps),
       p=st.tuples(st.tuples(pads, pads), st.tuples(pads, pads)),
       batch=st.integers(0, 3), c=st.integers(0, 3), m=st.integers(0, 3))
def test_raw_geometry_matches_the_formulas(fmt, padding, n, k, s, r, p, batch, c, m):
    in_shape, f_shape, s4, d4, e8 = _plan(n[0], n[1], k[0], k[1], s, r, padding, p, fmt,
                                          batch, c, m)
    g = ref.raw_geometry(in_shape, f_shape, s4, padding, e8, fmt, d4)
    if g["output_shape"] is None:
        i = 0 if g["out_sizes"][0] < 0 else 1
        eff = (k[i] - 1) * r[i] + 1
        msg = re.escape(f"Computed output size would be negative: {g['out_sizes'][i]} "
                        f"[input_size: {n[i]}, effective_filter_size: {eff}, "
                        f"stride: {s[i]}]")
        with pytest.raises(InvalidArgumentError, match=msg):
            shapes.raw_forward(in_shape, f_shape, s4, padding, e8, fmt, d4)
        return
    if math.prod(g["output_shape"]) > 2**63 - 1:
        with pytest.raises(InvalidArgumentError, match=r"int64"):
            shapes.raw_forward(in_shape, f_shape, s4, padding, e8, fmt, d4)
        return
    plan = shapes.raw_forward(in_shape, f_shape, s4, padding, e8, fmt, d4)
    assert plan.out_sizes[1:] == g["out_sizes"]
    assert plan.pads[1:] == g["pads_before"]
    assert plan.strides[1:] == g["strides"] == s
    assert plan.dilations[1:] == g["dilations"] == r
    assert plan.output_shape == g["output_shape"]
    assert plan.input_shape == tuple(in_shape)
    assert plan.filter_shape == tuple(f_shape)
    # SAME: the output covers the input and the padding never exceeds what is needed
    if padding == "SAME":
        for i in range(2):
            assert g["out_sizes"][i] == -(-n[i] // s[i])
            assert 0 <= g["pads_after"][i] - g["pads_before"][i] <= 1
    # the two backprop plans agree with the forward plan
    bi = shapes.raw_backprop_input(list(in_shape), f_shape, plan.output_shape, s4, padding,
                                   e8, fmt, d4)
    bf = shapes.raw_backprop_filter(in_shape, list(f_shape), plan.output_shape, s4, padding,
                                    e8, fmt, d4)
    assert bi == plan and bf == plan


@given(n=st.integers(0, 2**62), k=st.integers(1, 2**20), s=st.integers(1, INT32_MAX),
       r=st.integers(1, INT32_MAX), pb=st.integers(0, INT32_MAX),
       pa=st.integers(0, INT32_MAX))
def test_explicit_output_size_is_exact_for_big_integers(n, k, s, r, pb, pa):
    """Floating-point division would misround these; the plan must use integer arithmetic."""
    eff = (k - 1) * r + 1
    want = int(Fraction(n + pb + pa - eff + s, s))
    assert ref.tf_output_exact(n, k, s, r, "EXPLICIT", (pb, pa))[0] == want
    in_shape = (0, n, 1, 1)       # batch 0 keeps the element count at 0
    e8 = [0, 0, pb, pa, 0, 0, 0, 0]
    if want < 0:
        with pytest.raises(InvalidArgumentError, match="Computed output size would be negative"):
            shapes.raw_forward(in_shape, (k, 1, 1, 1), [1, s, 1, 1], "EXPLICIT", e8,
                               dilations=[1, r, 1, 1])
    else:
        plan = shapes.raw_forward(in_shape, (k, 1, 1, 1), [1, s, 1, 1], "EXPLICIT", e8,
                                  dilations=[1, r, 1, 1])
        assert plan.out_sizes[1] == want
        assert plan.pads[1] == pb
