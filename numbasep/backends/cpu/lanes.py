"""Channels-last forward, input gradient and filter gradient, 16 channels at a
time across each row, in vector registers.

Each output row is computed by :func:`.simd.taps_rows` (16 lanes, then 8 for a
last group of 8 channels): blocks of pixels whose sums stay in registers through
the window, each input vector loaded once for all the taps of the block that
read it, one fused multiply-add per tap. Rows whose window reaches past the top
or bottom of the map sum the window rows inside it. The pixels whose window the
left or right edge cuts are computed either in blocks too, the taps outside the
map masked off (a small map, a large window), or one at a time over the window
columns inside (:func:`.simd.taps_window`), whichever costs less
(:func:`_run`). No product with the padding reaches a sum, and every sum is
formed as the row kernels of :mod:`.kernels` form it (taps in (kh, kw) order,
fused with :func:`.simd.fma`, the first product rounded alone), so the two give
the same bits.

The forward and the stride-1 input gradient compute the rows whose windows lie
inside the map two at a time (:func:`.simd.taps_row_pairs`, ``_PAIR_ROWS``).

Rows longer than ``_LONG_ROW`` elements are computed in chunks of pixels, every
channel group of a chunk before the next chunk (forward and stride-1 input
gradient: the last chunk overlapping the one before; filter gradient: products
summed per chunk).

Where the operands come from memory, each job asks for the lines of the next
job's rows while it computes (:func:`_ahead`, :func:`_ask`), a share before
each piece of its row: pieces of pixels, or, for the filter gradient's rows
that want few pieces for their channels, pieces of the channels over the
whole row (``_CHANNEL_PIECES``).

Jobs are rows of one image. A strided input gradient is a gather by phases: the
input pixels of one row and one column phase (a stride apart) read the same
sub-window, whose taps sit one output-gradient pixel apart, so each phase is a
stride-1 gather over pixels a stride apart. The filter gradient sums the
products of each output-gradient row with the window rows it reads in registers
(:func:`.simd.dots_rows`); with 3x3 windows the side pixels join the same
pass, their taps outside the map masked off, and consecutive rows whose
windows lie inside the map share one pass (``_LINES``). The forward and the
filter gradient also take depth multipliers 2, 4 and 8, reading each input
vector once and repeating its channels in registers for their output
channels; the stride-1 input gradient takes them too, computing each row's
gradient of the repeated input in a scratch row and summing its groups of
channels from there.

``separable_forward`` fuses the forward with a separable convolution's
pointwise step: each part of the rows computes a few depthwise rows into a
scratch row of its own, then their pointwise sums from there
(:func:`.simd.pointwise_rows`), so the depthwise result is never written to
memory.

16-bit operands are read as their bit patterns and 16-bit results written as
theirs (the driver's ``raw16`` / ``writes16``): every result element is stored
once, so it can be rounded as it is stored.

They serve 2-D (and 1-D) problems with depth multiplier 1 and a multiple of 8
channels, for the windows of ``WINDOWS``, on rows the driver's ``_by_lanes``
says they are faster for.
"""

import numpy as np
from numba import literally, njit

from .kernels import _split
from .simd import BLOCK as _BLOCK
from .simd import GROUPS as _GROUPS
from .simd import KEEPS_UP as _KEEPS_UP
from .simd import WIDE as _WIDE
from .simd import ZEN as _ZEN
from .simd import dots_rows as _dots_rows
from .simd import dots_window as _dots_window
from .simd import pointwise_rows as _pointwise_rows
from .simd import prefetch as _prefetch
from .simd import sfence as _sfence
from .simd import stream_copy as _stream_copy
from .simd import sum_groups as _sum_groups
from .simd import taps_row_pairs as _taps_row_pairs
from .simd import taps_rows as _taps_rows
from .simd import taps_window as _taps_window
from .cache_key import instance as _instance
from .tasks import Parallel

#: Window shapes with lane kernels.
WINDOWS = frozenset({(3, 3), (5, 5), (7, 7), (1, 3), (1, 5)})

# The strided input gradient's column phases sum at most this many window
# columns (the cases of :func:`_phase_chunk`).
_PHASE_COLUMNS = 4


def phases_fit(KW, sw):
    """Whether ``backprop_input_strided`` takes a window KW columns wide at column
    stride ``sw``: each column phase sums ceil(KW / sw) window columns, at most
    ``_PHASE_COLUMNS`` (a 5- or 7-column window at column stride 1 does not fit)."""
    return -(-KW // sw) <= _PHASE_COLUMNS


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
def _span(n, c0, cpix, ctap, K, size, need):
    """[lo, hi): the pixels k < n of a row, pixel k's tap j at column ``c0 + k*cpix
    + j*ctap``, that have at least ``need`` of their K taps in [0, size) (a
    contiguous range, possibly empty)."""
    lo = 0
    while lo < n and _inside(c0 + lo * cpix, ctap, K, size) < need:
        lo += 1
    hi = n
    while hi > lo and _inside(c0 + (hi - 1) * cpix, ctap, K, size) < need:
        hi -= 1
    return lo, hi


@njit(inline="always")
def _inside(i0, r, K, size):
    """How many taps of a window whose tap k sits at ``i0 + k*r`` fall in [0, size)."""
    k0, k1 = _taps_inside(i0, r, K, size)
    return k1 - k0


@njit(inline="always")
def _blocks(n, K):
    """What ``n`` pixels cost in blocks (:func:`.simd.taps_rows`), in multiply-adds
    per window row and channel group: whole blocks, the last overlapping the one
    before, or single pixels, whose chains of dependent multiply-adds take about
    twice as long."""
    if n >= _BLOCK:
        return (n + _BLOCK - 1) // _BLOCK * _BLOCK * K
    return 2 * n * K


@njit(inline="always")
def _run(n, c0, cpix, ctap, K, size, C):
    """[lo, hi): the pixels of a row (as :func:`_span`'s) computed in blocks; the
    others are computed one at a time (:func:`_pixel`). Either the pixels with
    every tap inside (the interior, no tap left out) and the others one at a time,
    or every pixel with a tap inside, the blocks that the edges cut masked
    (taps outside still cost their multiply-add): whichever costs less. A side
    pixel's tap costs about 2.5 block multiply-adds (per channel group) when its
    groups are summed four side by side, 4 in a group of its own (one chain of
    dependent multiply-adds). Fitted to one thread, N=8, masked / interior and
    sides (ms): 28x28x240 5x5 0.74 / 0.86-0.94, 7x7x1152 5x5 0.39-0.42 /
    0.45-0.47, 14x14x576 3x3 0.39-0.40 / 0.36, 56x56x144 3x3 1.20-1.22 /
    1.17-1.22."""
    a, b = _span(n, c0, cpix, ctap, K, size, K)
    lo, hi = _span(n, c0, cpix, ctap, K, size, 1)
    taps = 0
    for i in range(a - lo + hi - b):
        taps += _inside(c0 + _side(lo + i, a, b) * cpix, ctap, K, size)
    groups = C // _WIDE + C % _WIDE // 8
    fours = groups // 4 * 4
    # tenths of a block multiply-add
    sides = taps * (fours * 25 + (groups - fours) * 40) // groups
    if 10 * _blocks(hi - lo, K) < 10 * _blocks(b - a, K) + sides:
        return lo, hi
    return a, b


# Rows longer than this (elements) are computed in chunks of _LONG_ROW_CHUNK
# elements, every channel group of a chunk before the next chunk, so that the
# window rows a chunk reads stay in L1 from group to group (1 thread, N=1,
# 147x147x128 rows of 18816 elements, whole rows / chunks of 2048, 4096 and
# 8192 elements, ms: forward 1.45-1.48 / 1.26-1.31, 1.23-1.37, 1.55-1.61; input
# gradient 1.16-1.20 / 1.19-1.26, 1.20-1.28, 1.30-1.43).
_LONG_ROW = 1 << 14
_LONG_ROW_CHUNK = 1 << 12


# Short rows (at most _PAIRED_ROW pixels) of windows at least _PAIRED_TAPS
# wide compute two channel groups' blocks side by side (:func:`.simd.taps_rows`
# with a negative ``together``): 8 chains of multiply-adds in flight, where a
# block's 4 leave FMA units idle.
_PAIRED_TAPS = 5
_PAIRED_ROW = 16
_GROUP_PAIRS = -_GROUPS


# Windows up to this wide have their rows (:func:`_row`) inlined into the task;
# wider ones call a function of their own (:func:`_row_apart`). A callee is
# linked into the task's module and optimised a second time there (see
# :func:`_phase_row`); inlined, 3x3 rows ran faster and 5x5 ones with 8 (mod
# 16) channels slower. 2 threads, medians of 4 alternating processes, both from
# Numba's cache, apart / inlined (ms): N=8 112x112x32 forward 0.80 / 0.56,
# input gradient 0.95 / 0.55; N=32 28x28x192 1.05 / 0.87, 1.14 / 0.88; N=8
# 28x28x192 0.22 / 0.17, 0.24 / 0.18; N=8 56x56x72 5x5 0.62 / 0.74, 0.68 /
# 0.73; stride-2 forward 0.235 / 0.261; 28x28x240 5x5 and 56x56x96 7x7 within
# 6 %.
_INLINED_ROW = 3

# The forward and the stride-1 input gradient compute the rows whose windows
# lie inside the map two at a time (:func:`.simd.taps_row_pairs`): each input
# vector is loaded once for both rows, from one pass over KH + 1 rows rather
# than two over KH. Found on Zen 4 (1 thread, from memory): a plain numba loop
# summing 3 rows of 75 KB into a fourth moved 19 GB/s one output row at a time,
# 26 two at a time, 29 four at a time (a copy: 29); 1 thread, N=4 147x147x128
# forward (42 MB an operand), the channels-last lanes about 100 ns a pixel,
# channels-first 48. Zen 4, 2 threads, alternating processes each with its own
# cache, medians of 4-5 (ms), one row / two: forward N=32 56x56x96 7x7 7.67 /
# 6.18 (and 7.41 / 5.97), 28x28x240 5x5 3.44 / 2.52, 14x14x672 5x5 2.34 /
# 1.88, 28x28x192 1.09 / 0.94, 56x56x144 3.57 / 3.77 (and 3.99 / 3.91),
# 147x147x128 36.3 / 37.5; N=8 14x14x384 0.117 / 0.100,
# 56x56x144 m2 1.41 / 1.28, 112x112x32 0.61 / 0.61. Input gradient N=32
# 28x28x240 5x5 3.56 / 2.33, 56x56x96 7x7 8.04 / 6.46, 56x56x144 3.36 / 3.57,
# 112x112x32 2.58 / 2.94, 28x28x192 0.91 / 0.88; N=8 56x56x144 0.80 / 0.69,
# 14x14x384 0.114 / 0.103. Rows of 7x7 windows up to _PAIRED_ROW pixels keep
# one row at a time, their channel groups' blocks paired side by side instead
# (N=32 14x14x384 7x7 forward 1.38 / 1.61, N=8 0.33 / 0.40), and so do rows of
# at most _PAIR_MIN_RUN pixels in blocks (7x7 maps: N=8 7x7x960 0.065 /
# 0.070). Not with stores in halves (NT 2): two rows' stores leave twice the
# lines open at once (N=8 19x19x728 forward 0.46 / 0.93). Each kernel compiles
# the pairs as well (cold 2x56x56x64 3x3: forward 15.8 -> 22.9 s, input
# gradient 12.7 -> 18.7).
_PAIR_ROWS = True
_PAIR_MIN_RUN = 8
# The filter gradient sums consecutive rows of an image whose windows lie inside
# the map (3x3 windows and rows of taps: all window rows in one pass) in one
# call of :func:`.simd.dots_rows`, up to this many (1: a row a call), where the
# operands stay in the caches (no asks) and a row is one piece: the taps' sums
# stay in registers from the first row to the last instead of being loaded and
# stored every row, and each channel group's input rows are read again while
# still in L1. The same products in the same order, so the same bits. Zen 4, 2
# threads, NHWC, alternating processes each with its own cache, a row a call /
# several (ms), medians of 4: N=1 56x56x144 0.090 / 0.074, stride 2 0.052 /
# 0.041, 14x14x384 0.037 / 0.031, 14x14x576 0.047 / 0.040, 28x28x192 0.046 /
# 0.039; N=8 56x56x144 stride 2 0.446 / 0.339, 28x28x192 0.248 / 0.190,
# 14x14x576 0.244 / 0.181, 14x14x384 0.161 / 0.128; even: N=1 112x112x32,
# 19x19x728, 112x112x96 stride 2, N=32 7x7x960 (5 such rows an image) 0.416 /
# 0.472, N=8 0.131 / 0.112. Medians of 6, another run: N=8 28x28x192 0.280 /
# 0.210, 14x14x576 0.251 / 0.209; within the noise: N=1 56x56x144 0.100 /
# 0.107, N=8 56x56x144 stride 2 0.438 / 0.487 (medians of the minima 0.378 /
# 0.355), N=32 7x7x960 0.419 / 0.425. The noise of those runs: N=1
# 147x147x128, whose rows are too long to change, ran 1.76 / 1.40 and 1.195 /
# 1.171. 1 thread, 4 alternating processes, minima: N=8 28x28x192 0.45 / 0.34,
# N=1 56x56x144 0.145 / 0.118, N=32 7x7x960 0.71 / 0.72.
_LINES = 1 << 30


@njit(inline="always")
def _row(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT, edges, M,
         ahead, S):
    """:func:`_row_here` inlined, or, for windows wider than ``_INLINED_ROW``,
    called (:func:`_row_apart`)."""
    if KW <= _INLINED_ROW:
        _row_here(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT,
                  edges, M, ahead, S)
    else:
        _row_apart(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT,
                   edges, M, ahead, S)


@njit(nogil=True, cache=True)
def _row_apart(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT, edges,
               M, ahead, S):
    """:func:`_row_here` as a function of its own, compiled per window width,
    multiplier, store kind and steps."""
    literally(KW)
    literally(NT)
    literally(M)
    literally(S)
    _row_here(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT, edges, M,
              ahead, S)


@njit(inline="always")
def _row_here(dst, d0, src, s0, sstep, rowstep, colstep, wt, C, run, k0, k1, KW, NT, edges, M,
              ahead, S):
    """``run`` output pixels from ``dst[d0]`` on, ``C`` apart: the taps of window
    rows [k0, k1) of a window of KW columns (a compile-time constant), pixel
    k's tap (r, j) at ``src[s0 + k*sstep + r*rowstep + j*colstep]``, 16 channels
    at a time (then 8), leaving out the columns outside the map that ``edges``
    describes (:func:`.simd.taps_rows`); NT (0, 1 or 2, a compile-time
    constant): non-temporal stores (2: in halves, :meth:`.simd._Lanes.put`); M
    (a compile-time constant): ``src`` holds a depth multiplier M's input (its
    channel c // M for output channel c). S (a compile-time constant): the
    steps the intrinsic generates code for (:data:`.simd._STEP_SETS`: 1 a
    forward's, -1 a gather's). ``ahead``:
    the elements [a, b) of ``src`` to ask for (:func:`_ahead`), spread over
    the row in pieces (:func:`_pieces`)."""
    rows = k1 - k0
    if rows == 0:
        _ask(src, ahead[0], ahead[1])
        for k in range(run):
            dst[d0 + k * C:d0 + (k + 1) * C] = 0
        return
    s0 += k0 * rowstep
    n = _piece_pixels(run, C, ahead, src.itemsize)
    pieces = (run + n - 1) // n
    for i in range(pieces):
        k = min(i * n, run - n)
        _ask_share(src, ahead[0], ahead[1], i, pieces)
        if KW >= _PAIRED_TAPS and n <= _PAIRED_ROW:
            _taps_rows(dst, d0 + k * C, C, src, s0 + k * sstep, sstep, rowstep, colstep, wt,
                       k0 * KW * C, KW * C, C, n, rows, C, KW, NT, _shifted(edges, k), M,
                       _GROUP_PAIRS, S)
        else:
            _taps_rows(dst, d0 + k * C, C, src, s0 + k * sstep, sstep, rowstep, colstep, wt,
                       k0 * KW * C, KW * C, C, n, rows, C, KW, NT, _shifted(edges, k), M,
                       _GROUPS, S)


@njit(inline="always")
def _piece_pixels(run, C, ahead, itemsize):
    """The pixels of each piece of a row of ``run`` pixels: a chunk
    (:func:`_chunk`), or, asking for ``ahead`` across the row, a piece of the
    asks (:func:`_pieces`)."""
    if ahead[1] > ahead[0]:
        return _pieces(run, _piece_count(ahead[1] - ahead[0], itemsize))
    return _chunk(run, C)


@njit(inline="always")
def _chunk(run, C):
    """The pixels of a row of ``run`` pixels of ``C`` channels computed at once."""
    if run * C > _LONG_ROW:
        return min(run, max(_BLOCK, _LONG_ROW_CHUNK // C))
    return run


@njit(inline="always")
def _shifted(edges, k):
    """``edges`` (:func:`.simd.taps_rows`) for the pixels from pixel k on."""
    if edges is None:
        return edges
    return (edges[0] + k * edges[1], edges[1], edges[2], edges[3], edges[4])


# The jobs of the forward and input-gradient kernels run in one part of
# consecutive jobs per thread (:class:`.tasks.Parallel`'s ``per_thread``), each
# ending with one fence for its non-temporal stores (:func:`.simd.sfence`): a
# fence per job (row) cost 32x112x112x32 most of what the streaming saved. Up to
# 64 parts before: 2 threads, the public API, the two alternating in one
# process, medians of 11 rounds (ms, forward and input gradient): N=1
# 112x112x32 0.082 -> 0.075, 0.087 -> 0.082; 7x7x960 0.0244 -> 0.0232, 0.0256 ->
# 0.0243; 7x7x1152 5x5 0.0345 -> 0.0334; N=32 within this machine's noise.


@njit(inline="always")
def _part(part, parts, jobs):
    """[first, last + 1): the jobs of part ``part``."""
    return part * jobs // parts, (part + 1) * jobs // parts


# Input-gradient rows longer than this (elements) are computed in chunks of
# _PHASE_CHUNK pixels per phase, every channel group of a chunk before the next
# chunk, so that a chunk's stores stay near each other; shorter rows one channel
# group at a time across the whole phase. Stride 2, 2 threads, min of 3
# interleaved rounds, whole phase / chunks of 8 (of 4, 12, 16 and 32 pixels, 8
# measured best): 112x112x96 3x3 (rows of 10752) N=8 1.82-1.96 / 1.57-1.60 ms,
# N=1 0.216 / 0.185, N=32 14.3 / 14.5; 56x56x144 3x3 (8064) N=8 0.51-0.59 /
# 0.53-0.55; 56x56x72 5x5 (4032) N=8 0.31-0.35 / 0.34-0.39. Those figures
# are of the phase rows as a called function (:func:`_phase_row`); inlined, the
# rows of 112x112x96 ran faster whole (limit 2^14 / 2^13 elements, from the
# cache, medians of 4-5 alternating processes, ms): N=1 0.165 / 0.195 and
# 0.135 / 0.161, N=8 1.56 / 1.81 and 1.47 / 1.51, N=32 7.95 / 7.53 and 7.32 /
# 7.31. Longer rows were not measured and keep their chunks.
_CHUNKED_ROW = 1 << 14
_PHASE_CHUNK = 8


# Inlined into the task, not a function of its own. Numba links a jitted callee
# into its caller's module, where LLVM optimises it a second time: that copy of
# this function was twice the size, and it is what a process runs when it loads
# the task from Numba's cache (the process that compiled the task runs the
# callee's own compilation, already in memory). 2 threads, from the cache,
# called / inlined (ms), medians of 4 alternating processes: 4x56x56x72 5x5
# stride 2 0.329 / 0.209, 8x56x56x144 3x3 stride 2 0.596 / 0.559; two processes
# each: 8x56x56x72 5x5 stride 2 0.64 / 0.40 (the process that compiled the
# called version: 0.46-0.49).
#
# The two row counts a window of KH rows gives its row phases at row stride 2
# are compile-time constants in their own copies of the chunk, whose loop over
# window rows LLVM then unrolls. 1 thread, N=1, runtime / constant (ms): 28x28x144
# 0.049 / 0.044, 28x28x72 5x5 0.050 / 0.042, 56x56x144 0.119 / 0.107, 56x56x72
# 5x5 0.122 / 0.098; 2 threads, 8 alternating processes: N=8 56x56x144 0.53 /
# 0.44, 56x56x72 5x5 0.45 / 0.41, N=32 56x56x72 5x5 3.9 / 3.4, N=8 112x112x96
# 1.48 / 1.49.
@njit(inline="always")
def _phase_row(dst, d0, dstep, src, s0, rowstep, wt, w0, wrow, wstep, C, run, rows, J, chunk,
               NT, KH):
    """``run`` input-gradient pixels of one column phase from ``dst[d0]`` on,
    ``dstep`` apart, each the gather of ``rows`` x J taps (J 1 to 4): pixel k's
    tap (r, j) at ``src[s0 + (k - j)*C + r*rowstep]`` and ``wt[w0 + r*wrow +
    j*wstep]``; zeros when there are no taps. ``chunk`` pixels at a time (the
    last chunk ends at pixel ``run``); NT as in :func:`_row_here` (the task's
    constant); KH: the window's rows (the task's constant)."""
    if rows == 0 or J == 0:
        for k in range(run):
            dst[d0 + k * dstep:d0 + k * dstep + C] = 0
        return
    n = min(run, chunk)
    for k in range(0, run, n):
        k = min(k, run - n)
        if KH > 1 and rows == KH // 2:
            _phase_chunk(dst, d0 + k * dstep, dstep, src, s0 + k * C, rowstep, wt, w0, wrow,
                         wstep, C, n, KH // 2, J, NT)
        elif rows == (KH + 1) // 2:
            _phase_chunk(dst, d0 + k * dstep, dstep, src, s0 + k * C, rowstep, wt, w0, wrow,
                         wstep, C, n, (KH + 1) // 2, J, NT)
        else:
            _phase_chunk(dst, d0 + k * dstep, dstep, src, s0 + k * C, rowstep, wt, w0, wrow,
                         wstep, C, n, rows, J, NT)


# Phases of 1 or 2 window columns take simd.GROUPS channel groups per block of
# pixels, wider ones one group at a time across the phase: 2 threads, N=32,
# one group / GROUPS for all phases / for phases of 1 or 2 columns (ms):
# 56x56x144 3x3 stride 2 2.27-2.33 / 1.69 / 1.70; 56x56x72 5x5 stride 2 (phases
# of 2 and 3 columns) 1.24-1.30 / 1.44 / 1.29.
@njit(inline="always")
def _phase_chunk(dst, d0, dstep, src, s0, rowstep, wt, w0, wrow, wstep, C, run, rows, J, NT):
    if J == 1:
        _taps_rows(dst, d0, dstep, src, s0, C, rowstep, -C, wt, w0, wrow, wstep, run, rows, C,
                   1, NT, None, 1, _GROUPS, -1)
    elif J == 2:
        _taps_rows(dst, d0, dstep, src, s0, C, rowstep, -C, wt, w0, wrow, wstep, run, rows, C,
                   2, NT, None, 1, _GROUPS, -1)
    elif J == 3:
        _taps_rows(dst, d0, dstep, src, s0, C, rowstep, -C, wt, w0, wrow, wstep, run, rows, C,
                   3, NT, None, 1, 1, -1)
    else:
        _taps_rows(dst, d0, dstep, src, s0, C, rowstep, -C, wt, w0, wrow, wstep, run, rows, C,
                   4, NT, None, 1, 1, -1)


@njit(inline="always")
def _pixel(dst, d0, src, s0, rowstep, colstep, wt, w0, wrow, wstep, C, rows, cols, NT):
    """One output pixel's ``C`` channels at ``dst[d0]``: the taps of ``rows`` x
    ``cols`` window rows and columns, the first at ``src[s0]`` and ``wt[w0]``
    (zeros when none); NT as in :func:`_row_here`."""
    if rows <= 0 or cols <= 0:
        dst[d0:d0 + C] = 0
        return
    _taps_window(dst, d0, src, s0, rowstep, colstep, wt, w0, wrow, wstep, rows, cols, C, NT)


# A call, not inlined: Numba's array analysis of the parallel kernels failed
# (IndexError) on the nested tuple an inlined version returns.
@njit(nogil=True, cache=True)
def _forward_columns(OW, W, CI, C, sw, rw, pw, KW, M):
    """(lo, hi, edges): the forward's output columns [lo, hi) computed in blocks,
    and the edges of the map those blocks mask (:func:`.simd.taps_rows`). Depth
    multiplier M above 1: every column with a tap inside, in masked blocks."""
    if M == 1:
        lo, hi = _run(OW, -pw, sw, rw, KW, W, C)
    else:
        lo, hi = _span(OW, -pw, sw, rw, KW, W, 1)
    return lo, hi, (lo * sw - pw, sw, rw, W, CI)


@njit(inline="always")
def _forward_row(dst, d0, xf, wt, job, H, W, CI, C, OH, OW, KH, KW, sh, sw, rh, rw, ph, pw, lo,
                 hi, edges, NT, M, ahead):
    """The forward's output row ``job`` (image n, row oh) at ``dst[d0]``: pixels
    [lo, hi) in blocks (:func:`_row`, asking for ``xf[a:b]`` of ``ahead`` across
    them), the others one at a time."""
    n, oh = _split(job, OH)
    ih0 = oh * sh - ph
    k0, k1 = _taps_inside(ih0, rh, KH, H)
    s0 = ((n * H + ih0) * W + lo * sw - pw) * CI
    if lo < hi:
        _row(dst, d0 + lo * C, xf, s0, sw * CI, W * rh * CI, rw * CI, wt, C, hi - lo, k0, k1,
             KW, NT, edges, M, ahead, 1)
    else:
        _ask(xf, ahead[0], ahead[1])
    _forward_sides(dst, d0, xf, wt, n, ih0, k0, k1, H, W, C, OW, KW, sw, rw, rh, pw, lo, hi,
                   NT, M)


@njit(inline="always")
def _pairs(OH, KH, KW, sh, rh, lo, hi, NT):
    """Whether a kernel of OH output rows an image computes the rows whose
    windows lie inside the map two at a time (:func:`.simd.taps_row_pairs`):
    the second row's window one window row further on (``sh == rh``); its
    blocks' pixels [lo, hi); NT as in :func:`_row_here` (see ``_PAIR_ROWS``)."""
    return (_PAIR_ROWS and sh == rh and KH >= 2 and OH >= 2 and NT != 2
            and hi - lo > _PAIR_MIN_RUN and not (KW >= 7 and hi - lo <= _PAIRED_ROW))


@njit(inline="always")
def _pair_inside(job, OH, H, KH, sh, rh, ph):
    """Whether rows ``job`` and ``job + 1`` (OH an image) are of one image and
    both their windows lie inside the H rows they read (row o's window row k
    at ``o*sh - ph + k*rh``)."""
    n, oh = _split(job, OH)
    if oh + 1 >= OH:
        return False
    ih0 = oh * sh - ph
    return ih0 >= 0 and ih0 + sh + (KH - 1) * rh < H


@njit(inline="always")
def _forward_pair(dst, d0, xf, wt, job, H, W, CI, C, OH, OW, KH, KW, sh, sw, rh, rw, ph, pw, lo,
                  hi, edges, NT, M, ahead):
    """Output rows ``job`` and ``job + 1`` (:func:`_pair_inside`) at ``dst[d0]``, as
    :func:`_forward_row` computes them, their blocks two rows at a time."""
    n, oh = _split(job, OH)
    ih0 = oh * sh - ph
    s0 = ((n * H + ih0) * W + lo * sw - pw) * CI
    _row_pair(dst, d0 + lo * C, OW * C, xf, s0, sw * CI, W * rh * CI, rw * CI, wt, C, hi - lo,
              KH, KW, NT, edges, M, ahead, 1)
    for r in range(2):
        _forward_sides(dst, d0 + r * OW * C, xf, wt, n, ih0 + r * sh, 0, KH, H, W, C, OW, KW,
                       sw, rw, rh, pw, lo, hi, NT, M)


@njit(inline="always")
def _row_pair(dst, d0, drow, src, s0, sstep, rowstep, colstep, wt, C, run, KH, KW, NT, edges, M,
              ahead, S):
    """:func:`_row_here` of all KH window rows for two output rows at once, the
    second at ``dst[d0 + drow]`` whose window lies ``rowstep`` further on
    (:func:`.simd.taps_row_pairs`)."""
    n = _piece_pixels(run, C, ahead, src.itemsize)
    pieces = (run + n - 1) // n
    for i in range(pieces):
        k = min(i * n, run - n)
        _ask_share(src, ahead[0], ahead[1], i, pieces)
        _taps_row_pairs(dst, d0 + k * C, C, src, s0 + k * sstep, sstep, rowstep, colstep, wt,
                        0, KW * C, C, n, KH, C, KW, NT, _shifted(edges, k), M, _GROUPS, S, drow)


@njit(inline="always")
def _forward_sides(dst, d0, xf, wt, n, ih0, k0, k1, H, W, C, OW, KW, sw, rw, rh, pw, lo, hi, NT,
                   M):
    """The forward's output columns outside [lo, hi) of one row: those whose window
    a side cuts."""
    for i in range(lo + OW - hi):
        ow = _side(i, lo, hi)
        if M > 1:       # none of their taps inside (the others are in blocks)
            dst[d0 + ow * C:d0 + (ow + 1) * C] = 0
            continue
        iw0 = ow * sw - pw
        j0, j1 = _taps_inside(iw0, rw, KW, W)
        _pixel(dst, d0 + ow * C, xf, ((n * H + ih0 + k0 * rh) * W + iw0 + j0 * rw) * C,
               W * rh * C, rw * C, wt, (k0 * KW + j0) * C, KW * C, C, C, k1 - k0, j1 - j0, NT)


# Operands (bytes, data and result together) from which the kernels ask for
# each job's next rows ahead (:func:`_ahead`): from memory the hardware
# prefetchers, following a few elements of each of several rows at a time,
# leave the cores waiting. Long rows (in chunks) are left out: N=32 147x147x128
# 48-49 / 51-52 ms (Intel, without / with).
#
# Intel Xeon (AVX-512; an earlier VM, 2 December, L3 size not recorded): the
# filter gradient asks, and the stride-1 input gradient with windows of 5 or
# more rows; 64 MB. 2 threads, float32, 3x3
# unless said, without / with (ms): filter gradient N=32 112x112x32 (103 MB)
# 5.6-6.0 / 3.6-4.0; 56x56x144 (115 MB) 6.5-6.8 / 4.3-4.4; 112x112x96 stride 2
# (193 MB) 10.7 / 8.2-8.3; 56x56x96 7x7 (77 MB) 9.0-9.4 / 6.3; N=24 56x56x144
# (87 MB) 2.8-2.9 both. Below, the rows are mostly in the cache and the
# requests cost more than they bring: N=16 56x56x144 (58 MB) 1.37 / 1.86; N=32
# 28x28x240 5x5 (48 MB) 2.3 / 2.6-2.7; N=16 56x56x96 7x7 (38 MB) 2.8 / 3.0; N=8
# 112x112x32 0.78 / 0.90. Input gradient N=32 56x56x96 7x7 (77 MB) 10.4-10.9 /
# 5.7-5.9, N=48 56x56x72 5x5 (87 MB) 7.7-7.9 / 6.2-6.6; with 3x3 windows the
# hardware kept up: N=32 112x112x32 (103 MB) 3.5-3.6 / 3.8-3.9, and so did the
# forward's (3.2-3.4 / 3.7).
#
# AMD Zen 4 (``simd.ZEN``): all three ops ask, every window, from 16 MB (20
# now, below). 2 threads, float32, NHWC, without / with, alternating processes,
# medians of 4 (ms). Forward: N=32 56x56x144 6.97 / 5.82, 28x28x192 2.21 /
# 1.67, 28x28x240 5x5 4.20 / 3.55, 56x56x96 7x7 9.58 / 8.50, 56x56x72 5x5
# stride 2 2.58 / 2.24, 14x14x576 1.23 / 1.13, 19x19x728 3.73 / 3.43,
# 112x112x32 and 112x112x96 stride 2 even; N=8 56x56x144 (29 MB) 1.44 / 0.97,
# 56x56x96 7x7 (19 MB) 1.89 / 1.53, 19x19x728 (17 MB) 0.49 / 0.43, 112x112x32
# (26 MB) 0.70 / 0.78. Input and filter gradient: N=32 56x56x144 5.32 / 4.94
# and 6.66 / 6.70, 14x14x576 1.09 / 0.93 and 2.20 / 1.18, 28x28x192 2.11 / 2.14
# and 2.23 / 2.06; N=8 56x56x144 1.12 / 0.92 and 1.19 / 0.83, 19x19x728 0.42 /
# 0.44 and 0.74 / 0.63. Below 16 MB the forward lost: N=4 56x56x144 (14 MB)
# 0.30 / 0.33, N=32 7x7x960 (12 MB) 0.29 / 0.30, N=8 28x28x192 (10 MB) 0.21 /
# 0.23. With results streamed from 8 MB (``driver._STREAM_BYTES``) the requests
# still paid, without / with in one process, medians of 9 (a slower hour of
# this VM): N=32 56x56x144 forward 12.2 / 9.3, input gradient 8.4 / 7.8;
# 28x28x192 3.76 / 2.60 and 3.41 / 2.45; N=8 56x56x96 7x7 forward 1.67 / 1.58;
# N=8 112x112x32 and N=32 14x14x384 even.
#
# Now from 20 MB: from 16 to 20 MB the operands stay in the L3 from call to
# call, and the requests, which split each row into pieces, cost more than they
# bring (5 December, 2 threads, from Numba's cache, medians of 12-20
# alternating processes, without / with, ms): N=8 19x19x728 (16 MB) forward
# 0.40 / 0.43, input gradient 0.40 / 0.47; 56x56x96 7x7 (18 MB) forward 1.54 /
# 1.74, input gradient 1.51 / 1.74; N=32 14x14x384 7x7 (18 MB) 1.68 / 1.80 and
# 1.79 / 1.79; N=8 56x56x144 stride 2 (17 MB) forward 0.27 / 0.29 (the gains at
# 17-19 MB above were measured on earlier kernels). The filter gradient asks
# from 20 MB at strides above 1 (N=8 56x56x144 stride 2: 0.32-0.42 / 0.47-0.58
# in four runs, 0.57-0.66 / 0.68-0.80 in two noisier ones) and from 16 MB at
# stride 1, where the runs disagreed, the requests gaining most in the
# noisiest: 3x3 19x19x728 0.58 / 0.68, 1.00 / 0.74, 0.65 / 0.82, 1.21 / 1.07
# and 1.60 / 1.06, N=32 14x14x384 (18 MB) 1.68 / 1.26 and 1.97 / 1.50; 7x7 N=8
# 56x56x96 2.07 / 1.88, N=32 14x14x384 2.84 / 2.73. Above 20 MB every filter
# gradient gained: N=8 112x112x32 (25 MB) 1.38 / 1.11, 56x56x144 (29 MB) 2.14 /
# 1.80.
#
# Now from 32 MB (the L3) for the forward, the input gradient and the strided
# filter gradient: on 6 December's Zen 4 (quiet hours, its bench copy rate
# 71-93 GB/s from the L3, 30-40 from memory) the requests lost up to 32 MB
# on every forward and input gradient tried but one (the kernels of 8737b1c,
# alternating processes each with its own cache, medians of 4 pairs, asking
# from 20 / from 32 MB, ms). Forward, faster in 4 of 4 pairs: N=8 56x56x144 (29
# MB) 0.68 / 0.56, N=32 14x14x576 (29 MB) 0.71 / 0.62, 28x28x120 5x5 (24 MB)
# 1.37 / 1.06; N=8 112x112x32 (26 MB) 0.52 / 0.50. Input gradient: N=8
# 56x56x144 0.64 / 0.54, 112x112x32 0.51 / 0.46, N=32 14x14x576 0.70 / 0.59,
# 28x28x120 5x5 1.57 / 1.11 (4 of 4 but 112x112x32, 3 of 4); 56x56x96 7x7 N=8
# (19 MB) even (1.47 / 1.50). The stride-1 filter gradient keeps 16 MB: from
# 32 its rows were mixed (N=32 14x14x384 0.71 / 0.55 and N=8 19x19x728 0.61 /
# 0.50 faster in 4 of 4, N=32 14x14x576 1.08 / 1.35, N=8 56x56x144 0.96 / 1.04
# and 112x112x32 0.54 / 0.57 slower or mixed). A second run, 6 pairs: 14x14x384
# 0.66 / 0.53, 19x19x728 0.60 / 0.47, 56x56x144 0.85 / 0.66, 14x14x576 1.02 /
# 0.98, 112x112x32 0.51 / 0.56, 28x28x120 5x5 1.24 / 1.37; a third: 14x14x576
# 1.08 / 1.69 in 6 of 6 pairs (2.00 ms side by side, 1.50 of PyTorch's time),
# 14x14x384 0.69 / 0.56 in 6 of 6. A rule between them is not measured yet.
_PREFETCH_BYTES = (32 if _ZEN else 64) << 20
_PREFETCH_FILTER_BYTES = (16 if _ZEN else 64) << 20
# Whether the filter gradient asks at all. Not where the prefetchers keep up
# (``simd.KEEPS_UP``): on Intel's Emerald Rapids (a Xeon, family 6 model 207,
# 2 cores of a VM reporting a 300 MB L3) they did at every size tried, in the
# L3 and from memory (6 December, 2 threads, float32, alternating processes
# each with its own cache, medians of 3, asking / not, ms): N=32 112x112x32
# (103 MB) 3.09 / 2.08, 56x56x144 (116 MB) 3.81 / 3.16, stride 2 (72 MB) 1.94 / 1.65,
# 112x112x96 stride 2 (193 MB) 7.24 / 5.43, 56x56x96 7x7 (77 MB) 7.06 / 7.18;
# N=96 112x112x32 (308 MB) 15.9 / 12.5, N=192 (616 MB) 33.9 / 26.7, N=128
# 56x56x144 (462 MB) 27.5 / 23.2, 112x112x96 stride 2 (770 MB) 34.7 / 30.8.
# Asking in pieces of 32 lines did not help (N=32 112x112x32 3.40, 56x56x144
# 5.10 against 3.32 and 4.90 whole rows). The input gradient there still asks
# (N=128 56x56x96 7x7, 308 MB: 35.3 / 37.5).
_FILTER_ASKS = not _KEEPS_UP
# The windows (rows) from which the stride-1 input gradient asks, and whether
# the forward does.
_PREFETCH_INPUT_ROWS = 1 if _ZEN else 5
_PREFETCH_FORWARD = _ZEN


@njit(inline="always")
def _ahead(job, jobs, out_rows, step, first, span, rows, length):
    """(a, b): the elements of the rows (images of ``rows`` rows of ``length``
    elements) that job ``job + 1`` reads and job ``job`` does not, to be asked
    for while job ``job`` runs (:func:`_ask`). Job j is output row o of image n
    (``out_rows`` rows an image) and reads rows ``o*step + first`` to ``o*step +
    first + span`` (those inside)."""
    if job + 1 < jobs:
        n, o = _split(job + 1, out_rows)
        hi = o * step + first + span
        lo = o * step + first if o == 0 else max(hi - step + 1, o * step + first)
        lo, hi = max(lo, 0), min(hi + 1, rows)
        if lo < hi:
            return (n * rows + lo) * length, (n * rows + hi) * length
    return 0, 0


@njit(inline="always")
def _ahead_pair(job, jobs, out_rows, step, first, span, rows, length):
    """:func:`_ahead` for a job computing rows ``job`` and ``job + 1`` at once: the
    elements that jobs ``job + 2`` and ``job + 3`` read and job ``job + 1`` does not."""
    a = _ahead(job + 1, jobs, out_rows, step, first, span, rows, length)
    b = _ahead(job + 2, jobs, out_rows, step, first, span, rows, length)
    if b[1] <= b[0]:
        return a
    if a[1] <= a[0]:
        return b
    return min(a[0], b[0]), max(a[1], b[1])


@njit(inline="always")
def _ask(a, lo, hi):
    """Ask for the cache lines of ``a[lo:hi]`` to be brought into L2."""
    line = 64 // a.itemsize
    for i in range(lo - lo % line, hi, line):
        _prefetch(a, i)


@njit(inline="always")
def _ask_share(a, lo, hi, i, shares):
    """:func:`_ask` for share ``i`` of ``shares`` of ``a[lo:hi]``."""
    _ask(a, lo + i * (hi - lo) // shares, lo + (i + 1) * (hi - lo) // shares)


# Lines of each array asked for (:func:`_ask`) before each piece of a row: asked
# for all at once, the next row's lines fill the queue of misses and the row's
# computation waits behind them. Zen 4, 2 threads, N=32, NHWC, each version in
# processes of its own, alternating, 3 rounds, the whole row at the start /
# pieces of 32 lines (ms): forward 56x56x144 (rows of 504 lines) 6.4-9.8 /
# 3.1-4.5, 112x112x32 4.2-5.6 / 2.9-3.0, 19x19x728 3.8-5.0 / 3.4-3.9, 56x56x96
# 7x7 9.1-9.3 / 7.1-7.2; input gradient 56x56x144 5.3-7.7 / 3.4-4.4, 112x112x32
# 4.2-5.4 / 3.2-4.2; filter gradient 56x56x144 7.2-9.7 / 5.4-6.1, 112x112x32
# 4.7-6.4 / 3.8-5.6 (32 lines of both arrays together there, pieces of 8 pixels:
# 6.2-7.8; pieces of at least 8 or 16 pixels at 56x56x144: 8.1-10.1 against
# 6.5-6.9 with 4). (A comparison in one process that read even timed these
# kernels twice: the old package's copy found its kernels by the registry's
# module name, this one's.) Intel cores: not measured, the whole row.
_PIECE_LINES = 32 if _ZEN else 1 << 30

# The filter gradient computes a row that asks for lines ahead in pieces of its
# channels, each over the whole row (pairs of channel groups, at most one piece
# a pair; from memory cut along the row, _SPLIT_BYTES), when the pieces wanted
# (:func:`_piece_count`) are at most this many times the pairs (rows of one
# window row a pass; rows of whole windows: the bounds below, and the
# measurements here are from when they had this one too): each tap's sums then
# stay in registers from the row's first pixel to its last instead of being
# loaded and stored every piece of pixels (4 pixels at 14x14x384). Longer
# rows, wanting more pieces, keep pieces of pixels, which cut the asks finer:
# channel pieces there were slower (2 threads, N=32 56x56x144 5.2 -> 6.4 ms,
# 112x112x32 3.6 -> 4.6). Both ways call
# the intrinsic in a function of its own (:func:`_dots_piece`), from one loop
# that gives the call one set of argument types (a literal 0 from one way, an
# integer from the other, compiled it twice): with the intrinsic inside a
# function holding both ways, the rows on pixel pieces ran as slowly as on
# channel pieces (Zen 4, 56x56x144 6.4 ms); with each way a function holding
# the intrinsic, it compiled twice over. Zen 4, 3x3 stride 1, 2 threads,
# alternating processes, medians of 3, pixel pieces / these (ms): N=32
# 14x14x384 0.87 / 0.68, 14x14x576 1.24 / 0.88, 28x28x192 1.57 / 1.39,
# 56x56x144 5.03 / 4.72, 112x112x32 3.70 / 3.48; N=8 56x56x144 1.28 / 1.22. 1
# thread, channel pieces: N=32 14x14x384 1.59 / 1.35, 7x7 14x14x384 5.54 /
# 4.86. Strided rows, channel pieces: even (N=32 112x112x96 8.5 / 8.4,
# 56x56x144 3.35 / 3.22).
_CHANNEL_PIECES = 2
# The same bound for rows of whole windows (3x3: all window rows in one pass)
# whose pixels step further than their taps (strides above 1): their pieces of
# 4 pixels loaded and stored the 81 sums of 144 channels every 4 pixels. Zen 4,
# 2 threads, N=32, alternating processes each with its own cache, medians of 4
# in three runs, the bound of 2 / 16 (ms): 56x56x144 stride 2 4.13 / 3.37, 4.27
# / 3.65, 4.58 / 3.72; 112x112x96 stride 2 9.09 / 8.76, 9.72 / 9.37, 9.14 /
# 8.82, N=8 1.66 / 1.67, 2.01 / 1.69, 2.05 / 1.92 (the "even" above was an
# earlier Zen 4). The 5x5 stride-2 rows (a window row a pass) keep the bound of
# 2: with 16, 56x56x72 N=32 ran 1.33 / 1.72 in one run, but as slowly (1.33 /
# 1.97) in a run where it kept 2 in both, and even with the processes' order
# swapped, so the bound for them is not measured.
_STRIDED_CHANNEL_PIECES = 16
# The bound for stride-1 rows of whole windows. Zen 4, 6 December, 2 threads,
# alternating processes each with its own cache, medians of 5 pairs (N=8) or
# 4 (N=32), the bound of 2 / 8 (ms). From the L3 (operands up to
# _SPLIT_BYTES), where fewer and larger requests paid, every pair faster: N=8
# 56x56x144 (29 MB; 4 pieces of its channels instead of 15 of 4 pixels) 1.72
# / 0.98, 112x112x32 (26 MB; the whole row in one piece instead of 7) 0.94 /
# 0.62; 1 thread, 3 pairs, 3.30 / 2.36 and 1.90 / 1.52. From memory, with the
# channel pieces cut as _SPLIT_BYTES says (alone, 8 lost there: N=32 56x56x144
# 6.49-7.06 / 6.56-8.47, 112x112x32 3.77-3.93 / 4.42-5.58), every pair faster
# on 56x56x144 N=32 (116 MB): 6.9 / 5.2 (5.3-7.4 / 4.7-5.4); 112x112x32 then
# takes the same pieces as before (the one channel piece cut into 7). 28x28x192
# N=32 lost where its channel pieces were cut in two (1.65 / 1.93), which they
# no longer are (_WINDOW_CUTS).
_WINDOW_CHANNEL_PIECES = 8
# Operands (input and output gradient) above this many bytes (the Zen 4's L3)
# come from memory: there each piece of a row's channels is cut into pieces of
# its pixels, about as many as the asks want over the channel pieces (rounded),
# so that the asks spread as finely as with pieces of pixels while the sums
# stay in registers across each cut. Zen 4, 6 December, N=32, as above,
# medians of 4 pairs, whole / cut (ms): 112x112x96 stride 2 (193 MB) 10.1 /
# 7.4-8.7 (9.2-12.5 / 5.3-9.5, 8 of 8 pairs faster), 56x56x144 stride 2 4.05
# / 3.5-3.7 (8 of 8), 28x28x240 5x5 3.54 / 2.68-2.76 (8 of 8), 56x56x72 5x5
# stride 2 1.59 / 1.47-1.54, N=8 112x112x96 stride 2 (48 MB) even (1.84-2.30 /
# 1.40-2.41); rows whose asks want fewer pieces than 1.5 a channel piece are
# not cut (19x19x728).
_SPLIT_BYTES = 32 << 20
# Rows of whole 3x3 windows (all window rows in one pass) from memory (operands
# above _SPLIT_BYTES), with at least a pair of channel groups and pixels one or
# two column steps apart, are one piece of all their pixels and channels, their
# asks spread over the blocks of pixels inside :func:`.simd.dots_rows`
# (``asks``): the pieces above and their cuts kept the asks fine, but each
# piece reloaded its sums and its calls cost more than its products (1 thread,
# N=1 112x112x96 stride 2 from the caches, made to take the pieces of N=32:
# 0.47 ms, against 0.12 without asks and 0.15 asking inside), so N=32 ran as
# slowly as the pieces, 14 ms (13.7 GB/s, where one thread reads 27.6). Zen 4,
# 2 threads, NHWC, alternating processes each with its own cache, medians of 3
# processes' minima, pieces / inside (ms): stride 2 N=32 112x112x96 (193 MB)
# 7.93 / 6.52, 56x56x144 3.17 / 2.16, N=8 112x112x96 (48 MB) 1.80 / 1.00;
# stride 1 N=32 112x112x32 4.11 / 2.80, 56x56x144 5.10 / 3.64, 28x28x192 1.49
# / 1.00, 19x19x728 2.72 / 2.15. Operands in the L3 (16 to 32 MB) keep the
# pieces, faster there (medians of 5, inside / pieces: N=32 14x14x384 0.79 /
# 0.64, N=8 112x112x32 0.94 / 0.54, 19x19x728 0.64 / 0.55, 56x56x144 1.06 /
# 0.95), and so do the 5x5 and 7x7 rows (a window row a pass), which lost
# asking inside (N=32 28x28x240 5x5 2.56 / 3.05, N=8 56x56x96 7x7 1.52 / 1.67),
# and rows of too few channels or other steps, where the intrinsic does not
# ask. The same bits either way (each tap's sums per lane in pixel order).
_ASKS_INSIDE = True
# Rows of whole windows are cut only into this many pieces or more: 28x28x192
# N=32 (10 pieces wanted over 6 channel pieces) lost when cut in two, 5x5 rows
# cut in two gained (medians of 5 pairs, cut in two / whole, ms: 28x28x192 1.72
# / 1.45, 4 of 5 pairs; 28x28x240 5x5 2.43 / 2.78, 5 of 5; 56x56x72 5x5 stride
# 2 1.29 / 1.30).
_WINDOW_CUTS = 3


@njit(inline="always")
def _piece_count(elements, itemsize):
    """Pieces to compute a row in when ``elements`` are asked for across it:
    about ``_PIECE_LINES`` lines a piece."""
    return max(1, elements * itemsize // (64 * _PIECE_LINES))


@njit(inline="always")
def _pieces(run, pieces):
    """The pixels of each of about ``pieces`` pieces of a row of ``run`` pixels:
    whole blocks (:data:`.simd.BLOCK`) of pixels."""
    n = (run + pieces - 1) // pieces
    return min(run, (n + _BLOCK - 1) // _BLOCK * _BLOCK)


@njit(inline="always")
def _channel_units(C):
    """The most pieces a row's ``C`` channels split into: pairs of channel
    groups (``2 * simd.WIDE`` channels), at least one."""
    return max(1, C // (2 * _WIDE))


@njit(inline="always")
def _side(i, a, b):
    """The i-th column outside [a, b) of a row."""
    return i if i < a else b + i - a


@njit(inline="always")
def _dots(part, a0, src, s0, sstep, rowstep, colstep, dy, g0, C, run, rows, KW, M, edges,
          ahead, split, lines, xline, gline):
    """Add into ``part`` (flat ``[kh, kw, c]``, from ``a0``) the products of ``run``
    output-gradient pixels from ``dy[g0]`` (``C`` apart) with the ``rows`` x KW
    window taps they read from ``src``, pixel k's tap (r, j) at ``src[s0 +
    k*sstep + r*rowstep + j*colstep]``, leaving out the columns outside the map
    that ``edges`` describes (:func:`.simd.dots_rows`, its pixel range relative
    to pixel 0). ``rows``, KW, M: compile-time constants (M: ``src`` holds a
    depth multiplier M's input, as in :func:`_row_here`). ``ahead``: (a, b, c, d),
    the elements ``src[a:b]`` and ``dy[c:d]`` to ask for, spread over the row's
    pieces: pieces of its channels (whole pairs of channel groups, ``2 *
    simd.WIDE`` channels; the last piece takes the rest) or of its pixels, as
    ``_CHANNEL_PIECES`` (rows of whole windows: ``_WINDOW_CHANNEL_PIECES``, or
    at strides above 1 ``_STRIDED_CHANNEL_PIECES``) says; with ``split``
    (operands from memory, ``_SPLIT_BYTES``) each piece of the channels is cut
    into pieces of its pixels too; or, for the rows ``_ASKS_INSIDE`` names, one
    piece asking across its blocks. ``lines``: rows of pixels summed in the same
    registers, ``xline`` and ``gline`` elements of ``src`` and ``dy`` apart (in
    one piece only: ``_LINES``)."""
    asked = max(ahead[1] - ahead[0], ahead[3] - ahead[2])
    inside = (_ASKS_INSIDE and split and asked > 0 and rows > 1 and C >= 2 * _WIDE
              and (sstep == colstep or sstep == 2 * colstep))
    wanted = _piece_count(asked, src.itemsize)
    units = _channel_units(C)
    if rows == 1:
        bound = _CHANNEL_PIECES
    else:
        bound = _STRIDED_CHANNEL_PIECES if sstep > colstep else _WINDOW_CHANNEL_PIECES
    if inside:
        across, n = 1, run
    elif asked > 0 and wanted <= bound * units:
        across = min(units, wanted)             # pieces of the channels
        cuts = (2 * wanted + across) // (2 * across)
        n = _pieces(run, cuts) if split and cuts >= (_WINDOW_CUTS if rows > 1 else 2) else run
    else:
        across = 1                              # (c0 = 0, c1 = C)
        n = _pieces(run, wanted) if asked > 0 else _chunk(run, C)
    along = (run + n - 1) // n
    pieces = across * along
    for i in range(pieces):
        # (no overlap here: each product is added once)
        u = i // along
        k = (i - u * along) * n
        c0 = u * units // across * 2 * _WIDE
        c1 = C if u == across - 1 else (u + 1) * units // across * 2 * _WIDE
        if not inside:
            _ask_share(src, ahead[0], ahead[1], i, pieces)
            _ask_share(dy, ahead[2], ahead[3], i, pieces)
        _dots_piece(part, a0, src, s0, sstep, rowstep, colstep, dy, g0, C, k, min(n, run - k),
                    c0, c1, rows, KW, M, edges, lines, xline, gline,
                    ahead if inside else (0, 0, 0, 0))


@njit(nogil=True, cache=True)
def _dots_piece(part, a0, src, s0, sstep, rowstep, colstep, dy, g0, C, k, m, c0, c1, rows, KW,
                M, edges, lines, xline, gline, asks):
    """:func:`.simd.dots_rows` for pixels [k, k + m) and channels [c0, c1) of
    :func:`_dots`' row, asking for ``asks`` (as its ``ahead``) across them."""
    literally(rows)
    literally(KW)
    literally(M)
    s = s0 + k * sstep + c0 // M
    g = g0 + k * C + c0
    if edges is None:
        _dots_rows(part, a0 + c0, C, src, s, sstep, rowstep, colstep, dy, g, C, m, c1 - c0,
                   rows, KW, M, None, lines, xline, gline, asks)
    else:
        lo = min(max(edges[0] - k, 0), m)
        hi = max(min(edges[1] - k, m), lo)
        _dots_rows(part, a0 + c0, C, src, s, sstep, rowstep, colstep, dy, g, C, m, c1 - c0,
                   rows, KW, M,
                   (lo, hi, edges[2] + k * edges[3], edges[3], edges[4], edges[5], edges[6]),
                   lines, xline, gline, asks)


@njit(inline="always")
def _dots_pixel(part, a0, arow, src, s0, rowstep, colstep, dy, g0, C, rows, cols, M):
    """Add one output-gradient pixel's products with the ``rows`` x ``cols`` window
    taps inside the map into ``part`` (tap (r, j) at ``part[a0 + r*arow + j*C]``,
    ``src[s0 + r*rowstep + j*colstep]``)."""
    if rows <= 0 or cols <= 0:
        return
    _dots_window(part, a0, arow, C, src, s0, rowstep, colstep, dy, g0, rows, cols, C, M)


@njit(inline="always")
def _gather_row(dst, d0, dyf, n, ih, wt, H, W, C, OH, OW, KH, KW, rh, rw, ph, pw, lo, hi, NT,
                ahead):
    """Input row ``ih`` of image ``n`` of a stride-1 input gradient (C channels)
    into ``dst`` from ``d0``: pixels [lo, hi) in blocks (:func:`_row`, asking for
    ``dyf[a:b]`` of ``ahead`` across them), the others one at a time."""
    oh0 = ih + ph
    k0, k1 = _taps_inside(oh0, -rh, KH, OH)
    s0 = ((n * OH + oh0) * OW + lo + pw) * C
    if lo < hi:
        _row(dst, d0 + lo * C, dyf, s0, C, -OW * rh * C, -rw * C, wt, C, hi - lo, k0, k1, KW,
             NT, (lo + pw, 1, -rw, OW, C), 1, ahead, -1)
    else:
        _ask(dyf, ahead[0], ahead[1])
    _gather_sides(dst, d0, dyf, wt, n, oh0, k0, k1, W, C, OH, OW, KW, rh, rw, pw, lo, hi, NT)


@njit(inline="always")
def _gather_pair(dst, d0, dyf, n, ih, wt, H, W, C, OH, OW, KH, KW, rh, rw, ph, pw, lo, hi, NT,
                 ahead):
    """Input rows ``ih`` and ``ih + 1`` of image ``n`` (both windows inside the
    output gradient, ``rh`` 1) as :func:`_gather_row` computes them, their blocks
    two rows at a time (:func:`_row_pair`): row ``ih + 1`` first, whose window
    one row up is row ``ih``'s."""
    oh0 = ih + 1 + ph
    s0 = ((n * OH + oh0) * OW + lo + pw) * C
    _row_pair(dst, d0 + (W + lo) * C, -W * C, dyf, s0, C, -OW * C, -rw * C, wt, C, hi - lo,
              KH, KW, NT, (lo + pw, 1, -rw, OW, C), 1, ahead, -1)
    for r in range(2):
        _gather_sides(dst, d0 + r * W * C, dyf, wt, n, ih + r + ph, 0, KH, W, C, OH, OW, KW,
                      rh, rw, pw, lo, hi, NT)


@njit(inline="always")
def _gather_sides(dst, d0, dyf, wt, n, oh0, k0, k1, W, C, OH, OW, KW, rh, rw, pw, lo, hi,
                  NT):
    """The input-gradient columns outside [lo, hi) of one row: those whose window a
    side cuts."""
    for i in range(lo + W - hi):
        iw = _side(i, lo, hi)
        j0, j1 = _taps_inside(iw + pw, -rw, KW, OW)
        _pixel(dst, d0 + iw * C, dyf, ((n * OH + oh0 - k0 * rh) * OW + iw + pw - j0 * rw) * C,
               -OW * rh * C, -rw * C, wt, (k0 * KW + j0) * C, KW * C, C, C, k1 - k0, j1 - j0,
               NT)


def _build(KH, KW, NT, M):
    @njit(nogil=True, cache=True)
    @_instance(KH, KW, NT, M)
    def forward(part, parts, x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``forward_cl``, for ``x[N, 1, H, W, C / M]``,
        ``w[1, KH, KW, C, 1]``, ``y[N, 1, OH, OW, C]``, C a multiple of 8: depth
        multiplier M (output channel c sees input channel c // M); above 1, the
        pixels whose window a side cuts are computed in masked blocks."""
        N, D, H, W, CI = x.shape
        _, OD, OH, OW, C = y.shape
        lo, hi, edges = _forward_columns(OW, W, CI, C, sw, rw, pw, KW, M)
        wt = w.reshape(w.size)
        xf = x.reshape(N * D * H * W * CI)
        yf = y.reshape(N * OD * OH * OW * C)
        jobs = N * OH
        ahead = (_PREFETCH_FORWARD and OW * C <= _LONG_ROW
                 and x.size * x.itemsize + y.size * y.itemsize > _PREFETCH_BYTES)
        first, last = _part(part, parts, jobs)
        pairs = _pairs(OH, KH, KW, sh, rh, lo, hi, NT)
        job = first
        while job < last:
            if pairs and job + 1 < last and _pair_inside(job, OH, H, KH, sh, rh, ph):
                span = (_ahead_pair(job, jobs, OH, sh, -ph, (KH - 1) * rh, H, W * CI)
                        if ahead else (0, 0))
                _forward_pair(yf, job * OW * C, xf, wt, job, H, W, CI, C, OH, OW, KH, KW, sh,
                              sw, rh, rw, ph, pw, lo, hi, edges, NT, M, span)
                job += 2
                continue
            span = (_ahead(job, jobs, OH, sh, -ph, (KH - 1) * rh, H, W * CI) if ahead
                    else (0, 0))
            _forward_row(yf, job * OW * C, xf, wt, job, H, W, CI, C, OH, OW, KH, KW, sh, sw,
                         rh, rw, ph, pw, lo, hi, edges, NT, M, span)
            job += 1
        if NT:
            _sfence()

    @njit(nogil=True, cache=True)
    @_instance(KH, KW, NT, M)
    def separable_forward(part, parts, x, w, pk, y, z, sd, sh, sw, rd, rh, rw, pd, ph, pw,
                          vecs):
        """:func:`forward` followed by a pointwise (1x1) convolution, for ``x[N, 1,
        H, W, C / M]``, ``w[1, KH, KW, C / M, M]``, ``pk[C, FP]`` (the pointwise
        kernel, its rows padded to FP columns so that they stay aligned, summed
        ``vecs`` vectors of columns at a time by :func:`.simd.pointwise_rows`),
        ``y[N, 1, OH, OW, F]``: each part of the rows computes a few depthwise
        rows at a time into its scratch row of ``z[parts, :]`` and their
        pointwise sums from there, so the depthwise result never leaves the
        cache. ``y`` written with non-temporal stores when the kernels stream
        (a multiple of ``simd.WIDE`` filters, ``y`` 64-byte aligned)."""
        N, D, H, W, CI = x.shape
        _, OD, OH, OW, F = y.shape
        C, FP = pk.shape
        lo, hi, edges = _forward_columns(OW, W, CI, C, sw, rw, pw, KW, M)
        wt = w.reshape(w.size)
        xf = x.reshape(N * D * H * W * CI)
        yf = y.reshape(N * OD * OH * OW * F)
        pkf = pk.reshape(C * FP)
        group = max(1, z.shape[1] // (OW * C))
        zf = z[part]
        a, b = _part(part, parts, N * OH)
        for j0 in range(a, b, group):
            j1 = min(b, j0 + group)
            for job in range(j0, j1):
                _forward_row(zf, (job - j0) * OW * C, xf, wt, job, H, W, CI, C, OH, OW, KH,
                             KW, sh, sw, rh, rw, ph, pw, lo, hi, edges, 0, M, (0, 0))
            _pointwise_rows(yf, j0 * OW * F, F, zf, 0, C, 1, pkf, 0, FP, F, C,
                            (j1 - j0) * OW, vecs, NT)
        if NT:
            _sfence()

    @njit(nogil=True, cache=True)
    @_instance(KH, KW, NT, M)
    def backprop_input(part, parts, dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``backprop_input_cl``, stride 1, for
        ``dy[N, 1, OH, OW, C]``, ``w[1, KH, KW, C, 1]``, ``dx[N, 1, H, W, C / M]``,
        C a multiple of 8: in gather form, dx[ih, iw] = sum over taps of dy[ih + ph
        - kh*rh, iw + pw - kw*rw] * w[kh, kw] (taps reach back: negative offsets).
        Depth multiplier M above 1: each row's gradient of the input repeated
        (C channels) in a scratch row, then its groups of M channels summed in
        order of m (:func:`.simd.sum_groups`), so the repeated gradient never
        leaves the cache."""
        N, D, H, W, CI = dx.shape
        _, OD, OH, OW, C = dy.shape
        lo, hi = _run(W, pw, 1, -rw, KW, OW, C)
        wt = w.reshape(w.size)
        dyf = dy.reshape(N * OD * OH * OW * C)
        dxf = dx.reshape(N * D * H * W * CI)
        jobs = N * H
        ahead = (KH >= _PREFETCH_INPUT_ROWS and OW * C <= _LONG_ROW
                 and dy.size * dy.itemsize + dx.size * dx.itemsize > _PREFETCH_BYTES)
        rep = np.empty(W * C if M > 1 else 0, np.float32)
        first, last = _part(part, parts, jobs)
        pairs = M == 1 and _pairs(H, KH, KW, 1, rh, lo, hi, NT)
        job = first
        while job < last:
            if pairs and job + 1 < last and _pair_inside(job, H, OH, KH, 1, rh,
                                                         (KH - 1) * rh - ph):
                span = (_ahead_pair(job, jobs, H, 1, ph - (KH - 1) * rh, (KH - 1) * rh, OH,
                                    OW * C) if ahead else (0, 0))
                n, ih = _split(job, H)
                _gather_pair(dxf, job * W * C, dyf, n, ih, wt, H, W, C, OH, OW, KH, KW, rh,
                             rw, ph, pw, lo, hi, NT, span)
                job += 2
                continue
            span = (_ahead(job, jobs, H, 1, ph - (KH - 1) * rh, (KH - 1) * rh, OH, OW * C)
                    if ahead else (0, 0))
            n, ih = _split(job, H)
            if M == 1:
                _gather_row(dxf, job * W * C, dyf, n, ih, wt, H, W, C, OH, OW, KH, KW,
                            rh, rw, ph, pw, lo, hi, NT, span)
            else:
                _gather_row(rep, 0, dyf, n, ih, wt, H, W, C, OH, OW, KH, KW, rh, rw, ph,
                            pw, lo, hi, 0, span)
                _sum_groups(dxf, job * W * CI, CI, rep, 0, C, W, CI, M, NT)
            job += 1
        if NT:
            _sfence()

    # Streamed in halves (NT 2: pixels ending in a group of 8 channels), a row's
    # column phases would write the two halves of a line that two pixels share
    # at different times, which lost to plain stores; the row is assembled in a
    # scratch row (plain stores, in L1) and streamed whole (the driver takes
    # this only for rows of whole 64-byte lines). 2 threads, N=32 56x56x72 5x5
    # stride 2 (29 MB result), plain / staged: `numbasep bench --peers torch`
    # side by side, 6 runs each, ratio to PyTorch 0.96-1.14 (median 1.06) /
    # 0.65-0.91 (0.86), numbasep 1.34-4.07 / 1.76-2.77 ms on a noisy VM;
    # alternating processes, medians of 5 minima 1.97 / 1.77 ms. Staging whole
    # vectors (NT 1, streamed as computed) lost: 32x56x56x144 3x3 stride 2 1.20
    # -> 2.88 ms, 32x112x112x96 4.56 -> 7.43.
    STAGED = NT == 2
    PNT = 0 if STAGED else NT

    @njit(nogil=True, cache=True)
    @_instance(KH, KW, NT, M)
    def backprop_input_strided(part, parts, dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``backprop_input_cl``, for strides above 1 and
        dilation 1, ``dy[N, 1, OH, OW, C]``, ``w[1, KH, KW, C, 1]``, C a multiple
        of 8, by phases: input row ih reads the window rows kh = (ih + ph) mod sh,
        + sh, + 2sh, ..., and the pixels of column phase q (iw = q mod sw) the
        window columns kw0 = (q + pw) mod sw, + sw, ..., where pixel iw's tap j
        reads dy column (iw + pw - kw0)/sw - j: per phase, a stride-1 gather
        (column step -1) of a sub-window, over pixels sw apart."""
        N, D, H, W, C = dx.shape
        _, OD, OH, OW, _ = dy.shape
        wt = w.reshape(w.size)
        dyf = dy.reshape(N * OD * OH * OW * C)
        dxf = dx.reshape(N * D * H * W * C)
        chunk = _PHASE_CHUNK if W * C > _CHUNKED_ROW else W
        # (from a 64-byte boundary, so that the copy's loads split no line)
        per_line = 64 // dx.itemsize
        stage = np.empty(W * C + per_line if STAGED else 0, dx.dtype)
        s0 = (-(stage.ctypes.data // dx.itemsize)) % per_line if STAGED else 0
        for job in range(*_part(part, parts, N * D * H)):
            if STAGED:
                out, at = stage, s0
            else:
                out, at = dxf, job * W * C
            nd, ih = _split(job, H)
            n = nd // D
            kh0 = (ih + ph) % sh
            oh0 = (ih + ph - kh0) // sh          # the dy row of tap kh0; tap i reads oh0 - i
            i0, i1 = _taps_inside(oh0, -1, (KH - kh0 + sh - 1) // sh, OH)
            rows = i1 - i0
            wr0 = (kh0 + i0 * sh) * KW
            r0 = (n * OH + oh0 - i0) * OW
            for q in range(min(sw, W)):
                kw0 = (q + pw) % sw
                J = (KW - kw0 + sw - 1) // sw if kw0 < KW else 0
                count = (W - q + sw - 1) // sw    # the phase's pixels q, q + sw, ...
                o0 = (q + pw - kw0) // sw         # the dy column of its first pixel's tap 0
                # the interior: every tap's column inside dy
                a = max(0, J - 1 - o0)
                b = min(count, OW - o0)
                if a >= b:
                    a = b = 0
                if a < b:
                    _phase_row(out, at + (q + a * sw) * C, sw * C, dyf,
                               (r0 + o0 + a) * C, -OW * C, wt, (wr0 + kw0) * C,
                               sh * KW * C, sw * C, C, b - a, rows, J, chunk, PNT, KH)
                for i in range(a + count - b):
                    m = _side(i, a, b)
                    ow = o0 + m
                    j0, j1 = _taps_inside(ow, -1, J, OW)
                    _pixel(out, at + (q + m * sw) * C, dyf, (r0 + ow - j0) * C, -OW * C,
                           -C, wt, (wr0 + kw0 + j0 * sw) * C, sh * KW * C, sw * C, C, rows,
                           j1 - j0, PNT)
            if STAGED:
                _stream_copy(dxf, job * W * C, stage, s0, W * C)
        if NT:
            _sfence()

    # window rows summed in one pass over a row of pixels: all of a 3x3 window's
    # (9 sums in registers); one at a time for larger windows
    ALL = KH if KH * KW <= 9 else 1
    # The filter gradient's side pixels: with all window rows in one pass, in the
    # row's sums, their taps outside masked off (:func:`.simd.dots_rows` edges);
    # with larger windows, a window row a pass, one pixel at a time after the
    # row, all its taps inside at once (:func:`.simd.dots_window`), which was
    # faster there (2 threads, N=32, masked / after: 28x28x240 5x5 2.6-2.8 /
    # 2.2 ms, 56x56x96 7x7 7.6-8.2 / 6.7-6.9).
    SIDES = ALL != KH

    @njit(nogil=True, cache=True)
    @_instance(KH, KW, NT, M)
    def backprop_filter(p, P, x, dy, parts, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """As :func:`.kernels` ``backprop_filter_cl``, for ``x[N, 1, H, W, C / M]``,
        ``dy[N, 1, OH, OW, C]``, partial filters ``parts[P, 1, KH, KW, C / M, M]``,
        C a multiple of 8 (depth multiplier M): partial filter p sums the output
        rows [p*rows/P, (p+1)*rows/P) (a split that depends on the problem
        only)."""
        N, D, H, W, CI = x.shape
        _, OD, OH, OW, C = dy.shape
        rows = N * OD * OH
        # pixels [lo, hi) have a tap inside the map's columns, [a, b) all their taps
        lo, hi = _span(OW, -pw, sw, rw, KW, W, 1)
        a, b = _span(OW, -pw, sw, rw, KW, W, KW)
        if a >= b:
            a = b = lo
        if SIDES:
            lo, hi = a, b
        edges = (a - lo, b - lo, lo * sw - pw, sw, rw, W, CI)
        xf = x.reshape(N * D * H * W * CI)
        dyf = dy.reshape(N * OD * OH * OW * C)
        ahead = (_FILTER_ASKS and x.size * x.itemsize + dy.size * dy.itemsize
                 > (_PREFETCH_BYTES if sh > 1 else _PREFETCH_FILTER_BYTES)
                 and OW * C <= _LONG_ROW)
        split = x.size * x.itemsize + dy.size * dy.itemsize > _SPLIT_BYTES
        part = parts[p]
        part[:] = 0
        pf = part.reshape(KH * KW * C)
        # the last output row whose window lies inside the map's rows
        inside = (H - 1 - (KH - 1) * rh + ph) // sh if H - 1 - (KH - 1) * rh + ph >= 0 else -1
        lined = _LINES > 1 and not ahead and (hi - lo) * C <= _LONG_ROW
        job, end = p * rows // P, (p + 1) * rows // P
        while job < end:
            span = ((_ahead(job, rows, OH, sh, -ph, (KH - 1) * rh, H, W * CI)
                     + _ahead(job, rows, OH, 1, 0, 0, OH, OW * C)) if ahead else (0, 0, 0, 0))
            nd, oh = _split(job, OH)
            n, od = _split(nd, OD)
            ih0 = oh * sh - ph
            k0, k1 = _taps_inside(ih0, rh, KH, H)
            # (s0 points at pixel lo's first tap column, which may lie outside)
            s0 = ((n * H + ih0) * W + lo * sw - pw) * CI
            g0 = (job * OW + lo) * C
            lines = 1
            if lo >= hi or k0 == k1:
                _ask(xf, span[0], span[1])
                _ask(dyf, span[2], span[3])
            elif ALL == KH and k0 == 0 and k1 == KH:
                if lined:
                    lines = max(1, min(_LINES, end - job, min(OH - 1, inside) - oh + 1))
                _dots(pf, 0, xf, s0, sw * CI, W * rh * CI, rw * CI, dyf, g0, C, hi - lo,
                      ALL, KW, M, edges, span, split, lines, sh * W * CI, OW * C)
            # (the lines asked for spread over the first window row's pixels)
            elif SIDES:
                for r in range(k0, k1):
                    _dots(pf, r * KW * C, xf, s0 + r * W * rh * CI, sw * CI, 0, rw * CI,
                          dyf, g0, C, hi - lo, 1, KW, M, None, span if r == k0 else (0, 0, 0, 0),
                          split, 1, 0, 0)
            else:
                for r in range(k0, k1):
                    _dots(pf, r * KW * C, xf, s0 + r * W * rh * CI, sw * CI, 0, rw * CI,
                          dyf, g0, C, hi - lo, 1, KW, M, edges,
                          span if r == k0 else (0, 0, 0, 0), split, 1, 0, 0)
            for i in range(a + OW - b if SIDES else 0):
                ow = _side(i, a, b)
                iw0 = ow * sw - pw
                j0, j1 = _taps_inside(iw0, rw, KW, W)
                _dots_pixel(pf, (k0 * KW + j0) * C, KW * C, xf,
                            ((n * H + ih0 + k0 * rh) * W + iw0 + j0 * rw) * CI, W * rh * CI,
                            rw * CI, dyf, (job * OW + ow) * C, C, k1 - k0, j1 - j0, M)
            job += lines

    return (Parallel(forward, lambda x, w, y, *_: y.shape[0] * y.shape[2], 3, per_thread=True),
            Parallel(backprop_input, lambda dy, w, dx, *_: dx.shape[0] * dx.shape[2], 3,
                     per_thread=True),
            Parallel(backprop_input_strided,
                     lambda dy, w, dx, *_: dx.shape[0] * dx.shape[1] * dx.shape[2], 3,
                     per_thread=True),
            Parallel(backprop_filter, lambda x, dy, parts, *_: parts.shape[0], 3),
            Parallel(separable_forward, lambda x, w, pk, y, z, *_: z.shape[0], 5))


class LaneKernels:
    """The lane kernels for one window shape: ``forward``, ``backprop_input`` (stride
    1), ``backprop_input_strided`` (dilation 1) and ``backprop_filter``; with
    ``stream``, the first three and ``separable_forward`` writing their results
    with non-temporal stores (every result vector must be aligned to its size,
    with ``stream`` 2 to half its size, stored in halves: the driver's
    ``_streaming``); with ``multiplier`` M above 1, ``forward``,
    ``backprop_input`` and ``backprop_filter`` serve a depth multiplier M
    (``backprop_input_strided`` serves multiplier 1 only)."""

    def __init__(self, KH, KW, stream=False, multiplier=1):
        (self.forward, self.backprop_input, self.backprop_input_strided,
         self.backprop_filter, self.separable_forward) = _build(KH, KW, int(stream),
                                                                multiplier)


_sets = {}


def kernels(KH, KW, stream=False, multiplier=1):
    """The lane kernels for a KH x KW window of ``WINDOWS`` (``stream``: writing
    with non-temporal stores, True or 1 whole vectors, 2 each vector in two
    halves (:meth:`.simd._Lanes.put`); ``multiplier``: a depth multiplier of
    :data:`.simd.REPEATS`)."""
    key = (KH, KW, int(stream), multiplier)
    if key not in _sets:
        _sets[key] = LaneKernels(*key)
    return _sets[key]
