"""Numba CPU kernels for depthwise convolution on canonical 5-D arrays.

Every rank is computed as a 3-D problem (1-D and 2-D problems have size-1 leading
spatial dimensions). Channels-last arrays are ``x[N, D, H, W, C]``,
``y[N, OD, OH, OW, C*M]``; channels-first ones ``x[N, C, D, H, W]``,
``y[N, C*M, OD, OH, OW]``; filters are always ``w[KD, KH, KW, C, M]``.

Arrays reach the kernels in their accumulation dtype (float32 or float64); the
16-bit formats are widened by the driver. Outputs are fully overwritten, so they
may be uninitialised on entry.

Parallel work is split so that each task owns the output elements it writes: no
atomics, no races. The filter gradient sums per-chunk partial filters in a fixed
order, and the chunking depends on the problem only, never on the thread count,
so results are bitwise reproducible.
"""

import numpy as np
from numba import njit, prange

# Reductions over a contiguous run may be reassociated so that they vectorise;
# NaN and Inf still propagate (no 'nnan' / 'ninf').
_REDUCE_MATH = {"reassoc", "contract"}


@njit(inline="always")
def _first_valid(pad, k, r, s):
    """Smallest output index o >= 0 with o*s - pad + k*r >= 0."""
    t = pad - k * r
    if t <= 0:
        return 0
    return (t + s - 1) // s


@njit(inline="always")
def _end_valid(size, pad, k, r, s, out_size):
    """One past the largest output index o with o*s - pad + k*r < size, capped at out_size."""
    t = size - 1 + pad - k * r
    if t < 0:
        return 0
    e = t // s + 1
    return e if e < out_size else out_size


@njit(inline="always")
def _split(job, b):
    return job // b, job % b


def partial_chunks(rows, filter_elems):
    """Fixed number of partial filters for the filter gradient (independent of threads)."""
    cap = max(1, (1 << 22) // max(1, filter_elems))
    return max(1, min(rows, 64, cap))


# ---------------------------------------------------------------------------- forward

@njit(parallel=True, cache=True)
def forward_cl(x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, D, H, W, C = x.shape
    KD, KH, KW, _, M = w.shape
    _, OD, OH, OW, CM = y.shape
    for job in prange(N * OD * OH):
        nd, oh = _split(job, OH)
        n, od = _split(nd, OD)
        yrow = y[n, od, oh]
        yrow[:, :] = 0
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
                    lo = _first_valid(pw, kw, rw, sw)
                    hi = _end_valid(W, pw, kw, rw, sw, OW)
                    off = kw * rw - pw
                    if M == 1:
                        for ow in range(lo, hi):
                            iw = ow * sw + off
                            for c in range(C):
                                yrow[ow, c] += xrow[iw, c] * w[kd, kh, kw, c, 0]
                    else:
                        for ow in range(lo, hi):
                            iw = ow * sw + off
                            for c in range(C):
                                xv = xrow[iw, c]
                                for m in range(M):
                                    yrow[ow, c * M + m] += xv * w[kd, kh, kw, c, m]


@njit(parallel=True, cache=True)
def forward_cf(x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, C, D, H, W = x.shape
    KD, KH, KW, _, M = w.shape
    _, CM, OD, OH, OW = y.shape
    for job in prange(N * CM):
        n, k = _split(job, CM)
        c = k // M
        m = k - c * M
        for od in range(OD):
            for oh in range(OH):
                yrow = y[n, k, od, oh]
                yrow[:] = 0
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
                            lo = _first_valid(pw, kw, rw, sw)
                            hi = _end_valid(W, pw, kw, rw, sw, OW)
                            off = kw * rw - pw
                            wv = w[kd, kh, kw, c, m]
                            for ow in range(lo, hi):
                                yrow[ow] += xrow[ow * sw + off] * wv


# ---------------------------------------------------------------------- backprop input

@njit(parallel=True, cache=True)
def backprop_input_cl(dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, D, H, W, C = dx.shape
    KD, KH, KW, _, M = w.shape
    _, OD, OH, OW, CM = dy.shape
    for job in prange(N * D * H):
        nd, ih = _split(job, H)
        n, id_ = _split(nd, D)
        dxrow = dx[n, id_, ih]
        dxrow[:, :] = 0
        for kd in range(KD):
            t = id_ + pd - kd * rd
            if t < 0 or t % sd != 0 or t // sd >= OD:
                continue
            od = t // sd
            for kh in range(KH):
                t = ih + ph - kh * rh
                if t < 0 or t % sh != 0 or t // sh >= OH:
                    continue
                oh = t // sh
                dyrow = dy[n, od, oh]
                for kw in range(KW):
                    lo = _first_valid(pw, kw, rw, sw)
                    hi = _end_valid(W, pw, kw, rw, sw, OW)
                    off = kw * rw - pw
                    if M == 1:
                        for ow in range(lo, hi):
                            iw = ow * sw + off
                            for c in range(C):
                                dxrow[iw, c] += dyrow[ow, c] * w[kd, kh, kw, c, 0]
                    else:
                        for ow in range(lo, hi):
                            iw = ow * sw + off
                            for c in range(C):
                                acc = dxrow[iw, c]
                                for m in range(M):
                                    acc += dyrow[ow, c * M + m] * w[kd, kh, kw, c, m]
                                dxrow[iw, c] = acc


@njit(parallel=True, cache=True)
def backprop_input_cf(dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, C, D, H, W = dx.shape
    KD, KH, KW, _, M = w.shape
    _, CM, OD, OH, OW = dy.shape
    for job in prange(N * C):
        n, c = _split(job, C)
        plane = dx[n, c]
        plane[:, :, :] = 0
        for m in range(M):
            k = c * M + m
            for od in range(OD):
                for oh in range(OH):
                    dyrow = dy[n, k, od, oh]
                    for kd in range(KD):
                        id_ = od * sd - pd + kd * rd
                        if id_ < 0 or id_ >= D:
                            continue
                        for kh in range(KH):
                            ih = oh * sh - ph + kh * rh
                            if ih < 0 or ih >= H:
                                continue
                            dxrow = plane[id_, ih]
                            for kw in range(KW):
                                lo = _first_valid(pw, kw, rw, sw)
                                hi = _end_valid(W, pw, kw, rw, sw, OW)
                                off = kw * rw - pw
                                wv = w[kd, kh, kw, c, m]
                                for ow in range(lo, hi):
                                    dxrow[ow * sw + off] += dyrow[ow] * wv


# --------------------------------------------------------------------- backprop filter

@njit(parallel=True, cache=True)
def _sum_partials(parts, dw):
    """dw = parts[0] + parts[1] + ... in that order, for every filter element."""
    P = parts.shape[0]
    KD, KH, KW, C, M = dw.shape
    for t in prange(KD * KH * KW):
        td, tw = _split(t, KH * KW)
        th, tw = _split(tw, KW)
        for c in range(C):
            for m in range(M):
                s = parts[0, td, th, tw, c, m]
                for p in range(1, P):
                    s += parts[p, td, th, tw, c, m]
                dw[td, th, tw, c, m] = s


@njit(parallel=True, cache=True)
def backprop_filter_cl(x, dy, parts, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, D, H, W, C = x.shape
    P, KD, KH, KW, _, M = parts.shape
    _, OD, OH, OW, CM = dy.shape
    rows = N * OD * OH
    for p in prange(P):
        part = parts[p]
        part[:] = 0
        for row in range(p * rows // P, (p + 1) * rows // P):
            nd, oh = _split(row, OH)
            n, od = _split(nd, OD)
            dyrow = dy[n, od, oh]
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
                        lo = _first_valid(pw, kw, rw, sw)
                        hi = _end_valid(W, pw, kw, rw, sw, OW)
                        off = kw * rw - pw
                        acc = part[kd, kh, kw]
                        if M == 1:
                            for ow in range(lo, hi):
                                iw = ow * sw + off
                                for c in range(C):
                                    acc[c, 0] += xrow[iw, c] * dyrow[ow, c]
                        else:
                            for ow in range(lo, hi):
                                iw = ow * sw + off
                                for c in range(C):
                                    xv = xrow[iw, c]
                                    for m in range(M):
                                        acc[c, m] += xv * dyrow[ow, c * M + m]


@njit(parallel=True, cache=True, fastmath=_REDUCE_MATH)
def backprop_filter_cf(x, dy, parts, sd, sh, sw, rd, rh, rw, pd, ph, pw):
    N, C, D, H, W = x.shape
    P, KD, KH, KW, _, M = parts.shape
    _, CM, OD, OH, OW = dy.shape
    # parts[p] holds the sum over batch chunk p; one task per (chunk, channel).
    for job in prange(P * C):
        p, c = _split(job, C)
        part = parts[p]
        part[:, :, :, c, :] = 0
        for n in range(p * N // P, (p + 1) * N // P):
            for m in range(M):
                k = c * M + m
                for od in range(OD):
                    for oh in range(OH):
                        dyrow = dy[n, k, od, oh]
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
                                    lo = _first_valid(pw, kw, rw, sw)
                                    hi = _end_valid(W, pw, kw, rw, sw, OW)
                                    off = kw * rw - pw
                                    s = part[kd, kh, kw, c, m]
                                    for ow in range(lo, hi):
                                        s += xrow[ow * sw + off] * dyrow[ow]
                                    part[kd, kh, kw, c, m] = s
