"""Bad arguments to the Keras-style operators (SPEC sections 4, 5 and 9).

Every case must raise before any kernel runs, with the documented error class
(``numbasep.InvalidArgumentError``, a ``ValueError``, or ``TypeError`` for
dtypes) and a message that names the argument and the offending shapes/values.
Each case is tried on all the operators it applies to.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import numbasep
from numbasep import InvalidArgumentError

FUNCS = ("depthwise_conv", "separable_conv", "depthwise_conv_grad", "separable_conv_grad")
SEPARABLE = ("separable_conv", "separable_conv_grad")
GRADS = ("depthwise_conv_grad", "separable_conv_grad")

# A valid 2-D problem (channels_last, valid padding, strides 1, dilation 1):
# inputs (1, 6, 5, 3), depthwise (2, 2, 3, 2) -> (1, 5, 4, 6);
# pointwise (1, 1, 6, 4) -> (1, 5, 4, 4)
X = (1, 6, 5, 3)
DK = (2, 2, 3, 2)
PK = (1, 1, 6, 4)
Y = (1, 5, 4, 6)
S = (1, 5, 4, 4)


def call(func, x=X, dk=DK, pk=PK, g=None, dtype=np.float32, dtypes=None, **kw):
    """Call ``func`` with arrays of the given shapes (or arrays given as such)."""
    dtypes = dict(dtypes or {})

    def arr(name, shape):
        if isinstance(shape, np.ndarray):
            return shape
        return np.zeros(shape, dtypes.get(name, dtype))

    fn = getattr(numbasep, func)
    args = [arr("inputs", x), arr("kernel", dk)]
    if func in SEPARABLE:
        args.append(arr("pointwise", pk))
    if func in GRADS:
        if g is None:
            g = S if func in SEPARABLE else Y
        args.append(arr("out_grad", g))
    return fn(*args, **kw)


def shape_re(shape):
    return re.escape(str(tuple(shape)))


def test_error_class_is_a_value_error():
    assert issubclass(InvalidArgumentError, ValueError)


# ------------------------------------------------------------------------------ ranks

@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("x", [(6, 3), (1, 2, 3, 4, 5, 3), (3,), ()])
def test_inputs_rank(func, x):
    with pytest.raises(InvalidArgumentError,
                       match=r"inputs must have rank 3, 4 or 5.*" + shape_re(x)):
        call(func, x=x)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("dk", [(2, 3, 2), (1, 2, 2, 3, 2), (3, 2)])
def test_kernel_rank(func, dk):
    with pytest.raises(InvalidArgumentError,
                       match=r"depthwise kernel must have rank 4.*" + shape_re(dk)
                       + r".*" + shape_re(X)):
        call(func, dk=dk)


@pytest.mark.parametrize("func", FUNCS)
def test_kernel_spatial_size_zero(func):
    dk = (0, 2, 3, 2)
    with pytest.raises(InvalidArgumentError, match=r"spatial sizes >= 1.*" + shape_re(dk)):
        call(func, dk=dk, padding="same")


# --------------------------------------------------------------------------- channels

@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("x, dk, fmt", [
    (X, (2, 2, 4, 2), "channels_last"),
    ((1, 3, 6, 5), (2, 2, 5, 2), "channels_first"),
    # a channels-last array read as channels-first: 6 channels, kernel has 3
    (X, DK, "channels_first"),
    ((2, 8, 3), (3, 1, 1), "channels_last"),
    ((2, 4, 4, 4, 2), (2, 2, 2, 3, 1), "channels_last"),
])
def test_channel_mismatch(func, x, dk, fmt):
    match = (r"The number of input channels must match the kernel's input channels.*"
             + shape_re(x) + r".*" + shape_re(dk))
    with pytest.raises(InvalidArgumentError, match=match):
        call(func, x=x, dk=dk, data_format=fmt, padding="same")


@pytest.mark.parametrize("func", SEPARABLE)
@pytest.mark.parametrize("pk", [
    (1, 1, 5, 4),        # wrong in-channels (Keras: a grouped convolution)
    (1, 1, 3, 4),        # C instead of C*M
    (3, 3, 6, 4),        # not 1x1 (Keras: a k x k convolution)
    (1, 2, 6, 4),
    (6, 4),              # wrong rank
    (1, 6, 4),
    (1, 1, 1, 6, 4),
])
def test_pointwise_kernel_shape(func, pk):
    match = (r"pointwise kernel must have shape " + re.escape("(1, 1, 6, 'F')")
             + r".*" + shape_re(DK) + r".*got " + shape_re(pk))
    with pytest.raises(InvalidArgumentError, match=match):
        call(func, pk=pk)


@pytest.mark.parametrize("func", SEPARABLE)
@pytest.mark.parametrize("x, dk, pk", [
    ((1, 5, 2), (2, 2, 3), (1, 2, 4)),                  # 1-D: C instead of C*M
    ((1, 5, 2), (2, 2, 3), (2, 6, 4)),                  # 1-D: not 1-wide
    ((1, 4, 4, 4, 2), (2, 2, 2, 2, 1), (1, 1, 2, 2, 3)),  # 3-D: not 1x1x1
    ((1, 4, 4, 4, 2), (2, 2, 2, 2, 1), (1, 1, 1, 3, 3)),  # 3-D: wrong in-channels
])
def test_pointwise_kernel_shape_1d_3d(func, x, dk, pk):
    ndim = len(x) - 2
    want = (1,) * ndim + (dk[-2] * dk[-1], "F")
    with pytest.raises(InvalidArgumentError,
                       match=r"pointwise kernel must have shape " + re.escape(str(want))
                       + r".*got " + shape_re(pk)):
        call(func, x=x, dk=dk, pk=pk, g=(1,) * len(x))


# ------------------------------------------------------------------------ output size

@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("x, dk, strides, dilation", [
    ((1, 3, 3), (4, 3, 1), 1, 1),                      # input smaller than the kernel
    ((1, 5, 5, 3), (3, 3, 3, 1), 1, 3),                # ... than the dilated kernel
    ((1, 5, 5, 3), (3, 3, 3, 1), 2, (1, 3)),
    ((1, 8, 5, 2), (2, 6, 2, 1), (1, 2), 1),
    ((2, 4, 4, 2, 1), (1, 1, 3, 1, 1), 1, 1),          # 3-D
    ((1, 0, 2), (1, 2, 1), 1, 1),                      # empty spatial dim: output 0
])
def test_valid_output_not_positive(func, x, dk, strides, dilation):
    c, m = dk[-2], dk[-1]
    ndim = len(x) - 2
    pk = (1,) * ndim + (c * m, 2)
    match = (r"Computed output size would be zero or negative.*inputs shape: " + shape_re(x)
             + r".*kernel shape: " + shape_re(dk) + r".*strides.*dilation_rate")
    with pytest.raises(InvalidArgumentError, match=match):
        call(func, x=x, dk=dk, pk=pk, g=(1,) * len(x), strides=strides,
             dilation_rate=dilation)


# ------------------------------------------------------------------ strides / dilation

@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("name", ["strides", "dilation_rate"])
@pytest.mark.parametrize("value", [(1,), (1, 1, 1), [2, 2, 2, 2], ()])
def test_wrong_length_tuples(func, name, value):
    match = rf"{name} must be an int or a tuple of 2 ints for a 2-D convolution, got " \
        + re.escape(repr(value))
    with pytest.raises(InvalidArgumentError, match=match):
        call(func, padding="same", **{name: value})


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("name", ["strides", "dilation_rate"])
@pytest.mark.parametrize("value", [0, (1, 0), (0, 0), -1, (2, -3)])
def test_not_positive(func, name, value):
    with pytest.raises(InvalidArgumentError,
                       match=rf"{name} must be positive, got " + re.escape(repr(value))):
        call(func, padding="same", **{name: value})


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("name", ["strides", "dilation_rate"])
@pytest.mark.parametrize("value", [1.5, (1.0, 1), "2", None, True, (1, True),
                                   np.array([[1, 1]]), np.array([1.0, 1.0])])
def test_not_integers(func, name, value):
    with pytest.raises(InvalidArgumentError, match=name):
        call(func, padding="same", **{name: value})


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("name", ["strides", "dilation_rate"])
def test_huge_strides_and_dilations(func, name):
    with pytest.raises(InvalidArgumentError, match=rf"{name} must be < 2\*\*31"):
        call(func, padding="same", **{name: (1, 2**31)})


@pytest.mark.parametrize("func", ["depthwise_conv", "separable_conv"])
def test_integer_types_accepted_for_strides(func):
    """numpy integers and 1-D integer arrays are valid spellings (no error, right shape)."""
    y = call(func, padding="same", strides=np.int64(2), dilation_rate=np.array([1, 2]))
    assert y.shape[1:3] == (3, 3)


# -------------------------------------------------------------- padding / data_format

@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("padding", ["full", "explicit", "", "same ", None, 1, ("same",)])
def test_bad_padding(func, padding):
    match = r"padding must be 'valid', 'same' or \(1-D only\) 'causal', got " \
        + re.escape(repr(padding))
    with pytest.raises(InvalidArgumentError, match=match):
        call(func, padding=padding)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("x, dk, pk, g", [
    (X, DK, PK, None),
    ((1, 4, 4, 4, 2), (2, 2, 2, 2, 1), (1, 1, 1, 2, 3), (1, 4, 4, 4, 2)),
])
def test_causal_only_1d(func, x, dk, pk, g):
    ndim = len(x) - 2
    if g is not None and func in SEPARABLE:
        g = g[:-1] + (3,)
    with pytest.raises(InvalidArgumentError,
                       match=rf"padding='causal' is only defined for 1-D.*{ndim}-D.*"
                       + shape_re(x)):
        call(func, x=x, dk=dk, pk=pk, g=g, padding="causal")


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW", "channels_middle", "", 1, True])
def test_bad_data_format(func, fmt):
    with pytest.raises(InvalidArgumentError,
                       match=r"data_format must be .*got " + re.escape(repr(fmt))):
        call(func, data_format=fmt)


# --------------------------------------------------------------------------- out_grad

@pytest.mark.parametrize("g", [(1, 5, 4, 5), (1, 4, 4, 6), (2, 5, 4, 6), (1, 5, 4), (1, 6, 5, 6),
                               (1, 5, 4, 4)])
def test_depthwise_grad_out_grad_shape(g):
    match = r"out_grad must have the shape of the operator's output, " + shape_re(Y) \
        + r", got " + shape_re(g)
    with pytest.raises(InvalidArgumentError, match=match):
        call("depthwise_conv_grad", g=g)


@pytest.mark.parametrize("g", [Y, (1, 5, 4, 3), (1, 5, 5, 4), (1, 4, 5, 4, 1)])
def test_separable_grad_out_grad_shape(g):
    match = r"out_grad must have the shape of the operator's output, " + shape_re(S) \
        + r", got " + shape_re(g)
    with pytest.raises(InvalidArgumentError, match=match):
        call("separable_conv_grad", g=g)


@pytest.mark.parametrize("func", GRADS)
def test_out_grad_shape_channels_first(func):
    x = (1, 3, 6, 5)
    want = (1, 6, 5, 4) if func == "depthwise_conv_grad" else (1, 4, 5, 4)
    g = (1, 5, 4, 6) if func == "depthwise_conv_grad" else (1, 5, 4, 4)  # channels-last shapes
    with pytest.raises(InvalidArgumentError, match=shape_re(want) + r", got " + shape_re(g)):
        call(func, x=x, g=g, data_format="channels_first")


# ------------------------------------------------------------------------------ dtypes

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("bad", [np.int32, np.int64, np.uint8, np.bool_, np.complex64,
                                 np.float128 if hasattr(np, "float128") else np.complex128,
                                 object])
def test_unsupported_dtype(func, bad):
    name = np.dtype(bad).name
    with pytest.raises(TypeError, match=rf"inputs has dtype {name}; numbasep supports "
                                        r"float16, bfloat16.*float32, float64"):
        call(func, dtype=bad)


@pytest.mark.parametrize("func", FUNCS)
def test_non_native_byte_order(func):
    with pytest.raises(TypeError, match=r"kernel has dtype >f4 \(non-native byte order\)"):
        call(func, dtypes={"kernel": np.dtype(">f4")})


@pytest.mark.parametrize("func, which, other", [
    ("depthwise_conv", "kernel", np.float64),
    ("depthwise_conv", "inputs", np.float16),
    ("separable_conv", "pointwise", BF16),
    ("separable_conv", "kernel", np.float16),
    ("depthwise_conv_grad", "out_grad", np.float64),
    ("separable_conv_grad", "out_grad", np.float16),
    ("separable_conv_grad", "pointwise", np.float64),
])
def test_mixed_dtypes(func, which, other):
    with pytest.raises(TypeError, match=r"all array arguments must share one dtype, got "
                                        r"inputs=\w+, \w*kernel=\w+"):
        call(func, dtypes={which: other})


def test_mixed_dtypes_message_names_every_argument():
    with pytest.raises(TypeError, match=re.escape(
            "inputs=float32, depthwise_kernel=float32, pointwise_kernel=bfloat16, "
            "out_grad=float32")):
        call("separable_conv_grad", dtypes={"pointwise": BF16})


# ---------------------------------------------------------------- nothing is computed

@pytest.mark.parametrize("func", GRADS)
def test_errors_leave_out_untouched(func):
    """A rejected call writes nothing: the preallocated results keep their contents."""
    n_out = 2 if func == "depthwise_conv_grad" else 3
    shapes = [X, DK, PK][:n_out]
    outs = tuple(np.full(s, 7.0, np.float32) for s in shapes)
    with pytest.raises(InvalidArgumentError):
        call(func, g=(1, 5, 4, 5), out=outs)
    for o in outs:
        assert (o == 7.0).all()
