"""Kernels that compute each block of channels in a padded channels-last tile.

On a 7x7 map a channels-first plane holds 49 values: whatever a plane kernel does
per plane (copies, loop set-up, short vector runs) is paid for a few dozen
multiply-adds. Channels-last kernels have no such cost, since they vectorise
across channels. Here a task transposes a block of channels of one image
into a channels-last tile (with the padding written as zeros; in L1 on small
maps, in L2 on larger strided ones), computes there exactly as the
channels-last kernels do, and transposes the result back. The transposes work
on 8 x 8 blocks in vector registers (:func:`.simd.transpose8`); only the pixels
and channels left over from whole 8-blocks go one by one.

The same kernels, built for channels-last arrays, take the filter gradient of
small channels-last maps: the tile is then a plain copy of a block of channels
with its padding, which spares the row kernels' border loops and their one
partial filter per output row.

Products with the zero padding are not products of the operator; with an Inf
or NaN weight they would put NaN where the operator has none. Channels whose
taps are not all finite (forward, input gradient), and channels whose
filter-gradient sums over a chunk of images are not finite, are therefore
recomputed by the direct loops of :mod:`.planes`, which skip the padding.

Channels-first 16-bit operands (float16 as ``int16``, bfloat16 as ``uint16``
bit patterns: :func:`.halves.bits`) are read and written in place: a job widens
its block of channels (a contiguous run of the array) into a float32 buffer of
its own before filling tiles from it, and a 16-bit result's block is assembled in
float32 and rounded as it is stored. No widened copy of a whole operand is made.

These kernels take 2-D (and 1-D) problems with depth multiplier 1: at stride 1
on small maps, and the forward and filter gradient of strided 3x3 windows on
mid-sized maps (the driver's ``_tile_width`` and ``_filter_tile_width`` say
which, from measurements); within a sum the taps come in (kh, kw) order, as in
the other kernels.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from .cache_key import instance as _instance
from .halves import stored as _stored
from .halves import value as _value
from .kernels import UNROLLED, _REDUCE_MATH, _u

#: Window shapes the tile kernels are built for (the unrolled ones of the row kernels).
WINDOWS = UNROLLED
from .planes import _bfil_direct, _bin_direct, _clear, _fwd_direct, _unlinked
from .simd import WIDE as _SIMD_WIDE
from .simd import prefetch as _prefetch
from .simd import taps_dot8 as _taps_dot8
from .simd import taps_dot16 as _taps_dot16
from .simd import taps_rows as _taps_rows
from .simd import transpose8 as _t8
from .tasks import Parallel

# The tile kernels run one task per thread (:class:`.tasks.Parallel`'s
# ``per_thread``), each a run of jobs that sets up its scratch once. The
# correlations took up to 8 per thread before (one per job up to 16 jobs): 2
# threads, NCHW, the public API, the two alternating in one process, medians
# of 7 rounds (ms, forward and input gradient): N=1 7x7x960 0.0430 -> 0.0374,
# 0.0429 -> 0.0396; 7x7x1152 5x5 0.0665 -> 0.0601, 0.0703 -> 0.0633; 14x14x672
# 5x5 0.115 -> 0.101, 0.124 -> 0.107; N=8 7x7x960 0.197 -> 0.186, 0.215 ->
# 0.200; 7x7x1152 5x5 0.353 -> 0.336, 0.389 -> 0.372; the other tile rows
# within 3 %. The filter gradient took up to 64 (11 rounds): N=1 7x7x960 0.0379
# -> 0.0343, 7x7x1152 5x5 0.0618 -> 0.0569, 14x14x672 5x5 0.122 -> 0.111; N=8
# 7x7x960 0.260 -> 0.234; 28x28x240 5x5 N=8 1.19 -> 1.24 (slower in three runs:
# each job then asked for the next one's 400 KB, which ``_ASK_ELEMS`` now
# leaves out), N=32 5.05 -> 4.92.


# Channels per tile: on small maps eight 8-lane vectors per pixel (a 9 x 9 tile of
# them is 20 KiB); on larger, strided maps two, so that the tile stays in L2.
WIDE, NARROW = 64, 16

def _bits(a):
    """Whether array ``a`` holds 16-bit bit patterns (a compile-time constant)."""
    return False


@overload(_bits)
def _bits_impl(a):
    held = a.dtype in (types.uint16, types.int16)
    return lambda a: held


def _floats(a, a0, n, buf):
    """(array, offset) holding ``a[a0:a0 + n]`` as the kernels compute with it:
    ``a`` itself, or for bit patterns ``buf`` with the run widened into it."""
    return a, a0


@overload(_floats)
def _floats_impl(a, a0, n, buf):
    if a.dtype in (types.uint16, types.int16):
        def widen(a, a0, n, buf):
            for i in range(n):
                buf[i] = _value(a[_u(a0 + i)])
            return buf, 0
        return widen
    return lambda a, a0, n, buf: (a, a0)


def _result(d, d0, buf):
    """(array, offset) a run of results starting at ``d[d0]`` is assembled in:
    ``d`` itself, or for bit patterns ``buf`` (then :func:`_store`)."""
    return d, d0


@overload(_result)
def _result_impl(d, d0, buf):
    if d.dtype in (types.uint16, types.int16):
        return lambda d, d0, buf: (buf, 0)
    return lambda d, d0, buf: (d, d0)


@njit(inline="always")
def _store(buf, n, d, d0):
    """The run assembled by :func:`_result` into ``d[d0:d0 + n]``, each value
    rounded to ``d``'s 16-bit type as it is stored (nothing to do for floats)."""
    if _bits(d):
        for i in range(n):
            d[_u(d0 + i)] = _stored(buf[i], d)


@njit(inline="always")
def _to_tile(src, s0, cs, P, cb, tile, t0, pos, p0):
    """``cb`` channels of P pixels, ``src[s0 + c*cs + p]``, into
    ``tile[t0 + pos[p0 + p] + c]``."""
    g8 = cb // 8 * 8
    p8 = P // 8 * 8
    for p in range(0, p8, 8):
        for g in range(0, g8, 8):
            _t8(src, s0 + g * cs + p, cs, tile, t0 + g, pos, p0 + p)
    for c in range(g8):
        for p in range(p8, P):
            tile[_u(t0 + pos[p0 + p] + c)] = src[_u(s0 + c * cs + p)]
    for c in range(g8, cb):
        for p in range(P):
            tile[_u(t0 + pos[p0 + p] + c)] = src[_u(s0 + c * cs + p)]


@njit(inline="always")
def _copy_pixels(src, s0, C, P, cb, tile, t0, pos, p0):
    """The channels-last twin of :func:`_to_tile`: ``cb`` channels of P pixels,
    ``src[s0 + p*C + c]``, into ``tile[t0 + pos[p0 + p] + c]`` (a contiguous run
    per pixel: no transpose)."""
    for p in range(P):
        t = t0 + pos[p0 + p]
        s = s0 + p * C
        for c in range(cb):
            tile[_u(t + c)] = src[_u(s + c)]


@njit(inline="always")
def _from_tile(tile, P, cb, dst, d0, cs, down, CB):
    """The inverse of :func:`_to_tile` for an unpadded tile of ``CB`` channels
    (pixel p at ``p*CB``): ``dst[d0 + c*cs + p] = tile[p*CB + c]``; ``down[c] = c*cs``
    for c < 8."""
    g8 = cb // 8 * 8
    p8 = P // 8 * 8
    for g in range(0, g8, 8):
        for p in range(0, p8, 8):
            _t8(tile, p * CB + g, CB, dst, d0 + g * cs + p, down, 0)
        for c in range(g, g + 8):
            for p in range(p8, P):
                dst[_u(d0 + c * cs + p)] = tile[_u(p * CB + c)]
    for c in range(g8, cb):
        for p in range(P):
            dst[_u(d0 + c * cs + p)] = tile[_u(p * CB + c)]


@njit(inline="always")
def _band_rows(band, WP, LA, s, CB):
    """Output rows per band: as many as keep a band's tile (rows ``(rows-1)*s + LA + 1``
    of ``WP`` cells) within ``band`` elements, at least one."""
    return max(1, (band // (WP * CB) - LA - 1) // s + 1)


@njit(inline="always")
def _fill_band(sf, s0, SH, SW, lo, hi, r0, q0, cb, tile, WP, CB, pos, C, cl):
    """Tile rows [lo, hi) of one block's channels: tile cell (r, q) holds source
    pixel (r - r0, q - q0); cells outside the source are zeros. The block starts
    at ``sf[s0]``: channels-first (``cl`` False), the first channel's plane;
    channels-last, pixel (0, 0)'s first channel, pixels ``C`` apart.

    Only the padding is zeroed, not the whole band (on a 112x112 map that halved
    the time of a fill); with fewer than ``CB`` channels all of it is, so that the
    spare lanes hold zeros, not whatever the buffer held."""
    a0, a1 = max(0, lo - r0), min(SH, hi - r0)
    if cb < CB or a1 <= a0:
        tile[:(hi - lo) * WP * CB] = 0
    else:
        tile[:(a0 + r0 - lo) * WP * CB] = 0
        tile[(a1 + r0 - lo) * WP * CB:(hi - lo) * WP * CB] = 0
        for r in range(a0 + r0 - lo, a1 + r0 - lo):
            tile[r * WP * CB:(r * WP + q0) * CB] = 0
            tile[(r * WP + q0 + SW) * CB:(r + 1) * WP * CB] = 0
    if a1 > a0 and cl:
        _copy_pixels(sf, s0 + a0 * SW * C, C, (a1 - a0) * SW, cb, tile, -lo * WP * CB, pos,
                     a0 * SW)
    elif a1 > a0:
        _to_tile(sf, s0 + a0 * SW, SH * SW, (a1 - a0) * SW, cb, tile, -lo * WP * CB, pos,
                 a0 * SW)


# Largest block (elements) that :func:`_ask_for` asks for ahead: a 7x7 or 14x14
# map's 64 channels (3K, 12K elements), a 19x19 map's (23K, even either way),
# not a 28x28 map's or 16 channels of a 56x56 map (50K each). 2 threads, one
# task per thread, NCHW, the kernel alone alternating in one process, medians
# of 9 rounds, 64K / 32K (ms): 56x56x144 3x3 stride 2 forward N=8 0.908 / 0.744,
# N=32 3.81 / 3.08, filter gradient N=8 0.861 / 0.690; 28x28x240 5x5 filter
# gradient N=8 1.086 / 0.909, N=32 5.30 / 4.74, forward N=8 1.090 / 1.049, N=32
# 6.09 / 6.13, input gradient N=8 1.132 / 1.071; 7x7x960 and 14x14x672 even.
_ASK_ELEMS = 1 << 15


@njit(inline="always")
def _ask_for(a, a0, n):
    """Ask for ``a[a0:a0 + n]`` (the block of channels a task computes next) to be
    brought into the cache while this one is computed. A block is a contiguous run, but
    a tile reads it as 8 runs a plane apart, which the hardware prefetchers did
    not follow from memory. 1 thread, N=32 7x7x960 (12 MB of operands), the
    tasks without / with, medians of 8 alternating rounds (ms): filter gradient
    1.97 / 1.48, 1.45 / 1.23; input gradient 1.26 / 1.11, 1.55 / 1.36; forward
    1.00 / 0.97, 1.24 / 1.29. At N=8 (3 MB) even. Not for blocks of more
    than ``_ASK_ELEMS`` elements, which pushed the current block's bands and
    tiles out of L2."""
    if n > _ASK_ELEMS:
        return
    for i in range(a0, a0 + n, 64 // a.itemsize):
        _prefetch(a, i)


@njit(inline="always")
def _positions(H, W, WP, r0, q0, CB):
    """pos[ih*W + iw] = CB * (tile cell of input (ih, iw)) in a tile of rows WP
    long whose cell (r0, q0) holds input (0, 0); 8 spare entries for _t8."""
    pos = np.zeros(H * W + 8, np.int64)
    for ih in range(H):
        for iw in range(W):
            pos[ih * W + iw] = ((ih + r0) * WP + iw + q0) * CB
    return pos


@njit(inline="always")
def _block_taps(wt, wk, c0, cb, KT, CB):
    """wt[t*CB + c] = wk[t, c0 + c] (zeros past cb: spare lanes stay finite)."""
    wt[:] = 0
    for t in range(KT):
        for c in range(cb):
            wt[t * CB + c] = wk[t, c0 + c]


@njit(inline="always")
def _dims(src, dst, cl):
    """(N, C, SH, SW, DH, DW): batch, channels and the spatial sizes of a source and
    a result array, channels-last (``cl``) or channels-first."""
    if cl:
        return (src.shape[0], src.shape[3], src.shape[1], src.shape[2], dst.shape[1],
                dst.shape[2])
    return src.shape[0], src.shape[1], src.shape[2], src.shape[3], dst.shape[2], dst.shape[3]


@njit(inline="always")
def _lane_checks(v, chk, n, KT, CB):
    """chk[c] = sum over t < KT of v[t*CB + c] * 0, for c < n: zero where lane c's
    KT values are all finite, NaN where one is not. Lanes side by side, so that it
    vectorises: checking one channel's taps at a time (a chain of dependent adds)
    cost as much as the tile forward itself on 7x7 maps."""
    for c in range(n):
        chk[c] = v[c] * 0
    for t in range(1, KT):
        for c in range(n):
            chk[c] += v[t * CB + c] * 0


# Most taps whose 16-lane sums (:func:`.simd.taps_dot16`) stay in the AVX-512
# registers (5x5: 25 of 32); with more, and without AVX-512, 8 lanes at a time.
_WIDE_TAPS = 25 if _SIMD_WIDE == 16 else 0


@njit(inline="always")
def _dots(acc, CB, xt, sstep, xstep, toffs, ga, ga0, gstep, grow, OW, rows, lanes, taps):
    """The filter-gradient sums of a band's rows (:func:`.simd.taps_dot8`) for the
    ``lanes`` (a multiple of 8) first channels of a block: float32 sums of up to
    ``_WIDE_TAPS`` taps 16 lanes at a time, where one AVX-512 register holds
    them; 8 lanes in half of one had left each multiply-add doing half the work
    (the same sums per lane). 1 thread, N=8, channels-first filter-gradient
    tasks, 8 / 16 lanes (ms): 7x7x960 0.37-0.54 / 0.33-0.46, 14x14x384 0.63-0.65
    / 0.42-0.44, 7x7x1152 5x5 0.64-0.68 / 0.60-0.64."""
    g = 0
    if taps <= _WIDE_TAPS and acc.itemsize == 4:
        while g + 16 <= lanes:
            _taps_dot16(acc, g, CB, xt, g, sstep, xstep, toffs, ga, ga0 + g, gstep, grow, OW,
                        rows, taps)
            g += 16
    while g < lanes:
        _taps_dot8(acc, g, CB, xt, g, sstep, xstep, toffs, ga, ga0 + g, gstep, grow, OW, rows,
                   taps)
        g += 8


def _build(KH, KW, CB, CL):
    """The kernels for a KH x KW window, its taps unrolled, on tiles of ``CB``
    channels (a multiple of 8), for channels-first arrays or (``CL``, the filter
    gradient only) channels-last ones. Without unrolling the forward's taps are
    summed through memory, ten times slower: there are no generic tile kernels,
    and the driver routes only the windows of ``WINDOWS`` here.

    Channels-last arrays need no transposes: the tiles are filled with one
    contiguous run of channels per pixel and the output gradient is read where it
    lies, 8 or 16 lanes at a time; only a block's last group of fewer than 8 channels
    goes through a small buffer, so that no lane reads past the array."""
    TAPS = KH * KW      # a compile-time constant for the register intrinsic

    @njit(nogil=True, cache=True)
    @_instance(KH, KW, CB, CL)
    def correlate(grp, groups, src, w, dst, sh, sw, rh, rw, ph, pw, band, adjoint):
        """The forward (``adjoint`` False, any stride) or the input gradient (True,
        stride 1):

        forward, ``src`` = x, ``dst`` = y: y[n, c, oh, ow] = sum over taps of
        x[n, c, oh - ph + kh*rh, ow - pw + kw*rw] * w[kh, kw, c];
        input gradient, ``src`` = dy, ``dst`` = dx, in gather form: dx[n, c, ih, iw] =
        sum over taps of dy[n, c, ih + ph - kh*rh, iw + pw - kw*rw] * w[kh, kw, c].

        ``src[N, C, SH, SW]``, ``w[KH, KW, C]``, ``dst[N, C, DH, DW]``; ``band``: tile
        elements per band of output rows. ``src`` and ``dst`` may hold 16-bit bit
        patterns (``w`` then holds float32).
        """
        N, C, SH, SW, DH, DW = _dims(src, dst, False)
        KH_, KW_ = KH, KW           # compile-time constants: the tap loops unroll
        LA, LB = (KH_ - 1) * rh, (KW_ - 1) * rw
        if adjoint:
            # dy with LA rows and LB columns of zeros on each side; dx (i, j) reads
            # back from tile cell (i + ph + LA, j + pw + LB)
            WP = SW + 2 * LB
            r0, q0, br, bq, step = LA, LB, ph + LA, pw + LB, -CB
        else:
            # the tile holds every input cell and every cell a window reaches
            WP = max(pw + SW, (DW - 1) * sw + LB + 1)
            r0, q0, br, bq, step = ph, pw, 0, 0, CB
        wk = w.reshape(KH_ * KW_, C)
        rstep, cstep = rh * WP * step, rw * step     # a tap row's and column's offsets
        sf = src.reshape(N * C * SH * SW)
        df = dst.reshape(N * C * DH * DW)
        lead = LA if adjoint else 0        # band rows read above the first output row
        BR = min(DH, _band_rows(band, WP, LA, sh, CB))
        nblk = (C + CB - 1) // CB
        # jobs (block, image) in one group per thread, block-major: a group's scratch
        # and a block's taps are set up once, not per job (on 7x7 maps a job is a few
        # microseconds)
        jobs = N * nblk
        pos = _positions(SH, SW, WP, r0, q0, CB)
        down = np.arange(8) * (DH * DW)
        st = np.empty(((BR - 1) * sh + LA + 1) * WP * CB, w.dtype)
        dt = np.empty(BR * DW * CB, w.dtype)
        wt = np.empty(TAPS * CB, w.dtype)
        chk = np.empty(CB, w.dtype)
        # a job's block widened, and its result before rounding (16-bit operands)
        sblk = np.empty(CB * SH * SW if _bits(src) else 0, w.dtype)
        dblk = np.empty(CB * DH * DW if _bits(dst) else 0, w.dtype)
        # cells with no taps (windows in the padding, inputs no window reads):
        # +0, where the tile's zeros give -0 products with a negative tap
        lost_rows = _unlinked(DH, SH, KH_, sh, rh, ph, not adjoint)
        lost_cols = _unlinked(DW, SW, KW_, sw, rw, pw, not adjoint)
        finite = True
        for job in range(grp * jobs // groups, (grp + 1) * jobs // groups):
            blk, n = job // N, job % N
            c0 = blk * CB
            cb = min(CB, C - c0)
            cv = (cb + 7) // 8 * 8
            if job == grp * jobs // groups or n == 0:
                _block_taps(wt, wk, c0, cb, TAPS, CB)
                _lane_checks(wt, chk, cb, TAPS, CB)
                finite = True
                for c in range(cb):
                    finite = finite and chk[c] == 0
            if job + 1 < (grp + 1) * jobs // groups:
                nc0 = (job + 1) // N * CB
                _ask_for(sf, ((job + 1) % N * C + nc0) * SH * SW, min(CB, C - nc0) * SH * SW)
            sa, s0 = _floats(sf, (n * C + c0) * SH * SW, cb * SH * SW, sblk)
            da, d0 = _result(df, (n * C + c0) * DH * DW, dblk)
            for i0 in range(0, DH, BR):
                i1 = min(DH, i0 + BR)
                lo = i0 * sh + br - lead
                _fill_band(sa, s0, SH, SW, lo, lo + (i1 - i0 - 1) * sh + LA + 1, r0, q0, cb,
                           st, WP, CB, pos, C, False)
                for i in range(i0, i1):
                    b = ((i * sh + br - lo) * WP + bq) * CB
                    _taps_rows(dt, (i - i0) * DW * CB, CB, st, b, sw * CB, rstep, cstep,
                               wt, 0, KW * CB, CB, DW, KH_, cv, KW, 0, None, 1, 1, 0)
                _from_tile(dt, (i1 - i0) * DW, cb, da, d0 + i0 * DW, DH * DW, down, CB)
            _store(dblk, cb * DH * DW, df, (n * C + c0) * DH * DW)
            for c in range(c0, c0 + cb if lost_rows[0] + lost_cols[0] > 0 else c0):
                _clear(df, (n * C + c) * DH * DW, DH, DW, lost_rows, lost_cols)
            if finite:
                continue
            for c in range(c0, c0 + cb):
                if chk[c - c0] == 0:
                    continue
                if adjoint:
                    _bin_direct(src[n, c], w, dst[n, c], c, 1, 1, rh, rw, ph, pw)
                else:
                    _fwd_direct(src[n, c], w, dst[n, c], c, sh, sw, rh, rw, ph, pw)

    @njit(nogil=True, cache=True, fastmath=_REDUCE_MATH)
    @_instance(KH, KW, CB, CL)
    def backprop_filter(grp, groups, x, dy, parts, sh, sw, rh, rw, ph, pw, band):
        """parts[p, kh, kw, c] = the filter gradient of channel c over the images of
        chunk p. Chunks depend on the problem only; each task sums its chunk's images
        in order, so the result does not depend on the thread count. Channels-first
        ``x`` and ``dy`` may hold 16-bit bit patterns."""
        N, C, H, W, OH, OW = _dims(x, dy, CL)
        P, KH_, KW_ = parts.shape[0], KH, KW
        KT = KH_ * KW_
        LA = (KH_ - 1) * rh
        WP = max(pw + W, (OW - 1) * sw + (KW_ - 1) * rw + 1)
        BR = min(OH, _band_rows(band, WP, LA, sh, CB))
        xf = x.reshape(N * C * H * W)
        dyf = dy.reshape(N * C * OH * OW)
        pf = parts.reshape(P * KT * C)
        nblk = (C + CB - 1) // CB
        # jobs (chunk, block) in one group per thread that sets up its scratch once,
        # as in the correlation
        jobs = P * nblk
        pos = _positions(H, W, WP, ph, pw, CB)
        xt = np.empty(((BR - 1) * sh + LA + 1) * WP * CB, parts.dtype)
        # the output gradient's tile; channels-last, only a short block's last lanes
        flat = np.arange((0 if CL else OH * OW) + 8) * CB
        gt = np.zeros(BR * OW * (8 if CL else CB), parts.dtype)
        acc = np.empty(KT * CB, parts.dtype)
        chk = np.empty(CB, parts.dtype)
        direct = np.empty(KT, parts.dtype)
        # a block of x and of dy widened (16-bit, channels-first)
        xblk = np.empty(CB * H * W if _bits(x) else 0, parts.dtype)
        gblk = np.empty(CB * OH * OW if _bits(dy) else 0, parts.dtype)
        toffs = np.empty(KT, np.int64)
        for kh in range(KH_):
            for kw in range(KW_):
                toffs[kh * KW_ + kw] = (kh * rh * WP + kw * rw) * CB
        for job in range(grp * jobs // groups, (grp + 1) * jobs // groups):
            p, blk = job // nblk, job % nblk
            c0 = blk * CB
            cb = min(CB, C - c0)
            cv = (cb + 7) // 8 * 8
            c8 = cb // 8 * 8
            acc[:] = 0
            for n in range(p * N // P, (p + 1) * N // P):
                # the next image's block, or the next job's first
                nn, nc0 = n + 1, c0
                if nn == (p + 1) * N // P:
                    nn = N
                    if job + 1 < (grp + 1) * jobs // groups:
                        nn, nc0 = (job + 1) // nblk * N // P, (job + 1) % nblk * CB
                if not CL and nn < N:
                    _ask_for(xf, (nn * C + nc0) * H * W, min(CB, C - nc0) * H * W)
                    _ask_for(dyf, (nn * C + nc0) * OH * OW, min(CB, C - nc0) * OH * OW)
                # (bit patterns come channels-first only: the driver's routes)
                xa, s0 = _floats(xf, n * H * W * C + c0 if CL else (n * C + c0) * H * W,
                                 cb * H * W, xblk)
                ga, gs0 = _floats(dyf, (n * C + c0) * OH * OW, cb * OH * OW, gblk)
                for o0 in range(0, OH, BR):
                    o1 = min(OH, o0 + BR)
                    lo = o0 * sh
                    hi = lo + (o1 - o0 - 1) * sh + LA + 1
                    _fill_band(xa, s0, H, W, lo, hi, ph, pw, cb, xt, WP, CB, pos, C, CL)
                    # all the band's rows in one call per 8 or 16 lanes: the sums stay in
                    # registers from the first row to the last
                    rows, xstep = o1 - o0, sh * WP * CB
                    if CL:
                        g0 = (n * OH + o0) * OW * C + c0     # the band's rows are contiguous
                        _dots(acc, CB, xt, sw * CB, xstep, toffs, dyf, g0, C, OW * C, OW, rows,
                              c8, TAPS)
                        if c8 < cb:
                            # spare lanes of gt stay zero (np.zeros)
                            for k in range(rows * OW):
                                for c in range(c8, cb):
                                    gt[k * 8 + c - c8] = dyf[g0 + k * C + c]
                            _taps_dot8(acc, c8, CB, xt, c8, sw * CB, xstep, toffs, gt, 0, 8,
                                       OW * 8, OW, rows, TAPS)
                    else:
                        _to_tile(ga, gs0 + o0 * OW, OH * OW, rows * OW, cb, gt, 0, flat, 0)
                        _dots(acc, CB, xt, sw * CB, xstep, toffs, gt, 0, CB, OW * CB, OW, rows,
                              cv, TAPS)
            # finite operands give finite sums (padding products are exact zeros);
            # a channel whose sums are not finite is summed again by the direct loop,
            # which skips the padding (checked once per job: per image it cost a tenth
            # of the time on 7x7 maps)
            _lane_checks(acc, chk, cb, KT, CB)
            for c in range(cb):
                if chk[c] == 0:
                    continue
                for t in range(KT):
                    acc[t * CB + c] = 0
                for n in range(p * N // P, (p + 1) * N // P):
                    direct[:] = 0
                    xs = x[n, :, :, c0 + c] if CL else x[n, c0 + c]
                    gs = dy[n, :, :, c0 + c] if CL else dy[n, c0 + c]
                    _bfil_direct(xs, gs, direct, KH_, KW_, sh, sw, rh, rw, ph, pw)
                    for t in range(KT):
                        acc[t * CB + c] += direct[t]
            # a contiguous run per tap (indexing parts[p, kh, kw, c] element by element
            # cost a tenth of the time on 7x7 maps)
            for t in range(KT):
                d = (p * KT + t) * C + c0
                for c in range(cb):
                    pf[_u(d + c)] = acc[_u(t * CB + c)]

    # Channels-last correlations stay on the row kernels (a channels-last tile
    # forward and input gradient measured even with them: 0.87-1.26)
    def blocks(c):
        return -(-c // CB)

    return (None if CL else Parallel(
                correlate, lambda src, w, dst, *_: src.shape[0] * blocks(src.shape[1]), 3,
                per_thread=True),
            Parallel(backprop_filter, lambda x, dy, parts, *_: parts.shape[0] * blocks(
                x.shape[3] if CL else x.shape[1]), 3, per_thread=True))


class TileKernels:
    """The tile kernels for one window shape, tile width and layout: ``correlate``
    (forward and input gradient; channels-first only, else None) and
    ``backprop_filter``."""

    def __init__(self, KH, KW, CB, CL):
        self.correlate, self.backprop_filter = _build(KH, KW, CB, CL)


_sets = {}


def kernels(KH, KW, CB, CL=False):
    """The tile kernels for a KH x KW window of ``WINDOWS`` on tiles of ``CB``
    channels, for channels-last (``CL``) or channels-first arrays."""
    key = (KH, KW, CB, bool(CL))
    if key not in _sets:
        _sets[key] = TileKernels(*key)
    return _sets[key]


def for_plan(plan, CB):
    """The tile kernels serving ``plan`` with tiles of ``CB`` channels."""
    return kernels(plan.kernel[1], plan.kernel[2], CB, plan.channels_last)
