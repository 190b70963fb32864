"""Validation of the TensorFlow raw-op family (SPEC sections 3, 4, 7 and 9).

Every malformed call must raise before any kernel runs: ``numbasep.InvalidArgumentError``
(a ``ValueError``) for bad values and shapes, ``TypeError`` for dtypes and array
types, each with a message naming the argument and the offending value. The
section 9 cases are the inputs that crashed or misbehaved in TensorFlow.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import numbasep
import reference as ref
from numbasep import InvalidArgumentError, raw_ops

f32 = np.float32
IAE = InvalidArgumentError
ONES = [1, 1, 1, 1]


def _x(shape=(1, 4, 4, 2), dtype=f32):
    return np.ones(shape, dtype)


_D = object()   # "use the default operand" (None is a value under test)


def F(input=_D, filter=_D, strides=ONES, padding="VALID", explicit_paddings=(),
      data_format="NHWC", dilations=ONES):
    input = _x() if input is _D else input
    filter = _x((2, 2, 2, 1)) if filter is _D else filter
    return numbasep.depthwise_conv2d_native(input, filter, strides, padding, explicit_paddings,
                                            data_format, dilations)


def BI(input_sizes=(1, 4, 4, 2), filter=_D, out_backprop=_D, strides=ONES,
       padding="VALID", explicit_paddings=(), data_format="NHWC", dilations=ONES):
    filter = _x((2, 2, 2, 1)) if filter is _D else filter
    out_backprop = _x((1, 3, 3, 2)) if out_backprop is _D else out_backprop
    return numbasep.depthwise_conv2d_native_backprop_input(
        input_sizes, filter, out_backprop, strides, padding, explicit_paddings, data_format,
        dilations)


def BF(input=_D, filter_sizes=(2, 2, 2, 1), out_backprop=_D, strides=ONES,
       padding="VALID", explicit_paddings=(), data_format="NHWC", dilations=ONES):
    input = _x() if input is _D else input
    out_backprop = _x((1, 3, 3, 2)) if out_backprop is _D else out_backprop
    return numbasep.depthwise_conv2d_native_backprop_filter(
        input, filter_sizes, out_backprop, strides, padding, explicit_paddings, data_format,
        dilations)


OPS = {"forward": F, "backprop_input": BI, "backprop_filter": BF}


def lst(values):
    """Regex for a list as the messages print it: [1, 2, 3]."""
    return re.escape(str(list(values)))


# ------------------------------------------------------------------ the attribute rules
# (kwargs, regex) applied to all three ops; they only concern the shared attributes.

ATTR_CASES = [
    # rule 1: strides
    ("strides_len3", dict(strides=[1, 1, 1]), rf"strides must have 4 entries.*{lst([1, 1, 1])}"),
    ("strides_len5", dict(strides=[1, 1, 1, 1, 1]),
     rf"strides must have 4 entries.*{lst([1] * 5)}"),
    ("strides_len2", dict(strides=[1, 1]), rf"strides must have 4 entries.*{lst([1, 1])}"),
    ("strides_empty", dict(strides=[]), r"strides must have 4 entries.*got \[\]"),
    ("strides_batch", dict(strides=[2, 1, 1, 1]),
     rf"strides in the batch and channel dimensions must be 1, got {lst([2, 1, 1, 1])}"),
    ("strides_channel_nhwc", dict(strides=[1, 1, 1, 2]),
     rf"strides in the batch and channel dimensions must be 1, got {lst([1, 1, 1, 2])}"),
    ("strides_channel_nchw", dict(strides=[1, 2, 1, 1], data_format="NCHW"),
     rf"strides in the batch and channel dimensions must be 1, got {lst([1, 2, 1, 1])}"
     r".*NCHW"),
    ("strides_zero", dict(strides=[1, 0, 1, 1]), rf"strides must be > 0, got {lst([1, 0, 1, 1])}"),
    ("strides_negative", dict(strides=[1, 1, -2, 1]),
     rf"strides must be > 0, got {lst([1, 1, -2, 1])}"),
    ("strides_2_31", dict(strides=[1, 2**31, 1, 1]),
     rf"strides must be < 2\*\*31.*{lst([1, 2**31, 1, 1])}"),
    ("strides_2_63", dict(strides=[1, 1, 2**63, 1]),
     rf"strides must be < 2\*\*31.*{lst([1, 1, 2**63, 1])}"),
    ("strides_float", dict(strides=[1, 2.0, 2, 1]), r"strides must hold integers, got \[1, 2.0"),
    ("strides_bool", dict(strides=[1, True, 1, 1]), r"strides must hold integers"),
    ("strides_none", dict(strides=None), r"strides must be a sequence of integers, got None"),
    ("strides_int", dict(strides=1), r"strides must be a sequence of integers, got 1"),
    ("strides_str", dict(strides="1111"), r"strides must be a sequence of integers, got '1111'"),
    ("strides_2d", dict(strides=np.ones((2, 2), np.int64)),
     r"strides must be 1-D, got an array of shape \(2, 2\)"),
    ("strides_float_array", dict(strides=np.ones(4)),
     r"strides must hold integers, got an array of dtype float64"),
    # rule 2: dilations
    ("dilations_len3", dict(dilations=[1, 1, 1]),
     rf"dilations must have 4 entries.*{lst([1, 1, 1])}"),
    ("dilations_len5", dict(dilations=[1, 1, 1, 1, 1]),
     rf"dilations must have 4 entries.*{lst([1] * 5)}"),
    ("dilations_zero", dict(dilations=[1, 1, 0, 1]),
     rf"dilations must be >= 1, got {lst([1, 1, 0, 1])}"),
    ("dilations_negative", dict(dilations=[1, -1, 1, 1]),
     rf"dilations must be >= 1, got {lst([1, -1, 1, 1])}"),
    ("dilations_batch", dict(dilations=[2, 1, 1, 1]),
     rf"dilations in the batch and channel dimensions must be 1, got {lst([2, 1, 1, 1])}"),
    ("dilations_channel_nhwc", dict(dilations=[1, 1, 1, 3]),
     rf"dilations in the batch and channel dimensions must be 1, got {lst([1, 1, 1, 3])}"),
    ("dilations_channel_nchw", dict(dilations=[1, 3, 1, 1], data_format="NCHW"),
     rf"dilations in the batch and channel dimensions must be 1, got {lst([1, 3, 1, 1])}"),
    ("dilations_2_31", dict(dilations=[1, 1, 2**31, 1]),
     rf"dilations must be < 2\*\*31.*{lst([1, 1, 2**31, 1])}"),
    ("dilations_float", dict(dilations=[1, 1.5, 1, 1]), r"dilations must hold integers"),
    # rule 3: padding, data_format, explicit paddings
    ("padding_lower", dict(padding="same"),
     r"padding must be one of 'SAME', 'VALID', 'EXPLICIT', got 'same'"),
    ("padding_full", dict(padding="FULL"), r"padding must be one of .*got 'FULL'"),
    ("padding_none", dict(padding=None), r"padding must be one of .*got None"),
    ("padding_bytes", dict(padding=b"SAME"), r"padding must be one of .*got b'SAME'"),
    ("data_format_ndhwc", dict(data_format="NDHWC"),
     r"data_format must be 'NHWC' or 'NCHW', got 'NDHWC'"),
    ("data_format_lower", dict(data_format="nhwc"), r"data_format must be .*got 'nhwc'"),
    ("data_format_keras", dict(data_format="channels_last"),
     r"data_format must be .*got 'channels_last'"),
    ("data_format_none", dict(data_format=None), r"data_format must be .*got None"),
    ("data_format_list", dict(data_format=["NHWC"]), r"data_format must be .*got \['NHWC'\]"),
    ("explicit_with_same", dict(padding="SAME", explicit_paddings=[0, 0, 1, 1, 1, 1, 0, 0]),
     rf"explicit_paddings must be empty unless padding is 'EXPLICIT' \(padding is 'SAME'\), "
     rf"got {lst([0, 0, 1, 1, 1, 1, 0, 0])}"),
    ("explicit_with_valid", dict(explicit_paddings=[0] * 8),
     rf"explicit_paddings must be empty unless padding is 'EXPLICIT'.*got {lst([0] * 8)}"),
    ("explicit_missing", dict(padding="EXPLICIT"),
     r"explicit_paddings must have 8 entries.*got \[\]"),
    ("explicit_len6", dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 1, 1, 1]),
     rf"explicit_paddings must have 8 entries.*got {lst([0, 0, 1, 1, 1, 1])}"),
    ("explicit_negative", dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, -1, 0, 0, 0, 0]),
     rf"explicit_paddings must be non-negative, got {lst([0, 0, 1, -1, 0, 0, 0, 0])}"),
    ("explicit_batch_nhwc", dict(padding="EXPLICIT", explicit_paddings=[1, 0, 0, 0, 0, 0, 0, 0]),
     rf"explicit_paddings of the batch and channel dimensions must be 0, "
     rf"got {lst([1, 0, 0, 0, 0, 0, 0, 0])}"),
    ("explicit_channel_nhwc",
     dict(padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 0, 0, 0, 2]),
     rf"explicit_paddings of the batch and channel dimensions must be 0, "
     rf"got {lst([0, 0, 0, 0, 0, 0, 0, 2])}"),
    # NCHW: the channel pair is entries 2-3 (what would be the rows in NHWC)
    ("explicit_channel_nchw",
     dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1, 0, 0, 0, 0, 0], data_format="NCHW"),
     rf"explicit_paddings of the batch and channel dimensions must be 0, "
     rf"got {lst([0, 0, 1, 0, 0, 0, 0, 0])}.*NCHW"),
    ("explicit_2_31", dict(padding="EXPLICIT", explicit_paddings=[0, 0, 2**31, 0, 0, 0, 0, 0]),
     rf"explicit_paddings must be < 2\*\*31, got {lst([0, 0, 2**31, 0, 0, 0, 0, 0])}"),
    ("explicit_float", dict(padding="EXPLICIT", explicit_paddings=[0, 0, 1.0, 0, 0, 0, 0, 0]),
     r"explicit_paddings must hold integers"),
    ("explicit_nested", dict(padding="EXPLICIT", explicit_paddings=[[0, 0], [1, 1], [1, 1],
                                                                    [0, 0]]),
     r"explicit_paddings must hold integers"),
    # order of the rules: strides before dilations before padding
    ("order_strides_first", dict(strides=[1, 1], dilations=[0], padding="FULL"),
     r"strides must have 4 entries"),
    ("order_dilations_before_padding", dict(dilations=[1, 1], padding="FULL"),
     r"dilations must have 4 entries"),
    ("order_padding_before_explicit", dict(padding="FULL", explicit_paddings=[1]),
     r"padding must be one of"),
]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("case", ATTR_CASES, ids=[c[0] for c in ATTR_CASES])
def test_attribute_rules(case, op):
    _, kwargs, pattern = case
    if kwargs.get("data_format") == "NCHW":
        # otherwise valid NCHW operands, so only the attribute under test is wrong
        kwargs = dict(kwargs)
        shapes = {"forward": dict(input=_x((1, 2, 4, 4))),
                  "backprop_input": dict(input_sizes=(1, 2, 4, 4),
                                         out_backprop=_x((1, 2, 3, 3))),
                  "backprop_filter": dict(input=_x((1, 2, 4, 4)),
                                          out_backprop=_x((1, 2, 3, 3)))}[op]
        kwargs.update(shapes)
    with pytest.raises(IAE, match=pattern):
        OPS[op](**kwargs)


def test_invalid_argument_error_is_a_value_error():
    assert issubclass(InvalidArgumentError, ValueError)
    with pytest.raises(ValueError):
        F(strides=[1, 1])


@pytest.mark.parametrize("op", list(OPS))
def test_valid_attribute_spellings_are_accepted(op):
    """The rules reject only what they say: the same op with well-formed variants works."""
    base = OPS[op]()
    for kw in (dict(strides=np.array(ONES, np.int32)), dict(strides=(1, 1, 1, 1)),
               dict(dilations=np.array(ONES, np.uint8)),
               dict(strides=[np.int64(1)] * 4),
               dict(padding="EXPLICIT", explicit_paddings=[0] * 8),
               dict(padding="EXPLICIT", explicit_paddings=np.zeros(8, np.int64)),
               dict(padding="VALID", explicit_paddings=[])):
        np.testing.assert_array_equal(OPS[op](**kw), base)


# ------------------------------------------------------------------ rule 4: sizes

SIZE_CASES = [
    ("len3", [2, 2, 2], r"{name} must have 4 entries, got \[2, 2, 2\]"),
    ("len5", [1, 2, 2, 2, 1], r"{name} must have 4 entries, got \[1, 2, 2, 2, 1\]"),
    ("empty", [], r"{name} must have 4 entries, got \[\]"),
    ("negative", [1, -2, 2, 1], r"{name} must be non-negative, got \[1, -2, 2, 1\]"),
    ("overflow", [2**31] * 4,
     rf"{{name}} {lst([2**31] * 4)} has more elements than fit in int64"),
    ("overflow_tfsa_2022_071_4", [1879048192] * 4,
     rf"{{name}} {lst([1879048192] * 4)} has more elements than fit in int64"),
    ("entry_2_64_product_0", [1, 1, 0, 2**64],
     rf"{{name}} entries must be < 2\*\*63, got {lst([1, 1, 0, 2**64])}"),
    ("tfsa_2022_071", [1879048192] * 13, r"{name} must have 4 entries, got \[1879048192, "),
    ("float_list", [2, 2.0, 2, 1], r"{name} must hold integers, got \[2, 2.0, 2, 1\]"),
    ("float_array", np.array([2.0, 2, 2, 1]),
     r"{name} must hold integers, got an array of dtype float64"),
    ("bool_array", np.array([True, True, True, True]),
     r"{name} must hold integers, got an array of dtype bool"),
    ("2d_array", np.ones((2, 2), np.int32), r"{name} must be 1-D, got an array of shape \(2, 2\)"),
    ("uint32_4d_tf85258", np.ones((13, 2, 5, 4), np.uint32),
     r"{name} must be 1-D, got an array of shape \(13, 2, 5, 4\)"),
    ("scalar", 4, r"{name} must be a sequence of integers, got 4"),
    ("none", None, r"{name} must be a sequence of integers, got None"),
    ("string", "2221", r"{name} must be a sequence of integers, got '2221'"),
]


@pytest.mark.parametrize("case", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_filter_sizes_rules(case):
    _, sizes, pattern = case
    with pytest.raises(IAE, match=pattern.format(name="filter_sizes")):
        BF(filter_sizes=sizes)


@pytest.mark.parametrize("case", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_input_sizes_rules(case):
    _, sizes, pattern = case
    with pytest.raises(IAE, match=pattern.format(name="input_sizes")):
        BI(input_sizes=sizes)


def _containers(values):
    return {
        "list": list(values), "tuple": tuple(values), "int32": np.array(values, np.int32),
        "uint64": np.array(values, np.uint64), "int8": np.array(values, np.int8),
        "numpy_scalars": [np.int64(values[0]), np.int32(values[1]), np.uint16(values[2]),
                          values[3]],
        "range_list": list(range(values[0], values[0] + 1)) + list(values[1:]),
    }


@pytest.mark.parametrize("kind", list(_containers([1, 2, 3, 4])))
def test_integer_sizes_in_any_integer_container(kind):
    dw = BF(filter_sizes=_containers([2, 2, 2, 1])[kind])
    assert dw.shape == (2, 2, 2, 1)
    np.testing.assert_array_equal(dw, np.full((2, 2, 2, 1), 9, f32))   # 3x3 windows of ones
    dx = BI(input_sizes=_containers([1, 4, 4, 2])[kind])
    assert dx.shape == (1, 4, 4, 2)
    counts = np.array([1, 2, 2, 1], f32)
    np.testing.assert_array_equal(dx[0, :, :, 1], np.outer(counts, counts))


def test_size_rules_come_before_tensor_rules():
    # rule 4 (filter_sizes) is checked before rule 5 (ranks of the tensors)
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries"):
        BF(input=_x((4, 4, 2)), filter_sizes=[2, 2, 2])
    with pytest.raises(IAE, match=r"input_sizes must be non-negative"):
        BI(input_sizes=[1, -4, 4, 2], filter=_x((2, 2)))
    # and after the attribute rules (1-3)
    with pytest.raises(IAE, match=r"padding must be one of"):
        BF(filter_sizes=[2, 2, 2], padding="same")


# ------------------------------------------------------------------ rule 5: tensors

TENSOR_CASES = [
    ("fwd_input_rank3", lambda: F(input=_x((4, 4, 2))),
     r"input must be 4-D, got shape \[4, 4, 2\] \(rank 3\)"),
    ("fwd_input_rank5", lambda: F(input=_x((1, 1, 4, 4, 2))),
     r"input must be 4-D, got shape \[1, 1, 4, 4, 2\] \(rank 5\)"),
    ("fwd_input_scalar", lambda: F(input=np.float32(1)), r"input must be 4-D, got shape \[\] \(rank 0\)"),
    ("fwd_filter_rank3", lambda: F(filter=_x((2, 2, 2))),
     r"filter must be 4-D, got shape \[2, 2, 2\] \(rank 3\)"),
    ("fwd_filter_rank1", lambda: F(filter=_x((3,))), r"filter must be 4-D, got shape \[3\]"),
    ("fwd_depth", lambda: F(filter=_x((2, 2, 3, 1))),
     r"input and filter must have the same depth: input has 2 channels .*\[1, 4, 4, 2\].*"
     r"\[2, 2, 3, 1\]"),
    ("fwd_depth_nchw", lambda: F(input=_x((1, 3, 4, 4)), data_format="NCHW"),
     r"input and filter must have the same depth: input has 3 channels \(NCHW"),
    ("fwd_filter_rows0", lambda: F(filter=_x((0, 2, 2, 1))),
     r"filter must have spatial sizes >= 1, got \[0, 2, 2, 1\]"),
    ("fwd_filter_cols0", lambda: F(filter=_x((2, 0, 2, 1))),
     r"filter must have spatial sizes >= 1, got \[2, 0, 2, 1\]"),
    ("bi_filter_rank1_tf104881", lambda: BI(input_sizes=[1, 2, 2, 1], filter=_x((3,)),
                                            out_backprop=_x((1, 2, 2, 1))),
     r"filter must be 4-D, got shape \[3\] \(rank 1\)"),
    ("bi_out_backprop_rank3", lambda: BI(out_backprop=_x((3, 3, 2))),
     r"out_backprop must be 4-D, got shape \[3, 3, 2\] \(rank 3\)"),
    ("bi_batch", lambda: BI(input_sizes=[2, 4, 4, 2]),
     r"out_backprop has batch size 1 but the input has 2"),
    ("bi_depth", lambda: BI(input_sizes=[1, 4, 4, 3]),
     r"input_sizes and filter must have the same depth: input_sizes has 3 channels"),
    ("bi_out_channels", lambda: BI(out_backprop=_x((1, 3, 3, 3))),
     r"out_backprop must have C\*M = 2\*1 = 2 channels, got 3"),
    ("bi_out_channels_nchw", lambda: BI(input_sizes=[1, 2, 4, 4], filter=_x((2, 2, 2, 3)),
                                        out_backprop=_x((1, 2, 3, 3)), data_format="NCHW"),
     r"out_backprop must have C\*M = 2\*3 = 6 channels, got 2 \(NCHW shape \[1, 2, 3, 3\]\)"),
    ("bf_input_rank3", lambda: BF(input=_x((4, 4, 2))),
     r"input must be 4-D, got shape \[4, 4, 2\] \(rank 3\)"),
    ("bf_out_backprop_rank5", lambda: BF(out_backprop=_x((1, 1, 3, 3, 2))),
     r"out_backprop must be 4-D, got shape \[1, 1, 3, 3, 2\] \(rank 5\)"),
    ("bf_batch", lambda: BF(out_backprop=_x((3, 3, 3, 2))),
     r"out_backprop has batch size 3 but the input has 1"),
    ("bf_depth", lambda: BF(filter_sizes=[2, 2, 3, 1]),
     r"input and filter_sizes must have the same depth: input has 2 channels"),
    ("bf_multiplier", lambda: BF(filter_sizes=[2, 2, 2, 2]),
     r"out_backprop must have C\*M = 2\*2 = 4 channels, got 2"),
    ("bf_filter_rows0", lambda: BF(filter_sizes=[0, 2, 2, 1]),
     r"filter_sizes must have spatial sizes >= 1, got \[0, 2, 2, 1\]"),
]


@pytest.mark.parametrize("case", TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_tensor_rules(case):
    _, call, pattern = case
    with pytest.raises(IAE, match=pattern):
        call()


# ------------------------------------------------------------------ rule 6 and section 3

@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("op", ["backprop_input", "backprop_filter"])
def test_out_backprop_spatial_sizes_must_match(op, fmt):
    def shape(n, h, w, c):
        return (n, h, w, c) if fmt == "NHWC" else (n, c, h, w)

    strides = [1, 2, 1, 1] if fmt == "NHWC" else [1, 1, 2, 1]
    # input 4x4, filter 2x2, row stride 2, VALID -> 2 rows, 3 cols
    kw = dict(strides=strides, data_format=fmt)
    if op == "backprop_input":
        call = lambda dy: BI(input_sizes=shape(1, 4, 4, 2), out_backprop=dy, **kw)
    else:
        call = lambda dy: BF(input=_x(shape(1, 4, 4, 2)), out_backprop=dy, **kw)
    assert call(_x(shape(1, 2, 3, 2))).shape   # the right shape is accepted
    with pytest.raises(IAE, match=re.escape(
            "Number of rows of out_backprop doesn't match computed: actual = 3, computed = 2")):
        call(_x(shape(1, 3, 3, 2)))
    with pytest.raises(IAE, match=re.escape(
            "Number of cols of out_backprop doesn't match computed: actual = 2, computed = 3")):
        call(_x(shape(1, 2, 2, 2)))
    with pytest.raises(IAE, match=re.escape(
            "Number of rows of out_backprop doesn't match computed: actual = 0, computed = 2")):
        call(_x(shape(1, 0, 0, 2)))


NEGATIVE_CASES = [
    # (input rows, filter rows, stride, dilation, padding, explicit (before, after))
    (1, 5, 2, 1, "VALID", (0, 0)),      # trunc((1 - 5 + 2) / 2) = -1
    (4, 2, 1, 5, "VALID", (0, 0)),      # eff 6: -1
    (3, 7, 1, 1, "VALID", (0, 0)),      # -3
    (2, 9, 2, 1, "EXPLICIT", (1, 1)),   # trunc((2 + 2 - 9 + 2) / 2) = trunc(-1.5) = -1
    (1, 3, 3, 4, "EXPLICIT", (2, 0)),   # eff 9: trunc((1 + 2 - 9 + 3) / 3) = -1
]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("case", NEGATIVE_CASES)
def test_negative_output_size_message(case, op):
    n, k, s, r, padding, (pb, pa) = case
    eff = (k - 1) * r + 1
    out, _, _ = ref.tf_output_exact(n, k, s, r, padding, (pb, pa))
    assert out < 0
    x = _x((1, n, 3, 2))
    kw = dict(strides=[1, s, 1, 1], dilations=[1, r, 1, 1], padding=padding,
              explicit_paddings=[0, 0, pb, pa, 0, 0, 0, 0] if padding == "EXPLICIT" else [])
    msg = re.escape(f"Computed output size would be negative: {out} [input_size: {n}, "
                    f"effective_filter_size: {eff}, stride: {s}]")
    dy = _x((1, 0, 3, 2))
    with pytest.raises(IAE, match=msg):
        if op == "forward":
            F(input=x, filter=_x((k, 1, 2, 1)), **kw)
        elif op == "backprop_input":
            BI(input_sizes=x.shape, filter=_x((k, 1, 2, 1)), out_backprop=dy, **kw)
        else:
            BF(input=x, filter_sizes=[k, 1, 2, 1], out_backprop=dy, **kw)


def test_negative_output_size_in_columns_and_nchw():
    msg = re.escape("Computed output size would be negative: -2 [input_size: 2, "
                    "effective_filter_size: 5, stride: 1]")
    with pytest.raises(IAE, match=msg):
        F(input=_x((1, 2, 4, 2)), filter=_x((1, 3, 2, 1)), dilations=[1, 1, 1, 2],
          data_format="NCHW")


def test_zero_output_size_is_legal():
    # n=1, k=4, s=2, VALID: trunc(-0.5) = 0, not an error (floor division would say -1)
    y = F(input=_x((1, 1, 1, 2)), filter=_x((4, 4, 2, 1)), strides=[1, 2, 2, 1])
    assert y.shape == (1, 0, 0, 2)


# ------------------------------------------------------------------ rule 7: huge values

def test_huge_strides_are_computed():
    x = np.arange(2 * 5 * 6 * 2, dtype=np.float64).reshape(2, 5, 6, 2)
    w = np.arange(1, 5, dtype=np.float64).reshape(1, 1, 2, 2)
    for s in (65536, 2**31 - 1):
        for padding in ("VALID", "SAME"):
            y = F(input=x, filter=w, strides=[1, s, s, 1], padding=padding)
            want = ref.raw_forward(x, w, [1, s, s, 1], padding)
            assert y.shape == want.shape == (2, 1, 1, 4)
            np.testing.assert_array_equal(y, want)


def test_huge_paddings():
    # accepted up to 2**31 - 1 (an empty batch keeps the result small) ...
    y = F(input=_x((0, 1, 1, 2)), filter=_x((1, 1, 2, 1)), padding="EXPLICIT",
          explicit_paddings=[0, 0, 2**31 - 1, 2**31 - 1, 0, 0, 0, 0])
    assert y.shape == (0, 2**32 - 1, 1, 2)
    # ... and rejected beyond, naming the argument
    with pytest.raises(IAE, match=r"explicit_paddings must be < 2\*\*31"):
        F(padding="EXPLICIT", explicit_paddings=[0, 0, 0, 0, 2**40, 0, 0, 0])


HUGE_PADS = [0, 0, 2**31 - 1, 2**31 - 1, 2**31 - 1, 2**31 - 1, 0, 0]


@pytest.mark.parametrize("batch", [0, 1], ids=["empty", "nonempty"])
def test_unrepresentable_output_is_a_clear_error(batch):
    """SPEC section 9, huge paddings: an output of (2**32 - 1)**2 pixels (more bytes than
    NumPy can address) must be refused with an error, never crash, wrap or start to fill
    memory. (Empty batch: the element count is 0 but the shape is still unrepresentable.)"""
    with pytest.raises((ValueError, MemoryError),
                       match=r"memory|int64|too big|[Oo]verflow|large|[Mm]aximum"):
        F(input=_x((batch, 1, 1, 2)), filter=_x((1, 1, 2, 1)), padding="EXPLICIT",
          explicit_paddings=HUGE_PADS)


# ------------------------------------------------------------------ dtypes and array types

BAD_DTYPES = [
    ("int64", np.int64, r"int64"),
    ("int32", np.int32, r"int32"),
    ("uint8", np.uint8, r"uint8"),
    ("bool", np.bool_, r"bool"),
    ("complex64", np.complex64, r"complex64"),
    ("complex128", np.complex128, r"complex128"),
    ("big_endian_f4", np.dtype(">f4"), r">f4 \(non-native byte order\)"),
    ("big_endian_f8", np.dtype(">f8"), r">f8 \(non-native byte order\)"),
    ("longdouble", np.longdouble, np.dtype(np.longdouble).name),
    ("object", object, r"object"),
    ("float8", ml_dtypes.float8_e4m3fn, r"float8_e4m3fn"),
]


@pytest.mark.parametrize("which", ["first", "second"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("case", BAD_DTYPES, ids=[c[0] for c in BAD_DTYPES])
def test_unsupported_dtypes(case, op, which):
    _, dtype, dname = case
    names = {"forward": ("input", "filter"), "backprop_input": ("filter", "out_backprop"),
             "backprop_filter": ("input", "out_backprop")}[op]
    arg = names[0] if which == "first" else names[1]
    shapes = {"input": (1, 4, 4, 2), "filter": (2, 2, 2, 1), "out_backprop": (1, 3, 3, 2)}
    bad = np.ones(shapes[arg], dtype)
    pattern = rf"{arg} has dtype {dname}.*numbasep supports float16, bfloat16.*float32, float64"
    with pytest.raises(TypeError, match=pattern):
        OPS[op](**{arg: bad})


MIXED = [
    ("forward", dict(filter=_x((2, 2, 2, 1), np.float64)), r"input=float32, filter=float64"),
    ("forward", dict(input=_x(dtype=np.float16)), r"input=float16, filter=float32"),
    ("forward", dict(input=_x(dtype=ml_dtypes.bfloat16), filter=_x((2, 2, 2, 1), np.float16)),
     r"input=bfloat16, filter=float16"),
    ("backprop_input", dict(out_backprop=_x((1, 3, 3, 2), np.float16)),
     r"filter=float32, out_backprop=float16"),
    ("backprop_filter", dict(input=_x(dtype=ml_dtypes.bfloat16)),
     r"input=bfloat16, out_backprop=float32"),
]


@pytest.mark.parametrize("case", MIXED, ids=[f"{c[0]}-{i}" for i, c in enumerate(MIXED)])
def test_mixed_dtypes(case):
    op, kwargs, pattern = case
    with pytest.raises(TypeError, match=r"all array arguments must share one dtype, got "
                                        + pattern):
        OPS[op](**kwargs)


class FakeCudaArray:
    """Looks like a CUDA array to the dispatcher (never reaches a CUDA backend)."""

    def __init__(self, shape):
        self.shape = shape
        self.dtype = np.dtype(np.float32)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": "<f4", "data": (0, False), "version": 3}


@pytest.mark.parametrize("op", list(OPS))
def test_mixed_cpu_and_cuda_arrays(op):
    args = {"forward": dict(filter=FakeCudaArray((2, 2, 2, 1))),
            "backprop_input": dict(out_backprop=FakeCudaArray((1, 3, 3, 2))),
            "backprop_filter": dict(out_backprop=FakeCudaArray((1, 3, 3, 2)))}[op]
    arg = next(iter(args))
    with pytest.raises(TypeError, match=r"all array arguments must live on one device, got "
                                        r".*numpy\.ndarray\) on cpu, " + arg +
                                        r" \(.*FakeCudaArray\) on cuda"):
        OPS[op](**args)


@pytest.mark.parametrize("obj", [object(), {"a": 1}, "input", None, b"\x00" * 16,
                                 {1, 2}],
                         ids=["object", "dict", "str", "None", "bytes", "set"])
@pytest.mark.parametrize("op", list(OPS))
def test_unknown_array_types(op, obj):
    arg = {"forward": "input", "backprop_input": "filter", "backprop_filter": "input"}[op]
    with pytest.raises(TypeError, match=rf"{arg} is a builtins\.\w+, which no numbasep "
                                        rf"backend accepts; supported: NumPy arrays"):
        OPS[op](**{arg: obj})


def test_unknown_type_in_the_second_argument():
    with pytest.raises(TypeError, match=r"out_backprop is a builtins\.object, which no"):
        BF(out_backprop=object())


# ------------------------------------------------------------------ SPEC section 9

def test_tfsa_2022_071_filter_sizes_element_count_overflow():
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries, got \[1879048192"):
        BF(filter_sizes=[1879048192] * 13)
    with pytest.raises(IAE, match=r"filter_sizes \[1879048192, .*\] has more elements than "
                                  r"fit in int64"):
        BF(filter_sizes=[1879048192] * 4)


def test_tf58180_scalar_input_empty_filter_sizes_bad_dilations():
    s = np.float32(1)
    with pytest.raises(IAE, match=r"dilations must have 4 entries.*\[1, 1, 1\]"):
        BF(input=s, filter_sizes=[], out_backprop=s, strides=[1, 1, 128, 128],
           data_format="NCHW", dilations=[1, 1, 1])
    # each fault on its own is caught too
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries, got \[\]"):
        BF(input=s, filter_sizes=[], out_backprop=s, strides=[1, 1, 128, 128],
           data_format="NCHW")
    with pytest.raises(IAE, match=r"input must be 4-D, got shape \[\] \(rank 0\)"):
        BF(input=s, filter_sizes=[1, 1, 1, 1], out_backprop=s, strides=[1, 1, 128, 128],
           data_format="NCHW")


def test_tf85258_uint32_filter_sizes_scalars_empty_strides():
    s = np.float32(1)
    fs = np.ones((13, 2, 5, 4), np.uint32)
    with pytest.raises(IAE, match=r"strides must have 4 entries.*got \[\]"):
        BF(input=s, filter_sizes=fs, out_backprop=s, strides=[])
    with pytest.raises(IAE, match=r"filter_sizes must be 1-D, got an array of shape "
                                  r"\(13, 2, 5, 4\)"):
        BF(input=s, filter_sizes=fs, out_backprop=s)


def test_tf104881_rank1_filter_short_strides():
    w = _x((3,))
    dy = _x((1, 2, 2, 1))
    with pytest.raises(IAE, match=r"strides must have 4 entries.*\[1, 1\]"):
        BI(input_sizes=[1, 2, 2, 1], filter=w, out_backprop=dy, strides=[1, 1])
    with pytest.raises(IAE, match=r"filter must be 4-D, got shape \[3\]"):
        BI(input_sizes=[1, 2, 2, 1], filter=w, out_backprop=dy)


def test_tf60201_backprop_input_bad_arguments():
    w = _x((1, 1, 1, 1))
    dy = _x((1, 0, 0, 1))
    with pytest.raises(IAE, match=r"strides must be > 0, got \[1, 0, 1, 1\]"):
        BI(input_sizes=[1, 2, 2], filter=w, out_backprop=dy, strides=[1, 0, 1, 1],
           dilations=[1, 1, 1, 1, 1])
    with pytest.raises(IAE, match=r"dilations must have 4 entries.*\[1, 1, 1, 1, 1\]"):
        BI(input_sizes=[1, 2, 2], filter=w, out_backprop=dy, dilations=[1, 1, 1, 1, 1])
    with pytest.raises(IAE, match=r"input_sizes must have 4 entries, got \[1, 2, 2\]"):
        BI(input_sizes=[1, 2, 2], filter=w, out_backprop=dy)
    with pytest.raises(IAE, match=re.escape(
            "Number of rows of out_backprop doesn't match computed: actual = 0, computed = 2")):
        BI(input_sizes=[1, 2, 2, 1], filter=w, out_backprop=dy)


def test_cve_2021_29524_zero_size_with_inconsistent_filter_sizes():
    with pytest.raises(IAE, match=r"input and filter_sizes must have the same depth: input "
                                  r"has 0 channels .*\[0, 0, 1, 0\].*\[1, 1, 1, 1\]"):
        BF(input=_x((0, 0, 1, 0)), filter_sizes=[1, 1, 1, 1], out_backprop=_x((0, 0, 1, 1)),
           strides=[1, 66, 18, 1])
    # the consistent version is computed: an empty filter gradient
    dw = BF(input=_x((0, 0, 1, 0)), filter_sizes=[1, 1, 0, 1], out_backprop=_x((0, 0, 1, 0)),
            strides=[1, 66, 18, 1])
    assert dw.shape == (1, 1, 0, 1)


def test_negative_sizes_anywhere():
    with pytest.raises(IAE, match=r"filter_sizes must be non-negative, got \[-1, 2, 2, 1\]"):
        BF(filter_sizes=[-1, 2, 2, 1])
    with pytest.raises(IAE, match=r"input_sizes must be non-negative, got \[1, 4, 4, -2\]"):
        BI(input_sizes=[1, 4, 4, -2])
    with pytest.raises(IAE, match=r"input_sizes must be non-negative, got \[-1, 4, 4, 2\]"):
        BI(input_sizes=[-1, 4, 4, 2])


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_rank3_tensors_and_short_strides_never_abort(fmt):
    """TF's oneDNN path aborted the process on these."""
    for strides in ([1, 1], [1, 1, 1]):
        for op in OPS.values():
            with pytest.raises(IAE, match=r"strides must have 4 entries"):
                op(strides=strides, data_format=fmt)
    with pytest.raises(IAE, match=r"input must be 4-D.*rank 3"):
        F(input=_x((4, 4, 2)), data_format=fmt)
    with pytest.raises(IAE, match=r"filter must be 4-D.*rank 3"):
        BI(filter=_x((2, 2, 2)), data_format=fmt)
    with pytest.raises(IAE, match=r"out_backprop must be 4-D.*rank 3"):
        BF(out_backprop=_x((3, 3, 2)), data_format=fmt,
           input=_x((1, 4, 4, 2) if fmt == "NHWC" else (1, 2, 4, 4)))


def test_raw_ops_spellings_validate_too():
    with pytest.raises(IAE, match=r"filter_sizes must have 4 entries"):
        raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=_x(), filter_sizes=[1879048192] * 13, out_backprop=_x((1, 3, 3, 2)),
            strides=ONES, padding="VALID", name="tfsa")
    with pytest.raises(IAE, match=r"input_sizes must have 4 entries, got \[1, 2, 2\]"):
        raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=[1, 2, 2], filter=_x((1, 1, 1, 1)), out_backprop=_x((1, 0, 0, 1)),
            strides=ONES, padding="VALID")
    with pytest.raises(TypeError, match=r"input has dtype int64"):
        raw_ops.DepthwiseConv2dNative(input=np.ones((1, 4, 4, 2), np.int64),
                                      filter=_x((2, 2, 2, 1)), strides=ONES, padding="VALID")
