"""Channels-last forward and input gradient of small maps, 8 channels at a time
across each row.

The row kernels of :mod:`.kernels` compute a channels-last output pixel by pixel,
all channels at a time, loading each tap's weights again for every pixel: on
small maps that loop is bound by its loads. Here each output row's interior is
computed 8 channels at a time across the row with :func:`.simd.taps_row8`, the
taps' weights held in registers; rows whose window reaches past the top or
bottom of the map sum the taps of the window rows inside it (fewer taps, same
order), and the columns whose window reaches past the sides go through the
row kernels' generic helpers. Products are formed and summed exactly as the
row kernels form and sum them (taps in (kh, kw) order, unfused), so the results
are the same; no product with the padding is ever formed.

They serve 2-D (and 1-D) problems with depth multiplier 1 and a multiple of 8
channels, on maps whose row interiors are short (the driver's
``_lanes_pay`` says which); longer rows stay faster on the row kernels, which
read each pixel's channels in one sweep.
"""

import numpy as np
from numba import literally, njit, prange

from .kernels import _bin_cl_sides, _fwd_cl_sides, _interior, _split
from .simd import taps_row8 as _taps_row8

#: Window shapes with lane kernels.
WINDOWS = frozenset({(3, 3), (5, 5)})


@njit(inline="always")
def _taps_inside(i0, r, K, size):
    """[k0, k1): the taps k of a window whose tap k sits at ``i0 + k*r`` that fall
    in [0, size) (a contiguous range, possibly empty)."""
    k0 = 0
    while k0 < K and not 0 <= i0 + k0 * r < size:
        k0 += 1
    k1 = k0
    while k1 < K and 0 <= i0 + k1 * r < size:
        k1 += 1
    return k0, k1


@njit(inline="always")
def _lane_taps(w, row_step, col_step, C):
    """(tap offsets, weights): tap (kh, kw) of a pixel lies ``kh*row_step +
    kw*col_step`` pixels from it, ``C`` elements per pixel; the weights are ``w``
    flat, ``[tap, channel]`` (depth multiplier 1)."""
    KH, KW = w.shape[1], w.shape[2]
    toffs = np.empty(KH * KW, np.int64)
    for kh in range(KH):
        for kw in range(KW):
            toffs[kh * KW + kw] = (kh * row_step + kw * col_step) * C
    return toffs, w.reshape(w.size)


@njit(nogil=True, cache=True)
def _row(dst, d0, src, s0, sstep, toffs, wt, C, run, k0, k1, KW, T1, T2, T3, T4, T5):
    """``run`` output pixels from ``dst[d0]`` on, ``C`` apart, 8 channels at a
    time, summing the taps of window rows [k0, k1) of a window of KW columns and
    at most 5 rows (pixel k's taps at ``src[s0 + k*sstep + toffs[t]]``). False,
    with nothing written, for a count of rows it has no unrolled form for.

    ``T1``-``T5``: the tap counts of 1-5 window rows, compile-time constants
    (``literally``) for the register intrinsic. (A module-level function:
    a helper built inside the kernel factory would be a closure variable of the
    kernels, which Numba's cache cannot key, so they would compile in every
    process.)"""
    literally(T1)
    literally(T2)
    literally(T3)
    literally(T4)
    literally(T5)
    rows = k1 - k0
    if rows == 0:
        for k in range(run * C):
            dst[d0 + k] = 0
        return True
    if rows > 5:
        return False
    t = toffs[k0 * KW:]
    for g in range(0, C, 8):
        w0 = k0 * KW * C + g
        if rows == 1:
            _taps_row8(dst, d0 + g, C, src, s0 + g, sstep, t, wt, w0, C, run, T1)
        elif rows == 2:
            _taps_row8(dst, d0 + g, C, src, s0 + g, sstep, t, wt, w0, C, run, T2)
        elif rows == 3:
            _taps_row8(dst, d0 + g, C, src, s0 + g, sstep, t, wt, w0, C, run, T3)
        elif rows == 4:
            _taps_row8(dst, d0 + g, C, src, s0 + g, sstep, t, wt, w0, C, run, T4)
        else:
            _taps_row8(dst, d0 + g, C, src, s0 + g, sstep, t, wt, w0, C, run, T5)
    return True


def _build(KH, KW):
    # the tap counts of 1 to 5 window rows (WINDOWS have at most 5)
    T1, T2, T3, T4, T5 = (k * KW for k in range(1, 6))

    @njit(parallel=True, nogil=True, cache=True)
    def forward(x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``forward_cl``, for ``x[N, 1, H, W, C]``,
        ``w[1, KH, KW, C, 1]``, C a multiple of 8."""
        N, D, H, W, C = x.shape
        _, OD, OH, OW, _ = y.shape
        a, b = _interior(W, pw, KW, rw, sw, OW)
        toffs, wt = _lane_taps(w, W * rh, rw, C)
        xf = x.reshape(N * D * H * W * C)
        yf = y.reshape(N * OD * OH * OW * C)
        for job in prange(N * OD * OH):
            nd, oh = _split(job, OH)
            n, od = _split(nd, OD)
            yrow = y[n, od, oh]
            ih0 = oh * sh - ph
            k0, k1 = _taps_inside(ih0, rh, KH, H)
            s0 = ((n * H + ih0) * W + a * sw - pw) * C
            done = a < b and _row(yf, (job * OW + a) * C, xf, s0, sw * C, toffs, wt, C, b - a,
                                  k0, k1, KW, T1, T2, T3, T4, T5)
            _fwd_cl_sides(x, w, yrow, n, od, oh, a if done else 0, b if done else 0,
                          sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(parallel=True, nogil=True, cache=True)
    def backprop_input(dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``backprop_input_cl``, stride 1, for
        ``dy[N, 1, OH, OW, C]``, ``w[1, KH, KW, C, 1]``, C a multiple of 8: in
        gather form, dx[ih, iw] = sum over taps of dy[ih + ph - kh*rh, iw + pw -
        kw*rw] * w[kh, kw] (taps reach back: negative offsets)."""
        N, D, H, W, C = dx.shape
        _, OD, OH, OW, _ = dy.shape
        # the interior: every tap's column inside dy
        a = max(0, (KW - 1) * rw - pw)
        b = min(W, OW - pw)
        toffs, wt = _lane_taps(w, -OW * rh, -rw, C)
        dyf = dy.reshape(N * OD * OH * OW * C)
        dxf = dx.reshape(N * D * H * W * C)
        for job in prange(N * D * H):
            nd, ih = _split(job, H)
            n, id_ = _split(nd, D)
            dxrow = dx[n, id_, ih]
            oh0 = ih + ph
            k0, k1 = _taps_inside(oh0, -rh, KH, OH)
            s0 = ((n * OH + oh0) * OW + a + pw) * C
            done = a < b and _row(dxf, (job * W + a) * C, dyf, s0, C, toffs, wt, C, b - a,
                                  k0, k1, KW, T1, T2, T3, T4, T5)
            _bin_cl_sides(dy, w, dxrow, n, id_, ih, a if done else 0, b if done else 0,
                          sd, sh, sw, rd, rh, rw, pd, ph, pw)

    return forward, backprop_input


class LaneKernels:
    """The lane kernels for one window shape: ``forward`` and ``backprop_input``."""

    def __init__(self, KH, KW):
        self.forward, self.backprop_input = _build(KH, KW)


_sets = {}


def kernels(KH, KW):
    """The lane kernels for a KH x KW window of ``WINDOWS``."""
    key = (KH, KW)
    if key not in _sets:
        _sets[key] = LaneKernels(*key)
    return _sets[key]
