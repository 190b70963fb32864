"""Channels-first kernels that read each plane where it lies, through lane masks.

At stride 1, when the output rows are as long as the input's (``OW == W``: the
padding of SAME and its like), output pixel q's tap t reads input pixel
``q + toffs[t]`` of a plane, a fixed offset: a vector of consecutive output
pixels reads a vector of consecutive input pixels for each tap. Nothing needs
to be copied, padded or transposed. The lanes whose tap falls outside the map
(in the padding, or a row's wrap into the next or previous row) are the same for
every plane; one mask per (tap, vector of pixels), built once per problem
(:func:`masks`), leaves them out of both the load and the multiply-add
(:func:`.simd.plane_dots`). The sums are therefore the operator's own, Inf and
NaN included, with no direct fallback: no product with the padding is formed.

The forward (and the stride-1 input gradient, the same correlation over the
output gradient with the offsets and masks of the adjoint's geometry) holds
sums of consecutive output pixels in registers through the taps, each tap's
weight broadcast (:func:`.simd.plane_taps`): each multiply-add takes one load,
the plane crosses memory once each way, and the plane kernels' copies into and
out of a padded scratch are gone. It beats them on every window and the tiles
on maps from memory (the driver's ``_in_place_correlation`` has the figures).

On 5x5 and 7x7 windows of dilation 1 in rows, with rows of three vectors or more,
the forward and input gradient take their output rows in blocks instead
(:func:`rows`, :func:`.simd.plane_rows`): a block's sums stay in registers down
its rows, one vector of columns at a time, and each input row's vector, loaded
once per column tap, serves every output row of the block that reads it. The
terms and their order are those of :func:`correlate`, so are the bits. 3x3
windows keep :func:`correlate`: their few taps leave too little to share
(the driver's ``_row_blocks`` has the figures).

The filter gradient here spares the plane kernels' padded copies and the tile
kernels' transposes. A tap's vector of input pixels starts anywhere in a line,
so each multiply-add takes an unaligned load of its own: the tiles (aligned
loads from L1, each input vector shared by a block's taps) stay faster on small
maps in the caches, and the planes on 5x5 and 7x7 windows (the driver's
``_in_place`` has the figures). A job sums a block of channels image by image,
each image's block a contiguous run of planes, and each plane's sums stay in
registers through its pixels; the images of a chunk are summed in order, so the
result does not depend on the thread count.

Both pass a 3x3 window's sizes (9 taps, 3 wide) to the intrinsics as constants:
inlined, LLVM then unrolls the loop over the taps and computes each tap's
indices once, where with the sizes as variables it reloaded them per tap. The
sums and their order are the same. 1 thread, float32, 64-byte-aligned planes,
the task alone, variables / constants, medians of 101 calls alternating in one
process (ms; Intel Emerald Rapids): forward 112x112x32 N=1 0.169 / 0.134, N=4
0.696 / 0.561, 56x56x144 N=1 0.213 / 0.169; input gradient 112x112x32 N=8
1.85 / 1.30; filter gradient 112x112x32 N=4 0.659 / 0.548, 56x56x144 N=1 0.281
/ 0.216. 5x5 and 7x7 windows gained 5-7 % (56x56x96 N=1 0.330 / 0.313, 0.668 /
0.636) and stay variable, sparing the compilations.
"""

import numpy as np
from numba import njit

from .cache_key import instance as _instance
from .kernels import _REDUCE_MATH
from .simd import DOT_SLOTS, plane_dots, plane_lanes, plane_rows, plane_taps
from .tasks import Parallel

# Most tasks a filter gradient is split into: enough for the machines this runs
# on to balance, few enough that each is many planes long.
GROUPS = 64


def masks(H, W, OH, OW, KH, KW, rh, rw, ph, pw, itemsize):
    """(bits, toffs, v0, v1) for :func:`.simd.plane_dots` on planes of ``H x W``
    inputs and ``OH x OW`` outputs (``OW == W``, stride 1) of ``itemsize``-byte
    sums. ``toffs[kh*KW + kw]``: the input pixel offset of tap (kh, kw). ``bits``,
    bit j for pixel ``v*L + j`` of vector v: ``bits[v]``, the output pixels that
    exist; ``bits[(t + 1)*nvec + v]``, those whose tap t lies inside the map;
    ``bits[(KH*KW + 1 + kw)*nvec + v]``, those whose column kw lies inside it;
    ``bits[(KH*KW + 1 + KW)*nvec + v]``, those with a tap inside it (the others'
    sums are empty: +0). [v0, v1): the vectors whose every lane and tap reads
    inside the planes."""
    lanes = plane_lanes.py_func(itemsize)   # from Python: no dispatcher to compile
    nvec = -(-OH * OW // lanes)
    q = np.arange(nvec * lanes)
    real = q < OH * OW
    dh = np.arange(KH) * rh - ph
    dw = np.arange(KW) * rw - pw
    ih = (q // OW)[None, :] + dh[:, None]
    iw = (q % OW)[None, :] + dw[:, None]
    column = real & (iw >= 0) & (iw < W)                   # (KW, pixels)
    row = (ih >= 0) & (ih < H)                             # (KH, pixels)
    inside = (row[:, None, :] & column[None, :, :]).reshape(KH * KW, -1)
    on = np.concatenate([real[None, :], inside, column, inside.any(axis=0)[None, :]])
    bits = _lane_bits(on, lanes)
    toffs = (dh[:, None] * W + dw[None, :]).reshape(-1).astype(np.int64)
    # vectors whose every lane exists and reads inside the plane at every tap
    lo, hi = -min(0, int(toffs.min())), H * W - max(0, int(toffs.max()))
    v0 = min(nvec, -(-lo // lanes))
    v1 = max(v0, min(OH * OW, hi) // lanes)
    return bits, toffs, v0, v1


def _lane_bits(on, lanes):
    """Per vector of ``lanes`` consecutive booleans of ``on`` (any shape, read in
    order), its mask: bit j for lane j, as uint16."""
    packed = np.packbits(on.reshape(-1, lanes), axis=1, bitorder="little")
    return (packed.view("<u2")[:, 0] if lanes == 16 else packed[:, 0]).astype(np.uint16)


# Most channels per job: a job sums each image's run of its planes (contiguous in
# memory) before the next image's, and keeps their lane sums in L1.
BLOCK = 64


def block(chunks, channels):
    """Channels per job for ``chunks`` chunks of images: up to ``BLOCK``, fewer
    where that leaves fewer than ``GROUPS`` jobs (one image of 112x112x32 was a
    single job)."""
    return max(1, min(BLOCK, chunks * channels // GROUPS))


@njit(nogil=True, cache=True, fastmath=_REDUCE_MATH)
def backprop_filter(grp, groups, x, dy, parts, bits, toffs, v0, v1, CB):
    """parts[p, kh, kw, c] = the filter gradient of channel c over the images of
    chunk p, for ``x[N, C, H, W]``, ``dy[N, C, OH, OW]`` (float32 or float64, or
    both 16-bit bit patterns with float32 ``parts``) and the lane masks and tap
    offsets of :func:`masks` (and its range of vectors read without masks); jobs
    of ``CB`` channels (:func:`block`). Chunks depend on the problem only and
    each sum runs in a fixed order, so the result does not depend on the thread
    count."""
    N, C, H, W = x.shape
    OH, OW = dy.shape[2], dy.shape[3]
    P, KT = parts.shape[0], toffs.shape[0]
    KW = parts.shape[2]
    nvec = bits.shape[0] // (KT + 2 + KW)
    lanes = plane_lanes(parts.itemsize)
    xf = x.reshape(N * C * H * W)
    dyf = dy.reshape(N * C * OH * OW)
    pf = parts.reshape(P * KT * C)
    span = KT * DOT_SLOTS
    one = np.empty(CB * span, parts.dtype)
    nblk = (C + CB - 1) // CB
    jobs = P * nblk
    for job in range(grp * jobs // groups, (grp + 1) * jobs // groups):
        p, blk = job // nblk, job % nblk
        c0 = blk * CB
        cb = min(CB, C - c0)
        one[:cb * span] = 0
        for n in range(p * N // P, (p + 1) * N // P):
            for c in range(cb):
                if KT == 9 and KW == 3:     # constants for LLVM, as in correlate
                    plane_dots(one, c * span, xf, (n * C + c0 + c) * H * W, dyf,
                               (n * C + c0 + c) * OH * OW, toffs, bits, 9, 3, nvec, v0, v1)
                else:
                    plane_dots(one, c * span, xf, (n * C + c0 + c) * H * W, dyf,
                               (n * C + c0 + c) * OH * OW, toffs, bits, KT, KW, nvec, v0, v1)
        for c in range(cb):
            for t in range(KT):
                a = c * span + t * DOT_SLOTS
                s = one[a]
                for j in range(1, lanes):
                    s += one[a + j]
                pf[(p * KT + t) * C + c0 + c] = s


backprop_filter_task = backprop_filter
backprop_filter = Parallel(backprop_filter_task, lambda x, dy, parts, *args: min(
    parts.shape[0] * -(-x.shape[1] // args[-1]), GROUPS), 5)


@njit(nogil=True, cache=True)
def correlate(grp, groups, x, w, y, bits, toffs, v0, v1):
    """Correlations of planes of ``x[N, C, H, W]`` into planes of ``y[N, CY, OH,
    OW]`` (``OW == W``) with taps ``w[KH, KW, max(C, CY)]``, through the lane
    masks and tap offsets of :func:`masks` (or :func:`adjoint_masks`).

    The forward (``CY = C*M``, depth multiplier M): y[n, k] = the correlation
    of plane x[n, k // M] with channel k's taps. The stride-1 input gradient
    (x the output gradient, y the input's; masks of the adjoint's geometry,
    ``C = CY*M``, :func:`repeated` for M > 1): y[n, c] = the sum over m of the
    correlations of planes x[n, c*M + m] with channel c*M + m's taps, added in
    order of m as the other kernels add them. Float32 or float64, or 16-bit
    bit patterns with float32 taps."""
    N, C, H, W = x.shape
    CY, OH, OW = y.shape[1], y.shape[2], y.shape[3]
    KW, CW = w.shape[1], w.shape[2]
    KT = toffs.shape[0]
    nvec = bits.shape[0] // (KT + 2 + KW)
    xf = x.reshape(N * C * H * W)
    yf = y.reshape(N * CY * OH * OW)
    wf = w.reshape(w.shape[0] * KW * CW)
    M = CW // min(C, CY)
    taps = KT // M if C > CY else KT        # taps of the window
    wv = np.empty(KT, w.dtype)
    NP = N * CY
    for pl in range(grp * NP // groups, (grp + 1) * NP // groups):
        n, k = pl // CY, pl % CY
        if C > CY:
            src = n * C + k * M
            for m in range(M):
                for t in range(taps):
                    wv[m * taps + t] = wf[t * CW + k * M + m]
        else:
            src = n * C + k // M
            for t in range(taps):
                wv[t] = wf[t * CW + k]
        if KT == 9 and taps == 9 and KW == 3:     # constants for LLVM (module docstring)
            plane_taps(yf, pl * OH * OW, xf, src * H * W, wv, 0, 1, toffs, bits, 9, 9, 3,
                       nvec, v0, v1)
        else:
            plane_taps(yf, pl * OH * OW, xf, src * H * W, wv, 0, 1, toffs, bits, KT, taps, KW,
                       nvec, v0, v1)


# The windows :func:`rows` builds kernels for (each window a compilation of its own).
ROW_WINDOWS = frozenset({(5, 5), (7, 7)})


def row_masks(W, KW, rw, ph, pw, itemsize, adjoint=False):
    """(cmasks, coffs, P) for :func:`.simd.plane_rows` on rows ``W`` long (input
    and output) of ``itemsize``-byte sums, a window ``KW`` wide of column
    dilation ``rw``, paddings ``ph`` (rows) and ``pw``: ``coffs[kw]``, tap column
    kw's input offset; ``cmasks``, per vector j of a row, bit l for its pixel j*L + l:
    ``cmasks[j*(KW + 2) + kw]``, the pixels that exist and read tap column kw
    inside the row, ``[... + KW]``, those that exist, ``[... + KW + 1]``, those
    with a tap column inside. ``adjoint``: the stride-1 input gradient's
    geometry (:func:`adjoint_masks`), its taps reading backwards. P: the row
    offset :func:`.simd.plane_rows` takes, ``ph`` (the adjoint's input rows
    are ``oh + ph - kh``: -ph)."""
    lanes = plane_lanes.py_func(itemsize)
    nvec = -(-W // lanes)
    c = np.arange(nvec * lanes)
    dw = (np.arange(KW) * rw - pw) * (-1 if adjoint else 1)
    real = c < W
    inside = real[None, :] & (c[None, :] + dw[:, None] >= 0) & (c[None, :] + dw[:, None] < W)
    on = np.concatenate([inside, real[None, :], inside.any(axis=0)[None, :]])
    bits = _lane_bits(on.reshape(KW + 2, nvec, lanes).transpose(1, 0, 2), lanes)
    return bits, dw.astype(np.int64), -ph if adjoint else ph


def _build_rows(KH, KW, DOWN):
    @njit(nogil=True, cache=True)
    @_instance(KH, KW, DOWN)
    def correlate_rows(grp, groups, x, w, y, cmasks, coffs, P):
        """:func:`correlate` of a KH x KW window of dilation 1 in rows (``DOWN``:
        the input gradient's geometry, multiplier 1), through
        :func:`.simd.plane_rows` and the masks of :func:`row_masks`."""
        N, C, H, W = x.shape
        CY, OH = y.shape[1], y.shape[2]
        CW = w.shape[2]
        xf = x.reshape(N * C * H * W)
        yf = y.reshape(N * CY * OH * W)
        wf = w.reshape(KH * KW * CW)
        M = CW // C
        wv = np.empty(KH * KW, w.dtype)
        NP = N * CY
        for pl in range(grp * NP // groups, (grp + 1) * NP // groups):
            n, k = pl // CY, pl % CY
            for t in range(KH * KW):
                wv[t] = wf[t * CW + k]
            plane_rows(yf, pl * OH * W, xf, (n * C + k // M) * H * W, wv, 0, coffs, cmasks,
                       H, OH, W, P, KH, KW, DOWN)

    return Parallel(correlate_rows, lambda x, w, y, *args: y.shape[0] * y.shape[1], 5,
                    per_thread=True)


_row_kernels = {}


def rows(KH, KW, adjoint=False):
    """The :func:`correlate` of a window of :data:`ROW_WINDOWS` that takes output
    rows in blocks (:func:`.simd.plane_rows`; ``adjoint``: the input gradient's),
    for planes of dilation 1 in rows: args ``(x, w, y, *row_masks(...))``."""
    key = (KH, KW, int(adjoint))
    if key not in _row_kernels:
        _row_kernels[key] = _build_rows(*key)
    return _row_kernels[key]


def repeated(bits, toffs, KW, M, plane):
    """The masks and tap offsets of :func:`masks` (windows ``KW`` wide) for M
    planes of ``plane`` elements one after the other, read as one window of M
    times the taps (the stride-1 input gradient of depth multiplier M,
    :func:`correlate`)."""
    KT = toffs.shape[0]
    nvec = bits.shape[0] // (KT + 2 + KW)
    taps = bits[nvec:(KT + 1) * nvec]
    bits = np.concatenate([bits[:nvec]] + [taps] * M + [bits[(KT + 1) * nvec:]])
    return bits, (np.arange(M)[:, None] * plane + toffs[None, :]).reshape(-1)


def adjoint_masks(H, W, OH, OW, KH, KW, rh, rw, ph, pw, itemsize):
    """:func:`masks` for :func:`correlate` computing the stride-1 input gradient of
    the forward of that geometry (``OW == W``): input pixel i gathers output
    pixel ``i - toffs[t]`` of the forward's tap t, through the same tap."""
    return masks(OH, OW, H, W, KH, KW, -rh, -rw, -ph, -pw, itemsize)


correlate_task = correlate
# One task per thread (:class:`.tasks.Parallel`), each a run of planes. 2 threads, NCHW,
# the public API, GROUPS tasks / one per thread alternating in one process,
# medians of 7 rounds (ms): N=1 forward 14x14x576 0.073 / 0.062, 19x19x728 0.142
# / 0.119, 56x56x144 0.124 / 0.097, 28x28x192 0.051 / 0.046, input gradient
# 14x14x576 0.073 / 0.063; N=8 and N=32 even within this machine's noise (10 %).
correlate = Parallel(correlate_task, lambda x, w, y, *args: y.shape[0] * y.shape[1], 5,
                     per_thread=True)
