"""Slow, obviously-correct float64 references, written independently of numbasep.

Everything here works on channels-last float64 arrays ``x[N, *S, C]``,
``w[*K, C, M]`` and computes each tap of the kernel as a gather (forward, filter
gradient) or a scatter-add (input gradient) with NumPy. Output sizes and
paddings are derived here from the published formulas, not taken from
``numbasep.shapes``.
"""

import itertools
import math

import numpy as np


# ------------------------------------------------------------------ size arithmetic

def tf_output_and_pad(n, k, s, r, padding, explicit=(0, 0)):
    """TensorFlow's windowed output size and pad-before (C-style truncating division)."""
    eff = (k - 1) * r + 1
    if padding == "SAME":
        out = math.ceil(n / s)
        need = max(0, (out - 1) * s + eff - n)
        return out, need // 2
    pb, pa = explicit if padding == "EXPLICIT" else (0, 0)
    out = int((n + pb + pa - eff + s) / s)  # int() truncates toward zero
    return out, pb


def keras_output_and_pad(n, k, s, r, padding):
    eff = (k - 1) * r + 1
    if padding == "same":
        out = math.ceil(n / s)
        need = max(0, (out - 1) * s + eff - n)
        return out, need // 2
    if padding == "causal":
        return math.ceil(n / s), (k - 1) * r
    return (n - eff) // s + 1, 0


# ------------------------------------------------------------------ layout helpers

def to_last(a, channels_first):
    """Channels-first array -> channels-last view (no-op when already channels-last)."""
    if not channels_first:
        return a
    return np.moveaxis(a, 1, -1)


def to_first(a, channels_first):
    if not channels_first:
        return a
    return np.moveaxis(a, -1, 1)


# ------------------------------------------------------------------ the operators

def _tap_index(out_sizes, in_sizes, strides, dilations, pads, tap):
    """Per spatial dim: input index of every output position for kernel tap ``tap``, and validity."""
    idx, ok = [], []
    for d, t in enumerate(tap):
        i = np.arange(out_sizes[d]) * strides[d] - pads[d] + t * dilations[d]
        idx.append(i)
        ok.append((i >= 0) & (i < in_sizes[d]))
    return idx, ok


def _gather(x, idx, ok):
    """x[N, *S, C] -> xs[N, *O, C] for one tap, zeros where the tap falls outside."""
    xs = x
    for d, (i, v) in enumerate(zip(idx, ok)):
        size = x.shape[1 + d]
        if size == 0 or not v.any():
            shape = list(xs.shape)
            shape[1 + d] = len(i)
            xs = np.zeros(shape)
            continue
        xs = np.take(xs, np.clip(i, 0, size - 1), axis=1 + d)
        shape = [1] * xs.ndim
        shape[1 + d] = len(i)
        xs = xs * v.reshape(shape)
    return xs


def forward(x, w, strides, dilations, pads, out_sizes):
    """y[N, *O, C*M] = sum over taps of x[N, i(o, t), c] * w[t, c, m] (channels-last float64)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    ndim = x.ndim - 2
    N, C = x.shape[0], x.shape[-1]
    M = w.shape[-1]
    y = np.zeros((N, *out_sizes, C, M))
    for tap in itertools.product(*[range(k) for k in w.shape[:ndim]]):
        idx, ok = _tap_index(out_sizes, x.shape[1:-1], strides, dilations, pads, tap)
        xs = _gather(x, idx, ok)
        y += xs[..., None] * w[tap]
    return y.reshape(N, *out_sizes, C * M)


def backprop_filter(x, dy, kernel, strides, dilations, pads):
    """dW[t, c, m] = sum_n sum_o x[n, i(o, t), c] * dy[n, o, c*M + m]."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    ndim = x.ndim - 2
    C = x.shape[-1]
    M = dy.shape[-1] // C if C else 0
    out_sizes = dy.shape[1:-1]
    dyr = dy.reshape(*dy.shape[:-1], C, M)
    dw = np.zeros((*kernel, C, M))
    for tap in itertools.product(*[range(k) for k in kernel]):
        idx, ok = _tap_index(out_sizes, x.shape[1:-1], strides, dilations, pads, tap)
        xs = _gather(x, idx, ok)
        dw[tap] = (xs[..., None] * dyr).sum(axis=tuple(range(ndim + 1)))
    return dw


def backprop_input(input_shape, w, dy, strides, dilations, pads):
    """dX[n, i, c] = sum over (o, t) with i = o*s - p + t*r of dy[n, o, c*M+m] * w[t, c, m]."""
    w = np.asarray(w, np.float64)
    dy = np.asarray(dy, np.float64)
    ndim = len(input_shape) - 2
    C = input_shape[-1]
    M = w.shape[-1]
    out_sizes = dy.shape[1:-1]
    dyr = dy.reshape(*dy.shape[:-1], C, M)
    dx = np.zeros(input_shape)
    for tap in itertools.product(*[range(k) for k in w.shape[:ndim]]):
        idx, ok = _tap_index(out_sizes, input_shape[1:-1], strides, dilations, pads, tap)
        contrib = np.einsum("...cm,cm->...c", dyr, w[tap])
        # keep only output positions whose input index is inside, then scatter-add
        sel = np.ix_(*[np.nonzero(v)[0] for v in ok])
        contrib = contrib[(slice(None),) + sel + (slice(None),)]
        target = np.ix_(*[i[v] for i, v in zip(idx, ok)])
        np.add.at(dx, (slice(None),) + target + (slice(None),), contrib)
    return dx


def pointwise(z, pk):
    """out[n, *o, f] = sum_j z[n, *o, j] * pk[0, ..., 0, j, f]."""
    pk2 = np.asarray(pk, np.float64).reshape(pk.shape[-2], pk.shape[-1])
    return np.asarray(z, np.float64) @ pk2


def dense_matrix(x_shape, w, strides, dilations, pads, out_sizes):
    """The forward op as an explicit matrix (for tiny problems): y.ravel() = A @ x.ravel()."""
    size = int(np.prod(x_shape))
    cols = []
    for j in range(size):
        e = np.zeros(size)
        e[j] = 1.0
        cols.append(forward(e.reshape(x_shape), w, strides, dilations, pads, out_sizes).ravel())
    return np.stack(cols, axis=1)


# ------------------------------------------------------------------ Keras-style N-D wrappers
#
# The Keras operators take inputs in either layout, with int-or-tuple strides and
# dilations and a case-insensitive padding string. These wrappers resolve those
# from the published rules (independently of numbasep.shapes), move
# channels-first arrays to channels-last, call the float64 code above and move
# the results back.

def keras_geometry(in_sizes, kernel, strides, dilation_rate, padding):
    """Per spatial dim: (out_sizes, pads_before, strides, dilations) as tuples."""
    ndim = len(in_sizes)
    st = (strides,) * ndim if isinstance(strides, int) else tuple(strides)
    dl = (dilation_rate,) * ndim if isinstance(dilation_rate, int) else tuple(dilation_rate)
    outs, pads = [], []
    for n, k, s, r in zip(in_sizes, kernel, st, dl):
        o, p = keras_output_and_pad(n, k, s, r, padding.lower())
        outs.append(o)
        pads.append(p)
    return tuple(outs), tuple(pads), st, dl


def _spatial(x, channels_first):
    return x.shape[2:] if channels_first else x.shape[1:-1]


def keras_depthwise(x, w, strides=1, padding="valid", data_format="channels_last",
                    dilation_rate=1):
    cf = data_format == "channels_first"
    x = np.asarray(x, np.float64)
    ndim = x.ndim - 2
    outs, pads, st, dl = keras_geometry(_spatial(x, cf), w.shape[:ndim], strides,
                                        dilation_rate, padding)
    y = forward(to_last(x, cf), w, st, dl, pads, outs)
    return to_first(y, cf)


def pointwise_backprop_input(dout, pk):
    """dz[n, *o, j] = sum_f dout[n, *o, f] * pk[..., j, f] (channels-last)."""
    pk2 = np.asarray(pk, np.float64).reshape(pk.shape[-2], pk.shape[-1])
    return np.asarray(dout, np.float64) @ pk2.T


def pointwise_backprop_filter(z, dout, pk_shape):
    """dpk[..., j, f] = sum_n sum_o z[n, *o, j] * dout[n, *o, f] (channels-last)."""
    z = np.asarray(z, np.float64)
    dout = np.asarray(dout, np.float64)
    rows = int(np.prod(z.shape[:-1]))  # spelled out: reshape(-1, 0) is ambiguous
    z2 = z.reshape(rows, z.shape[-1])
    d2 = dout.reshape(rows, dout.shape[-1])
    return (z2.T @ d2).reshape(pk_shape)


def keras_separable(x, dk, pk, strides=1, padding="valid", data_format="channels_last",
                    dilation_rate=1):
    cf = data_format == "channels_first"
    z = to_last(keras_depthwise(x, dk, strides, padding, data_format, dilation_rate), cf)
    return to_first(pointwise(z, pk), cf)


def keras_depthwise_grad(x, w, dy, strides=1, padding="valid",
                         data_format="channels_last", dilation_rate=1):
    """(d_inputs, d_kernel) of keras_depthwise, in the layouts of x and w."""
    cf = data_format == "channels_first"
    x = np.asarray(x, np.float64)
    ndim = x.ndim - 2
    kernel = w.shape[:ndim]
    outs, pads, st, dl = keras_geometry(_spatial(x, cf), kernel, strides, dilation_rate,
                                        padding)
    xl = to_last(x, cf)
    dyl = to_last(np.asarray(dy, np.float64), cf)
    dx = backprop_input(xl.shape, w, dyl, st, dl, pads)
    if w.shape[-2] == 0:  # no channels: backprop_filter cannot tell M from dy
        dw = np.zeros(w.shape)
    else:
        dw = backprop_filter(xl, dyl, kernel, st, dl, pads)
    return to_first(dx, cf), dw


def keras_separable_grad(x, dk, pk, dout, strides=1, padding="valid",
                         data_format="channels_last", dilation_rate=1):
    """(d_inputs, d_depthwise_kernel, d_pointwise_kernel) of keras_separable."""
    cf = data_format == "channels_first"
    z = to_last(keras_depthwise(x, dk, strides, padding, data_format, dilation_rate), cf)
    doutl = to_last(np.asarray(dout, np.float64), cf)
    dpk = pointwise_backprop_filter(z, doutl, pk.shape)
    dz = pointwise_backprop_input(doutl, pk)
    dx, ddk = keras_depthwise_grad(x, dk, to_first(dz, cf), strides, padding, data_format,
                                   dilation_rate)
    return dx, ddk, dpk


# ------------------------------------------------------------------ TensorFlow raw-op wrappers
#
# The tf.raw_ops.DepthwiseConv2dNative* family: 4-D tensors in NHWC or NCHW,
# strides / dilations / explicit_paddings in data_format order. Geometry is
# resolved from SPEC section 3 with exact integer arithmetic (independently of
# numbasep.shapes); the arrays are moved to channels-last for the code above.

_RAW_SPATIAL = {"NHWC": (1, 2), "NCHW": (2, 3)}
_RAW_CHANNEL = {"NHWC": 3, "NCHW": 1}


def tf_output_exact(n, k, s, r, padding, explicit=(0, 0)):
    """(out, pad_before, pad_after) for one dimension, exactly; ``out`` may be negative.

    The same formulas as :func:`tf_output_and_pad`, but with integer arithmetic only
    (``int(a / s)`` in floating point misrounds once ``a`` exceeds 2**53).
    """
    eff = (k - 1) * r + 1
    if padding == "SAME":
        out = -((-n) // s)                      # ceil(n / s) for n >= 0
        need = max(0, (out - 1) * s + eff - n)
        return out, need // 2, need - need // 2
    pb, pa = explicit if padding == "EXPLICIT" else (0, 0)
    a = n + pb + pa - eff + s
    out = abs(a) // s * (1 if a >= 0 else -1)   # C division: truncate toward zero
    return out, pb, pa


def raw_geometry(input_shape, filter_shape, strides, padding, explicit_paddings=(),
                 data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Resolve the raw-op attributes: dict with 2-tuples strides, dilations, pads_before,
    pads_after, in_sizes, out_sizes (rows, cols), plus batch, channels, multiplier and
    output_shape (in data_format order; None when an output size is negative)."""
    hax, wax = _RAW_SPATIAL[data_format]
    cax = _RAW_CHANNEL[data_format]
    g = {"strides": (strides[hax], strides[wax]),
         "dilations": (dilations[hax], dilations[wax])}
    outs, pbs, pas, ins = [], [], [], []
    for i, ax in enumerate((hax, wax)):
        ex = ((explicit_paddings[2 * ax], explicit_paddings[2 * ax + 1])
              if padding == "EXPLICIT" else (0, 0))
        o, pb, pa = tf_output_exact(input_shape[ax], filter_shape[i], g["strides"][i],
                                    g["dilations"][i], padding, ex)
        outs.append(o)
        pbs.append(pb)
        pas.append(pa)
        ins.append(input_shape[ax])
    g.update(out_sizes=tuple(outs), pads_before=tuple(pbs), pads_after=tuple(pas),
             in_sizes=tuple(ins), batch=input_shape[0], channels=input_shape[cax],
             multiplier=filter_shape[3])
    if min(outs) < 0:
        g["output_shape"] = None
    else:
        cm = input_shape[cax] * filter_shape[3]
        g["output_shape"] = ((input_shape[0], outs[0], outs[1], cm) if data_format == "NHWC"
                             else (input_shape[0], cm, outs[0], outs[1]))
    return g


def raw_forward(x, w, strides, padding, explicit_paddings=(), data_format="NHWC",
                dilations=(1, 1, 1, 1)):
    """float64 DepthwiseConv2dNative."""
    cf = data_format == "NCHW"
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    g = raw_geometry(x.shape, w.shape, strides, padding, explicit_paddings, data_format,
                     dilations)
    if x.size == 0 or w.size == 0:      # a sum over nothing (sizes may be huge)
        return np.zeros(g["output_shape"])
    y = forward(to_last(x, cf), w, g["strides"], g["dilations"], g["pads_before"],
                g["out_sizes"])
    return to_first(y, cf)


def raw_backprop_input(input_sizes, w, dy, strides, padding, explicit_paddings=(),
                       data_format="NHWC", dilations=(1, 1, 1, 1)):
    """float64 DepthwiseConv2dNativeBackpropInput (dilations honoured)."""
    cf = data_format == "NCHW"
    w = np.asarray(w, np.float64)
    dy = np.asarray(dy, np.float64)
    input_sizes = tuple(int(v) for v in input_sizes)
    g = raw_geometry(input_sizes, w.shape, strides, padding, explicit_paddings, data_format,
                     dilations)
    if w.size == 0 or dy.size == 0:
        return np.zeros(input_sizes)
    last_shape = to_last(np.empty(input_sizes), cf).shape
    dx = backprop_input(last_shape, w, to_last(dy, cf), g["strides"], g["dilations"],
                        g["pads_before"])
    return to_first(dx, cf)


def raw_backprop_filter(x, filter_sizes, dy, strides, padding, explicit_paddings=(),
                        data_format="NHWC", dilations=(1, 1, 1, 1)):
    """float64 DepthwiseConv2dNativeBackpropFilter (dilations honoured)."""
    cf = data_format == "NCHW"
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    filter_sizes = tuple(int(v) for v in filter_sizes)
    g = raw_geometry(x.shape, filter_sizes, strides, padding, explicit_paddings, data_format,
                     dilations)
    if 0 in filter_sizes or x.size == 0 or dy.size == 0:
        return np.zeros(filter_sizes)
    return backprop_filter(to_last(x, cf), to_last(dy, cf), filter_sizes[:2], g["strides"],
                           g["dilations"], g["pads_before"])
