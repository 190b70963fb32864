"""Argument normalisation, output-size arithmetic and validation: the one source of truth.

Every public operator turns its arguments into a :class:`Plan` here before any
backend sees them. The module is pure Python on shapes and integers: it never
touches array data, compiles nothing, and makes no assumption about the device
the arrays live on, so the CPU and CUDA backends share it unchanged.

A plan is canonical: every problem is described as a 3-D one, with the spatial
dimensions a 1-D or 2-D problem lacks set to size 1 (kernel 1, stride 1,
dilation 1, no padding), so one kernel per operator and layout serves all ranks.
"""

import os

from . import config
from .errors import InvalidArgumentError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# TensorFlow layouts: index of batch, channel and the spatial dims in a 4-D shape.
_RAW_FORMATS = {"NHWC": (0, 3, (1, 2)), "NCHW": (0, 1, (2, 3))}
_RAW_PADDINGS = ("SAME", "VALID", "EXPLICIT")
_KERAS_FORMATS = ("channels_last", "channels_first")
_UNSET = object()      # a memo not computed yet (None is a value a memo may hold)


class Plan:
    """A validated, canonical description of one depthwise convolution.

    Attributes
    ----------
    ndim : int
        Number of spatial dimensions of the caller's problem (1, 2 or 3).
    channels_last : bool
        Layout of the input, output and input gradient (filters never change layout).
    batch, channels, multiplier : int
        N, C and M.
    in_sizes, kernel, out_sizes, strides, dilations, pads : tuple of 3 ints
        Canonical spatial sizes, leading dimensions padded with 1 (0 for ``pads``,
        which holds the padding before each dimension).
    dtype : numpy.dtype or None
        Element type of every array argument, once checked.
    filters : int or None
        F, the pointwise kernel's output channels, for separable convolutions.
    """

    __slots__ = (
        "ndim", "channels_last", "batch", "channels", "multiplier", "in_sizes",
        "kernel", "out_sizes", "strides", "dilations", "pads", "dtype", "filters",
        "_typed", "_derived",
    )

    def __init__(self, ndim, channels_last, batch, channels, multiplier, in_sizes,
                 kernel, out_sizes, strides, dilations, pads, dtype=None, filters=None):
        lead = (1,) * (3 - ndim)
        self.ndim = ndim
        self.channels_last = channels_last
        self.batch = batch
        self.channels = channels
        self.multiplier = multiplier
        self.in_sizes = lead + tuple(in_sizes)
        self.kernel = lead + tuple(kernel)
        self.out_sizes = lead + tuple(out_sizes)
        self.strides = lead + tuple(strides)
        self.dilations = lead + tuple(dilations)
        self.pads = (0,) * (3 - ndim) + tuple(pads)
        self.dtype = dtype
        self.filters = filters
        self._typed = None
        self._derived = None

    def _memo(self, name, make, *args):
        """A derived value, ``make(*args)``, computed once per plan (plans never change)."""
        d = self._derived
        if d is None:
            d = self._derived = {}
        v = d.get(name, _UNSET)
        if v is _UNSET:
            v = d[name] = make(*args)
        return v

    def _layout(self, spatial, channels, ndim):
        spatial = tuple(spatial[3 - ndim:])
        if self.channels_last:
            return (self.batch,) + spatial + (channels,)
        return (self.batch, channels) + spatial

    @property
    def out_channels(self):
        return self.channels * self.multiplier

    @property
    def input_shape(self):
        """Shape of the input (and of its gradient) in the caller's layout."""
        return self._memo("input_shape",
                          lambda: self._layout(self.in_sizes, self.channels, self.ndim))

    @property
    def output_shape(self):
        """Shape of the depthwise output (and of its gradient) in the caller's layout."""
        return self._memo("output_shape",
                          lambda: self._layout(self.out_sizes, self.out_channels, self.ndim))

    @property
    def filter_shape(self):
        return tuple(self.kernel[3 - self.ndim:]) + (self.channels, self.multiplier)

    @property
    def pointwise_shape(self):
        return (1,) * self.ndim + (self.out_channels, self.filters)

    @property
    def separable_output_shape(self):
        return self._layout(self.out_sizes, self.filters, self.ndim)

    # Canonical 5-D shapes the kernels work on.
    @property
    def input_shape5(self):
        return self._memo("input_shape5", lambda: self._layout(self.in_sizes, self.channels, 3))

    @property
    def output_shape5(self):
        return self._memo("output_shape5",
                          lambda: self._layout(self.out_sizes, self.out_channels, 3))

    @property
    def filter_shape5(self):
        return self._memo("filter_shape5", lambda: self.kernel + (self.channels, self.multiplier))

    def with_dtype(self, dtype):
        """This plan for arrays of ``dtype``: a shared, memoised copy.

        Plans come from a cache and are shared between calls and threads: nothing
        may change a plan after it is made; derive a copy (:meth:`clone`) instead.
        """
        typed = self._typed
        if typed is None:
            typed = self._typed = {}
        p = typed.get(dtype)
        if p is None:
            p = self.clone()
            p.dtype = dtype
            typed[dtype] = p
        return p

    def clone(self):
        """A copy the caller may change (plans are mutable: ``dtype`` is set later)."""
        c = _new_plan(Plan)
        for name in Plan.__slots__:
            setattr(c, name, getattr(self, name))
        c._typed = None
        c._derived = None
        return c

    def key(self):
        return (self.ndim, self.channels_last, self.batch, self.channels, self.multiplier,
                self.in_sizes, self.kernel, self.out_sizes, self.strides, self.dilations,
                self.pads, self.dtype, self.filters)

    def __eq__(self, other):
        return isinstance(other, Plan) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return (f"Plan(ndim={self.ndim}, channels_last={self.channels_last}, "
                f"input={self.input_shape}, filter={self.filter_shape}, "
                f"output={self.output_shape}, strides={self.strides[3 - self.ndim:]}, "
                f"dilations={self.dilations[3 - self.ndim:]}, "
                f"pads_before={self.pads[3 - self.ndim:]}, dtype={self.dtype})")


_new_plan = object.__new__


# --------------------------------------------------------------------------- plan cache
# Networks call the same few shapes over and over; validating them again costs more
# than a small call's kernel. Plans are memoised by argument *values*, but only when
# every argument is a plain str, int, None or flat list/tuple of ints: those are
# values whose meaning cannot depend on anything but the value (a bool, a float, a
# NumPy integer or an object with a custom __index__ always takes the validating path).

_PLAN_CACHE = {}
_PLAN_CACHE_MAX = 1024
_UNCACHEABLE = object()


def _plain(v):
    t = type(v)
    if t is int or t is str or v is None:
        return v
    if t is tuple or t is list:
        for e in v:
            if type(e) is not int:
                return _UNCACHEABLE
        return tuple(v)
    return _UNCACHEABLE


def _memoised(fn):
    def planned(*args, **kwargs):
        key = [fn.__name__]
        for a in args:
            k = _plain(a)
            if k is _UNCACHEABLE:
                return fn(*args, **kwargs)
            key.append(k)
        for name in sorted(kwargs):
            k = _plain(kwargs[name])
            if k is _UNCACHEABLE:
                return fn(*args, **kwargs)
            key += (name, k)
        key.append(config._image_data_format)   # data_format=None means the default
        key = tuple(key)
        hit = _PLAN_CACHE.get(key)
        if hit is None:
            hit = fn(*args, **kwargs)
            if len(_PLAN_CACHE) >= _PLAN_CACHE_MAX:
                _PLAN_CACHE.clear()
            _PLAN_CACHE[key] = hit
        return hit

    planned.__name__ = fn.__name__
    planned.__qualname__ = fn.__qualname__
    planned.__doc__ = fn.__doc__
    planned.__wrapped__ = fn
    return planned


# --------------------------------------------------------------------------- helpers

def _is_int(v):
    # bool is an int subclass but never a meaningful size or stride.
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return type(v).__module__ == "numpy" and hasattr(v, "dtype") and v.dtype.kind in "iu" \
        and getattr(v, "ndim", 1) == 0


def _int_list(value, name):
    """Turn a sequence (or 1-D integer array) of integers into a tuple of Python ints."""
    if isinstance(value, (str, bytes)) or value is None:
        raise InvalidArgumentError(f"{name} must be a sequence of integers, got {value!r}")
    ndim = getattr(value, "ndim", None)
    if ndim is not None and ndim != 1:
        raise InvalidArgumentError(
            f"{name} must be 1-D, got an array of shape {tuple(value.shape)}")
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if kind is not None and kind not in "iu":
        raise InvalidArgumentError(
            f"{name} must hold integers, got an array of dtype {value.dtype}")
    try:
        items = list(value)
    except TypeError:
        raise InvalidArgumentError(
            f"{name} must be a sequence of integers, got {value!r}") from None
    for v in items:
        if not _is_int(v):
            raise InvalidArgumentError(f"{name} must hold integers, got {_show(items)}")
    return tuple(int(v) for v in items)


def _show(values):
    return list(values) if not isinstance(values, list) else values


def _check_product(sizes, name):
    total = 1
    for s in sizes:
        total *= s
        if total > INT64_MAX:
            raise InvalidArgumentError(
                f"{name} {list(sizes)} has more elements than fit in int64")
    return total


def trunc_div(a, b):
    """Integer division rounding toward zero, as C and TensorFlow do."""
    q = abs(a) // b
    return q if a >= 0 else -q


def _eff(k, r):
    return (k - 1) * r + 1


def _raw_output(n, k, s, r, mode, pb, pa):
    """TensorFlow's windowed output size and padding before, for one dimension."""
    eff = _eff(k, r)
    if mode == "SAME":
        out = -(-n // s)
        need = max(0, (out - 1) * s + eff - n)
        return out, need // 2
    if mode == "VALID":
        pb = pa = 0
    out = trunc_div(n + pb + pa - eff + s, s)
    if out < 0:
        raise InvalidArgumentError(
            f"Computed output size would be negative: {out} [input_size: {n}, "
            f"effective_filter_size: {eff}, stride: {s}]")
    return out, pb


# --------------------------------------------------------------------------- raw ops

class _RawAttrs:
    __slots__ = ("fmt", "batch_axis", "chan_axis", "spatial_axes", "strides",
                 "dilations", "padding", "explicit")


def _raw_attrs(strides, padding, explicit_paddings, data_format, dilations):
    """Validate the attributes shared by the three TensorFlow ops (SPEC §4 rules 1-3, 7)."""
    a = _RawAttrs()
    if not isinstance(data_format, str) or data_format not in _RAW_FORMATS:
        raise InvalidArgumentError(
            f"data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
    a.fmt = data_format
    a.batch_axis, a.chan_axis, a.spatial_axes = _RAW_FORMATS[data_format]
    where = f"(data_format {data_format}: batch is entry {a.batch_axis}, " \
            f"channels entry {a.chan_axis})"

    s = _int_list(strides, "strides")
    if len(s) != 4:
        raise InvalidArgumentError(
            f"strides must have 4 entries, one per dimension of {data_format}, got {list(s)}")
    if s[a.batch_axis] != 1 or s[a.chan_axis] != 1:
        raise InvalidArgumentError(
            f"strides in the batch and channel dimensions must be 1, got {list(s)} {where}")
    for v in s:
        if v < 1:
            raise InvalidArgumentError(f"strides must be > 0, got {list(s)}")
        if v > INT32_MAX:
            raise InvalidArgumentError(
                f"strides must be < 2**31 so that indices cannot overflow, got {list(s)}")
    a.strides = (s[a.spatial_axes[0]], s[a.spatial_axes[1]])

    d = _int_list(dilations, "dilations")
    if len(d) != 4:
        raise InvalidArgumentError(
            f"dilations must have 4 entries, one per dimension of {data_format}, got {list(d)}")
    for v in d:
        if v < 1:
            raise InvalidArgumentError(f"dilations must be >= 1, got {list(d)}")
        if v > INT32_MAX:
            raise InvalidArgumentError(
                f"dilations must be < 2**31 so that indices cannot overflow, got {list(d)}")
    if d[a.batch_axis] != 1 or d[a.chan_axis] != 1:
        raise InvalidArgumentError(
            f"dilations in the batch and channel dimensions must be 1, got {list(d)} {where}")
    a.dilations = (d[a.spatial_axes[0]], d[a.spatial_axes[1]])

    if not isinstance(padding, str) or padding not in _RAW_PADDINGS:
        raise InvalidArgumentError(
            f"padding must be one of 'SAME', 'VALID', 'EXPLICIT', got {padding!r}")
    a.padding = padding
    e = _int_list(explicit_paddings, "explicit_paddings")
    if padding != "EXPLICIT":
        if len(e) != 0:
            raise InvalidArgumentError(
                f"explicit_paddings must be empty unless padding is 'EXPLICIT' "
                f"(padding is {padding!r}), got {list(e)}")
        a.explicit = ((0, 0), (0, 0))
    else:
        if len(e) != 8:
            raise InvalidArgumentError(
                f"explicit_paddings must have 8 entries (before and after for each "
                f"dimension of {data_format}) when padding is 'EXPLICIT', got {list(e)}")
        for v in e:
            if v < 0:
                raise InvalidArgumentError(
                    f"explicit_paddings must be non-negative, got {list(e)}")
            if v > INT32_MAX:
                raise InvalidArgumentError(
                    f"explicit_paddings must be < 2**31, got {list(e)}")
        pairs = [(e[2 * i], e[2 * i + 1]) for i in range(4)]
        if pairs[a.batch_axis] != (0, 0) or pairs[a.chan_axis] != (0, 0):
            raise InvalidArgumentError(
                f"explicit_paddings of the batch and channel dimensions must be 0, "
                f"got {list(e)} {where}")
        a.explicit = (pairs[a.spatial_axes[0]], pairs[a.spatial_axes[1]])
    return a


def _sizes_arg(value, name):
    """Validate `filter_sizes` / `input_sizes` (SPEC §4 rule 4)."""
    sizes = _int_list(value, name)
    if len(sizes) != 4:
        raise InvalidArgumentError(f"{name} must have 4 entries, got {list(sizes)}")
    for v in sizes:
        if v < 0:
            raise InvalidArgumentError(f"{name} must be non-negative, got {list(sizes)}")
        if v > INT64_MAX:   # even when another entry is 0 and the product is 0
            raise InvalidArgumentError(f"{name} entries must be < 2**63, got {list(sizes)}")
    _check_product(sizes, name)
    return sizes


def _rank4(shape, name):
    if len(shape) != 4:
        raise InvalidArgumentError(
            f"{name} must be 4-D, got shape {list(shape)} (rank {len(shape)})")


def _filter_spatial(fshape, name):
    if fshape[0] < 1 or fshape[1] < 1:
        raise InvalidArgumentError(
            f"{name} must have spatial sizes >= 1, got {list(fshape)}")


def _raw_plan(a, input_shape, filter_shape, input_name, filter_name):
    _rank4(input_shape, input_name)
    _rank4(filter_shape, filter_name)
    _filter_spatial(filter_shape, filter_name)
    n = input_shape[a.batch_axis]
    c = input_shape[a.chan_axis]
    if filter_shape[2] != c:
        raise InvalidArgumentError(
            f"{input_name} and {filter_name} must have the same depth: {input_name} has "
            f"{c} channels ({a.fmt} shape {list(input_shape)}), {filter_name} "
            f"[FH, FW, C, M] = {list(filter_shape)}")
    m = filter_shape[3]
    ins, outs, pads = [], [], []
    for i, ax in enumerate(a.spatial_axes):
        size = input_shape[ax]
        o, p = _raw_output(size, filter_shape[i], a.strides[i], a.dilations[i], a.padding,
                           *a.explicit[i])
        ins.append(size)
        outs.append(o)
        pads.append(p)
    _check_product((n, outs[0], outs[1], c, m),
                   f"the output shape (from {input_name}, {filter_name}, strides, padding, "
                   f"explicit_paddings and dilations)")
    return Plan(2, a.fmt == "NHWC", n, c, m, ins, filter_shape[:2], outs, a.strides,
                a.dilations, pads)


def _check_out_backprop(plan, a, dy_shape, name="out_backprop"):
    _rank4(dy_shape, name)
    if dy_shape[a.batch_axis] != plan.batch:
        raise InvalidArgumentError(
            f"{name} has batch size {dy_shape[a.batch_axis]} but the input has "
            f"{plan.batch} ({a.fmt} shape {list(dy_shape)})")
    if dy_shape[a.chan_axis] != plan.out_channels:
        raise InvalidArgumentError(
            f"{name} must have C*M = {plan.channels}*{plan.multiplier} = "
            f"{plan.out_channels} channels, got {dy_shape[a.chan_axis]} "
            f"({a.fmt} shape {list(dy_shape)})")
    for label, ax, c in (("rows", a.spatial_axes[0], plan.out_sizes[1]),
                         ("cols", a.spatial_axes[1], plan.out_sizes[2])):
        if dy_shape[ax] != c:
            raise InvalidArgumentError(
                f"Number of {label} of {name} doesn't match computed: actual = "
                f"{dy_shape[ax]}, computed = {c}")


@_memoised
def raw_forward(input_shape, filter_shape, strides, padding, explicit_paddings=(),
                data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Plan for ``DepthwiseConv2dNative``."""
    a = _raw_attrs(strides, padding, explicit_paddings, data_format, dilations)
    return _raw_plan(a, tuple(input_shape), tuple(filter_shape), "input", "filter")


@_memoised
def raw_backprop_input(input_sizes, filter_shape, out_backprop_shape, strides, padding,
                       explicit_paddings=(), data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Plan for ``DepthwiseConv2dNativeBackpropInput``; ``input_sizes`` is validated here."""
    a = _raw_attrs(strides, padding, explicit_paddings, data_format, dilations)
    sizes = _sizes_arg(input_sizes, "input_sizes")
    plan = _raw_plan(a, sizes, tuple(filter_shape), "input_sizes", "filter")
    _check_out_backprop(plan, a, tuple(out_backprop_shape))
    return plan


@_memoised
def raw_backprop_filter(input_shape, filter_sizes, out_backprop_shape, strides, padding,
                        explicit_paddings=(), data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Plan for ``DepthwiseConv2dNativeBackpropFilter``; ``filter_sizes`` is validated here."""
    a = _raw_attrs(strides, padding, explicit_paddings, data_format, dilations)
    sizes = _sizes_arg(filter_sizes, "filter_sizes")
    plan = _raw_plan(a, tuple(input_shape), sizes, "input", "filter_sizes")
    _check_out_backprop(plan, a, tuple(out_backprop_shape))
    return plan


# --------------------------------------------------------------------------- Keras ops

def _per_dim(value, ndim, name):
    if _is_int(value):
        vals = (int(value),) * ndim
    else:
        vals = _int_list(value, name)
        if len(vals) != ndim:
            raise InvalidArgumentError(
                f"{name} must be an int or a tuple of {ndim} ints for a {ndim}-D "
                f"convolution, got {value!r}")
    for v in vals:
        if v < 1:
            raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
        if v > INT32_MAX:
            raise InvalidArgumentError(
                f"{name} must be < 2**31 so that indices cannot overflow, got {value!r}")
    return vals


def resolve_data_format(data_format):
    from . import config
    if data_format is None:
        return config.image_data_format()
    if not isinstance(data_format, str) or data_format.lower() not in _KERAS_FORMATS:
        raise InvalidArgumentError(
            f"data_format must be 'channels_last', 'channels_first' or None, "
            f"got {data_format!r}")
    return data_format.lower()


@_memoised
def keras(inputs_shape, kernel_shape, strides=1, padding="valid", data_format=None,
          dilation_rate=1, *, pointwise_shape=None, out_grad_shape=None):
    """Plan for the Keras-style ``depthwise_conv`` / ``separable_conv`` and their gradients.

    Parameters
    ----------
    inputs_shape, kernel_shape : tuple of int
        Shapes of ``inputs`` (``data_format`` layout) and of the depthwise kernel ``(*K, C, M)``.
    pointwise_shape : tuple of int, optional
        Shape of the pointwise kernel, which must be ``(1,)*ndim + (C*M, F)``.
    out_grad_shape : tuple of int, optional
        Shape of the output gradient, checked against the computed output.
    """
    inputs_shape = tuple(inputs_shape)
    kernel_shape = tuple(kernel_shape)
    rank = len(inputs_shape)
    if rank not in (3, 4, 5):
        raise InvalidArgumentError(
            f"inputs must have rank 3, 4 or 5 (batch, 1 to 3 spatial dims, channels), "
            f"got shape {inputs_shape} (rank {rank})")
    ndim = rank - 2
    if len(kernel_shape) != rank:
        raise InvalidArgumentError(
            f"the depthwise kernel must have rank {rank} like inputs ({ndim} spatial dims, "
            f"C, M), got shape {kernel_shape} for inputs of shape {inputs_shape}")
    fmt = resolve_data_format(data_format)
    channels_last = fmt == "channels_last"
    st = _per_dim(strides, ndim, "strides")
    dl = _per_dim(dilation_rate, ndim, "dilation_rate")
    if not isinstance(padding, str) or padding.lower() not in ("valid", "same", "causal"):
        raise InvalidArgumentError(
            f"padding must be 'valid', 'same' or (1-D only) 'causal', got {padding!r}")
    mode = padding.lower()
    if mode == "causal" and ndim != 1:
        raise InvalidArgumentError(
            f"padding='causal' is only defined for 1-D convolutions, got a {ndim}-D one "
            f"(inputs shape {inputs_shape})")

    n = inputs_shape[0]
    c = inputs_shape[-1] if channels_last else inputs_shape[1]
    spatial = inputs_shape[1:-1] if channels_last else inputs_shape[2:]
    ks = kernel_shape[:ndim]
    if kernel_shape[ndim] != c:
        raise InvalidArgumentError(
            f"The number of input channels must match the kernel's input channels: "
            f"inputs of shape {inputs_shape} ({fmt}) have {c} channels, the kernel of "
            f"shape {kernel_shape} expects {kernel_shape[ndim]}")
    if min(ks) < 1:
        raise InvalidArgumentError(
            f"the depthwise kernel must have spatial sizes >= 1, got shape {kernel_shape}")
    m = kernel_shape[ndim + 1]

    outs, pads = [], []
    for i in range(ndim):
        size, k, s, r = spatial[i], ks[i], st[i], dl[i]
        eff = _eff(k, r)
        if mode == "same":
            o = -(-size // s)
            need = max(0, (o - 1) * s + eff - size)
            p = need // 2
        elif mode == "causal":
            p = (k - 1) * r
            o = (size + p - eff) // s + 1 if size > 0 else 0
        else:
            o = (size - eff) // s + 1
            p = 0
            if o <= 0:
                raise InvalidArgumentError(
                    f"Computed output size would be zero or negative: {o} in spatial "
                    f"dimension {i} [inputs shape: {inputs_shape}, kernel shape: "
                    f"{kernel_shape}, strides: {st}, dilation_rate: {dl}, padding: 'valid']")
        outs.append(o)
        pads.append(p)
    filters = None
    if pointwise_shape is not None:
        pointwise_shape = tuple(pointwise_shape)
        want = (1,) * ndim + (c * m,)
        if len(pointwise_shape) != rank or pointwise_shape[:-1] != want:
            raise InvalidArgumentError(
                f"the pointwise kernel must have shape {want + ('F',)} for a depthwise "
                f"kernel of shape {kernel_shape} (1x1, C*M = {c}*{m} = {c * m} input "
                f"channels), got {pointwise_shape}")
        filters = pointwise_shape[-1]
    plan = Plan(ndim, channels_last, n, c, m, spatial, ks, outs, st, dl, pads,
                filters=filters)
    culprits = "(from inputs, kernel, strides, padding and dilation_rate)"
    _check_product(plan.output_shape, f"the output shape {culprits}")
    if filters is not None:
        _check_product(plan.separable_output_shape, f"the output shape {culprits}")
    if out_grad_shape is not None:
        want = plan.output_shape if filters is None else plan.separable_output_shape
        if tuple(out_grad_shape) != want:
            raise InvalidArgumentError(
                f"out_grad must have the shape of the operator's output, {want}, "
                f"got {tuple(out_grad_shape)}")
    return plan


# --------------------------------------------------------------------------- memory

MAX_BYTES_ENV = "NUMBASEP_MAX_BYTES"

try:   # os.environ's own table: a plain dict lookup, ten times cheaper than .get()
    _ENV_TABLE = os.environ._data
    _ENV_KEY = os.environ.encodekey(MAX_BYTES_ENV)
except AttributeError:   # another Python implementation
    _ENV_TABLE = None


def max_bytes_setting():
    """The raw value of ``NUMBASEP_MAX_BYTES`` (None when unset), for cache keys."""
    if _ENV_TABLE is not None:
        return _ENV_TABLE.get(_ENV_KEY)
    return os.environ.get(MAX_BYTES_ENV)


def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX, or not reported
        return None


_PHYSICAL_MEMORY = _physical_memory()


def memory_limit():
    """The most bytes one operator call may allocate, or None for no limit.

    ``NUMBASEP_MAX_BYTES`` (an integer number of bytes, read on every call) when
    set, else the machine's physical memory (``os.sysconf``): a request that
    could not fit even in all of it is refused up front instead of failing
    inside an allocation, or being killed by the operating system, midway.
    """
    value = os.environ.get(MAX_BYTES_ENV)
    if value:
        try:
            limit = int(value)
        except ValueError:
            limit = 0
        if limit <= 0:
            raise InvalidArgumentError(
                f"{MAX_BYTES_ENV} must be a positive integer number of bytes, got {value!r}")
        return limit
    return _PHYSICAL_MEMORY


def _bytes(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def check_memory(nbytes, what, culprits):
    """Refuse a call whose results and workspace would need more than :func:`memory_limit`.

    Parameters
    ----------
    nbytes : int
        Bytes the call would allocate (results, intermediates, copies).
    what : str
        The largest allocation, e.g. ``"an output of shape (1, 9, 9, 2) float32"``.
    culprits : str
        The arguments that determine the sizes, named in the message.
    """
    limit = memory_limit()
    if limit is not None and nbytes > limit:
        source = (f"set by {MAX_BYTES_ENV}" if os.environ.get(MAX_BYTES_ENV)
                  else f"the machine's physical memory; set {MAX_BYTES_ENV} to change it")
        raise InvalidArgumentError(
            f"this call would need {_bytes(nbytes)} ({nbytes} bytes) of memory for {what}, "
            f"more than the limit of {_bytes(limit)} ({source}); check {culprits}")
