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
        dw[tap] = (xs[..., None] * dyr).reshape(-1, C, M).sum(axis=0)
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
