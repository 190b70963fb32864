"""Adversarial argument tests: every public operator against arbitrary, mostly invalid calls.

Hypothesis builds calls for each of the ten public functions (the three snake_case
TensorFlow-family functions, their three ``numbasep.raw_ops`` spellings and the four
Keras-style operators). A call starts from a small valid problem and receives up to
three *mutations*: wrong ranks and lengths, zero, negative and huge sizes, strides,
dilations and paddings near 2**31 and 2**63, inconsistent ``input_sizes`` /
``filter_sizes``, scalars, lists, iterators, sets and other objects where arrays or
integer lists belong, integer / bool / complex / object / string / big-endian /
float8 dtypes, mixed dtypes, NaN and Inf values, empty tensors with huge dimensions,
non-contiguous, transposed, reversed, broadcast (zero-stride) and read-only views,
unknown ``padding`` and ``data_format`` strings, and ``out=`` of the wrong shape,
dtype or kind (and right ones, in strided layouts).

The oracle: every call must either

* return a result equal to the float64 reference (``tests/reference.py``), in the
  arguments' dtype, of the same kind of array as the input (and *be* the caller's
  ``out`` when one was given), with NaN and Inf exactly where an IEEE evaluation puts
  them; or
* raise ``numbasep.InvalidArgumentError`` or ``TypeError`` with a message that names
  one of the function's arguments (or states SPEC section 3's "Computed output size
  would be ..." rule).

Anything else fails: another exception type, a crash of the process, a hang, or
a rejection of a call built to be valid. Calls run in a persistent worker process
(``tests/_worker.py``) with a timeout, so a segfault or abort is reported as a
failure with its reproducer instead of killing the test run; the worker is reused
across cases (kernels are compiled once) and restarted when a case kills it. The
worker runs with ``NUMBASEP_MAX_BYTES`` = 8 MiB, so that every valid call whose
result or workspace would be large must be refused up front with a clear
InvalidArgumentError (this exercises the memory refusal without allocating), and
with an 8 GiB address-space limit as a safety net.

The CUDA backend gets the same treatment on device arrays (numba's simulator when
there is no GPU, tiny shapes, fewer examples); it is skipped with the reason when
the backend cannot be loaded.

Profiles (tests/conftest.py): the default "ci" runs 200 calls per CPU operator and 5
per CUDA operator (2 050 calls; well under a minute on 2 cores once the kernels are
in numba's cache, the CUDA simulator's share included); the longer run is

    HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_adversarial.py

which scales both by 25 (about 51 000 calls, roughly half an hour on 2 cores).
``NUMBASEP_ADVERSARIAL_SCALE`` (a float) multiplies the example counts further.

The generators lean towards the corners where bugs live: empty tensors whose
other extents are huge (a kernel looping over them would hang), windows wider than
the row at stride 1 with paddings that keep the output as wide as the input (the
channels-first kernels' flattened paths), and C-contiguous float32/float64 ``out``
arrays followed by a guard region that the worker checks after each call (a write
past the result's end is reported even when it does not crash).

Besides the generated calls, ``test_index_safety_*`` run fixed calls whose index
arithmetic exceeds 32 bits (strides, dilations and paddings of 2**31 - 1 on tiny
arrays) through the same worker, and ``test_cuda_index_types`` checks that the
CUDA kernels compute their indices in 64 bits.
"""

import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, note, settings, strategies as st

import _worker as W
import reference as ref
from _worker import Arr, Case, Iter, Special

# ------------------------------------------------------------------------ budget

_BASE = settings().max_examples            # 40 in "ci", 1000 in "thorough"
_SCALE = float(os.environ.get("NUMBASEP_ADVERSARIAL_SCALE", "1"))
CPU_EXAMPLES = max(1, int(_BASE * 5 * _SCALE))
CUDA_EXAMPLES = max(1, int(_BASE * 0.125 * _SCALE))
CASE_TIMEOUT = 20.0          # seconds per call once the worker is warm
RETRY_TIMEOUT = 120.0        # a second chance in a fresh worker (unexpected compilation)
WORKER_LIMIT = 8 << 20       # NUMBASEP_MAX_BYTES inside the worker

RAW_OPS = {
    "depthwise_conv2d_native": "fwd",
    "depthwise_conv2d_native_backprop_input": "bi",
    "depthwise_conv2d_native_backprop_filter": "bf",
    "raw_ops.DepthwiseConv2dNative": "fwd",
    "raw_ops.DepthwiseConv2dNativeBackpropInput": "bi",
    "raw_ops.DepthwiseConv2dNativeBackpropFilter": "bf",
}
KERAS_OPS = {
    "depthwise_conv": "dc",
    "separable_conv": "sc",
    "depthwise_conv_grad": "dcg",
    "separable_conv_grad": "scg",
}
ALL_OPS = {**RAW_OPS, **KERAS_OPS}
assert set(ALL_OPS) == set(W.OPS)

PARAMS = {
    "fwd": ("input", "filter"),
    "bi": ("input_sizes", "filter", "out_backprop"),
    "bf": ("input", "filter_sizes", "out_backprop"),
    "dc": ("inputs", "kernel"),
    "sc": ("inputs", "depthwise_kernel", "pointwise_kernel"),
    "dcg": ("inputs", "kernel", "out_grad"),
    "scg": ("inputs", "depthwise_kernel", "pointwise_kernel", "out_grad"),
}
RAW_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
KERAS_ATTRS = ("strides", "padding", "data_format", "dilation_rate")
ARRAYS = {"fwd": ("input", "filter"), "bi": ("filter", "out_backprop"),
          "bf": ("input", "out_backprop"), "dc": ("inputs", "kernel"),
          "sc": ("inputs", "depthwise_kernel", "pointwise_kernel"),
          "dcg": ("inputs", "kernel", "out_grad"),
          "scg": ("inputs", "depthwise_kernel", "pointwise_kernel", "out_grad")}
N_RESULTS = {"fwd": 1, "bi": 1, "bf": 1, "dc": 1, "sc": 1, "dcg": 2, "scg": 3}

FLOATS = ("float32", "float64", "float16", "bfloat16")
BAD_DTYPES = ("int32", "int64", "uint8", "uint16", "bool", "complex64", "complex128",
              "object", ">f4", ">f8", ">f2", "longdouble", "float8_e4m3fn", "<U3")
SPECIAL_INTS = (0, -1, -2, 128, 65536, 1879048192, 2**31 - 2, 2**31 - 1, 2**31, 2**32,
                2**32 + 1, 2**62, 2**63 - 1, 2**63, 2**64, -2**31, -2**31 - 1, -2**63,
                -2**63 - 1)
NON_INTS = (1.0, 2.5, float("nan"), float("inf"), True, False, None, "1", 1 + 0j, [1],
            np.float32(1), np.float64(2.0), np.bool_(True), np.uint64(2**64 - 1),
            np.int8(-1), np.int64(2**63 - 1), np.int64(1), np.uint8(1))
HUGE_DIMS = (2**20, 2**31 - 1, 2**31, 2**40)
INT_CONTAINERS = ("int8", "int32", "int64", "uint32", "uint64", "float64", "bool")
RAW_STRINGS = ("same", "valid", "explicit", "Same", "SAME ", " VALID", "", "CAUSAL",
               "causal", "FULL", "NHWC", "NCHW", "NDHWC", "NCHW_VECT_C", "nhwc",
               "channels_last", "HWNC", "SAME\x00", "VALİD")
KERAS_STRINGS = ("VALID ", "explicit", "EXPLICIT", "full", "causal", "CAUSAL", "",
                 "channels_middle", "NHWC", "NCHW", "channels-last", "ChAnNeLs_FiRsT",
                 "Same", "valid", "same", "channels_first", "channels_last")
NON_STRINGS = (None, 0, 1.5, b"SAME", ["SAME"], ("valid",), Special("object"),
               Special("ellipsis"))
TOL = {"float16": 4e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}


# ------------------------------------------------------------------------ helpers

def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _creatable(shape, itemsize=16):
    """NumPy refuses shapes whose non-zero dimensions overflow its size type."""
    n = 1
    for s in shape:
        if s:
            n *= s
    return n * itemsize < 2**62 and all(s >= 0 for s in shape)


class Meta:
    """What the generator knows about a case.

    ``valid`` is decided by :func:`final_validity` once all mutations are applied:
    True (must be computed), False (must be rejected) or None (either is fine, as
    long as the oracle's other rules hold).
    """

    def __init__(self, family, backend):
        self.family = family
        self.backend = backend
        self.base_valid = None      # the unmutated problem's geometry is valid
        self.preserving = True      # every mutation so far keeps a valid call valid
        self.valid = None
        self.effective = backend    # where the call computes (all arrays on one side)
        self.mutations = []

    def taint(self, what, preserving=False):
        self.mutations.append(what)
        self.preserving = self.preserving and preserving


_DEVICE_KINDS = ("device", "device_strided")


def final_validity(kw, meta):
    """True / False / None (see :class:`Meta`) from clear-cut rules on the final call."""
    arrays = [kw.get(a) for a in ARRAYS[meta.family]]
    recipes = [a for a in arrays if isinstance(a, Arr)]
    if meta.op.startswith("raw_ops"):
        need = PARAMS[meta.family] + ("strides", "padding")
        if any(k not in kw for k in need):
            return False
    typed = [a for a in recipes if a.kind in ("ndarray", "masked") + _DEVICE_KINDS]
    for a in typed:
        if a.dtype not in FLOATS:
            return False
    sides = {a.kind in _DEVICE_KINDS for a in recipes}
    if len(sides) > 1 and len(recipes) == len(arrays):
        return False                     # host and device arrays mixed
    if sides == {True}:
        meta.effective = "cuda"
    elif sides == {False}:
        meta.effective = "cpu"
    if len({a.dtype for a in typed}) > 1:
        return False
    if meta.family in ("fwd", "bi", "bf"):
        for name in ("strides", "dilations"):
            v = kw.get(name)
            if isinstance(v, list) and all(isinstance(x, int) for x in v) and len(v) != 4:
                return False
    if meta.preserving and meta.base_valid:
        return True
    return None


def _seed(draw):
    return draw(st.integers(0, 2**16))


def _array_kind(meta):
    return "device" if meta.backend == "cuda" else "ndarray"


# ------------------------------------------------------------------------ valid bases

@st.composite
def raw_base(draw, family, backend):
    meta = Meta(family, backend)
    fmt = draw(st.sampled_from(("NHWC", "NCHW")))
    padding = draw(st.sampled_from(("VALID", "SAME", "EXPLICIT")))
    n = draw(st.sampled_from((1, 2, 0)))
    c = draw(st.sampled_from((1, 2, 3, 0)))
    m = draw(st.sampled_from((1, 2, 0)))
    h = draw(st.integers(0, 7))
    # Rows of 32 and more reach the channels-first kernels (narrower channels-first
    # problems are computed as channels-last), with dilations and paddings that can
    # exceed them.
    w = draw(st.one_of(st.integers(0, 7), st.sampled_from((32, 33, 40))))
    fh, fw = (draw(st.sampled_from((1, 1, 2, 3, 4))) for _ in range(2))
    sh, sw = (draw(st.sampled_from((1, 1, 2, 3, 4, 2**31 - 1))) for _ in range(2))
    rh, rw = (draw(st.sampled_from((1, 1, 1, 2, 3, 17, 50))) for _ in range(2))
    pads = [draw(st.one_of(st.integers(0, 3), st.sampled_from((35, 60)))) for _ in range(4)]
    if w >= 32 and draw(st.booleans()):
        # windows wider than the row, at stride 1, with paddings that keep the output
        # as wide as the input: the channels-first kernels' row-flattened paths and
        # their border handling at its limits
        rw = draw(st.sampled_from((w // 2, w, 2 * w, 3 * w)))
        fw = max(fw, 2)
        sh = sw = 1
        if draw(st.booleans()):
            padding = "SAME"
        else:
            padding = "EXPLICIT"
            k = draw(st.integers(0, 2))
            pads[2], pads[3] = (fw - 1) * rw - k, k
    if draw(st.integers(0, 5)) == 0 and n and (c == 0 or m == 0 or h == 0 or w == 0):
        # An empty problem with a huge extent elsewhere: all arrays stay empty,
        # so nothing is allocated, but loops over the huge extent would hang.
        big = draw(st.sampled_from(HUGE_DIMS))
        if w == 0 or (h != 0 and draw(st.booleans())):
            h = big
        else:
            w = big
        sh = sw = 1
    dtype = draw(st.sampled_from(FLOATS))
    kind = _array_kind(meta)
    cf = fmt == "NCHW"
    geo = ref.raw_geometry(
        (n, c, h, w) if cf else (n, h, w, c), (fh, fw, c, m),
        [1, 1, sh, sw] if cf else [1, sh, sw, 1], padding,
        ([0, 0, 0, 0] + pads) if cf else ([0, 0] + pads + [0, 0]), fmt,
        [1, 1, rh, rw] if cf else [1, rh, rw, 1])
    oh, ow = geo["out_sizes"]
    meta.base_valid = oh >= 0 and ow >= 0
    oh, ow = max(oh, 0), max(ow, 0)

    def layout(sp, ch):
        return (n, ch) + sp if cf else (n,) + sp + (ch,)

    in_shape, out_shape = layout((h, w), c), layout((oh, ow), c * m)
    kw = {}
    if family in ("fwd", "bf"):
        kw["input"] = Arr(in_shape, dtype, _seed(draw), kind=kind)
    if family == "bi":
        kw["input_sizes"] = list(in_shape)
    if family in ("fwd", "bi"):
        kw["filter"] = Arr((fh, fw, c, m), dtype, _seed(draw), kind=kind)
    if family == "bf":
        kw["filter_sizes"] = [fh, fw, c, m]
    if family in ("bi", "bf"):
        kw["out_backprop"] = Arr(out_shape, dtype, _seed(draw), kind=kind)
    kw["strides"] = [1, 1, sh, sw] if cf else [1, sh, sw, 1]
    kw["padding"] = padding
    if padding == "EXPLICIT":
        kw["explicit_paddings"] = ([0, 0, 0, 0] + pads) if cf else ([0, 0] + pads + [0, 0])
    elif draw(st.booleans()):
        kw["explicit_paddings"] = []
    if cf or draw(st.booleans()):
        kw["data_format"] = fmt
    if (rh, rw) != (1, 1) or draw(st.booleans()):
        kw["dilations"] = [1, 1, rh, rw] if cf else [1, rh, rw, 1]
    meta.results = {"fwd": [out_shape], "bi": [in_shape], "bf": [(fh, fw, c, m)]}[family]
    meta.dtype = dtype
    _small(kw, meta)
    return kw, meta


def _small(kw, meta):
    """Keep every array and result of a base small (huge extents only on empty ones)."""
    sizes = [_prod(a.shape) for a in kw.values() if isinstance(a, Arr)]
    sizes += [_prod(r) for r in meta.results]
    assume(max(sizes) <= 10**5)


@st.composite
def keras_base(draw, family, backend):
    meta = Meta(family, backend)
    ndim = draw(st.integers(1, 3))
    fmt_arg = draw(st.sampled_from(("channels_last", "channels_first", None,
                                    "Channels_Last")))
    fmt = (fmt_arg or "channels_last").lower()
    pads = ("valid", "same", "VALID", "Same") + (("causal",) if ndim == 1 else ())
    padding = draw(st.sampled_from(pads))
    top = {1: 9, 2: 6, 3: 4}[ndim]
    spatial = tuple(draw(st.integers(0, top)) for _ in range(ndim))
    wide = ndim < 3 and draw(st.integers(0, 3)) == 0   # wide rows: channels-first kernels
    if wide:
        spatial = spatial[:-1] + (draw(st.sampled_from((32, 33, 40))),)
    kernel = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    n = draw(st.sampled_from((1, 2, 0)))
    c = draw(st.sampled_from((1, 2, 3, 0)))
    m = draw(st.sampled_from((1, 2, 0)))
    f = draw(st.sampled_from((1, 2, 3, 0)))
    if draw(st.integers(0, 5)) == 0 and n and (c == 0 or m == 0 or 0 in spatial) \
            and ndim > 1:
        # An empty problem with a huge extent elsewhere (see raw_base).
        i = draw(st.sampled_from([i for i, v in enumerate(spatial) if v] or [0]))
        spatial = spatial[:i] + (draw(st.sampled_from(HUGE_DIMS)),) + spatial[i + 1:]
    if draw(st.booleans()):
        strides = draw(st.integers(1, 3))
        st_t = (strides,) * ndim
    else:
        st_t = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
        strides = st_t if draw(st.booleans()) else list(st_t)
    dils = st.sampled_from((1, 1, 2, 2, 3, 40))
    if draw(st.booleans()):
        dil = draw(dils)
        dl_t = (dil,) * ndim
    else:
        dl_t = tuple(draw(dils) for _ in range(ndim))
        dil = dl_t
    if wide and spatial[-1] <= 64 and draw(st.booleans()):   # windows wider than the row
        dl_t = dl_t[:-1] + (draw(st.sampled_from((spatial[-1] // 2, spatial[-1],
                                                   2 * spatial[-1], 3 * spatial[-1]))),)
        dil = dl_t
        kernel = kernel[:-1] + (max(kernel[-1], 2),)
        st_t = st_t[:-1] + (1,)
        strides = st_t
        padding = draw(st.sampled_from(("same", "causal") if ndim == 1 else ("same",)))
    outs = [ref.keras_output_and_pad(sz, k, s, r, padding.lower())[0]
            for sz, k, s, r in zip(spatial, kernel, st_t, dl_t)]
    meta.base_valid = all(o > 0 for o in outs) or padding.lower() != "valid"
    outs = tuple(max(o, 0) for o in outs)
    cf = fmt == "channels_first"

    def layout(sp, ch):
        return (n, ch) + sp if cf else (n,) + sp + (ch,)

    dtype = draw(st.sampled_from(FLOATS))
    kind = _array_kind(meta)
    in_shape = layout(spatial, c)
    k_shape = kernel + (c, m)
    pk_shape = (1,) * ndim + (c * m, f)
    out_shape = layout(outs, c * m) if family in ("dc", "dcg") else layout(outs, f)
    kw = {"inputs": Arr(in_shape, dtype, _seed(draw), kind=kind)}
    if family in ("dc", "dcg"):
        kw["kernel"] = Arr(k_shape, dtype, _seed(draw), kind=kind)
    else:
        kw["depthwise_kernel"] = Arr(k_shape, dtype, _seed(draw), kind=kind)
        kw["pointwise_kernel"] = Arr(pk_shape, dtype, _seed(draw), kind=kind)
    if family in ("dcg", "scg"):
        kw["out_grad"] = Arr(out_shape, dtype, _seed(draw), kind=kind)
    if strides != 1 or draw(st.booleans()):
        kw["strides"] = strides
    if padding != "valid" or draw(st.booleans()):
        kw["padding"] = padding
    if fmt_arg is not None or draw(st.booleans()):
        kw["data_format"] = fmt_arg
    if dil != 1 or draw(st.booleans()):
        kw["dilation_rate"] = dil
    meta.results = {"dc": [out_shape], "sc": [out_shape], "dcg": [in_shape, k_shape],
                    "scg": [in_shape, k_shape, pk_shape]}[family]
    meta.dtype = dtype
    _small(kw, meta)
    return kw, meta


# ------------------------------------------------------------------------ mutations

def _int_list_value(draw, base, exact_len):
    """A mutated integer-list argument (``base`` is the valid value)."""
    how = draw(st.sampled_from(("len", "entry", "entry", "container", "scalar", "junk")))
    base = list(base) if isinstance(base, (list, tuple)) else [base]
    if how == "len":
        k = draw(st.integers(0, 13).filter(lambda k: k != exact_len))
        vals = [draw(st.sampled_from((1, 1, 1, 2) + SPECIAL_INTS)) for _ in range(k)]
        return vals
    if how == "entry" and base:
        i = draw(st.integers(0, len(base) - 1))
        v = draw(st.one_of(st.sampled_from(SPECIAL_INTS), st.sampled_from(NON_INTS)))
        out = list(base)
        out[i] = v
        return out
    if how == "container":
        shape = draw(st.sampled_from(("tuple", "array", "array2d", "array0d", "iter")))
        if shape == "tuple":
            return tuple(base)
        if shape == "iter":
            return Iter(base)
        dt = draw(st.sampled_from(INT_CONTAINERS))
        try:
            arr = np.array(base, dtype=np.int64).astype(dt)
        except (OverflowError, ValueError, TypeError):
            arr = np.array(base + [None], dtype=object)[:-1]
        if shape == "array2d" and arr.size:
            arr = arr.reshape(1, -1)
        elif shape == "array0d":
            arr = arr.reshape(-1)[0][()] if arr.size and arr.dtype != object else \
                np.array(1, dtype=np.int64)
            arr = np.array(arr)
        return arr
    if how == "scalar":
        return draw(st.sampled_from((1, 2, 0, -1, 2**31, 1.0, None, "1111")))
    return draw(st.sampled_from((Special("object"), Special("dict"), Special("set"),
                                 "1,1,1,1", b"\x01\x01", [[1, 1], [1, 1]], [],
                                 Special("ellipsis"))))


def _huge_shape(draw):
    """A shape with a zero dimension and a huge one (an empty tensor NumPy can describe)."""
    rank = draw(st.integers(1, 6))
    dims = [draw(st.sampled_from((0, 1, 2, 3))) for _ in range(rank)]
    zero = draw(st.integers(0, rank - 1))
    dims[zero] = 0
    if rank > 1:
        i = draw(st.integers(0, rank - 1).filter(lambda i: i != zero))
        dims[i] = draw(st.sampled_from(HUGE_DIMS))
    return tuple(dims)


@st.composite
def mutate(draw, kw, meta):
    """Apply one mutation to ``kw`` (in place) and record it in ``meta``."""
    fam = meta.family
    raw = fam in ("fwd", "bi", "bf")
    arrays = [a for a in ARRAYS[fam] if a in kw]
    int_lists = ([a for a in ("strides", "dilations", "explicit_paddings") if True] +
                 (["input_sizes"] if fam == "bi" else []) +
                 (["filter_sizes"] if fam == "bf" else [])) if raw else \
        ["strides", "dilation_rate"]
    what = draw(st.sampled_from(
        ("int_list",) * 4 + ("string",) * 2 + ("shape",) * 3 + ("dtype",) * 2 +
        ("values", "layout", "layout", "kind", "kind", "backend", "out", "out", "huge",
         "huge", "drop")))
    if what == "int_list":
        name = draw(st.sampled_from(int_lists))
        default = {"strides": [1, 1, 1, 1] if raw else 1, "dilations": [1, 1, 1, 1],
                   "explicit_paddings": [], "dilation_rate": 1}
        exact = {"strides": 4, "dilations": 4, "input_sizes": 4, "filter_sizes": 4}.get(name)
        if not raw:
            exact = None
        value = _int_list_value(draw, kw.get(name, default.get(name, [])), exact)
        if not raw and draw(st.booleans()):   # Keras: also plain bad ints
            value = draw(st.sampled_from(SPECIAL_INTS + NON_INTS))
        kw[name] = value
        meta.taint(f"{name}={value!r}")
    elif what == "string":
        name = draw(st.sampled_from(("padding", "data_format")))
        pool = RAW_STRINGS if raw else KERAS_STRINGS
        kw[name] = draw(st.one_of(st.sampled_from(pool), st.sampled_from(NON_STRINGS),
                                  st.text(max_size=6)))
        meta.taint(f"{name}={kw[name]!r}")
    elif what in ("shape", "dtype", "values", "layout", "kind", "backend") and arrays:
        name = draw(st.sampled_from(arrays))
        a = kw[name]
        if not isinstance(a, Arr):
            return
        if what == "shape":
            how = draw(st.sampled_from(("rank", "off_by_one", "huge_empty", "zero")))
            if how == "rank":
                rank = draw(st.integers(0, 6))
                shape = tuple(draw(st.integers(0, 4)) for _ in range(rank))
            elif how == "off_by_one" and a.shape:
                i = draw(st.integers(0, len(a.shape) - 1))
                shape = list(a.shape)
                shape[i] = max(0, shape[i] + draw(st.sampled_from((-1, 1, 2))))
                shape = tuple(shape)
            elif how == "zero" and a.shape:
                i = draw(st.integers(0, len(a.shape) - 1))
                shape = a.shape[:i] + (0,) + a.shape[i + 1:]
            else:
                shape = _huge_shape(draw)
            if not _creatable(shape) or (a.kind == "list" and max(shape, default=0) > 64):
                return
            kw[name] = a.replace(shape=shape)
            meta.taint(f"{name}.shape={shape}")
        elif what == "dtype":
            if draw(st.booleans()):
                dt = draw(st.sampled_from(BAD_DTYPES))
            else:
                dt = draw(st.sampled_from(FLOATS))
            if a.kind in _DEVICE_KINDS and dt in ("object", "<U3"):
                return      # numba cannot even put those on a device
            kw[name] = a.replace(dtype=dt)
            meta.taint(f"{name}.dtype={dt}")
        elif what == "values":
            sp = draw(st.sampled_from(("nan", "inf", "nan+inf")))
            kw[name] = a.replace(special=sp)
            meta.taint(f"{name} with {sp}", True)
        elif what == "layout":
            if meta.backend == "cuda":
                kw[name] = a.replace(kind="device_strided")
                meta.taint(f"{name} strided on the device", True)
            else:
                lay = draw(st.sampled_from(("f", "strided", "reversed", "transposed",
                                            "broadcast", "readonly")))
                kw[name] = a.replace(readonly=True) if lay == "readonly" else \
                    a.replace(layout=lay)
                meta.taint(f"{name} layout {lay}", True)
        elif what == "kind":
            k = draw(st.sampled_from(("list", "scalar", "pyfloat", "masked", "none", "string",
                                      "object", "dict")))
            if k == "list" and max(a.shape, default=0) > 64:
                return              # nested lists of 2**31 empty lists: not the point
            if k in ("list", "scalar", "pyfloat", "masked"):
                kw[name] = a.replace(kind=k)
            else:
                kw[name] = {"none": None, "string": "abc", "object": Special("object"),
                            "dict": Special("dict")}[k]
            meta.taint(f"{name} as {k}", k == "masked" and meta.backend == "cpu")
        else:  # backend: one argument on the other device
            other = "ndarray" if meta.backend == "cuda" else "device"
            kw[name] = a.replace(kind=other)
            meta.taint(f"{name} on {other}")
    elif what == "out" and not meta.op.startswith("raw_ops"):
        _mutate_out(draw, kw, meta)
    elif what == "huge":
        _mutate_huge(draw, kw, meta)
    elif what == "drop":
        required = [k for k in kw if k in PARAMS[fam] or k in ("strides", "padding")]
        if required and meta.op.startswith("raw_ops"):
            name = draw(st.sampled_from(required))
            del kw[name]
            meta.taint(f"without {name}")


def _out_arr(meta, shape, dtype, layout="c", kind=None):
    kind = kind or _array_kind(meta)
    if layout == "guarded" and dtype not in ("float32", "float64"):
        layout = "c"                # 16-bit results are rounded into out from a copy
    return Arr(shape, dtype, 7, layout=layout if kind == "ndarray" else "c", kind=kind)


def _mutate_out(draw, kw, meta):
    shapes = meta.results
    dtype = meta.dtype
    how = draw(st.sampled_from(("valid", "valid", "shape", "dtype", "kind", "readonly",
                                "container")))
    lay = draw(st.sampled_from(("c", "strided", "f", "guarded", "guarded")))

    def one(shape, how):
        if how == "valid":
            return _out_arr(meta, shape, dtype, lay)
        if how == "shape":
            bad = tuple(shape) + (1,) if draw(st.booleans()) else \
                tuple(max(0, s - 1) for s in shape) + ()
            if bad == tuple(shape):
                bad = tuple(shape) + (2,)
            return _out_arr(meta, bad, dtype)
        if how == "dtype":
            return _out_arr(meta, shape, draw(st.sampled_from(
                tuple(f for f in FLOATS if f != dtype) + ("int32", "complex64", ">f4"))))
        if how == "kind":
            return draw(st.sampled_from((
                _out_arr(meta, shape, dtype, kind="list"), Special("object"), "out",
                _out_arr(meta, shape, dtype,
                         kind="ndarray" if meta.backend == "cuda" else "device"))))
        if how == "readonly":
            return _out_arr(meta, shape, dtype).replace(readonly=True)
        return None

    if len(shapes) == 1:
        if how == "container":
            kw["out"] = (one(shapes[0], "valid"),)
            meta.taint("out as a tuple")
        else:
            kw["out"] = one(shapes[0], how)
            meta.taint(f"out {how}", how == "valid")
    else:
        if how == "container":
            n = draw(st.sampled_from((0, 1, len(shapes) + 1)))
            kw["out"] = draw(st.sampled_from((
                tuple(one(shapes[0], "valid") for _ in range(n)),
                one(shapes[0], "valid"), Special("object"))))
            meta.taint("out of the wrong arity or kind")
        else:
            items = [one(s, how) if draw(st.booleans()) or how == "valid" else None
                     for s in shapes]
            if draw(st.booleans()):
                items = list(items)          # a list is accepted like a tuple
            else:
                items = tuple(items)
            kw["out"] = items
            meta.taint(f"out {how}", how == "valid")


def _mutate_huge(draw, kw, meta):
    """Strides, dilations, paddings or sizes near 2**31 / 2**63 (often valid!)."""
    fam = meta.family
    big = draw(st.sampled_from((2**31 - 1, 2**31 - 2, 2**31, 2**32, 2**63 - 1, 2**40)))
    if fam in ("fwd", "bi", "bf"):
        fmt = kw.get("data_format", "NHWC")
        ax = draw(st.sampled_from((1, 2) if fmt != "NCHW" else (2, 3)))
        what = draw(st.sampled_from(("strides", "dilations", "explicit_paddings", "sizes")))
        if what in ("strides", "dilations"):
            v = list(kw.get(what, [1, 1, 1, 1])) if isinstance(kw.get(what), list) \
                else [1, 1, 1, 1]
            if len(v) == 4:
                v[ax] = big
                kw[what] = v
        elif what == "explicit_paddings":
            v = list(kw["explicit_paddings"]) if isinstance(kw.get("explicit_paddings"),
                                                             list) else [0] * 8
            if len(v) != 8:
                v = [0] * 8
            v[2 * ax + draw(st.integers(0, 1))] = big
            kw["padding"] = "EXPLICIT"
            kw["explicit_paddings"] = v
        else:
            name = "input_sizes" if fam == "bi" else ("filter_sizes" if fam == "bf"
                                                      else "strides")
            v = list(kw[name]) if isinstance(kw.get(name), list) else [1, 1, 1, 1]
            if len(v) == 4:
                v[ax if name != "filter_sizes" else ax - 1] = big
                kw[name] = v
        meta.taint(f"huge {what}: {big}")
    else:
        what = draw(st.sampled_from(("strides", "dilation_rate")))
        kw[what] = big
        if draw(st.booleans()):
            kw["padding"] = "same"
        meta.taint(f"huge {what}: {big}")


@st.composite
def cases(draw, op, backend):
    fam = ALL_OPS[op]
    base = raw_base if op in RAW_OPS else keras_base
    kw, meta = draw(base(fam, backend))
    meta.op = op
    if draw(st.integers(0, 4)) == 0:
        pass                                    # the valid base itself, sometimes
    else:
        for _ in range(draw(st.integers(1, 3))):
            draw(mutate(kw, meta))
    if (backend == "cpu" and not op.startswith("raw_ops") and "out" not in kw
            and meta.dtype in ("float32", "float64") and draw(st.booleans())):
        # Results written straight into C-contiguous outs followed by guard regions:
        # the worker reports any write past a result's end.
        outs = tuple(Arr(r, meta.dtype, 7, layout="guarded") for r in meta.results)
        kw["out"] = outs if len(outs) > 1 else outs[0]
        meta.taint("guarded out", True)
    if op.startswith("raw_ops") and draw(st.booleans()):
        kw["name"] = draw(st.sampled_from(("x", None, "depthwise/1")))
    meta.valid = final_validity(kw, meta)
    return Case(op, kw, "; ".join(meta.mutations)), meta


# ------------------------------------------------------------------------ the oracle

def _names_pattern(op):
    fam = ALL_OPS[op]
    names = PARAMS[fam] + (RAW_ATTRS if op in RAW_OPS else KERAS_ATTRS) + ("out", "name")
    alts = sorted({re.escape(n).replace("_", "[_ ]") for n in names}, key=len, reverse=True)
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(alts) + r")(?![A-Za-z0-9_])")


DOCUMENTED = re.compile(r"Computed output size would be (negative|zero or negative)")


def _ints(v):
    if isinstance(v, Iter):
        v = v.items
    if isinstance(v, (int, np.integer, np.ndarray)) and np.ndim(v) == 0 and \
            not isinstance(v, (bool, np.bool_)):
        return int(v)
    return [int(x) for x in v]


def _keras_int(v):
    v = _ints(v)
    return v if isinstance(v, int) else tuple(v)


def _host(value):
    a = W.build(value, device=False)
    if isinstance(a, np.ma.MaskedArray):
        a = a.data
    return np.asarray(a)


def reference_fn(case, meta):
    """(evaluate(arrays) -> tuple of float64 results, the array arguments as float64)."""
    kw = case.kwargs
    fam = meta.family
    arrays = {name: _host(kw[name]) for name in ARRAYS[fam]}
    if fam in ("fwd", "bi", "bf"):
        attrs = dict(strides=_ints(kw["strides"]), padding=kw["padding"],
                     explicit_paddings=_ints(kw.get("explicit_paddings", [])),
                     data_format=kw.get("data_format", "NHWC"),
                     dilations=_ints(kw.get("dilations", [1, 1, 1, 1])))
        if fam == "fwd":
            def f(a):
                return (ref.raw_forward(a["input"], a["filter"], **attrs),)
        elif fam == "bi":
            sizes = _ints(kw["input_sizes"])

            def f(a):
                return (ref.raw_backprop_input(sizes, a["filter"], a["out_backprop"],
                                               **attrs),)
        else:
            sizes = _ints(kw["filter_sizes"])

            def f(a):
                return (ref.raw_backprop_filter(a["input"], sizes, a["out_backprop"],
                                                **attrs),)
    else:
        attrs = dict(strides=_keras_int(kw.get("strides", 1)),
                     padding=kw.get("padding", "valid").lower(),
                     data_format=(kw.get("data_format") or "channels_last").lower(),
                     dilation_rate=_keras_int(kw.get("dilation_rate", 1)))
        if fam == "dc":
            def f(a):
                return (ref.keras_depthwise(a["inputs"], a["kernel"], **attrs),)
        elif fam == "sc":
            def f(a):
                return (ref.keras_separable(a["inputs"], a["depthwise_kernel"],
                                            a["pointwise_kernel"], **attrs),)
        elif fam == "dcg":
            def f(a):
                return tuple(ref.keras_depthwise_grad(a["inputs"], a["kernel"],
                                                      a["out_grad"], **attrs))
        else:
            def f(a):
                return tuple(ref.keras_separable_grad(
                    a["inputs"], a["depthwise_kernel"], a["pointwise_kernel"],
                    a["out_grad"], **attrs))
    if fam in ("fwd", "bi", "bf"):
        xs = arrays["input"].shape if fam != "bi" else tuple(_ints(kw["input_sizes"]))
        fs = arrays["filter"].shape if fam != "bf" else tuple(_ints(kw["filter_sizes"]))
        geo = ref.raw_geometry(xs, fs, **attrs) if len(xs) == 4 and len(fs) == 4 else None
        shape = {"fwd": geo and geo["output_shape"], "bi": xs, "bf": fs}[fam]
        if geo and geo["output_shape"] and (
                0 in geo["output_shape"] or any(a.size == 0 for a in arrays.values())):
            # a single multilinear op with an empty operand or result: zeros (the
            # reference would build index vectors as long as huge empty extents)
            f = lambda a: (np.zeros(shape),)  # noqa: E731
    if fam in ("dc", "sc", "dcg", "scg") and any(a.size == 0 for a in arrays.values()):
        # Every result is a sum of products with one factor from each array it
        # depends on (or has the shape of the one it does not): zeros. The float64
        # reference would build index vectors as long as the (possibly huge)
        # empty extents.
        shapes = _keras_shapes(fam, arrays, attrs)
        f = lambda a: tuple(np.zeros(s) for s in shapes)  # noqa: E731
    f.attrs = attrs
    return f, arrays


def _composite_reach(fam, x, bad, attrs):
    """Where NaN/Inf reach the results of separable_conv(_grad), stage by stage.

    The separable operators are compositions (SPEC section 2): a NaN times an
    intermediate that is an empty sum (exactly 0, e.g. with F = 0) is still NaN,
    so reach is propagated through the intermediates z = depthwise(x, dk) and
    dz = out_grad @ pk^T, each entry of which is a number.
    """
    cf = attrs["data_format"] == "channels_first"
    ind = {k: b.astype(np.float64) for k, b in bad.items()}
    one = {k: np.ones_like(v) for k, v in x.items()}

    def Z(a, dk):
        return ref.keras_depthwise(a, dk, **attrs)

    def PW(z, pk):
        return ref.to_first(ref.pointwise(ref.to_last(z, cf), pk), cf)

    zr = Z(ind["inputs"], one["depthwise_kernel"]) + Z(one["inputs"], ind["depthwise_kernel"])
    z1 = np.ones_like(zr)
    zr = (zr > 0).astype(np.float64)
    if fam == "sc":
        return [PW(zr, one["pointwise_kernel"]) + PW(z1, ind["pointwise_kernel"])]
    pk_shape = x["pointwise_kernel"].shape

    def PWBI(d, pk):
        return ref.to_first(ref.pointwise_backprop_input(ref.to_last(d, cf), pk), cf)

    def PWBF(z, d):
        return ref.pointwise_backprop_filter(ref.to_last(z, cf), ref.to_last(d, cf), pk_shape)

    def G(a, dk, d):
        return ref.keras_depthwise_grad(a, dk, d, **attrs)

    dzr = PWBI(ind["out_grad"], one["pointwise_kernel"]) + \
        PWBI(one["out_grad"], ind["pointwise_kernel"])
    dz1 = np.ones_like(dzr)
    dzr = (dzr > 0).astype(np.float64)
    dpk = PWBF(zr, one["out_grad"]) + PWBF(z1, ind["out_grad"])
    dx = G(one["inputs"], one["depthwise_kernel"], dzr)[0] + \
        G(one["inputs"], ind["depthwise_kernel"], dz1)[0]
    ddk = G(ind["inputs"], one["depthwise_kernel"], dz1)[1] + \
        G(one["inputs"], one["depthwise_kernel"], dzr)[1]
    return [dx, ddk, dpk]


def _keras_shapes(fam, arrays, attrs):
    x = arrays["inputs"]
    k = arrays.get("kernel", arrays.get("depthwise_kernel"))
    ndim = x.ndim - 2
    cf = attrs["data_format"] == "channels_first"
    spatial = x.shape[2:] if cf else x.shape[1:-1]
    outs = ref.keras_geometry(spatial, k.shape[:ndim], attrs["strides"],
                              attrs["dilation_rate"], attrs["padding"])[0]
    ch = k.shape[-2] * k.shape[-1] if fam in ("dc", "dcg") else \
        arrays["pointwise_kernel"].shape[-1]
    out = (x.shape[0], ch) + tuple(outs) if cf else (x.shape[0],) + tuple(outs) + (ch,)
    if fam in ("dc", "sc"):
        return [out]
    if fam == "dcg":
        return [x.shape, k.shape]
    return [x.shape, k.shape, arrays["pointwise_kernel"].shape]


def _f64(a):
    return np.asarray(a).astype(np.float64)


def check_result(case, meta, outcome):
    _, is_tuple, results, _ = outcome
    fam = meta.family
    want_n = N_RESULTS[fam]
    assert is_tuple == (want_n > 1), "a tuple of results only for the gradients"
    assert len(results) == want_n, f"{len(results)} results, expected {want_n}"
    f, arrays = reference_fn(case, meta)
    dtypes = {a.dtype for a in arrays.values()}
    assert len(dtypes) == 1, f"mixed dtypes accepted: {dtypes}"
    dtype = dtypes.pop()
    dname = dtype.name
    assert dname in TOL, f"unsupported dtype {dtype} accepted"
    x64 = {k: _f64(v) for k, v in arrays.items()}
    finite = {k: np.where(np.isfinite(v), v, 0.0) for k, v in x64.items()}
    try:
        val = f(finite)
        mag = f({k: np.abs(v) for k, v in finite.items()})
    except Exception as e:  # noqa: BLE001 - the call should have been rejected
        raise AssertionError(
            f"numbasep accepted a call the float64 reference cannot evaluate "
            f"({type(e).__name__}: {e})") from e
    bad = {k: ~np.isfinite(v) for k, v in x64.items()}
    reach = [np.zeros(np.shape(v)) for v in val]
    huge = max((max(v.shape, default=0) for v in x64.values()), default=0) > 10**4
    if any(b.any() for b in bad.values()) and fam in ("sc", "scg") and not huge:
        reach = _composite_reach(fam, x64, bad, f.attrs)
    elif any(b.any() for b in bad.values()):
        for k in x64:
            if not bad[k].any():
                continue
            # Everything else 1: no cancellation, so a result is reached by k's
            # NaN/Inf exactly when this difference is positive (every result is
            # linear in each array it depends on, and independent of the others).
            ones = {j: np.ones_like(x64[j]) for j in x64}
            zero = dict(ones, **{k: np.zeros_like(x64[k])})
            hit = f(dict(ones, **{k: bad[k].astype(np.float64)}))
            reach = [r + (h - z) for r, h, z in zip(reach, hit, f(zero))]
    outs = case.kwargs.get("out")
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    for i, (kind, rdt, shape, vals, is_out) in enumerate(results):
        what = f"result {i}"
        want_kind = "ndarray" if meta.effective == "cpu" else "device"
        assert kind == want_kind, f"{what}: a {kind}, expected a {want_kind}"
        assert rdt == dname, f"{what}: dtype {rdt}, expected {dname}"
        assert shape == val[i].shape, f"{what}: shape {shape}, expected {val[i].shape}"
        given = outs[i] if i < len(outs) else None
        assert is_out == (given is not None), \
            f"{what}: {'is not' if given is not None else 'is'} the caller's out"
        tol = TOL[dname]
        nonfinite = reach[i] > 0
        got_nonfinite = ~np.isfinite(vals)
        assert np.array_equal(got_nonfinite, nonfinite), (
            f"{what}: NaN/Inf at {np.argwhere(got_nonfinite != nonfinite)[:5].tolist()} "
            f"differ from IEEE propagation")
        err = np.abs(np.where(nonfinite, 0.0, vals) - np.where(nonfinite, 0.0, val[i]))
        lim = tol * (1.0 + mag[i])
        if err.size:
            worst = np.unravel_index(np.argmax(err - lim), err.shape)
            assert (err <= lim).all(), (
                f"{what}: |got - reference| = {err[worst]:.3g} > {lim[worst]:.3g} at "
                f"{list(worst)} (got {vals[worst]!r}, reference {val[i][worst]!r})")


def check(case, meta, outcome):
    """The oracle (module docstring); raises AssertionError with a reproducer."""
    status = outcome[0]
    head = f"\nreproducer: numbasep.{case!r}\n(backend {meta.backend})\n"
    if status == "crash":
        rc, sig, tail = outcome[1:]
        raise AssertionError(f"{head}the worker process died: rc={rc} {sig}\n{tail}")
    if status == "hang":
        raise AssertionError(f"{head}no answer within {outcome[1]} s (hang)\n{outcome[2]}")
    if status == "corrupt":
        raise AssertionError(f"{head}memory outside the result was written: {outcome[1]}")
    if status == "setup-error":
        raise AssertionError(f"{head}test bug, could not build the case: {outcome[1]}\n"
                             f"{outcome[2]}")
    if status == "raise":
        _, tname, msg, is_iae, is_type, tb, _ = outcome
        assert is_iae or is_type, (
            f"{head}raised {tname} (neither InvalidArgumentError nor TypeError): {msg}\n{tb}")
        assert meta.valid is not True, f"{head}a valid call was rejected: {tname}: {msg}"
        assert _names_pattern(case.op).search(msg) or DOCUMENTED.search(msg), (
            f"{head}{tname} message names no argument: {msg!r}")
        return "rejected"
    assert meta.valid is not False, f"{head}an invalid call was accepted"
    try:
        check_result(case, meta, outcome)
    except AssertionError as e:
        raise AssertionError(f"{head}{e}") from None
    return "computed"


# ------------------------------------------------------------------------ the worker

def warm_cases():
    """One valid call per CPU kernel the generators can reach (compiled before timing)."""
    out = []
    for dt in ("float32", "float64"):
        for fmt in ("NHWC", "NCHW"):
            for fh, fw in ((1, 1), (1, 3), (3, 3)):
                cf = fmt == "NCHW"
                x = Arr((1, 2, 4, 4) if cf else (1, 4, 4, 2), dt)
                w = Arr((fh, fw, 2, 1), dt)
                oh, ow = 4 - fh + 1, 4 - fw + 1
                dy = Arr((1, 2, oh, ow) if cf else (1, oh, ow, 2), dt)
                common = dict(strides=[1, 1, 1, 1], padding="VALID", data_format=fmt)
                out.append(Case("depthwise_conv2d_native", dict(input=x, filter=w, **common)))
                out.append(Case("depthwise_conv2d_native_backprop_input",
                                dict(input_sizes=list(x.shape), filter=w, out_backprop=dy,
                                     **common)))
                out.append(Case("depthwise_conv2d_native_backprop_filter",
                                dict(input=x, filter_sizes=list(w.shape), out_backprop=dy,
                                     **common)))
        for fmt in ("channels_last", "channels_first"):
            x = Arr((1, 2, 3, 3), dt)
            dk = Arr((1, 1, 3 if fmt == "channels_last" else 2, 1), dt)
            c = dk.shape[2]
            pk = Arr((1, 1, c, 2), dt)
            g = Arr((1, 2, 3, 2) if fmt == "channels_last" else (1, 2, 3, 3), dt)
            out.append(Case("separable_conv_grad", dict(
                inputs=x, depthwise_kernel=dk, pointwise_kernel=pk, out_grad=g,
                data_format=fmt)))
    return out


def _backend_available(name):
    from numbasep import backends
    try:
        backends.get(name)
    except Exception as e:  # noqa: BLE001 - any failure means "not available"
        return f"{type(e).__name__}: {e}"
    return None


@pytest.fixture(scope="module")
def worker():
    w = W.Worker(env={"NUMBASEP_MAX_BYTES": str(WORKER_LIMIT),
                      "NUMBASEP_WORKER_RLIMIT_AS": str(8 << 30)},
                 warm=warm_cases())
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def cuda_worker():
    """A separate worker for device cases: it needs no CPU warm-up."""
    w = W.Worker(env={"NUMBASEP_MAX_BYTES": str(WORKER_LIMIT),
                      "NUMBASEP_WORKER_RLIMIT_AS": str(8 << 30)})
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="module")
def stats():
    counts = {}
    yield counts
    total = sum(sum(v.values()) for v in counts.values())
    print(f"\nadversarial calls: {total}")
    for op, v in sorted(counts.items()):
        print(f"  {op}: {v}")


def _run(worker, stats, case, meta):
    timeout = CASE_TIMEOUT * (3 if meta.backend == "cuda" else 1)
    outcome = worker.run(case, timeout=timeout, retry_timeout=RETRY_TIMEOUT)
    verdict = check(case, meta, outcome)
    key = f"{case.op} [{meta.backend}]"
    stats.setdefault(key, {}).setdefault(verdict, 0)
    stats[key][verdict] += 1
    note(f"{verdict}: {case!r}")


@pytest.mark.parametrize("op", list(ALL_OPS))
@settings(max_examples=CPU_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_adversarial_cpu(worker, stats, op, data):
    case, meta = data.draw(cases(op, "cpu"), label="case")
    _run(worker, stats, case, meta)


@pytest.fixture(scope="module")
def cuda_ready():
    why = _backend_available("cuda")
    if why:
        pytest.skip(f"CUDA backend not available: {why}")


@pytest.mark.parametrize("op", list(ALL_OPS))
@settings(max_examples=CUDA_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_adversarial_cuda(cuda_ready, cuda_worker, stats, op, data):
    case, meta = data.draw(cases(op, "cuda"), label="case")
    _run(cuda_worker, stats, case, meta)


# ------------------------------------------------------------------ index safety
#
# Index arithmetic must be 64-bit everywhere: i = o*s - p + t*r reaches 2**32 and
# more with strides, dilations and paddings just under 2**31 (the largest values
# accepted), while every array stays tiny. Each case is computed and compared with
# the float64 reference (wrapped 32-bit indices would read the wrong pixels or out
# of bounds, or wrongly skip taps that are inside), or refused; values of 2**31 and
# beyond are refused naming the argument. On the CUDA simulator the kernels run
# as Python (no fixed-width overflow), so there the cases check the logic only;
# the CUDA kernels' index types are checked statically in test_cuda_index_types.

B31 = 2**31 - 1

# (label, input NHWC, filter, (sh, sw), padding, explicit (hb, ha, wb, wa), (rh, rw))
RAW_INDEX = [
    ("stride_2**31-1_valid", (2, 5, 6, 2), (2, 2, 2, 2), (B31, B31), "VALID", None, (1, 1)),
    ("stride_2**31-1_same", (2, 5, 6, 2), (2, 3, 2, 1), (B31, B31), "SAME", None, (1, 1)),
    ("dilation_2**31-1_same_3_taps", (1, 4, 5, 2), (3, 3, 2, 1), (1, 1), "SAME", None,
     (B31, B31)),
    ("dilation_2**31-1_stride_2", (1, 4, 5, 1), (2, 3, 1, 2), (2, 1), "SAME", None,
     (B31, 3)),
    ("padding_and_stride_2**31-1", (1, 3, 3, 2), (1, 1, 2, 1), (B31, B31), "EXPLICIT",
     (B31, B31, B31, B31), (1, 1)),
    ("padding_2**31-1_before_2_taps", (1, 3, 2, 2), (2, 1, 2, 1), (B31, 1), "EXPLICIT",
     (B31, 0, 0, 1), (B31 - 1, 1)),
    ("padding_2**31-1_empty_batch", (0, 1, 1, 2), (1, 1, 2, 1), (1, 1), "EXPLICIT",
     (B31, B31, 0, 0), (1, 1)),
    # rows of 32+ columns: channels-first problems run the channels-first kernels
    ("wide_dilation_2**31-1_same", (1, 2, 33, 2), (1, 3, 2, 1), (1, 1), "SAME", None,
     (1, B31)),
    ("wide_dilation_50_same", (2, 3, 40, 2), (1, 3, 2, 1), (1, 1), "SAME", None, (1, 50)),
    ("wide_padding_60", (1, 2, 34, 1), (2, 2, 1, 2), (1, 1), "EXPLICIT", (1, 0, 60, 0),
     (1, 1)),
    ("wide_dilation_2**31-1_rows", (1, 3, 32, 2), (3, 1, 2, 1), (1, 1), "SAME", None,
     (B31, 1)),
]
RAW_INDEX_REFUSED = [
    # (label, changes to a valid call, regex the message must match)
    ("stride_2**31", dict(strides=[1, 2**31, 1, 1]), r"strides"),
    ("stride_2**63-1", dict(strides=[1, 1, 2**63 - 1, 1]), r"strides"),
    ("stride_2**64", dict(strides=[1, 2**64, 1, 1]), r"strides"),
    ("dilation_2**31", dict(dilations=[1, 2**31, 1, 1]), r"dilations"),
    ("dilation_2**63", dict(dilations=[1, 1, 2**63, 1]), r"dilations"),
    ("padding_2**31", dict(padding="EXPLICIT", explicit_paddings=[0, 0, 2**31, 0, 0, 0, 0, 0]),
     r"explicit_paddings"),
    ("padding_2**63-1", dict(padding="EXPLICIT",
                             explicit_paddings=[0, 0, 0, 0, 0, 2**63 - 1, 0, 0]),
     r"explicit_paddings"),
    ("padding_-2**63", dict(padding="EXPLICIT", explicit_paddings=[0, 0, -2**63, 0, 0, 0, 0, 0]),
     r"explicit_paddings"),
    ("huge_output_batch_1", dict(padding="EXPLICIT",
                                 explicit_paddings=[0, 0, B31, B31, B31, B31, 0, 0]),
     r"output|memory"),
]


def _nchw(shape):
    return (shape[0], shape[3], shape[1], shape[2])


def _raw_index_case(op, label, xs, ws, s, padding, ex, r, fmt, dtype, backend, seed=3):
    kind = "device" if backend == "cuda" else "ndarray"
    cf = fmt == "NCHW"
    geo = ref.raw_geometry(_nchw(xs) if cf else xs, ws,
                           [1, 1, *s] if cf else [1, *s, 1], padding,
                           ([0, 0, 0, 0, *ex] if cf else [0, 0, *ex, 0, 0]) if ex else (),
                           fmt, [1, 1, *r] if cf else [1, *r, 1])
    out_shape = geo["output_shape"]
    fam = RAW_OPS[op]
    x_shape = _nchw(xs) if cf else xs
    kw = {}
    if fam in ("fwd", "bf"):
        kw["input"] = Arr(x_shape, dtype, seed, kind=kind)
    if fam == "bi":
        kw["input_sizes"] = list(x_shape)
    if fam in ("fwd", "bi"):
        kw["filter"] = Arr(ws, dtype, seed + 1, kind=kind)
    if fam == "bf":
        kw["filter_sizes"] = list(ws)
    if fam in ("bi", "bf"):
        kw["out_backprop"] = Arr(out_shape, dtype, seed + 2, kind=kind)
    kw.update(strides=[1, 1, *s] if cf else [1, *s, 1], padding=padding, data_format=fmt,
              dilations=[1, 1, *r] if cf else [1, *r, 1])
    if ex:
        kw["explicit_paddings"] = [0, 0, 0, 0, *ex] if cf else [0, 0, *ex, 0, 0]
    if backend == "cpu" and not op.startswith("raw_ops") and dtype in ("float32", "float64"):
        # the kernels write straight into a C-contiguous out: an out-of-bounds
        # write lands in the guard region after it
        res = {"fwd": out_shape, "bi": x_shape, "bf": ws}[fam]
        if res is not None and min(res) > 0:
            kw["out"] = Arr(res, dtype, 99, layout="guarded")
    meta = Meta(fam, backend)
    meta.op = op
    meta.valid = True
    meta.dtype = dtype
    return Case(op, kw, label), meta


def _index_run(worker, case, meta, timeout=None):
    timeout = timeout or CASE_TIMEOUT * (3 if meta.backend == "cuda" else 1)
    outcome = worker.run(case, timeout=timeout, retry_timeout=RETRY_TIMEOUT)
    return outcome, check(case, meta, outcome)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("op", ["depthwise_conv2d_native",
                                "depthwise_conv2d_native_backprop_input",
                                "depthwise_conv2d_native_backprop_filter"])
@pytest.mark.parametrize("label,xs,ws,s,padding,ex,r", RAW_INDEX, ids=[c[0] for c in RAW_INDEX])
def test_index_safety_raw(worker, op, fmt, label, xs, ws, s, padding, ex, r):
    """Strides, dilations and paddings of 2**31 - 1: computed exactly, never wrapped."""
    dtype = "float64" if fmt == "NCHW" else "float32"
    case, meta = _raw_index_case(op, label, xs, ws, s, padding, ex, r, fmt, dtype, "cpu")
    outcome, verdict = _index_run(worker, case, meta)
    assert verdict == "computed"


@pytest.mark.parametrize("label,changes,pattern", RAW_INDEX_REFUSED,
                         ids=[c[0] for c in RAW_INDEX_REFUSED])
@pytest.mark.parametrize("op", ["depthwise_conv2d_native",
                                "depthwise_conv2d_native_backprop_filter"])
def test_index_safety_raw_refused(worker, op, label, changes, pattern):
    """Values the index type cannot hold, and outputs no memory can, are refused up front."""
    case, meta = _raw_index_case(op, label, (1, 3, 3, 2), (1, 1, 2, 1), (1, 1), "VALID", None,
                                 (1, 1), "NHWC", "float32", "cpu")
    case.kwargs.update(changes)
    if RAW_OPS[op] == "bf":
        # keep out_backprop consistent with the geometry, so only the value is wrong
        case.kwargs["out_backprop"] = Arr((1, 3, 3, 2), "float32", 1)
    meta.valid = None
    outcome, verdict = _index_run(worker, case, meta)
    assert verdict == "rejected"
    assert outcome[3], f"not an InvalidArgumentError: {outcome[1]}: {outcome[2]}"
    assert re.search(pattern, outcome[2]), outcome[2]


KERAS_INDEX = [
    # (label, inputs channels_last, kernel, strides, padding, dilation_rate)
    ("stride_2**31-1_1d", (2, 5, 3), (2, 3, 1), B31, "valid", 1),
    ("wide_dilation_2**31-1_causal_1d", (1, 40, 2), (3, 2, 1), 1, "causal", B31),
    ("wide_dilation_2**31-1_same_2d", (1, 2, 33, 2), (1, 3, 2, 1), 1, "same", B31),
    ("dilation_2**31-1_same_2d", (1, 4, 5, 2), (3, 3, 2, 1), 1, "same", B31),
    ("dilation_2**31-1_causal_1d", (1, 6, 2), (3, 2, 2), 1, "causal", B31),
    ("stride_and_dilation_3d", (1, 2, 3, 4, 1), (2, 1, 3, 1, 2), (1, B31, 2), "same",
     (B31, 1, B31 - 2)),
]


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
@pytest.mark.parametrize("op", list(KERAS_OPS))
@pytest.mark.parametrize("label,xs,ks,strides,padding,dil", KERAS_INDEX,
                         ids=[c[0] for c in KERAS_INDEX])
def test_index_safety_keras(worker, op, fmt, label, xs, ks, strides, padding, dil):
    case, meta = _keras_index_case(op, xs, ks, strides, padding, dil, fmt, "cpu", label)
    outcome, verdict = _index_run(worker, case, meta)
    assert verdict == "computed"


def _keras_index_case(op, xs, ks, strides, padding, dil, fmt, backend, label, dtype="float32"):
    kind = "device" if backend == "cuda" else "ndarray"
    fam = KERAS_OPS[op]
    ndim = len(xs) - 2
    cf = fmt == "channels_first"
    x_shape = (xs[0], xs[-1]) + xs[1:-1] if cf else xs
    st_ = (strides,) * ndim if isinstance(strides, int) else strides
    dl_ = (dil,) * ndim if isinstance(dil, int) else dil
    outs = [ref.keras_output_and_pad(n, k, s_, r_, padding)[0]
            for n, k, s_, r_ in zip(xs[1:-1], ks[:ndim], st_, dl_)]
    c, m, f = ks[-2], ks[-1], 3
    ch = c * m if fam in ("dc", "dcg") else f
    out_shape = (xs[0], ch, *outs) if cf else (xs[0], *outs, ch)
    kw = {"inputs": Arr(x_shape, dtype, 11, kind=kind)}
    if fam in ("dc", "dcg"):
        kw["kernel"] = Arr(ks, dtype, 12, kind=kind)
    else:
        kw["depthwise_kernel"] = Arr(ks, dtype, 12, kind=kind)
        kw["pointwise_kernel"] = Arr((1,) * ndim + (c * m, f), dtype, 13, kind=kind)
    if fam in ("dcg", "scg"):
        kw["out_grad"] = Arr(out_shape, dtype, 14, kind=kind)
    kw.update(strides=strides, padding=padding, data_format=fmt, dilation_rate=dil)
    meta = Meta(fam, backend)
    meta.op = op
    meta.valid = True
    meta.dtype = dtype
    return Case(op, kw, label), meta


@pytest.mark.parametrize("op", ["depthwise_conv2d_native",
                                "depthwise_conv2d_native_backprop_input",
                                "depthwise_conv2d_native_backprop_filter"])
@pytest.mark.parametrize("label,xs,ws,s,padding,ex,r",
                         [c for c in RAW_INDEX if c[1][0] <= 1], ids=lambda v: None)
def test_index_safety_raw_cuda(cuda_ready, cuda_worker, op, label, xs, ws, s, padding, ex, r):
    case, meta = _raw_index_case(op, label, xs, ws, s, padding, ex, r, "NHWC", "float32",
                                 "cuda")
    outcome, verdict = _index_run(cuda_worker, case, meta)
    assert verdict == "computed"


@pytest.mark.parametrize("op", list(KERAS_OPS))
@pytest.mark.parametrize("label,xs,ks,strides,padding,dil", KERAS_INDEX[1:3],
                         ids=[c[0] for c in KERAS_INDEX[1:3]])
def test_index_safety_keras_cuda(cuda_ready, cuda_worker, op, label, xs, ks, strides,
                                 padding, dil):
    case, meta = _keras_index_case(op, xs, ks, strides, padding, dil, "channels_first",
                                   "cuda", label)
    outcome, verdict = _index_run(cuda_worker, case, meta)
    assert verdict == "computed"


def test_cuda_index_types(cuda_ready):
    """Every index in the CUDA kernels is computed in 64 bits.

    The simulator cannot show a 32-bit overflow, so this checks the kernels'
    source: each grid-stride loop starts from an ``np.int64`` index, and the
    thread/block registers (32-bit in CUDA) only ever enter arithmetic next to a
    64-bit operand. Scalar arguments (strides, dilations, paddings) are Python
    ints, which numba types as int64.
    """
    import inspect

    from numbasep.backends.cuda import kernels as ck
    src = inspect.getsource(ck)
    for m in re.finditer(r"^\s*(\w+) = (cuda\.grid\(1\)|cuda\.gridsize\(1\))", src, re.M):
        raise AssertionError(f"32-bit grid index: {m.group(0).strip()}")
    for m in re.finditer(r"(np\.int64\()?cuda\.(blockIdx|blockDim|gridDim)\.[xyz]", src):
        line = src[src.rfind("\n", 0, m.start()) + 1:src.find("\n", m.end())]
        if m.group(1) or "int64" in line or re.search(r"\+= cuda\.gridDim", line):
            continue
        raise AssertionError(f"32-bit block/grid register in index arithmetic: {line.strip()}")
