"""Numba CPU kernels for depthwise convolution on canonical 5-D arrays.

Every rank is computed as a 3-D problem (1-D and 2-D problems have size-1 leading
spatial dimensions). Channels-last arrays are ``x[N, D, H, W, C]``,
``y[N, OD, OH, OW, C*M]``; channels-first ones ``x[N, C, D, H, W]``,
``y[N, C*M, OD, OH, OW]``; filters are always ``w[KD, KH, KW, C, M]``.

Arrays reach the kernels C-contiguous, in their accumulation dtype (float32 or
float64); the driver widens 16-bit formats. Outputs are fully overwritten, so
they may be uninitialised on entry.

Two paths share every kernel:

* the *generic* row helpers (``_*_row``) handle any window, checking each tap
  against the input borders; they serve every border and any filter shape;
* :func:`kernel_set` builds kernels for one filter shape (KH, KW) known at
  compile time, so that the tap loops unroll and the channel (channels-last) or
  column (channels-first) loop vectorises; the unrolled path covers the interior
  of 2-D/1-D problems with depth multiplier 1 and hands borders to the generic
  helpers. ``kernel_set(0, 0)`` is the generic-only set.

Taps are always summed in the order (kd, kh, kw), so both paths give the same
sums. The correlations, in either layout, add each product with a fused
multiply-add (:func:`.simd.fma`, one rounding per tap; the first product is
rounded alone), as the lane, tile and plane kernels do: every route, in either
layout, gives the same floats (tests/test_layout_bits.py). Each kernel is a
:class:`.tasks.Parallel`: one row or plane of its result (a part of its rows,
for the filter gradient) is a task, compiled on its own and run in parallel by
address. Kernels release the GIL (``nogil=True``): Python threads may call the
operators concurrently; each call owns its output and scratch buffers. Parallel
tasks own the outputs they write: no atomics, no races. The filter gradient sums
per-chunk partial filters in a fixed order, with a chunking that depends on the
problem only, never on the thread count, so results are bitwise reproducible.
"""

import numpy as np
from numba import njit

from .halves import value as _val
from .simd import fma as _fma
from .cache_key import instance as _instance
from .tasks import Parallel

# Reductions over a contiguous run may be reassociated so that they vectorise;
# NaN and Inf still propagate (no 'nnan' / 'ninf').
_REDUCE_MATH = {"reassoc", "contract"}

# Filter shapes (KH, KW) that get unrolled kernels when KD == 1.
UNROLLED = frozenset({(3, 3), (5, 5), (7, 7), (1, 3), (1, 5)})


@njit(inline="always")
def _first_valid(pad, k, r, s):
    """Smallest output index o >= 0 with o*s - pad + k*r >= 0."""
    t = pad - k * r
    if t <= 0:
        return 0
    return (t + s - 1) // s


@njit(inline="always")
def _end_valid(size, pad, k, r, s, out_size):
    """One past the largest o with o*s - pad + k*r < size, capped at out_size."""
    t = size - 1 + pad - k * r
    if t < 0:
        return 0
    e = t // s + 1
    return e if e < out_size else out_size


@njit(inline="always")
def _u(i):
    """An index known to be in range, as unsigned: Numba then emits no negative-index
    wraparound, so loads along it stay contiguous and the loop vectorises."""
    return np.uint64(i)


@njit(inline="always")
def _split(job, b):
    return job // b, job % b


@njit(inline="always")
def _interior(size, pad, k, r, s, out_size):
    """Output range [a, b) where all k taps of a window fall inside the input."""
    a = _first_valid(pad, 0, r, s)
    if a > out_size:
        a = out_size
    b = _end_valid(size, pad, k - 1, r, s, out_size)
    if b < a:
        b = a
    return a, b


@njit(inline="always")
def _row_origin(row, OD, OH, sd, sh, pd, ph):
    """Output row ``row`` of the (n, od, oh) rows in order: n, od, oh, and the
    input depth and input row its window's first tap reads."""
    nd, oh = _split(row, OH)
    n, od = _split(nd, OD)
    return n, od, oh, od * sd - pd, oh * sh - ph


@njit(inline="always")
def _unrolled_row(unroll, M, KD, a, b, id_, D, ih0, KH, rh, H):
    """Whether a channels-last output row takes the unrolled interior loop: the
    window unrolled, depth multiplier 1, a 2-D window, some interior columns
    [a, b), and every tap row of its window inside the input."""
    return (unroll and M == 1 and KD == 1 and a < b and 0 <= id_ < D and ih0 >= 0
            and ih0 + (KH - 1) * rh < H)


@njit(inline="always")
def _clip(lo, hi, a, b):
    lo = a if a > lo else lo
    hi = b if b < hi else hi
    return lo, hi


def partial_chunks(rows, filter_elems):
    """Fixed number of partial filters for the filter gradient (independent of threads)."""
    cap = max(1, (1 << 22) // max(1, filter_elems))
    return max(1, min(rows, 64, cap))


# ------------------------------------------------------------- generic row helpers

@njit(inline="always")
def _fwd_cl_row(x, w, yrow, n, od, oh, o_lo, o_hi, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """Add every in-range tap into yrow[o_lo:o_hi] (channels-last)."""
    D, H, W, C = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW, M = w.shape[0], w.shape[1], w.shape[2], w.shape[4]
    OW = yrow.shape[0]
    for kd in range(KD):
        id_ = od * sd - pd + kd * rd
        if id_ < 0 or id_ >= D:
            continue
        for kh in range(KH):
            ih = oh * sh - ph + kh * rh
            if ih < 0 or ih >= H:
                continue
            xrow = x[n, id_, ih]
            for kw in range(KW):
                lo, hi = _clip(o_lo, o_hi, _first_valid(pw, kw, rw, sw),
                               _end_valid(W, pw, kw, rw, sw, OW))
                off = kw * rw - pw
                if M == 1:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            yrow[ow, c] = _fma(_val(xrow[iw, c]), w[kd, kh, kw, c, 0],
                                               yrow[ow, c])
                else:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            xv = _val(xrow[iw, c])
                            for m in range(M):
                                yrow[ow, c * M + m] = _fma(xv, w[kd, kh, kw, c, m],
                                                           yrow[ow, c * M + m])


@njit(inline="always")
def _fwd_cl_sides(x, w, yrow, n, od, oh, a, b, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """A channels-last output row's columns outside [a, b), whose interior is done:
    zeroed, then summed by the generic helper (a = b = 0: the whole row)."""
    yrow[:a, :] = 0
    yrow[b:, :] = 0
    _fwd_cl_row(x, w, yrow, n, od, oh, 0, a, sd, sh, sw, rd, rh, rw, pd, ph, pw)
    _fwd_cl_row(x, w, yrow, n, od, oh, b, yrow.shape[0], sd, sh, sw, rd, rh, rw, pd, ph, pw)


@njit(inline="always")
def _fwd_cf_row(x, w, yrow, n, c, m, od, oh, o_lo, o_hi, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """Add every in-range tap into yrow[o_lo:o_hi] (channels-first, one channel)."""
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW = w.shape[0], w.shape[1], w.shape[2]
    OW = yrow.shape[0]
    for kd in range(KD):
        id_ = od * sd - pd + kd * rd
        if id_ < 0 or id_ >= D:
            continue
        for kh in range(KH):
            ih = oh * sh - ph + kh * rh
            if ih < 0 or ih >= H:
                continue
            xrow = x[n, c, id_, ih]
            for kw in range(KW):
                lo, hi = _clip(o_lo, o_hi, _first_valid(pw, kw, rw, sw),
                               _end_valid(W, pw, kw, rw, sw, OW))
                off = kw * rw - pw
                wv = w[kd, kh, kw, c, m]
                for ow in range(lo, hi):
                    yrow[_u(ow)] = _fma(xrow[_u(ow * sw + off)], wv, yrow[_u(ow)])


@njit(inline="always")
def _out_range_for_inputs(i_lo, i_hi, off, s):
    """Output indices o whose input index o*s + off lies in [i_lo, i_hi)."""
    a = i_lo - off
    a = 0 if a <= 0 else (a + s - 1) // s
    b = i_hi - off
    b = 0 if b <= 0 else (b + s - 1) // s
    return a, b


@njit(inline="always")
def _bin_cl_row(dy, w, dxrow, n, id_, ih, i_lo, i_hi, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """Add into dxrow[i_lo:i_hi] every (output, tap) pair that reads it (channels-last)."""
    OD, OH, OW = dy.shape[1], dy.shape[2], dy.shape[3]
    KD, KH, KW, C, M = w.shape
    for kd in range(KD):
        t = id_ + pd - kd * rd
        if t < 0 or t % sd != 0 or t // sd >= OD:
            continue
        od = t // sd
        for kh in range(KH):
            t = ih + ph - kh * rh
            if t < 0 or t % sh != 0 or t // sh >= OH:
                continue
            dyrow = dy[n, od, t // sh]
            for kw in range(KW):
                off = kw * rw - pw
                lo, hi = _out_range_for_inputs(i_lo, i_hi, off, sw)
                if hi > OW:
                    hi = OW
                if M == 1:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            dxrow[iw, c] = _fma(_val(dyrow[ow, c]), w[kd, kh, kw, c, 0],
                                                dxrow[iw, c])
                else:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            acc = dxrow[iw, c]
                            for m in range(M):
                                acc = _fma(_val(dyrow[ow, c * M + m]), w[kd, kh, kw, c, m], acc)
                            dxrow[iw, c] = acc


@njit(inline="always")
def _bin_cl_sides(dy, w, dxrow, n, id_, ih, a, b, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """The input-gradient twin of :func:`_fwd_cl_sides`."""
    dxrow[:a, :] = 0
    dxrow[b:, :] = 0
    _bin_cl_row(dy, w, dxrow, n, id_, ih, 0, a, sd, sh, sw, rd, rh, rw, pd, ph, pw)
    _bin_cl_row(dy, w, dxrow, n, id_, ih, b, dxrow.shape[0], sd, sh, sw, rd, rh, rw, pd, ph, pw)


@njit(inline="always")
def _bin_cf_row(dy, w, dxrow, n, c, m, id_, ih, i_lo, i_hi, sd, sh, sw, rd, rh, rw, pd, ph,
                pw):
    """Add into dxrow[i_lo:i_hi] the contributions of output channel c*M+m (channels-first)."""
    OD, OH, OW = dy.shape[2], dy.shape[3], dy.shape[4]
    KD, KH, KW, M = w.shape[0], w.shape[1], w.shape[2], w.shape[4]
    k = c * M + m
    for kd in range(KD):
        t = id_ + pd - kd * rd
        if t < 0 or t % sd != 0 or t // sd >= OD:
            continue
        od = t // sd
        for kh in range(KH):
            t = ih + ph - kh * rh
            if t < 0 or t % sh != 0 or t // sh >= OH:
                continue
            dyrow = dy[n, k, od, t // sh]
            for kw in range(KW):
                off = kw * rw - pw
                lo, hi = _out_range_for_inputs(i_lo, i_hi, off, sw)
                if hi > OW:
                    hi = OW
                wv = w[kd, kh, kw, c, m]
                for ow in range(lo, hi):
                    dxrow[_u(ow * sw + off)] = _fma(dyrow[_u(ow)], wv, dxrow[_u(ow * sw + off)])


@njit(inline="always")
def _bfil_cl_row(x, dyrow, part, n, od, oh, o_lo, o_hi, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    """Add the products of output row (n, od, oh), columns [o_lo, o_hi), into part."""
    D, H, W, C = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW, M = part.shape[0], part.shape[1], part.shape[2], part.shape[4]
    OW = dyrow.shape[0]
    for kd in range(KD):
        id_ = od * sd - pd + kd * rd
        if id_ < 0 or id_ >= D:
            continue
        for kh in range(KH):
            ih = oh * sh - ph + kh * rh
            if ih < 0 or ih >= H:
                continue
            xrow = x[n, id_, ih]
            for kw in range(KW):
                lo, hi = _clip(o_lo, o_hi, _first_valid(pw, kw, rw, sw),
                               _end_valid(W, pw, kw, rw, sw, OW))
                off = kw * rw - pw
                acc = part[kd, kh, kw]
                if M == 1:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            acc[c, 0] += _val(xrow[iw, c]) * _val(dyrow[ow, c])
                else:
                    for ow in range(lo, hi):
                        iw = ow * sw + off
                        for c in range(C):
                            xv = _val(xrow[iw, c])
                            for m in range(M):
                                acc[c, m] += xv * _val(dyrow[ow, c * M + m])


@njit(inline="always", fastmath=_REDUCE_MATH)
def _bfil_cf_row(x, dyrow, part, n, c, m, od, oh, o_lo, o_hi, sd, sh, sw, rd, rh, rw, pd, ph,
                 pw):
    """Add the products of one output row of channel c*M+m, columns [o_lo, o_hi), into part."""
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW = part.shape[0], part.shape[1], part.shape[2]
    OW = dyrow.shape[0]
    for kd in range(KD):
        id_ = od * sd - pd + kd * rd
        if id_ < 0 or id_ >= D:
            continue
        for kh in range(KH):
            ih = oh * sh - ph + kh * rh
            if ih < 0 or ih >= H:
                continue
            xrow = x[n, c, id_, ih]
            for kw in range(KW):
                lo, hi = _clip(o_lo, o_hi, _first_valid(pw, kw, rw, sw),
                               _end_valid(W, pw, kw, rw, sw, OW))
                off = kw * rw - pw
                s = part[kd, kh, kw, c, m]
                for ow in range(lo, hi):
                    s += xrow[_u(ow * sw + off)] * dyrow[_u(ow)]
                part[kd, kh, kw, c, m] = s


@njit(inline="always")
def _fwd_cf_flat(xp, w, yp, c, m, r0, r1, rh, rw, ph, pw):
    """Stride-1 rows [r0, r1) of one channels-first output plane whose width equals
    the input's: each tap is then one constant offset into the flattened input
    plane, so a tap is a single long vectorised pass instead of a pass per row.
    Columns whose window wraps across a row edge come out wrong here and are
    recomputed by the caller (the border columns)."""
    H, W = xp.shape
    KH, KW = w.shape[1], w.shape[2]
    xf = xp.reshape(H * W)
    yf = yp.reshape(yp.shape[0] * W)
    lo, hi = r0 * W, r1 * W
    first = True
    for kh in range(KH):
        for kw in range(KW):
            off = (kh * rh - ph) * W + kw * rw - pw
            s, e = _clip(lo, hi, -off, H * W - off)
            wv = w[0, kh, kw, c, m]
            if first:
                for i in range(s, e):
                    yf[_u(i)] = xf[_u(i + off)] * wv
                first = False
            else:
                for i in range(s, e):
                    yf[_u(i)] = _fma(xf[_u(i + off)], wv, yf[_u(i)])


@njit(inline="always")
def _fwd_cf_cols(xp, w, yrow, c, m, oh, o_lo, o_hi, rh, rw, ph, pw):
    """Columns [o_lo, o_hi) of a stride-1 channels-first output row, tap by tap with
    border checks (the few columns a flat pass gets wrong)."""
    H, W = xp.shape
    KH, KW = w.shape[1], w.shape[2]
    for ow in range(o_lo, o_hi):
        yrow[ow] = 0
        for kh in range(KH):
            ih = oh - ph + kh * rh
            if ih < 0 or ih >= H:
                continue
            for kw in range(KW):
                iw = ow - pw + kw * rw
                if 0 <= iw < W:
                    yrow[ow] = _fma(xp[ih, iw], w[0, kh, kw, c, m], yrow[ow])


@njit(inline="always")
def _bin_cf_cols(dy, w, dxrow, n, c, od, ih, i_lo, i_hi, rh, rw, ph, pw):
    """Columns [i_lo, i_hi) of a stride-1 channels-first input-gradient row, tap by
    tap with border checks (the few columns a flat pass gets wrong)."""
    OH, OW = dy.shape[3], dy.shape[4]
    KH, KW, M = w.shape[1], w.shape[2], w.shape[4]
    for iw in range(i_lo, i_hi):
        dxrow[iw] = 0
        for m in range(M):
            dyp = dy[n, c * M + m, od]
            for kh in range(KH):
                oh = ih + ph - kh * rh
                if oh < 0 or oh >= OH:
                    continue
                for kw in range(KW):
                    ow = iw + pw - kw * rw
                    if 0 <= ow < OW:
                        dxrow[iw] = _fma(dyp[oh, ow], w[0, kh, kw, c, m], dxrow[iw])


@njit(inline="always")
def _bin_cf_flat(dyp, w, dxp, c, m, r0, r1, rh, rw, ph, pw):
    """Input-gradient twin of :func:`_fwd_cf_flat`: rows [r0, r1) of a dx plane, for
    stride 1 and equal input and output widths; accumulates output channel c*M+m
    (the first channel, m == 0, assigns)."""
    OH, W = dyp.shape
    KH, KW = w.shape[1], w.shape[2]
    dyf = dyp.reshape(OH * W)
    dxf = dxp.reshape(dxp.shape[0] * W)
    lo, hi = r0 * W, r1 * W
    first = m == 0
    for kh in range(KH):
        for kw in range(KW):
            off = (ph - kh * rh) * W + pw - kw * rw
            s, e = _clip(lo, hi, -off, OH * W - off)
            wv = w[0, kh, kw, c, m]
            if first:
                for i in range(s, e):
                    dxf[_u(i)] = dyf[_u(i + off)] * wv
                first = False
            else:
                for i in range(s, e):
                    dxf[_u(i)] = _fma(dyf[_u(i + off)], wv, dxf[_u(i)])


# Filter elements per block of :func:`_sum_partials`: a block's sums stay in L1
# while each partial's run is added.
_SUM_BLOCK = 2048


@njit(nogil=True, cache=True)
def _sum_partials(t, count, parts, dw):
    """dw = parts[0] + parts[1] + ... in that order, for every filter element
    (``dw`` and ``parts`` C-contiguous): task t of ``count`` takes a contiguous run
    of the elements, in blocks, each partial's run added as a vector loop. One
    task per filter tap, each element summed over the partials one by one (a
    scalar loop), took 30-55 us for 5-21 partials of a 3x3x960 filter: public
    API, 2 threads, NHWC, alternating in one process, medians of 9 rounds (ms):
    7x7x960 N=8 0.153 -> 0.131, N=32 0.444 -> 0.425; 14x14x576 N=1 0.059 ->
    0.050, N=32 0.883 -> 0.830; 14x14x384 N=1 0.041 -> 0.035."""
    P = parts.shape[0]
    n = dw.size
    pf = parts.reshape(P * n)
    out = dw.reshape(n)
    for b0 in range(t * n // count, (t + 1) * n // count, _SUM_BLOCK):
        b1 = min(b0 + _SUM_BLOCK, (t + 1) * n // count)
        for i in range(b0, b1):
            out[_u(i)] = pf[_u(i)]
        for p in range(1, P):
            for i in range(b0, b1):
                out[_u(i)] += pf[_u(p * n + i)]


sum_partials = Parallel(_sum_partials, lambda parts, dw: -(-dw.size // _SUM_BLOCK), 2,
                        per_thread=True)


# ------------------------------------------------------------------ kernel factory

class KernelSet:
    """The six depthwise kernels for one unrolled filter shape (or the generic ones)."""

    def __init__(self, **kernels):
        self.__dict__.update(kernels)


@njit(inline="always")
def _fwd_cf_flat_unrolled(xp, w, yp, c, m, r0, r1, rh, rw, ph, pw, KH, KW):
    # One pass with every tap in registers; positions where some tap would
    # leave the plane are left for the border columns. KH and KW are the calling
    # kernel's compile-time constants. Module level on purpose: a dispatcher held
    # in a kernel factory's closure makes the cached kernel miss Numba's on-disk
    # cache in every new process.
    H, W = xp.shape
    xf = xp.reshape(H * W)
    yf = yp.reshape(yp.shape[0] * W)
    lo = ph * W + pw
    lo = lo if lo > r0 * W else r0 * W
    hi = H * W - ((KH - 1) * rh - ph) * W - (KW - 1) * rw + pw
    hi = hi if hi < r1 * W else r1 * W
    base = -ph * W - pw
    for i in range(lo, hi):
        acc = xf[_u(i + base)] * w[0, 0, 0, c, m]
        for kh in range(KH):
            for kw in range(KW):
                if kh + kw > 0:
                    acc = _fma(xf[_u(i + base + kh * rh * W + kw * rw)], w[0, kh, kw, c, m], acc)
        yf[_u(i)] = acc


@njit(inline="always")
def _bin_cf_flat_unrolled(dyp, w, dxp, c, r0, r1, rh, rw, ph, pw, KH, KW):
    # Input-gradient twin of _fwd_cf_flat_unrolled (stride 1, M == 1).
    OH, W = dyp.shape
    dyf = dyp.reshape(OH * W)
    dxf = dxp.reshape(dxp.shape[0] * W)
    base = ph * W + pw
    lo = (KH - 1) * rh * W + (KW - 1) * rw - base
    lo = lo if lo > r0 * W else r0 * W
    hi = OH * W - base
    hi = hi if hi < r1 * W else r1 * W
    for i in range(lo, hi):
        acc = dyf[_u(i + base)] * w[0, 0, 0, c, 0]
        for kh in range(KH):
            for kw in range(KW):
                if kh + kw > 0:
                    acc = _fma(dyf[_u(i + base - kh * rh * W - kw * rw)], w[0, kh, kw, c, 0],
                               acc)
        dxf[_u(i)] = acc


_sets = {}


def kernel_set(KH, KW):
    """Kernels whose interior path is unrolled for a KH x KW window (0, 0: generic only)."""
    key = (KH, KW)
    if key not in _sets:
        _sets[key] = _build(KH, KW)
    return _sets[key]


def _build(KH, KW):
    UNROLL = KH > 0

    @njit(nogil=True, cache=True)
    @_instance(KH, KW)
    def forward_cl(job, count, x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, D, H, W, C = x.shape
        KD, M = w.shape[0], w.shape[4]
        _, OD, OH, OW, CM = y.shape
        a, b = _interior(W, pw, KW, rw, sw, OW)
        n, od, oh, id_, ih0 = _row_origin(job, OD, OH, sd, sh, pd, ph)
        yrow = y[n, od, oh]
        if _unrolled_row(UNROLL, M, KD, a, b, id_, D, ih0, KH, rh, H):
            for ow in range(a, b):
                iw0 = ow * sw - pw
                for c in range(C):
                    acc = _val(x[n, id_, ih0, iw0, c]) * w[0, 0, 0, c, 0]
                    for kh in range(KH):
                        for kw in range(KW):
                            if kh + kw > 0:
                                acc = _fma(_val(x[n, id_, ih0 + kh * rh, iw0 + kw * rw, c]),
                                           w[0, kh, kw, c, 0], acc)
                    yrow[ow, c] = acc
            _fwd_cl_sides(x, w, yrow, n, od, oh, a, b, sd, sh, sw, rd, rh, rw, pd, ph, pw)
        else:
            _fwd_cl_sides(x, w, yrow, n, od, oh, 0, 0, sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(nogil=True, cache=True)
    @_instance(KH, KW)
    def forward_cf(job, count, x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, C, D, H, W = x.shape
        KD, KH_, KW_, _, M = w.shape
        _, CM, OD, OH, OW = y.shape
        a, b = _interior(W, pw, KW_, rw, sw, OW)
        # Rows every tap of the window falls in (meaningful for stride 1).
        r0 = ph if ph < OH else OH
        r1 = H + ph - (KH_ - 1) * rh
        r1 = r1 if r1 < OH else OH
        r1 = r1 if r1 > r0 else r0
        flat = KD == 1 and sh == 1 and sw == 1 and OW == W
        n, k = _split(job, CM)
        c, m = _split(k, M)
        for od in range(OD):
            id_ = od * sd - pd
            if flat and 0 <= id_ < D and r0 < r1:
                xp = x[n, c, id_]
                if UNROLL:
                    _fwd_cf_flat_unrolled(xp, w, y[n, k, od], c, m, r0, r1, rh, rw, ph, pw,
                                          KH, KW)
                else:
                    _fwd_cf_flat(xp, w, y[n, k, od], c, m, r0, r1, rh, rw, ph, pw)
                for oh in range(r0, r1):
                    yrow = y[n, k, od, oh]
                    _fwd_cf_cols(xp, w, yrow, c, m, oh, 0, a, rh, rw, ph, pw)
                    _fwd_cf_cols(xp, w, yrow, c, m, oh, b, OW, rh, rw, ph, pw)
                lo, hi = r0, r1
            else:
                lo, hi = 0, 0
            for oh in range(OH):
                if lo <= oh < hi:
                    continue
                yrow = y[n, k, od, oh]
                yrow[:] = 0
                _fwd_cf_row(x, w, yrow, n, c, m, od, oh, 0, OW,
                            sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(nogil=True, cache=True)
    @_instance(KH, KW)
    def backprop_input_cl(job, count, dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, D, H, W, C = dx.shape
        KD, M = w.shape[0], w.shape[4]
        _, OD, OH, OW, CM = dy.shape
        # stride 1: dx[i] = sum_t dy[i + p - t*r] * w[t]; interior where every tap lands in dy
        a = (KW - 1) * rw - pw
        a = a if a > 0 else 0
        b = OW - pw
        b = b if b < W else W
        nd, ih = _split(job, H)
        n, id_ = _split(nd, D)
        dxrow = dx[n, id_, ih]
        od = id_ + pd
        oh0 = ih + ph
        if (UNROLL and M == 1 and KD == 1 and sw == 1 and sh == 1 and sd == 1 and a < b
                and od < OD and oh0 - (KH - 1) * rh >= 0 and oh0 < OH):
            for iw in range(a, b):
                ow0 = iw + pw
                for c in range(C):
                    acc = _val(dy[n, od, oh0, ow0, c]) * w[0, 0, 0, c, 0]
                    for kh in range(KH):
                        for kw in range(KW):
                            if kh + kw > 0:
                                acc = _fma(_val(dy[n, od, oh0 - kh * rh, ow0 - kw * rw, c]),
                                           w[0, kh, kw, c, 0], acc)
                    dxrow[iw, c] = acc
            _bin_cl_sides(dy, w, dxrow, n, id_, ih, a, b, sd, sh, sw, rd, rh, rw, pd, ph, pw)
        else:
            _bin_cl_sides(dy, w, dxrow, n, id_, ih, 0, 0, sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(nogil=True, cache=True)
    @_instance(KH, KW)
    def backprop_input_cf(job, count, dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, C, D, H, W = dx.shape
        KD, KH_, KW_, _, M = w.shape
        _, CM, OD, OH, OW = dy.shape
        # stride 1: dx[i] = sum_t dy[i + p - t*r] * w[t]; interior rows/columns are
        # those where every tap lands inside dy.
        a = (KW_ - 1) * rw - pw
        a = a if a > 0 else 0
        a = a if a < W else W
        b = OW - pw
        b = b if b < W else W
        b = b if b > a else a
        r0 = (KH_ - 1) * rh - ph
        r0 = r0 if r0 > 0 else 0
        r0 = r0 if r0 < H else H
        r1 = OH - ph
        r1 = r1 if r1 < H else H
        r1 = r1 if r1 > r0 else r0
        flat = KD == 1 and sd == 1 and sh == 1 and sw == 1 and OW == W
        n, c = _split(job, C)
        for id_ in range(D):
            od = id_ + pd
            if flat and od < OD and r0 < r1:
                dxp = dx[n, c, id_]
                if UNROLL and M == 1:
                    _bin_cf_flat_unrolled(dy[n, c, od], w, dxp, c, r0, r1, rh, rw, ph, pw,
                                          KH, KW)
                else:
                    for m in range(M):
                        _bin_cf_flat(dy[n, c * M + m, od], w, dxp, c, m, r0, r1, rh, rw,
                                     ph, pw)
                for ih in range(r0, r1):
                    dxrow = dxp[ih]
                    _bin_cf_cols(dy, w, dxrow, n, c, od, ih, 0, a, rh, rw, ph, pw)
                    _bin_cf_cols(dy, w, dxrow, n, c, od, ih, b, W, rh, rw, ph, pw)
                lo, hi = r0, r1
            else:
                lo, hi = 0, 0
            for ih in range(H):
                if lo <= ih < hi:
                    continue
                dxrow = dx[n, c, id_, ih]
                dxrow[:] = 0
                for m in range(M):
                    _bin_cf_row(dy, w, dxrow, n, c, m, id_, ih, 0, W,
                                sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(nogil=True, cache=True)
    @_instance(KH, KW)
    def backprop_filter_cl(p, count, x, dy, parts, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, D, H, W, C = x.shape
        P, KD, M = parts.shape[0], parts.shape[1], parts.shape[5]
        _, OD, OH, OW, CM = dy.shape
        rows = N * OD * OH
        a, b = _interior(W, pw, KW, rw, sw, OW)
        part = parts[p]
        part[:] = 0
        for row in range(p * rows // P, (p + 1) * rows // P):
            n, od, oh, id_, ih0 = _row_origin(row, OD, OH, sd, sh, pd, ph)
            dyrow = dy[n, od, oh]
            if _unrolled_row(UNROLL, M, KD, a, b, id_, D, ih0, KH, rh, H):
                for ow in range(a, b):
                    iw0 = ow * sw - pw
                    for kh in range(KH):
                        xrow = x[n, id_, ih0 + kh * rh]
                        for kw in range(KW):
                            acc = part[0, kh, kw]
                            iw = iw0 + kw * rw
                            for c in range(C):
                                acc[c, 0] += _val(xrow[iw, c]) * _val(dyrow[ow, c])
                _bfil_cl_row(x, dyrow, part, n, od, oh, 0, a,
                             sd, sh, sw, rd, rh, rw, pd, ph, pw)
                _bfil_cl_row(x, dyrow, part, n, od, oh, b, OW,
                             sd, sh, sw, rd, rh, rw, pd, ph, pw)
            else:
                _bfil_cl_row(x, dyrow, part, n, od, oh, 0, OW,
                             sd, sh, sw, rd, rh, rw, pd, ph, pw)

    @njit(nogil=True, cache=True, fastmath=_REDUCE_MATH)
    @_instance(KH, KW)
    def backprop_filter_cf(job, count, x, dy, parts, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        N, C, D, H, W = x.shape
        P, M = parts.shape[0], parts.shape[5]
        _, CM, OD, OH, OW = dy.shape
        # parts[p] holds the sum over batch chunk p; one task per (chunk, channel).
        p, c = _split(job, C)
        part = parts[p]
        part[:, :, :, c, :] = 0
        for n in range(p * N // P, (p + 1) * N // P):
            for m in range(M):
                for od in range(OD):
                    for oh in range(OH):
                        dyrow = dy[n, c * M + m, od, oh]
                        _bfil_cf_row(x, dyrow, part, n, c, m, od, oh, 0, OW,
                                     sd, sh, sw, rd, rh, rw, pd, ph, pw)

    return KernelSet(
        forward_cl=Parallel(forward_cl, _rows_of_result, 3),
        forward_cf=Parallel(forward_cf, _planes_of_result, 3),
        backprop_input_cl=Parallel(backprop_input_cl, _rows_of_result, 3),
        backprop_input_cf=Parallel(backprop_input_cf, _planes_of_result, 3),
        backprop_filter_cl=Parallel(backprop_filter_cl, lambda x, dy, parts, *_: parts.shape[0],
                                    3),
        backprop_filter_cf=Parallel(backprop_filter_cf,
                                    lambda x, dy, parts, *_: parts.shape[0] * x.shape[1], 3))


# The tasks of the forward and input-gradient kernels: one per row (channels-last)
# or plane (channels-first) of the result, their third argument.
def _rows_of_result(data, w, res, *_):
    return res.shape[0] * res.shape[1] * res.shape[2]


def _planes_of_result(data, w, res, *_):
    return res.shape[0] * res.shape[1]


def for_plan(plan):
    """The kernel set serving ``plan``: unrolled when its filter shape has one."""
    kd, kh, kw = plan.kernel
    if kd == 1 and (kh, kw) in UNROLLED:
        return kernel_set(kh, kw)
    return kernel_set(0, 0)
