"""The benchmark suite of PERFORMANCE.md: one definition shared by the CLI, asv and the peers.

A :class:`Case` names one timed call: an operator, the shape it runs on (batch,
spatial sizes, channels, kernel, stride, depth multiplier, pointwise filters),
a dtype and a layout. :func:`cases` lists the suite (or its ``quick`` subset),
:func:`bytes_moved` and :func:`flops` give the lower bound on memory traffic and
the arithmetic of a case, and :func:`make_inputs` builds the arrays and a
callable that runs the numbasep operator on them.

Every case uses ``SAME`` padding and dilation 1, as the networks the shapes come
from do. Everything here is pure Python on integers until :func:`make_inputs`
allocates arrays; nothing is compiled at import.

Examples
--------
>>> from numbasep import suite
>>> c = suite.find("forward/56x56x144/k3s1/N8")
>>> c.input_shape, c.output_shape
((8, 56, 56, 144), (8, 56, 56, 144))
>>> suite.bytes_moved(c) == 4 * (2 * 8 * 56 * 56 * 144 + 9 * 144)
True
>>> len(suite.cases(quick=True, op="forward", dtype="float32", layout="NHWC")) > 0
True
"""

from dataclasses import dataclass
import math

OPS = ("forward", "backprop_input", "backprop_filter", "separable_forward", "separable_grad")
LAYOUTS_2D = ("NHWC", "NCHW")
LAYOUTS_ND = ("channels_last", "channels_first")
DTYPES = ("float32", "float64", "float16", "bfloat16")

_OP_SHORT = {"forward": "forward", "backprop_input": "bwd_input",
             "backprop_filter": "bwd_filter", "separable_forward": "sep_forward",
             "separable_grad": "sep_grad"}
_DTYPE_SHORT = {"float32": "", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
_CHANNELS_LAST = {"NHWC": True, "NCHW": False, "channels_last": True,
                  "channels_first": False}


@dataclass(frozen=True)
class Case:
    """One benchmark row: an operator on one shape, dtype and layout.

    Parameters
    ----------
    name : str
        Unique label, ``"<op>/<H>x<W>x<C>/k<k>s<s>[/m<M>][/F<F>]/N<N>[/<dtype>][/<layout>]"``
        (float32 and channels-last are left out of the label).
    op : {"forward", "backprop_input", "backprop_filter", "separable_forward", "separable_grad"}
    N : int
        Batch size.
    spatial : tuple of int
        Input spatial sizes (1, 2 or 3 of them).
    C : int
        Input channels.
    kernel : tuple of int
        Depthwise kernel spatial sizes, one per spatial dimension.
    stride : int
        The same stride in every spatial dimension; padding is always SAME.
    multiplier : int
        Depth multiplier M.
    filters : int or None
        F, the pointwise kernel's output channels (separable ops only).
    dtype : str
        ``"float32"``, ``"float64"``, ``"float16"`` or ``"bfloat16"``.
    layout : str
        ``"NHWC"`` / ``"NCHW"`` for 2-D cases, ``"channels_last"`` /
        ``"channels_first"`` for 1-D and 3-D ones.
    net : str
        The network the shape comes from (for the reader; not part of the identity).
    """

    name: str
    op: str
    N: int
    spatial: tuple
    C: int
    kernel: tuple
    stride: int
    multiplier: int = 1
    filters: int = None
    dtype: str = "float32"
    layout: str = "NHWC"
    net: str = ""

    # ---------------------------------------------------------------- derived sizes
    @property
    def ndim(self):
        """Number of spatial dimensions."""
        return len(self.spatial)

    @property
    def channels_last(self):
        return _CHANNELS_LAST[self.layout]

    @property
    def data_format(self):
        """The Keras-style ``data_format`` of the case."""
        return "channels_last" if self.channels_last else "channels_first"

    @property
    def out_spatial(self):
        """Output spatial sizes under SAME padding: ``ceil(n / s)``."""
        return tuple(-(-n // self.stride) for n in self.spatial)

    @property
    def pads(self):
        """SAME padding ``(before, after)`` per spatial dimension (the odd pixel after)."""
        res = []
        for n, k, o in zip(self.spatial, self.kernel, self.out_spatial):
            need = max(0, (o - 1) * self.stride + k - n)
            res.append((need // 2, need - need // 2))
        return tuple(res)

    @property
    def CM(self):
        return self.C * self.multiplier

    def _shape(self, spatial, channels):
        if self.channels_last:
            return (self.N,) + tuple(spatial) + (channels,)
        return (self.N, channels) + tuple(spatial)

    @property
    def input_shape(self):
        return self._shape(self.spatial, self.C)

    @property
    def output_shape(self):
        """Shape of the depthwise output (the op's output for non-separable ops)."""
        return self._shape(self.out_spatial, self.CM)

    @property
    def filter_shape(self):
        """Depthwise kernel ``(*K, C, M)``."""
        return tuple(self.kernel) + (self.C, self.multiplier)

    @property
    def pointwise_shape(self):
        return (1,) * self.ndim + (self.CM, self.filters)

    @property
    def separable_output_shape(self):
        return self._shape(self.out_spatial, self.filters)

    @property
    def itemsize(self):
        return 8 if self.dtype == "float64" else 2 if self.dtype in ("float16", "bfloat16") else 4

    def to_dict(self):
        """Plain-JSON description of the case, with every shape a peer needs to build it."""
        d = {
            "name": self.name, "op": self.op, "N": self.N, "spatial": list(self.spatial),
            "C": self.C, "kernel": list(self.kernel), "stride": self.stride,
            "multiplier": self.multiplier, "filters": self.filters, "dtype": self.dtype,
            "layout": self.layout, "net": self.net, "channels_last": self.channels_last,
            "input_shape": list(self.input_shape), "output_shape": list(self.output_shape),
            "filter_shape": list(self.filter_shape), "out_spatial": list(self.out_spatial),
            "pads": [list(p) for p in self.pads],
        }
        if self.filters is not None:
            d["pointwise_shape"] = list(self.pointwise_shape)
            d["separable_output_shape"] = list(self.separable_output_shape)
        return d


def _prod(xs):
    return math.prod(xs)


def _label(op, spatial, C, kernel, stride, M, F, N, dtype, layout):
    parts = [_OP_SHORT[op], "x".join(str(s) for s in spatial) + f"x{C}"]
    ks = "x".join(str(k) for k in kernel) if len(set(kernel)) > 1 else str(kernel[0])
    parts.append(f"k{ks}s{stride}")
    if M != 1:
        parts.append(f"m{M}")
    if F is not None:
        parts.append(f"F{F}")
    parts.append(f"N{N}")
    if _DTYPE_SHORT[dtype]:
        parts.append(_DTYPE_SHORT[dtype])
    if not _CHANNELS_LAST[layout]:
        parts.append(layout if len(spatial) == 2 else "cfirst")
    return "/".join(parts)


def make_case(op, N, spatial, C, kernel, stride=1, multiplier=1, filters=None,
              dtype="float32", layout=None, net=""):
    """Build a :class:`Case`, naming it and checking its fields.

    Parameters
    ----------
    op, N, C, stride, multiplier, filters, dtype, net
        As in :class:`Case`.
    spatial : int or tuple of int
        An int means a square 2-D map.
    kernel : int or tuple of int
        An int means the same size in every spatial dimension.
    layout : str, optional
        Defaults to the channels-last layout of the rank (``"NHWC"`` for 2-D,
        ``"channels_last"`` otherwise).

    Returns
    -------
    Case
    """
    if isinstance(spatial, int):
        spatial = (spatial, spatial)
    spatial = tuple(spatial)
    if isinstance(kernel, int):
        kernel = (kernel,) * len(spatial)
    kernel = tuple(kernel)
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if len(kernel) != len(spatial) or len(spatial) not in (1, 2, 3):
        raise ValueError(f"spatial {spatial} and kernel {kernel} must have 1 to 3 equal-length dims")
    if layout is None:
        layout = "NHWC" if len(spatial) == 2 else "channels_last"
    allowed = LAYOUTS_2D if len(spatial) == 2 else LAYOUTS_ND
    if layout not in allowed:
        raise ValueError(f"layout of a {len(spatial)}-D case must be one of {allowed}, got {layout!r}")
    if (filters is None) != (not op.startswith("separable")):
        raise ValueError("filters must be given exactly for the separable ops")
    name = _label(op, spatial, C, kernel, stride, multiplier, filters, N, dtype, layout)
    return Case(name, op, N, spatial, C, kernel, stride, multiplier, filters, dtype, layout, net)


# ------------------------------------------------------------------ the suite itself

#: 2-D depthwise shapes of PERFORMANCE.md: (net, H=W, C, k, s); all M = 1, SAME.
SHAPES_2D = (
    ("MobileNetV1/V2", 112, 32, 3, 1),
    ("MobileNetV2", 112, 96, 3, 2),
    ("MobileNetV2", 56, 144, 3, 1),
    ("MobileNetV2", 56, 144, 3, 2),
    ("MobileNetV2", 28, 192, 3, 1),
    ("MobileNetV2", 14, 384, 3, 1),
    ("MobileNetV2", 14, 576, 3, 1),
    ("MobileNetV2", 7, 960, 3, 1),
    ("MobileNetV3-L", 56, 72, 5, 2),
    ("MobileNetV3-L", 28, 120, 5, 1),
    ("EfficientNet-B0", 28, 240, 5, 1),
    ("EfficientNet-B0", 14, 672, 5, 1),
    ("EfficientNet-B0", 7, 1152, 5, 1),
    ("Xception", 147, 128, 3, 1),
    ("Xception middle", 19, 728, 3, 1),
    ("ConvNeXt-T", 56, 96, 7, 1),
    ("ConvNeXt-T", 14, 384, 7, 1),
)
BATCHES = (1, 8, 32)
DEPTHWISE_OPS = ("forward", "backprop_input", "backprop_filter")
#: Depth-multiplier rows: (net, H, C, k, s, M) at N = 8.
MULTIPLIER_SHAPES = (
    ("MobileNetV2", 56, 144, 3, 1, 2),
    ("MobileNetV2", 56, 144, 3, 1, 4),
    ("Xception middle", 19, 728, 3, 1, 2),
    ("Xception middle", 19, 728, 3, 1, 4),
)
#: 16-bit rows: (net, H, C, k, s, N).
HALF_SHAPES = (
    ("MobileNetV2", 56, 144, 3, 1, 8),
    ("MobileNetV2", 7, 960, 3, 1, 32),
    ("EfficientNet-B0", 28, 240, 5, 1, 32),
)
#: Separable rows (depthwise 3x3 s1, then pointwise to F): (net, H, C, F).
SEPARABLE_SHAPES = (
    ("MobileNetV2", 56, 144, 24),
    ("MobileNetV1", 7, 1024, 1024),
    ("Xception middle", 19, 728, 728),
    ("Xception entry", 147, 64, 128),
)

#: The quick subset (``--quick``): a dozen-odd rows covering every op, both layouts,
#: the 16-bit path, a multiplier, a 5x5 and a strided shape, small-call overhead,
#: 1-D and separable; each call is at most a few milliseconds.
_QUICK = (
    "forward/56x56x144/k3s1/N8",
    "bwd_input/56x56x144/k3s1/N8",
    "bwd_filter/56x56x144/k3s1/N8",
    "forward/112x112x96/k3s2/N8",
    "bwd_filter/112x112x96/k3s2/N8",
    "forward/28x28x240/k5s1/N8",
    "bwd_filter/28x28x240/k5s1/N8",
    "forward/7x7x960/k3s1/N1",
    "bwd_filter/7x7x960/k3s1/N32",
    "forward/56x56x144/k3s1/N8/NCHW",
    "bwd_filter/56x56x144/k3s1/N8/NCHW",
    "forward/56x56x144/k3s1/N8/bf16",
    "forward/56x56x144/k3s1/N8/f16",
    "forward/19x19x728/k3s1/m2/N8",
    "forward/1024x512/k5s1/N8",
    "sep_forward/56x56x144/k3s1/F24/N8",
    "sep_grad/19x19x728/k3s1/F728/N8",
)


def _all_cases():
    out = []
    for layout in LAYOUTS_2D:
        for net, hw, c, k, s in SHAPES_2D:
            for n in BATCHES:
                for op in DEPTHWISE_OPS:
                    out.append(make_case(op, n, hw, c, k, s, layout=layout, net=net))
    for net, hw, c, k, s, m in MULTIPLIER_SHAPES:
        for op in DEPTHWISE_OPS:
            out.append(make_case(op, 8, hw, c, k, s, multiplier=m, net=net))
    for dt in ("float16", "bfloat16"):
        for net, hw, c, k, s, n in HALF_SHAPES:
            for op in DEPTHWISE_OPS:
                out.append(make_case(op, n, hw, c, k, s, dtype=dt, net=net))
    for layout in LAYOUTS_ND:
        for n in BATCHES:
            for op in DEPTHWISE_OPS:
                out.append(make_case(op, n, (1024,), 512, 5, 1, layout=layout, net="1-D"))
        for op in DEPTHWISE_OPS:
            out.append(make_case(op, 1, (15, 75, 315), 64, 3, 1, layout=layout, net="3-D"))
            out.append(make_case(op, 8, (16, 56, 56), 192, 3, 1, layout=layout, net="3-D"))
    for op in ("separable_forward", "separable_grad"):
        for net, hw, c, f in SEPARABLE_SHAPES:
            for n in BATCHES:
                out.append(make_case(op, n, hw, c, 3, 1, filters=f, net=net))
    return tuple(out)


_CASES = None


def all_cases():
    """Every case of the suite, in a fixed order (computed once)."""
    global _CASES
    if _CASES is None:
        _CASES = _all_cases()
        names = [c.name for c in _CASES]
        assert len(set(names)) == len(names), "duplicate case names"
    return _CASES


def _matches(value, wanted):
    if wanted is None:
        return True
    if isinstance(wanted, (str, int)):
        wanted = (wanted,)
    return value in tuple(wanted)


def _layout_matches(case, wanted):
    if wanted is None:
        return True
    if isinstance(wanted, str):
        wanted = (wanted,)
    for w in wanted:
        # "channels_last"/"channels_first" select by memory order at every rank;
        # "NHWC"/"NCHW" select the 2-D rows of that layout.
        if w in LAYOUTS_ND and case.channels_last == _CHANNELS_LAST[w]:
            return True
        if w == case.layout:
            return True
    return False


def cases(quick=False, op=None, N=None, dtype=None, layout=None, name=None):
    """The benchmark cases, optionally filtered.

    Parameters
    ----------
    quick : bool
        Only the quick subset (runs in well under a minute on 2 cores, compile excluded).
    op, N, dtype : value or sequence of values, optional
        Keep cases whose field is (one of) these.
    layout : str or sequence of str, optional
        ``"NHWC"`` / ``"NCHW"`` keep the 2-D rows of that layout;
        ``"channels_last"`` / ``"channels_first"`` keep every row of that memory order.
    name : str, optional
        A regular expression searched for in the case names.

    Returns
    -------
    list of Case

    Examples
    --------
    >>> from numbasep import suite
    >>> [c.name for c in suite.cases(quick=True, op="separable_grad")]
    ['sep_grad/19x19x728/k3s1/F728/N8']
    """
    import re
    pool = all_cases()
    if quick:
        by_name = {c.name: c for c in pool}
        pool = [by_name[n] for n in _QUICK]
    rx = re.compile(name) if name else None
    return [c for c in pool
            if _matches(c.op, op) and _matches(c.N, N) and _matches(c.dtype, dtype)
            and _layout_matches(c, layout) and (rx is None or rx.search(c.name))]


def find(name):
    """The case called ``name`` (raises ``KeyError`` when there is none)."""
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)


# ------------------------------------------------------------------ bytes and FLOPs

def _depthwise_flops(c):
    return 2 * c.N * _prod(c.out_spatial) * c.CM * _prod(c.kernel)


def _gemm_flops(c):
    return 2 * c.N * _prod(c.out_spatial) * c.CM * c.filters


def flops(case):
    """Floating-point operations of one call (a multiply-add counts 2).

    Depthwise (every direction): ``2 N OH OW C M KH KW``. Separable forward adds
    the pointwise GEMM ``2 N OH OW (C M) F``. Separable grad recomputes the
    depthwise output, then does two GEMMs (pointwise input and filter gradients)
    and two depthwise gradients: ``3 depthwise + 2 GEMM``.

    Parameters
    ----------
    case : Case

    Returns
    -------
    int
    """
    dw = _depthwise_flops(case)
    if case.op == "separable_forward":
        return dw + _gemm_flops(case)
    if case.op == "separable_grad":
        return 3 * dw + 2 * _gemm_flops(case)
    return dw


def bytes_moved(case):
    """Lower bound on the bytes one call must move: each tensor read or written once.

    Depthwise forward, input and filter gradients alike:
    ``itemsize (N H W C + N OH OW C M + K C M)`` (read two tensors, write one).
    Separable forward (fused, the ``N OH OW C M`` intermediate never stored):
    ``itemsize (N H W C + K C M + C M F + N OH OW F)``. Separable grad reads
    ``x, dk, pk, dout`` and writes ``dx, ddk, dpk``:
    ``itemsize (2 N H W C + N OH OW F + 2 K C M + 2 C M F)``.

    Parameters
    ----------
    case : Case

    Returns
    -------
    int
    """
    s = case.itemsize
    x = case.N * _prod(case.spatial) * case.C
    y = case.N * _prod(case.out_spatial) * case.CM
    w = _prod(case.kernel) * case.CM
    if case.op == "separable_forward":
        return s * (x + w + case.CM * case.filters
                    + case.N * _prod(case.out_spatial) * case.filters)
    if case.op == "separable_grad":
        return s * (2 * x + case.N * _prod(case.out_spatial) * case.filters
                    + 2 * w + 2 * case.CM * case.filters)
    return s * (x + y + w)


def intensity(case):
    """Arithmetic intensity, FLOP per byte of :func:`bytes_moved`."""
    return flops(case) / bytes_moved(case)


# ------------------------------------------------------------------ inputs and callables

def _np_dtype(name):
    import numpy as np
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _random(rng, shape, dtype):
    """Standard normal values, in an array aligned as the peers' frameworks align
    theirs (64 bytes: :mod:`numbasep.aligned`)."""
    import numpy as np
    from .aligned import empty_aligned
    out = empty_aligned(shape, _np_dtype(dtype))
    out[...] = rng.standard_normal(shape, dtype=np.float32)
    return out


def make_inputs(case, rng=None, out=True):
    """Arrays for ``case`` and a callable that runs the numbasep operator on them.

    Parameters
    ----------
    case : Case
    rng : numpy.random.Generator or int, optional
        Source of the random inputs (a seed, or ``None`` for seed 0).
    out : bool
        When true the callable writes into preallocated result arrays through
        ``out=`` (what a training loop reusing buffers pays); when false every call
        allocates fresh results (and pays their page faults).

    Returns
    -------
    arrays : dict of str to numpy.ndarray
        The operator's arguments (``x``, ``w``, ``dy``, ``pk``... as the op needs)
        and, when ``out`` is true, the result buffers (``out`` or ``out0``...).
    fn : callable
        ``fn()`` runs the operator once and returns its result.

    Examples
    --------
    >>> from numbasep import suite
    >>> c = suite.make_case("forward", 1, 6, 4, 3)
    >>> arrays, fn = suite.make_inputs(c, 0)
    >>> fn().shape
    (1, 6, 6, 4)
    """
    import numpy as np
    import numbasep as nb
    from .aligned import empty_aligned

    if rng is None or isinstance(rng, int):
        rng = np.random.default_rng(rng or 0)
    c = case
    dt = _np_dtype(c.dtype)
    x = _random(rng, c.input_shape, c.dtype)
    w = _random(rng, c.filter_shape, c.dtype)
    arrays = {"x": x, "w": w}
    two_d = c.ndim == 2
    fmt2 = c.layout if two_d else None
    s = c.stride
    strides4 = ([1, s, s, 1] if c.channels_last else [1, 1, s, s])

    if c.op == "forward":
        o = empty_aligned(c.output_shape, dt) if out else None
        if two_d:
            def fn():
                return nb.depthwise_conv2d_native(x, w, strides4, "SAME", data_format=fmt2, out=o)
        else:
            def fn():
                return nb.depthwise_conv(x, w, s, "same", c.data_format, out=o)
        arrays["out"] = o
    elif c.op in ("backprop_input", "backprop_filter"):
        dy = _random(rng, c.output_shape, c.dtype)
        arrays["dy"] = dy
        want_input = c.op == "backprop_input"
        o = (empty_aligned(c.input_shape if want_input else c.filter_shape, dt) if out else None)
        arrays["out"] = o
        if two_d:
            if want_input:
                sizes = list(c.input_shape)

                def fn():
                    return nb.depthwise_conv2d_native_backprop_input(
                        sizes, w, dy, strides4, "SAME", data_format=fmt2, out=o)
            else:
                fsizes = list(c.filter_shape)

                def fn():
                    return nb.depthwise_conv2d_native_backprop_filter(
                        x, fsizes, dy, strides4, "SAME", data_format=fmt2, out=o)
        else:
            fn = _nd_gradient(c, x, w, dy, o, want_input)
    elif c.op == "separable_forward":
        pk = _random(rng, c.pointwise_shape, c.dtype)
        arrays["pk"] = pk
        o = empty_aligned(c.separable_output_shape, dt) if out else None
        arrays["out"] = o

        def fn():
            return nb.separable_conv(x, w, pk, s, "same", c.data_format, out=o)
    else:  # separable_grad
        pk = _random(rng, c.pointwise_shape, c.dtype)
        dy = _random(rng, c.separable_output_shape, c.dtype)
        arrays.update(pk=pk, dy=dy)
        if out:
            o = (empty_aligned(c.input_shape, dt), empty_aligned(c.filter_shape, dt),
                 empty_aligned(c.pointwise_shape, dt))
            arrays.update(out0=o[0], out1=o[1], out2=o[2])
        else:
            o = None

        def fn():
            return nb.separable_conv_grad(x, w, pk, dy, s, "same", c.data_format, out=o)
    if arrays.get("out", 0) is None:
        del arrays["out"]
    return arrays, fn


def _nd_gradient(c, x, w, dy, o, want_input):
    """One gradient of a 1-D or 3-D depthwise convolution.

    The public API offers the single-gradient ops only in 2-D (the TensorFlow
    family); the Keras-style ``depthwise_conv_grad`` returns both gradients. To
    time one gradient at a time, a 1-D case runs the 2-D raw op on a size-1 row
    (a free view); a 3-D case calls the backend primitive the public operators
    use, after the same validation.
    """
    import numbasep as nb
    s = c.stride
    if c.ndim == 1:
        if c.channels_last:
            ex = (lambda a: a[:, None, :, :])
            fmt, st = "NHWC", [1, 1, s, 1]
        else:
            ex = (lambda a: a[:, :, None, :])
            fmt, st = "NCHW", [1, 1, 1, s]
        x4, dy4, w4 = ex(x), ex(dy), w[None]
        if want_input:
            o4 = None if o is None else ex(o)
            sizes = list(x4.shape)

            def fn():
                r = nb.depthwise_conv2d_native_backprop_input(
                    sizes, w4, dy4, st, "SAME", data_format=fmt, out=o4)
                return o if o is not None else r.reshape(c.input_shape)
        else:
            o4 = None if o is None else o[None]
            fsizes = list(w4.shape)

            def fn():
                r = nb.depthwise_conv2d_native_backprop_filter(
                    x4, fsizes, dy4, st, "SAME", data_format=fmt, out=o4)
                return o if o is not None else r[0]
        return fn

    from numbasep import backends, dtypes, shapes
    be, (xb, wb, dyb) = backends.select(inputs=x, kernel=w, out_grad=dy)
    plan = shapes.keras(x.shape, w.shape, s, "same", c.data_format, 1,
                        out_grad_shape=dy.shape)
    plan = plan.with_dtype(dtypes.common_dtype([("inputs", x.dtype), ("kernel", w.dtype),
                                      ("out_grad", dy.dtype)]))
    if want_input:
        def fn():
            return be.depthwise_backprop_input(plan, dyb, wb, o)
    else:
        def fn():
            return be.depthwise_backprop_filter(plan, xb, dyb, o)
    return fn
