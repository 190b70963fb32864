"""Channels-first kernels that work on one zero-padded plane at a time.

A channels-first plane is contiguous, but its rows are short (7 to 56 columns on
the suite), strided windows skip columns, and every row has two borders: kernels
that walk rows waste most of each vector. Here a task copies one (n, c) plane
into a scratch with the padding written as zeros and the columns (and rows)
split by phase modulo the stride, "space to depth": every tap of the window then
reads one contiguous run of the scratch, at a fixed offset, for all outputs at
once. A tap is one vectorised multiply-add over ``OH * WQ`` elements, where
``WQ`` is the output row length plus the window's reach; the few extra columns
per row are computed and dropped. The plane crosses memory once each way. The
input gradient at a column stride of 2 writes no phase planes: a row's even and
odd columns are summed side by side from the padded output gradient and stored
interleaved (:func:`_bin_rows`).

Products with the zero padding, and with the dropped columns, are not products
of the operator: with an Inf or NaN among the operands they would put NaN where
the operator has none. A plane whose operands are not all finite is therefore
computed by a direct loop that skips them (``_*_direct``); the finite case, the
common one, never pays for that.

A task takes a run of consecutive planes (about 32K elements; at least 32 tasks)
and reuses one scratch for all of them; runs are padded to whole vector groups, so no
scalar loop tail. A plane's tap sums go in pieces of 256 elements, each preceded
by copying in the input rows it reads and followed by copying out the output
rows it completed (the forward at any stride, the input gradient at stride 1),
so that memory is read and written all through the sums rather than in bursts
between them. The forward and input gradient hold
four vectors of sums in registers through all the taps (:func:`.simd.tap_sums`,
16 lanes with AVX-512, where the loop vectoriser used 8 and stored the sums
after every third tap: 10-15 % faster, 1 thread, N=8 56x56x144 3.11 -> 2.79 ms);
the filter gradient walks its runs in L1-sized chunks, its taps' dot products
in groups of up to 9 that share each load of the output gradient
(:func:`.simd.tap_dots`; one dot product at a time took two loads per
multiply-add). 1 thread, NCHW / NHWC time, one dot product at a time / groups:
N=8 56x56x144 1.40 / 1.03, 56x56x96 7x7 1.77 / 1.36, 112x112x32 1.80 / 1.64;
N=32 56x56x144 1.22 / 1.12, 56x56x96 7x7 1.87 / 1.42, 147x147x128 1.31 / 1.06
(``benchmarks/layout_ratio.py --batch 8,32 --threads 1 --rounds 3 --case
bwd_filter``).

16-bit operands reach these kernels as their bit patterns (:func:`.halves.value`)
and are widened as they are copied into the scratch; 16-bit results are rounded
as they are copied out (:func:`.simd.copy_rows`, :func:`.halves.stored`). The
widened copies and the rounding pass this saves had cost as much as the
convolution: 1 thread, NCHW, bits / widened copies (ms): N=8 56x56x144 float16
forward 2.52 / 5.16, input gradient 2.88 / 6.36, filter gradient 3.03 / 7.61;
N=32 28x28x240 5x5 forward 8.7 / 15.7 (``benchmarks/layout_ratio.py --batch
8,32 --threads 1 --rounds 3 --case f16``). They are not compiled for a mix of
16-bit and float32 operands: a separable convolution's float32 intermediates
come with widened copies of its 16-bit data (the driver's ``_run_correlation``).

These kernels serve 1-D and 2-D problems whose plane fits the scratch limit of
the driver; the row kernels of :mod:`.kernels` serve the rest. A depth
multiplier M's input plane is copied once for its M output planes (the input
gradient: the M planes' gradients added in order of m, as if the input were
repeated in memory). Within a tap sum the taps come in (kh, kw) order, like
there.
"""

import numpy as np
from numba import njit, prange

from .halves import stored as _stored
from .halves import value as _val
from .kernels import _REDUCE_MATH, _u
from .simd import copy_rows as _copy_rows
from .simd import deinterleave as _deinterleave
from .simd import fma as _fma
from .simd import interleaved_sums as _interleaved_sums
from .simd import sfence as _sfence
from .simd import stream_copy as _stream_copy
from .simd import DOT_SLOTS as _SLOTS
from .simd import tap_dots as _tap_dots
from .simd import tap_sums as _tap_sums
from .tasks import threads

# Runs are padded to a multiple of this (two 16-lane vectors): the tap sums
# (:func:`.simd.tap_sums`) and the vectorised loops then never end in a partial
# vector.
_VEC = 32
# Elements of a run per pass over the taps: the accumulator chunk stays in L1.
_CHUNK = 1024
# Elements of a plane's tap sums between its copies in and out (see _fwd_plane).
_PIECE = 256
# A task sets up its scratch once for a run of consecutive planes: one task per
# thread (Numba gives each thread one contiguous range of a parallel loop, so
# more tasks balance nothing). Before, tasks of about 32K elements (128K for the
# input gradient at column stride 2), at least 32: 2 threads, NCHW, each kernel
# alone on the same arguments, both alternating in one process, medians of 7
# rounds (ms; forward and filter gradient routed here for the measurement):
# stride 2, input gradient: N=1 112x112x96 0.268 -> 0.231, 56x56x144 0.160 ->
# 0.134, 56x56x72 5x5 0.126 -> 0.099; N=8 1.81 -> 1.75, 0.698 -> 0.681, 0.547 ->
# 0.532; N=32 8.02 -> 7.69, 5.49 -> 5.36, 2.86 -> 2.91. Forward: N=1 112x112x96
# 0.393 -> 0.370, 56x56x72 5x5 0.113 -> 0.096; N=32 112x112x96 17.1 -> 12.6,
# 56x56x144 4.91 -> 5.04. Filter gradient: N=1 56x56x72 5x5 0.106 -> 0.093; N=32
# 112x112x96 12.7 -> 11.8, 56x56x72 2.01 -> 1.79.


@njit(inline="always")
def _task_count(planes):
    """Tasks for ``planes`` planes: one per thread, at most one per plane. The
    results do not depend on it (each plane is computed on its own)."""
    return max(1, min(planes, threads()))


@njit(inline="always")
def _geometry(KH, KW, OH, OW, sh, sw, rh, rw):
    """Sizes of the phase-split scratch: rows RQ and row length WQ of each of the
    sh*sw phase planes, the run length L (OH rows of WQ, padded to _VEC) and the
    elements S one phase plane takes (a run reaches up to WQ + _VEC past its
    plane's last row, into slack that is never read as data)."""
    RQ = OH + ((KH - 1) * rh) // sh
    WQ = OW + ((KW - 1) * rw) // sw
    L = (OH * WQ + _VEC - 1) // _VEC * _VEC
    return RQ, WQ, L, RQ * WQ + WQ + _VEC


@njit(inline="always")
def _taps(KH, KW, sh, sw, rh, rw, WQ, S):
    """offs[kh*KW + kw]: offset in the scratch of the input that output (0, 0)
    reads through tap (kh, kw) (computed once per task: it takes divisions)."""
    offs = np.empty(KH * KW, np.int64)
    for kh in range(KH):
        a, dr = (kh * rh) % sh, (kh * rh) // sh
        for kw in range(KW):
            b, dq = (kw * rw) % sw, (kw * rw) // sw
            offs[kh * KW + kw] = (a * sw + b) * S + dr * WQ + dq
    return offs


@njit(inline="always")
def _task_scratch(dtype, KH, KW, W, sh, sw, rh, rw, pw, WQ, S):
    """A task's zeroed phase planes, column ranges and tap offsets."""
    cols = np.empty((sw, 2), np.int64)
    _phase_cols(cols, sw, pw, W, WQ)
    return np.zeros(sh * sw * S, dtype), cols, _taps(KH, KW, sh, sw, rh, rw, WQ, S)


@njit(inline="always")
def _phase_cols(cols, sw, pw, W, WQ):
    """cols[b] = [lo, hi): the phase-plane columns q with 0 <= q*sw + b - pw < W."""
    for b in range(sw):
        t = pw - b
        lo = 0 if t <= 0 else (t + sw - 1) // sw
        e = W - 1 + pw - b
        hi = min(WQ, e // sw + 1) if e >= 0 else 0
        cols[b, 0] = lo
        cols[b, 1] = max(lo, hi)


@njit(inline="always")
def _scatter_plane(src, s0, H, W, xp, cols, sh, sw, ph, pw, RQ, WQ, S, ih0, ih1):
    """Rows ``ih0`` to ``ih1`` of the input plane ``src[s0 : s0 + H*W]`` (row-major)
    into the phase planes ``xp``. Every plane of a problem fills the same cells,
    so the padding cells, zeroed once per task, stay zero. (Flat offsets, not
    row views: a view per row costs more than a 7-element row.)"""
    if sh == 1 and sw == 1:            # the common case: whole rows as vectors
        _copy_rows(xp, (ph + ih0) * WQ + pw, WQ, src, s0 + ih0 * W, W,
                   max(0, min(ih1, RQ - ph) - ih0), min(W, WQ - pw))
        return
    a, rr = (ph + ih0) % sh, (ph + ih0) // sh   # phase and phase-plane row of row ih0
    # column stride 2: the columns that both phases hold are split together, the
    # few at either end that only one holds one by one. Their ranges are read
    # once, not per row: on 56-column rows the per-row reads had taken as long
    # as the splits (1 thread, 32 planes of 56x56 in L2, alternating processes:
    # 14-15 us, 9-10 read once, 7-8 for the splits alone; 112x112 even).
    lo0, hi0 = cols[0, 0], cols[0, 1]
    lo1, hi1 = (cols[1, 0], cols[1, 1]) if sw > 1 else (lo0, hi0)
    lo, hi = max(lo0, lo1), min(hi0, hi1)
    if lo >= hi:
        lo, hi = hi0, hi0
    for ih in range(ih0, ih1):
        if rr >= RQ:
            break
        r = s0 + ih * W - pw
        d = a * sw * S + rr * WQ
        if sw == 1:
            for q in range(lo0, hi0):
                xp[_u(d + q)] = _val(src[_u(r + q)])
        elif sw == 2:
            d1 = d + S
            if lo < hi:
                _deinterleave(src, r + 2 * lo, hi - lo, xp, d + lo, d1 + lo)
            for q in range(lo0, min(lo, hi0)):
                xp[_u(d + q)] = _val(src[_u(r + 2 * q)])
            for q in range(max(hi, lo0), hi0):
                xp[_u(d + q)] = _val(src[_u(r + 2 * q)])
            for q in range(lo1, min(lo, hi1)):
                xp[_u(d1 + q)] = _val(src[_u(r + 2 * q + 1)])
            for q in range(max(hi, lo1), hi1):
                xp[_u(d1 + q)] = _val(src[_u(r + 2 * q + 1)])
        else:
            for b in range(sw):
                db = d + b * S
                for q in range(cols[b, 0], cols[b, 1]):
                    xp[_u(db + q)] = _val(src[_u(r + q * sw + b)])
        a += 1
        if a == sh:
            a = 0
            rr += 1


@njit(inline="always")
def _gather_plane(xp, dst, d0, H, W, cols, sh, sw, ph, pw, RQ, WQ, S, ih0, ih1):
    """The inverse of :func:`_scatter_plane`: rows ``ih0`` to ``ih1`` of the phase
    planes back into the plane ``dst[d0 : d0 + H*W]``; input cells no window
    reaches get 0. (Strides other than 1 and column stride 2: all rows.)"""
    if sh == 1 and sw == 1:
        rows = max(ih0, min(ih1, RQ - ph))
        n = max(0, min(W, WQ - pw))
        _copy_rows(dst, d0 + ih0 * W, W, xp, (ph + ih0) * WQ + pw, WQ, rows - ih0, n)
        for ih in range(ih0, ih1):
            r = d0 + ih * W
            for iw in range(n if ih < rows else 0, W):
                dst[_u(r + iw)] = 0
        return
    a, rr = ph % sh, ph // sh
    for ih in range(H):
        r = d0 + ih * W
        for iw in range(W):
            dst[_u(r + iw)] = 0
        if rr < RQ:
            d = a * sw * S + rr * WQ
            for b in range(sw):
                db = d + b * S
                for q in range(cols[b, 0], cols[b, 1]):
                    dst[_u(r + q * sw + b - pw)] = _stored(xp[_u(db + q)], dst)
        a += 1
        if a == sh:
            a = 0
            rr += 1


@njit(inline="always")
def _unlinked(n, other, k, s, r, p, outputs):
    """Indices along one axis with no tap linking them to the other side, after
    their count: ``outputs``, the outputs o < n whose window (inputs o*s - p + t*r,
    t < k) lies wholly in the padding; else the inputs i < n that no output
    o < ``other`` reads. Their sums are empty, +0, where the phase planes hold
    sums of the padding's zero products (-0 with a negative tap)."""
    idx = np.empty(n + 1, np.int64)
    count = 0
    for i in range(n):
        hit = False
        for t in range(k):
            if outputs:
                u = i * s - p + t * r
                hit = 0 <= u < other
            else:
                u = i + p - t * r
                hit = u >= 0 and u % s == 0 and u // s < other
            if hit:
                break
        if not hit:
            count += 1
            idx[count] = i
    idx[0] = count
    return idx


@njit(inline="always")
def _clear(dst, d0, H, W, rows, cols):
    """Zero the rows ``rows[1 : rows[0] + 1]`` and the columns ``cols[1 : cols[0] +
    1]`` of the row-major H x W plane at ``dst[d0]``."""
    for j in range(1, rows[0] + 1):
        r = d0 + rows[j] * W
        for iw in range(W):
            dst[_u(r + iw)] = 0
    for ih in range(H if cols[0] > 0 else 0):
        r = d0 + ih * W
        for j in range(1, cols[0] + 1):
            dst[_u(r + cols[j])] = 0


@njit(inline="always")
def _finite_taps(w, c):
    s = w[0, 0, c] * 0
    for kh in range(w.shape[0]):
        for kw in range(w.shape[1]):
            s += w[kh, kw, c] * 0
    return s == 0


@njit(inline="always")
def _dims(x, w, y):
    """(N, C, H, W, KH, KW, CM, OH, OW, M) of input planes ``x[N, C, H, W]``, taps
    ``w[KH, KW, CM]`` and output planes ``y[N, CM, OH, OW]``, M = CM // C."""
    N, C, H, W = x.shape
    CM, OH, OW = y.shape[1], y.shape[2], y.shape[3]
    return N, C, H, W, w.shape[0], w.shape[1], CM, OH, OW, CM // C


@njit(parallel=True, nogil=True, cache=True)
def forward(x, w, y, sh, sw, rh, rw, ph, pw, stream):
    """y[n, c*M + m, oh, ow] = sum over (kh, kw) of
    x[n, c, oh*sh - ph + kh*rh, ow*sw - pw + kw*rw] * w[kh, kw, c*M + m].

    ``x[N, C, H, W]``, ``w[KH, KW, C*M]``, ``y[N, C*M, OH, OW]``, all
    C-contiguous (depth multiplier M: each input plane copied once for its M
    output planes). ``stream``: each output plane assembled in a scratch plane
    and written to y with non-temporal stores (``y`` 64-byte aligned, planes of
    whole 64-byte lines: the driver's ``_plane_streaming``). A run-time flag, not
    a second kernel: it decides once per plane, and a second kernel cost CI and
    a cold start another compilation per dtype.
    """
    N, C, H, W, KH, KW, CM, OH, OW, M = _dims(x, w, y)
    RQ, WQ, L, S = _geometry(KH, KW, OH, OW, sh, sw, rh, rw)
    wk = w.reshape(KH * KW, CM)
    xf = x.reshape(N * C * H * W)
    yf = y.reshape(N * CM * OH * OW)
    NP = N * C
    T = _task_count(NP)
    for job in prange(T):
        xp, cols, offs = _task_scratch(w.dtype, KH, KW, W, sh, sw, rh, rw, pw, WQ, S)
        acc = np.empty(L, w.dtype)
        wv = np.empty(KH * KW, w.dtype)
        lost_rows = _unlinked(OH, H, KH, sh, rh, ph, True)
        lost_cols = _unlinked(OW, W, KW, sw, rw, pw, True)
        geo = (H, W, OH, OW, sh, sw, ph, pw, RQ, WQ, S, L, (KH - 1) * rh // sh + 2)
        # stream: each output plane assembled here, then sent to y
        stage = np.empty(OH * OW if stream else 0, y.dtype)
        for pl in range(job * NP // T, (job + 1) * NP // T):
            n, c = pl // C, pl % C
            copied = False
            for k in range(c * M, (c + 1) * M):
                if not _finite_taps(w, k):
                    _fwd_direct(x[n, c], w, y[n, k], k, sh, sw, rh, rw, ph, pw)
                    continue
                for t in range(KH * KW):
                    wv[t] = wk[t, k]
                y0 = (n * CM + k) * OH * OW
                dst, d0 = (stage, 0) if stream else (yf, y0)
                _fwd_plane(xf, (n * C + c) * H * W, not copied, xp, cols, acc, offs, wv,
                           KH * KW, dst, d0, geo)
                _clear(dst, d0, OH, OW, lost_rows, lost_cols)
                if stream:
                    _stream_copy(yf, y0, stage, 0, OH * OW)
                copied = True
        if stream:
            _sfence()


@njit(inline="always")
def _rows_read(i1, WQ, reach, sh, ph, H):
    """Input rows that the first ``i1`` elements of a run read, through any tap:
    those in phase-plane rows below (i1 - 1) // WQ + ``reach``, where ``reach``
    is the window's reach in phase-plane rows plus 2 (a tap's column offset can
    carry it into the next row)."""
    return max(0, min(H, ((i1 - 1) // WQ + reach) * sh - ph))


@njit(inline="always")
def _fwd_plane(xf, s0, scatter, xp, cols, acc, offs, wv, ntaps, yf, y0, geo):
    """One output plane: the tap sums in pieces of about _PIECE elements, each
    preceded by copying (``scatter``: else they are there) the input rows it
    reads into the phase planes and followed by copying out the output rows it
    completed. Memory is then read and written all through the plane's sums;
    copying the whole plane in, summing, then copying it out had left memory
    idle during the sums and the sums waiting on memory during the copies.
    (:func:`forward` alone, 1 thread, N=8 56x56x144 3x3: 2.9-3.0 ms before, 2.5
    in pieces, 2.35 with runs of planes per task, 1.85-2.1 with both; 1.3 ms
    channels-last.)"""
    H, W, OH, OW, sh, sw, ph, pw, RQ, WQ, S, L, reach = geo
    done_in = 0 if scatter else H
    done_out = 0
    pieces = max(1, L // _PIECE)
    for j in range(pieces):
        i0 = j * L // pieces // _VEC * _VEC
        i1 = L if j == pieces - 1 else (j + 1) * L // pieces // _VEC * _VEC
        need = _rows_read(i1, WQ, reach, sh, ph, H)
        if need > done_in:
            _scatter_plane(xf, s0, H, W, xp, cols, sh, sw, ph, pw, RQ, WQ, S, done_in, need)
            done_in = need
        _tap_sums(acc, i0, xp[i0:], offs, wv, ntaps, i1 - i0)
        ready = OH if j == pieces - 1 else min(OH, i1 // WQ)
        if ready > done_out:
            _copy_rows(yf, y0 + done_out * OW, OW, acc, done_out * WQ, WQ, ready - done_out, OW)
            done_out = ready


# The paths for non-finite taps (_fwd_direct, _bin_direct, _bfil_direct) are
# calls, not inlined: they are rare, and inlined they took about 7 s of each plane
# kernel's compilation (backprop_input 44 -> 38 s).
@njit(nogil=True)
def _fwd_direct(x, w, y, c, sh, sw, rh, rw, ph, pw):
    """Forward of one plane, skipping the padding (for non-finite taps): the taps
    inside the map in (kh, kw) order, fused from -0 (the first product rounded
    alone), as the channels-last kernels sum them; 0 where the window holds none."""
    H, W = x.shape
    OH, OW = y.shape
    neg0 = -np.zeros(1, w.dtype)[0]
    for oh in range(OH):
        for ow in range(OW):
            s = neg0
            some = False
            for kh in range(w.shape[0]):
                ih = oh * sh - ph + kh * rh
                if 0 <= ih < H:
                    for kw in range(w.shape[1]):
                        iw = ow * sw - pw + kw * rw
                        if 0 <= iw < W:
                            s = _fma(_val(x[ih, iw]), w[kh, kw, c], s)
                            some = True
            y[oh, ow] = _stored(s if some else s - s, y)


@njit(nogil=True)
def _bin_direct(g, w, out, c, sh, sw, rh, rw, ph, pw):
    """Input gradient of one plane, skipping the padding (for non-finite taps):
    each input cell gathers the outputs whose windows reach it, in (kh, kw)
    order, fused from -0 as :func:`_fwd_direct`; 0 where none does."""
    H, W = out.shape
    OH, OW = g.shape
    neg0 = -np.zeros(1, w.dtype)[0]
    for ih in range(H):
        for iw in range(W):
            s = neg0
            some = False
            for kh in range(w.shape[0]):
                t = ih + ph - kh * rh
                if t < 0 or t % sh != 0 or t // sh >= OH:
                    continue
                for kw in range(w.shape[1]):
                    u = iw + pw - kw * rw
                    if u < 0 or u % sw != 0 or u // sw >= OW:
                        continue
                    s = _fma(_val(g[t // sh, u // sw]), w[kh, kw, c], s)
                    some = True
            out[ih, iw] = _stored(s if some else s - s, out)


@njit(parallel=True, nogil=True, cache=True)
def backprop_input(dy, w, dx, sh, sw, rh, rw, ph, pw, stream):
    """The adjoint of :func:`forward`: each output's gradient spread over its window.

    ``dy[N, C*M, OH, OW]``, ``w[KH, KW, C*M]``, ``dx[N, C, H, W]``: depth
    multiplier M, input channel c's gradient the sum of its M output channels'
    (each computed as at multiplier 1, added in order of m). ``stream``: the
    strided planes (multiplier 1) written to dx with non-temporal stores, each
    assembled first in a scratch plane (``dx`` 64-byte aligned, planes of whole
    64-byte lines: the driver's ``_plane_streaming``); a run-time flag, as the
    forward's.
    """
    N, C, H, W, KH, KW, CM, OH, OW, M = _dims(dx, w, dy)
    RQ, WQ, L, S = _geometry(KH, KW, OH, OW, sh, sw, rh, rw)
    wk = w.reshape(KH * KW, CM)
    # Gather form, phase plane by phase plane: input cell j of phase plane (a, b)
    # collects gp[j - off] * w for each tap of that phase, whose offset into the
    # phase plane is off. gp is stored after a lead of zeros (lead >= every off).
    dyf = dy.reshape(N * CM * OH * OW)
    dxf = dx.reshape(N * C * H * W)
    lead = ((KH - 1) * rh // sh + 1) * WQ + _VEC
    LJ = (RQ * WQ + _VEC - 1) // _VEC * _VEC
    # only the phase-plane rows that hold input rows are computed
    j0 = (ph // sh) * WQ
    LR = min(RQ * WQ, ((ph + H - 1) // sh + 1) * WQ) - j0
    LR = (max(LR, 0) + _VEC - 1) // _VEC * _VEC
    NP = N * C
    T = _task_count(NP)
    for job in prange(T):
        xp = np.empty(0 if sw == 2 else sh * sw * S, w.dtype)    # the phase planes
        # columns past OW stay 0; interleaved_sums reads up to a vector past a row
        gp = np.zeros(max(lead + LJ, lead + RQ * WQ + (pw + 1) // 2 + (W + 1) // 2 + _VEC)
                      + _VEC, w.dtype)
        cols = np.empty((sw, 2), np.int64)
        _phase_cols(cols, sw, pw, W, WQ)
        # taps grouped by phase: which taps, and their source offsets into gp
        nph = sh * sw
        count = np.zeros(nph, np.int64)
        which = np.empty((nph, KH * KW), np.int64)
        src = np.empty((nph, KH * KW), np.int64)
        for kh in range(KH):
            a, dr = (kh * rh) % sh, (kh * rh) // sh
            for kw in range(KW):
                b, dq = (kw * rw) % sw, (kw * rw) // sw
                f = a * sw + b
                which[f, count[f]] = kh * KW + kw
                src[f, count[f]] = lead - (dr * WQ + dq) + j0
                count[f] += 1
        wv = np.empty(KH * KW, w.dtype)
        # column stride 2: each row phase's taps of the even and of the odd columns
        # (their offsets into gp from a row's start, and which taps), for
        # interleaved_sums
        KK = KH * KW
        pairs = np.zeros((sh, 2), np.int64)
        poffs = np.empty(sh * KK if sw == 2 else 0, np.int64)
        ptaps = np.empty(sh * KK if sw == 2 else 0, np.int64)
        pwv = np.empty(sh * KK if sw == 2 else 0, w.dtype)
        for a in range(sh if sw == 2 else 0):
            n = a * KK
            for e in range(2):
                f = a * 2 + (pw + e) % 2
                for t in range(count[f]):
                    poffs[n] = src[f, t] - j0 + (pw + e) // 2
                    ptaps[n] = which[f, t]
                    n += 1
                pairs[a, e] = count[f]
        # input cells no window reaches: an empty sum, +0, where the phase planes
        # hold sums of the padding's zero products (-0 with a negative tap)
        lost_rows = _unlinked(H, OH, KH, sh, rh, ph, False)
        lost_cols = _unlinked(W, OW, KW, sw, rw, pw, False)
        geo = (H, W, OH, OW, sh, sw, rh, rw, ph, pw, RQ, WQ, S, lead, j0, LR, KK)
        # stream at column stride 2: rows of whole 64-byte lines stored straight to
        # dx, non-temporally (_bin_rows)
        direct = 1 if stream and M == 1 and sw == 2 and W % (64 // dx.itemsize) == 0 else 0
        rows = (pairs, poffs, ptaps, pwv, direct)
        # depth multiplier M > 1: the M output channels' gradients summed in order
        # of m (as if the input were repeated in memory), the last sum stored
        total = np.empty(H * W if M > 1 else 0, w.dtype)
        more = np.empty(H * W if M > 1 else 0, w.dtype)
        # stream: each strided plane assembled here, then sent to dx (_bin_plane)
        stage = np.empty(H * W if stream and M == 1 and sh * sw > 1 and not direct else 0,
                         dx.dtype)
        p0, p1 = job * NP // T, (job + 1) * NP // T
        if M > 1:
            _bin_multiplier_planes(dy, dyf, w, wk, p0, p1, C, M, gp, xp, wv, count, which,
                                   src, cols, lost_rows, lost_cols, dxf, total, more, geo,
                                   rows)
        else:
            for pl in range(p0, p1):
                _bin_plane(dy, dyf, w, wk, pl // C, pl % C, gp, xp, wv, count, which, src,
                           cols, lost_rows, lost_cols, dxf, pl * H * W, geo, stage, rows)
        if stream:
            _sfence()


# Depth multipliers above 1 call the plane code, one call per task, instead of
# inlining it a second time: the kernel took 72 s to compile, 44 s with this call.
@njit(nogil=True)
def _bin_multiplier_planes(dy, dyf, w, wk, p0, p1, C, M, gp, xp, wv, count, which, src, cols,
                           lost_rows, lost_cols, dxf, total, more, geo, rows):
    """Input planes [p0, p1) of :func:`backprop_input` at depth multiplier M > 1:
    the M output channels' gradients of each summed in order of m (as if the
    input were repeated in memory), the last sum stored."""
    H, W = geo[0], geo[1]
    for pl in range(p0, p1):
        n, c = pl // C, pl % C
        d0 = pl * H * W
        for m in range(M):
            _bin_plane(dy, dyf, w, wk, n, c * M + m, gp, xp, wv, count, which, src, cols,
                       lost_rows, lost_cols, total if m == 0 else more, 0, geo, total[:0],
                       rows)
            if m == M - 1:
                for i in range(H * W):
                    dxf[_u(d0 + i)] = _stored(total[_u(i)] + more[_u(i)], dxf)
            elif m > 0:
                for i in range(H * W):
                    total[_u(i)] += more[_u(i)]


@njit(inline="always")
def _bin_plane(dy, dyf, w, wk, n, k, gp, xp, wv, count, which, src, cols, lost_rows, lost_cols,
               dst, at, geo, stage, rows):
    """Output channel k's input gradient of image n, into the plane at ``dst[at]``
    (see :func:`backprop_input`); strided, with a ``stage`` (not empty): there
    first, then streamed to ``dst`` (:func:`.simd.stream_copy`)."""
    H, W, OH, OW, sh, sw, rh, rw, ph, pw, RQ, WQ, S, lead, j0, LR, KK = geo
    if not _finite_taps(w, k):
        _bin_direct(dy[n, k], w, dst[at:at + H * W].reshape(H, W), k, sh, sw, rh, rw, ph, pw)
        return
    g0 = (n * dy.shape[1] + k) * OH * OW
    if sw == 2:
        _bin_rows(dyf, wk, k, g0, gp, dst, at, stage, lost_rows, lost_cols, geo, rows)
        return
    if sh * sw > 1:
        _copy_rows(gp, lead, WQ, dyf, g0, OW, OH, OW)
        for f in range(sh * sw):
            for t in range(count[f]):
                wv[t] = wk[which[f, t], k]
            _tap_sums(xp, f * S + j0, gp, src[f], wv, count[f], LR)
        if stage.size:
            _gather_plane(xp, stage, 0, H, W, cols, sh, sw, ph, pw, RQ, WQ, S, 0, H)
            _clear(stage, 0, H, W, lost_rows, lost_cols)
            _stream_copy(dst, at, stage, 0, H * W)
            return
        _gather_plane(xp, dst, at, H, W, cols, sh, sw, ph, pw, RQ, WQ, S, 0, H)
    else:
        # one phase plane: in pieces, as the forward (:func:`_fwd_plane`)
        for t in range(count[0]):
            wv[t] = wk[which[0, t], k]
        done_in, done_out = 0, 0
        pieces = max(1, LR // _PIECE)
        for j in range(pieces):
            i0 = j * LR // pieces // _VEC * _VEC
            i1 = LR if j == pieces - 1 else (j + 1) * LR // pieces // _VEC * _VEC
            # gp's element lead + j0 + i holds dy row (j0 + i) // WQ, and a tap
            # reads no further on than that
            need = min(OH, (j0 + i1 - 1) // WQ + 1)
            if need > done_in:
                _copy_rows(gp, lead + done_in * WQ, WQ, dyf, g0 + done_in * OW, OW,
                           need - done_in, OW)
                done_in = need
            _tap_sums(xp, j0 + i0, gp[i0:], src[0], wv, count[0], i1 - i0)
            # phase-plane row r holds input row r - ph (j0 = ph * WQ)
            ready = H if j == pieces - 1 else min(H, i1 // WQ)
            if ready > done_out:
                _gather_plane(xp, dst, at, H, W, cols, 1, 1, ph, pw, RQ, WQ, S, done_out, ready)
                done_out = ready
    _clear(dst, at, H, W, lost_rows, lost_cols)


@njit(inline="always")
def _bin_rows(dyf, wk, k, g0, gp, dst, at, stage, lost_rows, lost_cols, geo, rows):
    """:func:`_bin_plane` at a column stride of 2: each input-gradient row's even
    and odd columns summed side by side and stored interleaved
    (:func:`.simd.interleaved_sums`), with no phase planes to write and gather
    back. NCHW float32, 3x3, stride 2, phase planes / rows (ms, medians of
    11-31 calls alternating in one process, bit-identical): 1 thread, N=4
    112x112x96 2.54 / 1.48; 2 threads, streaming, N=32 112x112x96 15.0 / 4.7,
    56x56x144 6.4 / 3.1."""
    H, W, OH, OW, sh, sw, rh, rw, ph, pw, RQ, WQ, S, lead, j0, LR, KK = geo
    pairs, poffs, ptaps, pwv, direct = rows
    done_in = 0
    for a in range(sh):
        for t in range(a * KK, a * KK + pairs[a, 0] + pairs[a, 1]):
            pwv[t] = wk[ptaps[t], k]
    out, o0 = (stage, 0) if stage.size else (dst, at)
    # streaming through the stage: the 64-byte lines a row completes sent on
    # at once (while in L1), unless cells no window reaches are to be cleared
    line = 64 // dst.itemsize
    early = stage.size > 0 and lost_rows[0] + lost_cols[0] == 0
    sent = 0
    a, rr = ph % sh, ph // sh
    for ih in range(H):
        r = o0 + ih * W
        if rr < RQ:
            # the dy rows this row reads (rows up to rr) copied in as it comes
            # to them, the reads from memory spread among the writes
            need = min(OH, rr + 1)
            if need > done_in:
                _copy_rows(gp, lead + done_in * WQ, WQ, dyf, g0 + done_in * OW, OW,
                           need - done_in, OW)
                done_in = need
            _interleaved_sums(out, r, gp, rr * WQ, poffs, pwv, a * KK, pairs[a, 0],
                              pairs[a, 1], W, direct)
        else:
            for iw in range(W):
                out[_u(r + iw)] = 0
        if early:
            done = (r + W) // line * line
            if done > sent:
                _stream_copy(dst, at + sent, stage, sent, done - sent)
                sent = done
        a += 1
        if a == sh:
            a = 0
            rr += 1
    _clear(out, o0, H, W, lost_rows, lost_cols)
    if stage.size:
        _stream_copy(dst, at + sent, stage, sent, H * W - sent)


@njit(parallel=True, nogil=True, cache=True, fastmath=_REDUCE_MATH)
def backprop_filter(x, dy, parts, sh, sw, rh, rw, ph, pw):
    """parts[p, kh, kw, k] = the filter gradient of output channel k over the images
    of chunk p.

    ``x[N, C, H, W]``, ``dy[N, C*M, OH, OW]``, ``parts[P, KH, KW, C*M]`` (depth
    multiplier M: output channel c*M + m sees input channel c, whose plane is
    copied once for its M output planes). The images are split into P chunks
    that depend on the problem only and each task sums its chunk's images in
    order (each image's run in fixed chunks), so the result does not depend on
    the number of threads.
    """
    N, C, H, W, KH, KW, CM, OH, OW, M = _dims(x, parts[0], dy)
    P = parts.shape[0]
    RQ, WQ, L, S = _geometry(KH, KW, OH, OW, sh, sw, rh, rw)
    xf = x.reshape(N * C * H * W)
    dyf = dy.reshape(N * CM * OH * OW)
    NP = P * C
    T = _task_count(NP)
    for job in prange(T):
        xp, cols, offs = _task_scratch(parts.dtype, KH, KW, W, sh, sw, rh, rw, pw, WQ, S)
        gp = np.zeros(L, parts.dtype)
        sums = np.empty((M, KH * KW), parts.dtype)
        one = np.empty(KH * KW * _SLOTS, parts.dtype)
        geo = (H, W, OH, OW, sh, sw, ph, pw, RQ, WQ, S, L, (KH - 1) * rh // sh + 2)
        for pc in range(job * NP // T, (job + 1) * NP // T):
            p, c = pc // C, pc % C
            sums[:] = 0
            for n in range(p * N // P, (p + 1) * N // P):
                for m in range(M):
                    _bfil_plane(x, dy, xf, dyf, m == 0, xp, cols, gp, offs, one, sums[m], n, c,
                                c * M + m, KH, KW, rh, rw, geo)
            for m in range(M):
                for kh in range(KH):
                    for kw in range(KW):
                        parts[p, kh, kw, c * M + m] = sums[m, kh * KW + kw]


@njit(inline="always")
def _bfil_plane(x, dy, xf, dyf, scatter, xp, cols, gp, offs, one, acc, n, c, k, KH, KW, rh, rw,
                geo):
    """Add image n's filter-gradient sums of output channel k (input channel c)
    into ``acc``: chunk by chunk, each preceded by copying in the rows of dy and
    (``scatter``: else they are in ``xp``) of x that it reads, as
    :func:`_fwd_plane` does."""
    H, W, OH, OW, sh, sw, ph, pw, RQ, WQ, S, L, reach = geo
    s0, g0 = (n * x.shape[1] + c) * H * W, (n * dy.shape[1] + k) * OH * OW
    done_x = 0 if scatter else H
    done_g = 0
    one[:] = 0
    for i0 in range(0, L, _CHUNK):
        i1 = min(L, i0 + _CHUNK)
        need = _rows_read(i1, WQ, reach, sh, ph, H)
        if need > done_x:
            _scatter_plane(xf, s0, H, W, xp, cols, sh, sw, ph, pw, RQ, WQ, S, done_x, need)
            done_x = need
        need = min(OH, (i1 - 1) // WQ + 1)        # gp[i] holds dy row i // WQ
        if need > done_g:
            _copy_rows(gp, done_g * WQ, WQ, dyf, g0 + done_g * OW, OW, need - done_g, OW)
            done_g = need
        _tap_dots(one, xp, offs, KH * KW, gp, i0, i1)
    for t in range(KH * KW):
        s = one[t * _SLOTS]
        for j in range(1, _SLOTS):
            s += one[t * _SLOTS + j]
        one[t] = s
    # With finite operands every product is finite (the padding and the extra
    # columns contribute exact zeros); a NaN or Inf sum means an operand was not
    # finite, and then padding products must not count.
    check = one[0] * 0
    for t in range(KH * KW):
        check += one[t] * 0
    if check == 0:
        for t in range(KH * KW):
            acc[t] += one[t]
    else:
        _bfil_direct(x[n, c], dy[n, k], acc, KH, KW, sh, sw, rh, rw, ph, pw)


@njit(nogil=True, fastmath=_REDUCE_MATH)     # as its caller
def _bfil_direct(xs, g, acc, KH, KW, sh, sw, rh, rw, ph, pw):
    """One image's filter gradient for one channel, skipping the padding (for
    planes with NaN or Inf)."""
    H, W = xs.shape
    OH, OW = g.shape
    for kh in range(KH):
        for kw in range(KW):
            s = 0.0
            for oh in range(OH):
                ih = oh * sh - ph + kh * rh
                if 0 <= ih < H:
                    for ow in range(OW):
                        iw = ow * sw - pw + kw * rw
                        if 0 <= iw < W:
                            s += _val(xs[ih, iw]) * _val(g[oh, ow])
            acc[kh * KW + kw] += s
