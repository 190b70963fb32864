"""A compact float64 reference used by ``python -m numbasep check``.

It shares no code with the kernels or with :mod:`numbasep.shapes`: output sizes
and paddings come from the published formulas (SPEC section 3) and every
operator is computed tap by tap with NumPy. For a kernel tap ``t`` the input
positions it reads form a strided slice of the zero-padded input, so

* forward:         ``y[..., c, m] += xpad[slice(t)][..., c] * w[t, c, m]``
* filter gradient: ``dw[t, c, m]   = sum over n, o of xpad[slice(t)][..., c] * dy[..., c, m]``
* input gradient:  ``dxpad[slice(t)][..., c] += sum over m of dy[..., c, m] * w[t, c, m]``

Arrays here are channels-last float64: ``x[N, *S, C]``, ``w[*K, C, M]``,
``y[N, *O, C*M]``; the ``*_cf`` helpers move the channel axis for
channels-first callers.
"""

import itertools
import math

import numpy as np

# ------------------------------------------------------------------ geometry


def tf_geometry(n, k, s, r, padding, explicit=(0, 0)):
    """Output size and pad-before of one spatial dim for TensorFlow's raw ops."""
    eff = (k - 1) * r + 1
    if padding == "SAME":
        out = -(-n // s)
        need = max(0, (out - 1) * s + eff - n)
        return out, need // 2
    before, after = explicit if padding == "EXPLICIT" else (0, 0)
    total = n + before + after - eff + s
    out = total // s if total >= 0 else -((-total) // s)  # C-style truncation
    return out, before


def keras_geometry(n, k, s, r, padding):
    """Output size and pad-before of one spatial dim for the Keras-style ops."""
    eff = (k - 1) * r + 1
    padding = padding.lower()
    if padding == "same":
        return tf_geometry(n, k, s, r, "SAME")
    if padding == "causal":
        return -(-n // s), (k - 1) * r
    return (n - eff) // s + 1, 0


# ------------------------------------------------------------------ helpers


def _padded(x, k_sizes, strides, dilations, pads, out_sizes):
    """Zero-pad ``x[N, *S, C]`` so that every tap's slice lies inside it."""
    widths = [(0, 0)]
    for d, n in enumerate(x.shape[1:-1]):
        last = (out_sizes[d] - 1) * strides[d] + (k_sizes[d] - 1) * dilations[d]
        widths.append((pads[d], max(0, last + 1 - pads[d] - n)))
    widths.append((0, 0))
    return np.pad(x, widths), widths


def _tap_slices(tap, strides, dilations, out_sizes):
    sl = [slice(None)]
    for d, t in enumerate(tap):
        start = t * dilations[d]
        sl.append(slice(start, start + out_sizes[d] * strides[d], strides[d]))
    sl.append(slice(None))
    return tuple(sl)


# ------------------------------------------------------------------ operators


def depthwise_forward(x, w, strides, dilations, pads, out_sizes):
    """``y[N, *O, C*M]`` of a depthwise convolution (channels-last, float64)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c = x.shape[0], x.shape[-1]
    k_sizes, m = w.shape[:-2], w.shape[-1]
    y = np.zeros((n, *out_sizes, c, m))
    if y.size == 0:
        return y.reshape(n, *out_sizes, c * m)
    xp, _ = _padded(x, k_sizes, strides, dilations, pads, out_sizes)
    for tap in itertools.product(*(range(k) for k in k_sizes)):
        xs = xp[_tap_slices(tap, strides, dilations, out_sizes)]
        y += xs[..., None] * w[tap]
    return y.reshape(n, *out_sizes, c * m)


def depthwise_backprop_filter(x, dy, k_sizes, m, strides, dilations, pads):
    """``dw[*K, C, M]``: gradient of :func:`depthwise_forward` w.r.t. its filter."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    n, c = x.shape[0], x.shape[-1]
    out_sizes = dy.shape[1:-1]
    dw = np.zeros((*k_sizes, c, m))
    if dy.size == 0 or x.size == 0:
        return dw
    dy = dy.reshape(n, *out_sizes, c, m)
    xp, _ = _padded(x, k_sizes, strides, dilations, pads, out_sizes)
    axes = tuple(range(len(out_sizes) + 1))
    for tap in itertools.product(*(range(k) for k in k_sizes)):
        xs = xp[_tap_slices(tap, strides, dilations, out_sizes)]
        dw[tap] = np.sum(xs[..., None] * dy, axis=axes)
    return dw


def depthwise_backprop_input(in_shape, w, dy, strides, dilations, pads):
    """``dx`` of shape ``in_shape`` (channels-last): gradient w.r.t. the input."""
    w = np.asarray(w, np.float64)
    dy = np.asarray(dy, np.float64)
    n, c = in_shape[0], in_shape[-1]
    k_sizes, m = w.shape[:-2], w.shape[-1]
    out_sizes = dy.shape[1:-1]
    dx = np.zeros(in_shape)
    if dy.size == 0 or dx.size == 0:
        return dx
    dy = dy.reshape(n, *out_sizes, c, m)
    dxp, widths = _padded(dx, k_sizes, strides, dilations, pads, out_sizes)
    for tap in itertools.product(*(range(k) for k in k_sizes)):
        dxp[_tap_slices(tap, strides, dilations, out_sizes)] += np.einsum(
            "...cm,cm->...c", dy, w[tap])
    crop = tuple(slice(b, b + size) for (b, _), size in zip(widths, in_shape))
    return dxp[crop]


def pointwise(z, pk):
    """``z[N, *O, J] @ pk[..., J, F]`` (pk's leading 1-sized dims ignored)."""
    return np.asarray(z, np.float64) @ np.asarray(pk, np.float64).reshape(pk.shape[-2:])


# ------------------------------------------------------------------ layouts


def to_last(a):
    """Channels-first ``[N, C, *S]`` -> channels-last ``[N, *S, C]``."""
    return np.moveaxis(a, 1, -1)


def to_first(a):
    """Channels-last ``[N, *S, C]`` -> channels-first ``[N, C, *S]``."""
    return np.moveaxis(a, -1, 1)


# ------------------------------------------------------------------ Keras-style wrappers


def _keras_plan(x_last, k_sizes, strides, dilations, padding):
    geo = [keras_geometry(n, k, s, r, padding)
           for n, k, s, r in zip(x_last.shape[1:-1], k_sizes, strides, dilations)]
    return [g[0] for g in geo], [g[1] for g in geo]


def keras_depthwise(x, w, strides, padding, channels_first, dilations):
    """Forward, backward-free reference of ``depthwise_conv`` (float64)."""
    xl = to_last(x) if channels_first else x
    out_sizes, pads = _keras_plan(xl, w.shape[:-2], strides, dilations, padding)
    y = depthwise_forward(xl, w, strides, dilations, pads, out_sizes)
    return to_first(y) if channels_first else y


def keras_depthwise_grad(x, w, dy, strides, padding, channels_first, dilations):
    """``(d_inputs, d_kernel)`` reference of ``depthwise_conv_grad`` (float64)."""
    xl = to_last(x) if channels_first else x
    dyl = to_last(dy) if channels_first else dy
    _, pads = _keras_plan(xl, w.shape[:-2], strides, dilations, padding)
    dx = depthwise_backprop_input(xl.shape, w, dyl, strides, dilations, pads)
    dw = depthwise_backprop_filter(xl, dyl, w.shape[:-2], w.shape[-1], strides, dilations, pads)
    return (to_first(dx) if channels_first else dx), dw


def keras_separable(x, dk, pk, strides, padding, channels_first, dilations):
    """Reference of ``separable_conv`` (float64)."""
    xl = to_last(x) if channels_first else x
    out_sizes, pads = _keras_plan(xl, dk.shape[:-2], strides, dilations, padding)
    y = pointwise(depthwise_forward(xl, dk, strides, dilations, pads, out_sizes), pk)
    return to_first(y) if channels_first else y


def keras_separable_grad(x, dk, pk, dy, strides, padding, channels_first, dilations):
    """``(d_inputs, d_depthwise_kernel, d_pointwise_kernel)`` reference (float64)."""
    xl = to_last(x) if channels_first else x
    dyl = np.asarray(to_last(dy) if channels_first else dy, np.float64)
    out_sizes, pads = _keras_plan(xl, dk.shape[:-2], strides, dilations, padding)
    z = depthwise_forward(xl, dk, strides, dilations, pads, out_sizes)
    j, f = pk.shape[-2:]
    dpk = (z.reshape(-1, j).T @ dyl.reshape(-1, f)).reshape(pk.shape)
    dz = dyl @ np.asarray(pk, np.float64).reshape(j, f).T
    dx = depthwise_backprop_input(xl.shape, dk, dz, strides, dilations, pads)
    ddk = depthwise_backprop_filter(xl, dz, dk.shape[:-2], dk.shape[-1], strides, dilations,
                                    pads)
    return (to_first(dx) if channels_first else dx), ddk, dpk


# ------------------------------------------------------------------ TensorFlow raw ops


def _raw_attrs(shape4, strides, padding, explicit_paddings, data_format, dilations, k_sizes):
    """Spatial sizes, strides, dilations, pads and output sizes of a raw op (2-D)."""
    if data_format == "NCHW":
        sp, st, di = (2, 3), strides[2:], dilations[2:]
    else:
        sp, st, di = (1, 2), strides[1:3], dilations[1:3]
    geo = []
    for i, d in enumerate(sp):
        explicit = tuple(explicit_paddings[2 * d:2 * d + 2]) if padding == "EXPLICIT" else (0, 0)
        geo.append(tf_geometry(shape4[d], k_sizes[i], st[i], di[i], padding, explicit))
    return list(st), list(di), [g[1] for g in geo], [g[0] for g in geo]


def raw_forward(x, w, strides, padding, explicit_paddings=(), data_format="NHWC",
                dilations=(1, 1, 1, 1)):
    """Reference of ``DepthwiseConv2dNative`` (float64)."""
    cf = data_format == "NCHW"
    st, di, pads, out_sizes = _raw_attrs(x.shape, strides, padding, explicit_paddings,
                                         data_format, dilations, w.shape[:2])
    y = depthwise_forward(to_last(x) if cf else x, w, st, di, pads, out_sizes)
    return to_first(y) if cf else y


def raw_backprop_input(input_sizes, w, dy, strides, padding, explicit_paddings=(),
                       data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Reference of ``DepthwiseConv2dNativeBackpropInput`` (float64), dilations honoured."""
    cf = data_format == "NCHW"
    st, di, pads, _ = _raw_attrs(tuple(input_sizes), strides, padding, explicit_paddings,
                                 data_format, dilations, w.shape[:2])
    shape_last = tuple(to_last(np.empty(input_sizes, np.int8)).shape) if cf \
        else tuple(input_sizes)
    dx = depthwise_backprop_input(shape_last, w, to_last(dy) if cf else dy, st, di, pads)
    return to_first(dx) if cf else dx


def raw_backprop_filter(x, filter_sizes, dy, strides, padding, explicit_paddings=(),
                        data_format="NHWC", dilations=(1, 1, 1, 1)):
    """Reference of ``DepthwiseConv2dNativeBackpropFilter`` (float64), dilations honoured."""
    cf = data_format == "NCHW"
    st, di, pads, _ = _raw_attrs(x.shape, strides, padding, explicit_paddings, data_format,
                                 dilations, filter_sizes[:2])
    return depthwise_backprop_filter(to_last(x) if cf else x, to_last(dy) if cf else dy,
                                     tuple(filter_sizes[:2]), filter_sizes[3], st, di, pads)


def max_error(got, ref):
    """``max |got - ref| / (1 + |ref|)`` in float64: within ``tol`` means
    ``|got - ref| <= tol * (1 + |ref|)``, i.e. ``atol = rtol = tol``. NaN counts as infinite."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.size == 0:
        return 0.0
    err = np.abs(got - ref) / (1.0 + np.abs(ref))
    if not np.all(np.isfinite(err)):
        return math.inf
    return float(err.max())
