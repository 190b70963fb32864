"""The public operators: validate with :mod:`numbasep.shapes`, pick a backend, call it.

Nothing here knows which devices exist: :func:`numbasep.backends.select` finds
the backend from the arrays' types, and every backend implements the same
primitives (:class:`numbasep.backends.base.Backend`).
"""

import math

from . import backends, config, dtypes, shapes
from .errors import InvalidArgumentError


def _dtype(be, pairs):
    return dtypes.common_dtype([(name, be.dtype(a)) for name, a in pairs])


def _out(be, out, shape, dtype, name="out"):
    """Check a caller-supplied result array; ``None`` means "allocate one"."""
    if out is None:
        return None
    native = _native_out(be, out, name)
    got = be.shape(native)
    if got != tuple(shape):
        raise InvalidArgumentError(f"{name} must have shape {tuple(shape)}, got {got}")
    dt = be.dtype(native)
    if dt != dtype:
        raise TypeError(f"{name} must have dtype {dtype.name}, got {dt.name}")
    return native


def _native_out(be, out, name):
    """``out`` as the backend's array, if the backend can write it."""
    try:
        return be.check_out(out, name)
    except ValueError as e:   # e.g. a read-only out: still an invalid argument (SPEC §4)
        if isinstance(e, InvalidArgumentError):
            raise
        raise InvalidArgumentError(str(e)) from None


def _refuse_shared(be, outs, arrays):
    """Refuse result arrays that share memory with an argument or with each other:
    the kernels read their arguments while they write, so an overlap would give
    silently wrong results. ``outs`` and ``arrays`` are (name, array) pairs; None
    entries of ``outs`` (results to allocate) are skipped."""
    given = [(name, o) for name, o in outs if o is not None]
    for i, (name, o) in enumerate(given):
        for other, a in (*arrays, *given[:i]):
            if be.shares_memory(o, a):
                raise InvalidArgumentError(
                    f"{name} shares memory with {other}; results must be written to "
                    f"arrays of their own")


def _outs(out, count):
    if out is None:
        return (None,) * count
    if not isinstance(out, (tuple, list)) or len(out) != count:
        raise InvalidArgumentError(
            f"out must be a tuple of {count} arrays (or None entries), got {type(out).__name__}")
    return tuple(out)


# Upper bound, in elements, of the filter gradients' per-chunk partial sums
# (both backends cap them near 2**22 elements unless one filter is larger).
_PARTIAL_ELEMS = 1 << 22
_RAW_ATTRS = "strides, padding, explicit_paddings and dilations"
_KERAS_ATTRS = "strides, padding and dilation_rate"


def _contiguous(a):
    test = getattr(a, "is_c_contiguous", None)   # numba device arrays
    return test() if test is not None else bool(a.flags.c_contiguous)


def _check_memory(be, plan, results, arrays, culprits, temps=(), filter_grad=False,
                  data=("input", "out_backprop", "inputs", "out_grad")):
    """Refuse, before anything is allocated, a call that could not fit in memory.

    Counts, in bytes: every result (its dtype, plus an accumulation-dtype buffer
    for 16-bit results or results written into a caller's ``out``), the
    intermediates ``temps`` (output-shaped, accumulation dtype), the filter
    gradient's partial sums, and a compute copy of every array argument that is
    16-bit (widened) or not C-contiguous (e.g. a broadcast view). A channels-first
    problem may be computed as channels-last: then every argument named in
    ``data`` is copied, and every data-layout result (``results`` entries with a
    true fourth item) and intermediate has a channels-last buffer too. Raises
    :class:`InvalidArgumentError` when the total exceeds :func:`shapes.memory_limit`.
    """
    item = plan.dtype.itemsize
    acc = dtypes.accumulator(plan.dtype)
    cf = not plan.channels_last
    # (nbytes, description format, its arguments): the text is only built for a refusal,
    # which keeps this check off the small-call overhead.
    parts = []
    for label, shape, given, in_layout in results:
        n = math.prod(shape)
        nbytes = n * acc.itemsize if given else \
            n * item + (n * acc.itemsize if acc.itemsize != item else 0)
        if cf and in_layout and not given and acc.itemsize == item:
            nbytes += n * acc.itemsize          # the channels-last buffer
        parts.append((nbytes, "{} of shape {} ({})", (label, shape, plan.dtype)))
    for t in temps:
        parts.append((math.prod(t) * acc.itemsize * (2 if cf else 1),
                      "an intermediate of shape {} ({})", (t, acc)))
    ws = be.workspace_bytes(plan)
    if ws:
        parts.append((ws, "the {} backend's intermediates", (be.name,)))
    if filter_grad:
        f = math.prod(plan.filter_shape)
        parts.append((min(64 * f, max(f, _PARTIAL_ELEMS)) * acc.itemsize,
                      "the filter gradient's partial sums", ()))
    for name, a in arrays:
        if dtypes.is_16bit(be.dtype(a)) or not _contiguous(a) or (cf and name in data):
            shape = be.shape(a)
            parts.append((math.prod(shape) * acc.itemsize, "a contiguous {} copy of {} (shape {})",
                          (acc, name, shape)))
    total = sum(p[0] for p in parts)
    limit = shapes.memory_limit()
    if limit is None or total <= limit:
        return
    _, fmt, args = max(parts, key=lambda p: p[0])
    args = [tuple(a) if isinstance(a, list) else a for a in args]   # dtypes print their names
    shapes.check_memory(total, fmt.format(*args), culprits)


# ------------------------------------------------------------------ repeated calls
# A training or inference loop makes the same call over and over. Everything the
# checks above decide depends only on the attribute values and on each array's
# type, shape, dtype and strides (and on the memory limit and the default
# data_format), so a call whose key matches an earlier accepted one skips straight
# to the backend with that call's backend and plan. Arrays without a tuple
# ``shape`` and ``strides`` (e.g. Python lists, PyTorch tensors) and attributes that
# are not plain ints/strings/tuples always take the checking path.

_FAST = {}
_FAST_MAX = 512


def _fast_key(op, attrs, arrays):
    key = [op, config._image_data_format, shapes.max_bytes_setting()]
    plain, uncacheable = shapes._plain, shapes._UNCACHEABLE
    for a in attrs:
        k = plain(a)
        if k is uncacheable:
            return None
        key.append(k)
    for a in arrays:
        if a is None:
            key.append(None)
            continue
        try:
            shape, strides, dtype = a.shape, a.strides, a.dtype
        except AttributeError:
            return None
        if type(shape) is not tuple or type(strides) is not tuple:
            return None
        key += (type(a), shape, strides, dtype)
    return tuple(key)


def _cached(key):
    return _FAST.get(key) if key is not None else None


def _rerun(hit, named, out, like):
    """Run a call whose checks an identical earlier call passed: ``hit`` is what
    :func:`_remember` kept; ``named`` the array arguments in the primitive's order.
    ``out``'s type, shape, strides and dtype are part of the call's key, so only
    what the key does not hold (e.g. whether it is writeable) is checked again."""
    be, run = hit
    prepare = be.prepare
    arrays = [prepare(a, name) for name, a in named]
    o = None
    if out is not None:
        o = _native_out(be, out, "out")
        _refuse_shared(be, (("out", o),), zip((name for name, _ in named), arrays))
    return be.wrap(run(*arrays, o), like)


def _remember(key, be, plan, method, arrays, out):
    """Keep, for calls with this key, the backend and its primitive ``method``
    bound to ``plan`` for arrays like ``arrays`` and ``out`` (``Backend.bind``)."""
    if key is not None:
        if len(_FAST) >= _FAST_MAX:
            _FAST.clear()
        _FAST[key] = (be, be.bind(method, plan, arrays, out))


# ------------------------------------------------------------------ TensorFlow family

def depthwise_conv2d_native(input, filter, strides, padding, explicit_paddings=(),
                            data_format="NHWC", dilations=(1, 1, 1, 1), *, out=None):
    """Depthwise 2-D convolution, as TensorFlow's ``DepthwiseConv2dNative``.

    Each input channel ``c`` is convolved with its own ``M`` filters
    ``filter[:, :, c, :]``; output channel ``c*M + m`` holds the result of filter
    ``m``. Unlike TensorFlow's CPU kernel, any strides, any dilations and NCHW are
    computed, and 16-bit inputs are accumulated in float32.

    Parameters
    ----------
    input : array, shape ``[N, H, W, C]`` (NHWC) or ``[N, C, H, W]`` (NCHW)
        A NumPy array (computed on the CPU) or a CUDA array (computed on the GPU).
    filter : array, shape ``[FH, FW, C, M]``
        Whatever ``data_format`` is.
    strides : sequence of 4 ints
        In ``data_format`` order; batch and channel entries must be 1.
    padding : {"SAME", "VALID", "EXPLICIT"}
    explicit_paddings : sequence of 8 ints, optional
        Before/after pairs per dimension in ``data_format`` order; only with
        ``padding="EXPLICIT"``.
    data_format : {"NHWC", "NCHW"}
    dilations : sequence of 4 ints
        In ``data_format`` order; batch and channel entries must be 1.
    out : array, optional
        Preallocated result of the output's shape and dtype, on the same device.

    Returns
    -------
    array, shape ``[N, OH, OW, C*M]`` (NHWC) or ``[N, C*M, OH, OW]`` (NCHW)
        Same dtype and kind of array as ``input``.

    Raises
    ------
    InvalidArgumentError
        For malformed attributes or inconsistent shapes (before any computation).
    TypeError
        For unsupported or mixed dtypes, or arrays on different devices.

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.arange(1, 13, dtype=np.float32).reshape(1, 2, 3, 2)
    >>> w = np.arange(1, 17, dtype=np.float32).reshape(2, 2, 2, 2)
    >>> numbasep.depthwise_conv2d_native(x, w, [1, 1, 1, 1], "VALID").ravel()
    array([196., 216., 272., 296., 252., 280., 344., 376.], dtype=float32)
    """
    key = _fast_key("fwd", (strides, padding, explicit_paddings, data_format, dilations),
                    (input, filter, out))
    hit = _cached(key)
    if hit is not None:
        return _rerun(hit, (("input", input), ("filter", filter)), out, input)
    be, (x, w) = backends.select(input=input, filter=filter)
    plan = shapes.raw_forward(be.shape(x), be.shape(w), strides, padding,
                              explicit_paddings, data_format, dilations)
    plan = plan.with_dtype(_dtype(be, (("input", x), ("filter", w))))
    o = _out(be, out, plan.output_shape, plan.dtype)
    _refuse_shared(be, (("out", o),), (("input", x), ("filter", w)))
    _check_memory(be, plan, [("the output", plan.output_shape, o is not None, True)],
                  (("input", x), ("filter", w)), "input, filter, " + _RAW_ATTRS)
    _remember(key, be, plan, "depthwise_forward", (x, w), o)
    return be.wrap(be.depthwise_forward(plan, x, w, o), input)


def depthwise_conv2d_native_backprop_input(input_sizes, filter, out_backprop, strides,
                                           padding, explicit_paddings=(), data_format="NHWC",
                                           dilations=(1, 1, 1, 1), *, out=None):
    """Gradient of :func:`depthwise_conv2d_native` with respect to its input.

    As TensorFlow's ``DepthwiseConv2dNativeBackpropInput``, except that
    ``dilations`` are honoured (TensorFlow ignores them and returns the gradient
    of the undilated convolution).

    Parameters
    ----------
    input_sizes : sequence of 4 ints
        Shape of the forward op's input, in ``data_format`` order.
    filter : array, shape ``[FH, FW, C, M]``
    out_backprop : array
        Gradient of the forward op's output; its spatial sizes must equal the
        computed output sizes.
    strides, padding, explicit_paddings, data_format, dilations
        As in :func:`depthwise_conv2d_native`.
    out : array, optional
        Preallocated result of shape ``input_sizes``.

    Returns
    -------
    array of shape ``input_sizes``

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> w = np.ones((3, 3, 2, 1), np.float32)
    >>> dy = np.ones((1, 4, 4, 2), np.float32)
    >>> dx = numbasep.depthwise_conv2d_native_backprop_input(
    ...     [1, 4, 4, 2], w, dy, [1, 1, 1, 1], "SAME")
    >>> dx[0, :, :, 0]
    array([[4., 6., 6., 4.],
           [6., 9., 9., 6.],
           [6., 9., 9., 6.],
           [4., 6., 6., 4.]], dtype=float32)
    """
    key = _fast_key("bin", (input_sizes, strides, padding, explicit_paddings, data_format,
                            dilations), (filter, out_backprop, out))
    hit = _cached(key)
    if hit is not None:
        return _rerun(hit, (("out_backprop", out_backprop), ("filter", filter)), out,
                      out_backprop)
    be, (w, dy) = backends.select(filter=filter, out_backprop=out_backprop)
    plan = shapes.raw_backprop_input(input_sizes, be.shape(w), be.shape(dy), strides, padding,
                                     explicit_paddings, data_format, dilations)
    plan = plan.with_dtype(_dtype(be, (("filter", w), ("out_backprop", dy))))
    o = _out(be, out, plan.input_shape, plan.dtype)
    _refuse_shared(be, (("out", o),), (("filter", w), ("out_backprop", dy)))
    _check_memory(be, plan, [("the input gradient", plan.input_shape, o is not None, True)],
                  (("filter", w), ("out_backprop", dy)),
                  "input_sizes, filter, out_backprop, " + _RAW_ATTRS)
    _remember(key, be, plan, "depthwise_backprop_input", (dy, w), o)
    return be.wrap(be.depthwise_backprop_input(plan, dy, w, o), out_backprop)


def depthwise_conv2d_native_backprop_filter(input, filter_sizes, out_backprop, strides,
                                            padding, explicit_paddings=(), data_format="NHWC",
                                            dilations=(1, 1, 1, 1), *, out=None):
    """Gradient of :func:`depthwise_conv2d_native` with respect to its filter.

    As TensorFlow's ``DepthwiseConv2dNativeBackpropFilter``, except that
    ``dilations`` are honoured and an empty ``out_backprop`` gives zeros (never
    uninitialised memory). The reduction order is fixed: the result does not
    depend on the number of threads.

    Parameters
    ----------
    input : array
        The forward op's input.
    filter_sizes : sequence of 4 ints
        ``[FH, FW, C, M]``.
    out_backprop : array
        Gradient of the forward op's output.
    strides, padding, explicit_paddings, data_format, dilations
        As in :func:`depthwise_conv2d_native`.
    out : array, optional
        Preallocated result of shape ``filter_sizes``.

    Returns
    -------
    array of shape ``filter_sizes``

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.ones((2, 5, 5, 3), np.float32)
    >>> dy = np.ones((2, 3, 3, 3), np.float32)
    >>> dw = numbasep.depthwise_conv2d_native_backprop_filter(
    ...     x, [3, 3, 3, 1], dy, [1, 1, 1, 1], "VALID")
    >>> dw[:, :, 0, 0]
    array([[18., 18., 18.],
           [18., 18., 18.],
           [18., 18., 18.]], dtype=float32)
    """
    key = _fast_key("bfil", (filter_sizes, strides, padding, explicit_paddings, data_format,
                             dilations), (input, out_backprop, out))
    hit = _cached(key)
    if hit is not None:
        return _rerun(hit, (("input", input), ("out_backprop", out_backprop)), out, input)
    be, (x, dy) = backends.select(input=input, out_backprop=out_backprop)
    plan = shapes.raw_backprop_filter(be.shape(x), filter_sizes, be.shape(dy), strides,
                                      padding, explicit_paddings, data_format, dilations)
    plan = plan.with_dtype(_dtype(be, (("input", x), ("out_backprop", dy))))
    o = _out(be, out, plan.filter_shape, plan.dtype)
    _refuse_shared(be, (("out", o),), (("input", x), ("out_backprop", dy)))
    _check_memory(be, plan, [("the filter gradient", plan.filter_shape, o is not None, False)],
                  (("input", x), ("out_backprop", dy)),
                  "filter_sizes, input, out_backprop, " + _RAW_ATTRS, filter_grad=True)
    _remember(key, be, plan, "depthwise_backprop_filter", (x, dy), o)
    return be.wrap(be.depthwise_backprop_filter(plan, x, dy, o), input)


# ----------------------------------------------------------------- Keras-style N-D ops

def depthwise_conv(inputs, kernel, strides=1, padding="valid", data_format=None,
                   dilation_rate=1, *, out=None):
    """N-D depthwise convolution (1-D, 2-D or 3-D), as ``keras.ops.depthwise_conv``.

    Parameters
    ----------
    inputs : array of rank 3, 4 or 5
        ``(N, *spatial, C)`` for channels_last, ``(N, C, *spatial)`` for channels_first.
    kernel : array, shape ``(*K, C, M)``
        Whatever ``data_format`` is.
    strides : int or tuple of ints
        One per spatial dimension, or one int for all.
    padding : {"valid", "same", "causal"}
        Case-insensitive; ``"causal"`` only for 1-D (left padding ``(k-1)*dilation``).
    data_format : {"channels_last", "channels_first"}, optional
        ``None`` means :func:`numbasep.config.image_data_format`.
    dilation_rate : int or tuple of ints
        Any dilation may be combined with any stride.
    out : array, optional
        Preallocated result.

    Returns
    -------
    array, ``(N, *out_spatial, C*M)`` or ``(N, C*M, *out_spatial)``

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.ones((2, 20, 3), np.float32)
    >>> k = np.ones((4, 3, 1), np.float32)
    >>> numbasep.depthwise_conv(x, k, strides=2, dilation_rate=2).shape
    (2, 7, 3)
    >>> numbasep.depthwise_conv(x, k, padding="same")[0, :3, 0]
    array([3., 4., 4.], dtype=float32)
    """
    key = _fast_key("kfwd", (strides, padding, data_format, dilation_rate),
                    (inputs, kernel, out))
    hit = _cached(key)
    if hit is not None:
        return _rerun(hit, (("inputs", inputs), ("kernel", kernel)), out, inputs)
    be, (x, w) = backends.select(inputs=inputs, kernel=kernel)
    plan = shapes.keras(be.shape(x), be.shape(w), strides, padding, data_format, dilation_rate)
    plan = plan.with_dtype(_dtype(be, (("inputs", x), ("kernel", w))))
    o = _out(be, out, plan.output_shape, plan.dtype)
    _refuse_shared(be, (("out", o),), (("inputs", x), ("kernel", w)))
    _check_memory(be, plan, [("the output", plan.output_shape, o is not None, True)],
                  (("inputs", x), ("kernel", w)), "inputs, kernel, " + _KERAS_ATTRS)
    _remember(key, be, plan, "depthwise_forward", (x, w), o)
    return be.wrap(be.depthwise_forward(plan, x, w, o), inputs)


def separable_conv(inputs, depthwise_kernel, pointwise_kernel, strides=1, padding="valid",
                   data_format=None, dilation_rate=1, *, out=None):
    """N-D separable convolution: depthwise, then a pointwise (1x1) convolution.

    As ``keras.ops.separable_conv``, except that a pointwise kernel that is not
    ``(1,)*ndim + (C*M, F)`` is rejected instead of silently becoming a grouped or
    k-by-k convolution. For 16-bit dtypes the depthwise intermediate is kept in
    float32.

    Parameters
    ----------
    inputs : array of rank 3, 4 or 5
    depthwise_kernel : array, shape ``(*K, C, M)``
    pointwise_kernel : array, shape ``(1,)*ndim + (C*M, F)``
    strides, padding, data_format, dilation_rate
        As in :func:`depthwise_conv`.
    out : array, optional
        Preallocated result.

    Returns
    -------
    array, ``(N, *out_spatial, F)`` or ``(N, F, *out_spatial)``

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.ones((2, 10, 10, 3), np.float32)
    >>> dk = np.ones((2, 2, 3, 2), np.float32)
    >>> pk = np.ones((1, 1, 6, 5), np.float32)
    >>> y = numbasep.separable_conv(x, dk, pk, strides=2, dilation_rate=(2, 1))
    >>> y.shape, float(y[0, 0, 0, 0])
    ((2, 4, 5, 5), 24.0)
    """
    be, (x, dk, pk) = backends.select(inputs=inputs, depthwise_kernel=depthwise_kernel,
                                      pointwise_kernel=pointwise_kernel)
    plan = shapes.keras(be.shape(x), be.shape(dk), strides, padding, data_format,
                        dilation_rate, pointwise_shape=be.shape(pk))
    plan = plan.with_dtype(_dtype(be, (("inputs", x), ("depthwise_kernel", dk),
                             ("pointwise_kernel", pk))))
    o = _out(be, out, plan.separable_output_shape, plan.dtype)
    _refuse_shared(be, (("out", o),), (("inputs", x), ("depthwise_kernel", dk),
                                       ("pointwise_kernel", pk)))
    _check_memory(be, plan, [("the output", plan.separable_output_shape, o is not None, False)],
                  (("inputs", x), ("depthwise_kernel", dk), ("pointwise_kernel", pk)),
                  "inputs, depthwise_kernel, pointwise_kernel, " + _KERAS_ATTRS,
                  temps=(plan.output_shape,))
    return be.wrap(be.separable_forward(plan, x, dk, pk, o), inputs)


def depthwise_conv_grad(inputs, kernel, out_grad, strides=1, padding="valid",
                        data_format=None, dilation_rate=1, *, out=None):
    """Vector-Jacobian product of :func:`depthwise_conv`.

    Parameters
    ----------
    inputs, kernel, strides, padding, data_format, dilation_rate
        As in :func:`depthwise_conv`.
    out_grad : array
        Gradient of the loss with respect to ``depthwise_conv``'s output.
    out : tuple of 2 arrays (or None entries), optional
        Preallocated ``(d_inputs, d_kernel)``.

    Returns
    -------
    d_inputs : array, shape and layout of ``inputs``
    d_kernel : array, shape of ``kernel``

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.ones((1, 5, 2), np.float32)
    >>> k = np.ones((3, 2, 1), np.float32)
    >>> dx, dk = numbasep.depthwise_conv_grad(x, k, np.ones((1, 3, 2), np.float32))
    >>> dx[0, :, 0], dk[:, 0, 0]
    (array([1., 2., 3., 2., 1.], dtype=float32), array([3., 3., 3.], dtype=float32))
    """
    be, (x, w, dy) = backends.select(inputs=inputs, kernel=kernel, out_grad=out_grad)
    plan = shapes.keras(be.shape(x), be.shape(w), strides, padding, data_format,
                        dilation_rate, out_grad_shape=be.shape(dy))
    plan = plan.with_dtype(_dtype(be, (("inputs", x), ("kernel", w), ("out_grad", dy))))
    o_dx, o_dw = _outs(out, 2)
    o_dx = _out(be, o_dx, plan.input_shape, plan.dtype, "out[0]")
    o_dw = _out(be, o_dw, plan.filter_shape, plan.dtype, "out[1]")
    _refuse_shared(be, (("out[0]", o_dx), ("out[1]", o_dw)),
                   (("inputs", x), ("kernel", w), ("out_grad", dy)))
    _check_memory(be, plan, [("the inputs gradient", plan.input_shape, o_dx is not None, True),
                             ("the kernel gradient", plan.filter_shape, o_dw is not None,
                              False)],
                  (("inputs", x), ("kernel", w), ("out_grad", dy)),
                  "inputs, kernel, out_grad, " + _KERAS_ATTRS, filter_grad=True)
    dx, dw = be.depthwise_grad(plan, x, w, dy, o_dx, o_dw)
    return be.wrap(dx, inputs), be.wrap(dw, inputs)


def separable_conv_grad(inputs, depthwise_kernel, pointwise_kernel, out_grad, strides=1,
                        padding="valid", data_format=None, dilation_rate=1, *, out=None):
    """Vector-Jacobian product of :func:`separable_conv`.

    Parameters
    ----------
    inputs, depthwise_kernel, pointwise_kernel, strides, padding, data_format, dilation_rate
        As in :func:`separable_conv`.
    out_grad : array
        Gradient of the loss with respect to ``separable_conv``'s output.
    out : tuple of 3 arrays (or None entries), optional
        Preallocated ``(d_inputs, d_depthwise_kernel, d_pointwise_kernel)``.

    Returns
    -------
    d_inputs, d_depthwise_kernel, d_pointwise_kernel : arrays
        Shapes, layouts and dtypes of the corresponding arguments.

    Examples
    --------
    >>> import numpy as np
    >>> import numbasep
    >>> x = np.ones((1, 4, 4, 2), np.float32)
    >>> dk = np.ones((3, 3, 2, 1), np.float32)
    >>> pk = np.ones((1, 1, 2, 4), np.float32)
    >>> g = np.ones((1, 2, 2, 4), np.float32)
    >>> dx, ddk, dpk = numbasep.separable_conv_grad(x, dk, pk, g)
    >>> dx.shape, ddk.shape, float(dpk[0, 0, 0, 0])
    ((1, 4, 4, 2), (3, 3, 2, 1), 36.0)
    """
    be, (x, dk, pk, dy) = backends.select(inputs=inputs, depthwise_kernel=depthwise_kernel,
                                          pointwise_kernel=pointwise_kernel,
                                          out_grad=out_grad)
    plan = shapes.keras(be.shape(x), be.shape(dk), strides, padding, data_format,
                        dilation_rate, pointwise_shape=be.shape(pk),
                        out_grad_shape=be.shape(dy))
    plan = plan.with_dtype(_dtype(be, (("inputs", x), ("depthwise_kernel", dk),
                             ("pointwise_kernel", pk), ("out_grad", dy))))
    o_dx, o_dk, o_pk = _outs(out, 3)
    o_dx = _out(be, o_dx, plan.input_shape, plan.dtype, "out[0]")
    o_dk = _out(be, o_dk, plan.filter_shape, plan.dtype, "out[1]")
    o_pk = _out(be, o_pk, plan.pointwise_shape, plan.dtype, "out[2]")
    _refuse_shared(be, (("out[0]", o_dx), ("out[1]", o_dk), ("out[2]", o_pk)),
                   (("inputs", x), ("depthwise_kernel", dk), ("pointwise_kernel", pk),
                    ("out_grad", dy)))
    _check_memory(be, plan, [("the inputs gradient", plan.input_shape, o_dx is not None, True),
                             ("the depthwise_kernel gradient", plan.filter_shape,
                              o_dk is not None, False),
                             ("the pointwise_kernel gradient", plan.pointwise_shape,
                              o_pk is not None, False)],
                  (("inputs", x), ("depthwise_kernel", dk), ("pointwise_kernel", pk),
                   ("out_grad", dy)),
                  "inputs, depthwise_kernel, pointwise_kernel, out_grad, " + _KERAS_ATTRS,
                  temps=(plan.output_shape,) * 3, filter_grad=True)
    dx, ddk, dpk = be.separable_grad(plan, x, dk, pk, dy, o_dx, o_dk, o_pk)
    return be.wrap(dx, inputs), be.wrap(ddk, inputs), be.wrap(dpk, inputs)
