"""Host side of the CPU backend: canonical views, dtype widening, kernel launches.

Kernels run on float32 or float64 arrays. float16 and bfloat16 arguments are
widened to float32 here and results rounded back once, into the caller's dtype,
so every sum is kept in float32 whatever the storage format (:mod:`.halves`
converts, in parallel kernels).
"""

import math
import threading

import numba
import numpy as np

from .. import base
from ... import aligned, dtypes
from . import groups, halves, inplace, kernels, lanes, planes, pointwise, scratch, simd, tiles


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _params(plan):
    return plan.strides + plan.dilations + plan.pads


def _compute(a, shape=None, slot=scratch.OPERAND_0):
    """``a`` as the kernels take it: C-contiguous, read-only, float32 or float64,
    viewed with ``shape`` when given.

    Each kernel is compiled for exactly this array type (one signature per dtype),
    so a strided or read-only argument never triggers another compilation. The
    cost is documented: 16-bit arrays are widened to float32 (into this thread's
    scratch buffer for ``slot``: the result is only valid until the next request
    for that slot) and non-contiguous arrays copied to a contiguous buffer, once
    per call.
    """
    dt = a.dtype
    if dt is not _F32 and dt is not _F64 and dt != _F32 and dt != _F64:
        a = halves.widen(aligned.contiguous(a), scratch.empty(slot, a.shape, _F32))
    elif not a.flags.c_contiguous:
        a = aligned.contiguous(a)
    return _read_only(a, shape)


def _read_only(a, shape=None, slot=None):
    """A read-only view of ``a``, shaped ``shape`` when given (a new view either way:
    reshape never returns ``a`` itself, so the caller's array keeps its flags)."""
    v = a.view() if shape is None else a.reshape(shape)
    v.setflags(write=False)
    return v


def _result(plan, shape, out, wide):
    """The array the kernel writes (compute dtype, C-contiguous) and the one to return.

    ``None`` as the second means "round the first to ``plan.dtype``".
    """
    acc = dtypes.accumulator(plan.dtype)
    if out is not None:
        if out.dtype == acc and out.flags.c_contiguous:
            return out, out
        return scratch.empty(scratch.RESULT, shape, acc), out
    if wide or plan.dtype == acc:
        buf = aligned.empty(shape, acc)
        return buf, buf
    # rounded into a new array afterwards: the float32 sums are a temporary
    return scratch.empty(scratch.RESULT, shape, acc), None


def _finish(plan, buf, final):
    if final is None:
        return halves.narrow_into(buf, aligned.empty(buf.shape, plan.dtype))
    if final is not buf:
        if final.dtype.itemsize == 2 and final.flags.c_contiguous and buf.dtype == _F32:
            halves.narrow_into(buf, final)
        else:
            final[...] = buf
    return final


_launch_lock = threading.Lock()
_serialise = None   # None until Numba's threading layer is known


def _launch(kern, *args):
    """Run a parallel kernel. The kernels release the GIL, so Python threads may
    launch them concurrently; Numba's ``workqueue`` layer aborts the process on
    concurrent parallel regions, so under it (and until the layer is known)
    launches take turns."""
    global _serialise
    if _serialise is False:
        return kern(*args)
    with _launch_lock:
        kern(*args)
        if _serialise is None:
            _serialise = numba.threading_layer() == "workqueue"


def _nothing_to_do(buf, *operands):
    """True when no kernel need run: the result is empty, or an operand is (then
    every sum is empty and the result is zeros). Skipping the launch matters: an
    empty tensor may have other dimensions of 2**30 that a kernel would loop over."""
    if buf.size == 0:
        return True
    for a in operands:
        if a.size == 0:
            buf[...] = 0
            return True
    return False


def _transpose_pays(plan):
    """Whether a channels-first problem the plane kernels do not take (3-D, or a
    depth multiplier above 1) runs faster as channels-last plus transposes.

    Channels-first row kernels vectorise along rows; on maps of 16 columns or fewer
    their per-row overheads cost more than moving the data to channels-last and
    back (measured, 1 thread, N=8: 7x7x960 forward 7.1 ms -> 1.7 ms, 14x14x384
    5.3 ms -> 2.8 ms; at 28 columns the transposes already lost)."""
    return not plan.channels_last and plan.out_sizes[2] <= 16 and not _by_planes(plan)


# Largest scratch (elements) of a plane task; a plane stretched by a huge stride,
# dilation or padding goes to the row kernels instead.
_PLANE_SCRATCH = 1 << 20


def _flat(plan):
    """Whether ``plan`` is a 1-D or 2-D problem with depth multiplier 1 and no
    negative padding: what the plane and tile kernels are written for."""
    return (plan.multiplier == 1 and plan.in_sizes[0] == 1 and plan.kernel[0] == 1
            and plan.out_sizes[0] == 1 and min(plan.pads) >= 0)


def _by_planes(plan):
    """Whether the plane kernels (:mod:`.planes`) take this problem: channels-first,
    1-D or 2-D, depth multiplier 1, and a plane whose phase-split scratch is small.

    On the suite's NCHW rows they replaced the row kernels (and the transposes)
    with a geometric-mean NCHW/NHWC time ratio of 1.09 instead of 2.03 (1 thread,
    N=8, 51 rows; ``python -m numbasep bench --full --layout NHWC,NCHW --batch 8
    --threads 1``)."""
    if plan.channels_last or not _flat(plan):
        return False
    _, kh, kw = plan.kernel
    _, sh, sw = plan.strides
    _, rh, rw = plan.dilations
    _, oh, ow = plan.out_sizes
    rq = oh + (kh - 1) * rh // sh
    wq = ow + (kw - 1) * rw // sw
    return (2 * sh * sw * (rq + 2) * (wq + 32) <= _PLANE_SCRATCH
            and sh * sw * kh * kw <= _PLANE_SCRATCH)


# Largest map (pixels, input or output) the tile kernels take at stride 1, with
# tiles of 64 channels: 1-D windows up to _SMALL_PIXELS, 3x3 up to _TILE_PIXELS
# (19 x 19), or up to _LARGE_WINDOW_PIXELS where the input holds at most
# _TILE_3X3_ELEMS elements, 5x5 and 7x7 up to _LARGE_WINDOW_PIXELS (28 x 28);
# largest tile or band of a tile (elements) a task holds.
_SMALL_PIXELS = 64
_TILE_PIXELS = 400
_LARGE_WINDOW_PIXELS = 784
_TILE_3X3_ELEMS = 3 << 20
_TILE_SCRATCH = 1 << 18

# Largest tile (elements) a tile task fills at once: a larger map is taken in bands
# of output rows whose tiles stay in L2 (128 KiB of float32).
_TILE_BAND = 1 << 15


def _tile_geometry(plan):
    """(pixels, row, cells): the larger map's pixel count, and bounds on the cells
    of a tile row and of a whole stride-1 tile (forward or adjoint)."""
    _, h, w = plan.in_sizes
    _, oh, ow = plan.out_sizes
    _, kh, kw = plan.kernel
    _, rh, rw = plan.dilations
    _, ph, pw = plan.pads
    wp = max(pw + w, (ow - 1) * plan.strides[2] + 2 * (kw - 1) * rw + 1)
    return max(h * w, oh * ow), wp, max(ph + h, oh + 2 * (kh - 1) * rh) * wp


def _tile_width(plan, adjoint=False):
    """Channels per tile when the tile kernels (:mod:`.tiles`) take this problem,
    else 0. They take what the plane kernels take, for the window shapes they are
    built for, where measured faster:

    * stride 1 on maps of at most ``_TILE_PIXELS`` pixels for 3x3 windows (19 x 19;
      28 x 28 for smaller inputs, below), ``_LARGE_WINDOW_PIXELS`` for 5x5 and 7x7
      (28 x 28), ``_SMALL_PIXELS`` for 1-D
      windows, all three ops, 64 channels per tile: there a plane's own costs
      outweigh its few hundred outputs. 1 thread, float32, NCHW/NHWC time
      ratio on the plane -> tile kernels: 14x14x384 3x3 N=8 forward 1.15 -> 0.95,
      input gradient 1.82 -> 1.04, filter gradient 1.43 -> 0.98; 19x19x728 forward
      N=1 1.83 -> 1.04; 7x7x960 forward N=8 1.21 -> 0.66 ms. 5x5 and 7x7 windows on
      14x14 maps and every window on 28x28 maps once measured even and stayed on
      the planes; with both kernels (and the channels-last ones) as they are now,
      the tiles win there (1 thread at N=1 and 8, 2 at N=32; NCHW/NHWC time, planes
      / tiles, the three forced in turn in one process, medians of 5 rounds):
      14x14x384 7x7 forward N=8 1.52 / 1.01, N=32 1.42 / 0.84; 14x14x672 5x5
      forward N=8 1.47 / 1.10, input gradient 1.75 / 1.39, N=32 1.46 / 1.04, filter
      gradient N=8 2.90 / 1.40, N=32 2.41 / 1.16; 28x28x240 5x5 N=32 forward 0.97 /
      0.84, input gradient 1.05 / 0.96, filter gradient 1.75 / 1.35; 28x28x120 5x5
      forward N=8 1.90 / 1.21. 3x3 windows on maps up to 28x28 take the tiles while
      the input holds at most ``_TILE_3X3_ELEMS`` elements (28x28x192 at N=16): there
      they won and at N=32 lost (forward, input gradient, filter gradient; 2 threads
      N=1 1.57 / 1.33, 1.65 / 1.31, 1.49 / 1.34; N=8 1.83 / 1.21, 1.82 / 1.18, 1.88
      / 1.28; N=16 1.70 / 1.36, 1.80 / 1.51, 1.54 / 1.27; N=32 0.81 / 0.91, 0.88 /
      0.96, 0.87 / 0.95; 1 thread N=8 1.35 / 1.10, 1.79 / 1.24, 1.76 / 1.24, N=16
      0.83 / 0.93, 1.28 / 1.02, 1.52 / 1.37, N=32 0.76 / 0.92, 0.74 / 0.81, 0.98 /
      1.14). On 56x56 maps the planes keep every window (56x56x144 3x3 forward N=8
      0.83 / 1.13; 56x56x96 7x7 input gradient 1.14 / 1.55).
    * strided forwards and filter gradients (the input gradient's tile form is
      stride 1 only), 16 channels per tile, in bands of ``_TILE_BAND`` elements:
      56x56x144 3x3 s2 forward N=1 0.29 -> 0.21 ms, N=8 4.0 -> 2.5; filter gradient
      N=8 3.0 -> 2.0; 112x112x96 3x3 s2 filter gradient N=8 7.7 -> 5.8, forward 6.4
      -> 6.1 (medians of 3 interleaved rounds; this machine's noise is +-20 %).
      5x5 and 7x7 windows once lost to the planes there and win now (1 thread,
      NCHW/NHWC time, planes / tiles, as above). Forward: 56x56x72 5x5 s2 N=1 1.69
      / 1.05, N=8 1.70 / 0.96, N=32 1.08 / 0.64; 28x28x120 5x5 s2 N=8 2.10 / 1.04;
      112x112x32 5x5 s2 N=8 1.14 / 0.69; 56x56x96 7x7 s2 N=8 1.14 / 0.65. Filter
      gradient: 56x56x72 5x5 s2 N=8 3.26 / 1.71, N=32 1.46 / 0.81; 28x28x120 5x5 s2
      N=8 3.19 / 1.01; 112x112x32 5x5 s2 N=8 2.23 / 1.57; 56x56x96 7x7 s2 N=8 1.82
      / 1.15.
    """
    if not _by_planes(plan) or plan.kernel[1:] not in tiles.WINDOWS:
        return 0
    _, kh, kw = plan.kernel
    _, sh, sw = plan.strides
    _, rh, _ = plan.dilations
    pixels, wp, tile = _tile_geometry(plan)
    if sh == sw == 1:
        if kh == 1:
            limit = _SMALL_PIXELS
        elif (kh, kw) == (3, 3) and plan.batch * plan.channels * pixels > _TILE_3X3_ELEMS:
            limit = _TILE_PIXELS
        else:
            limit = _LARGE_WINDOW_PIXELS
        small = pixels <= limit
        return tiles.WIDE if small and tile * tiles.WIDE <= _TILE_SCRATCH else 0
    smallest_band = ((kh - 1) * rh + 1 + sh) * wp * tiles.NARROW
    if adjoint or smallest_band > _TILE_SCRATCH:
        return 0
    return tiles.NARROW


# Largest map (pixels) whose channels-last filter gradient the tile kernels take,
# for 3x3 windows (5x5: _SMALL_PIXELS).
_CL_TILE_PIXELS = 196


def _filter_tile_width(plan):
    """Channels per tile for the filter gradient, or 0 (channels-first: as
    :func:`_tile_width` says).

    Channels-last problems take the tiles for their filter gradient on small
    stride-1 maps, float32 sums, 3x3 windows up to ``_CL_TILE_PIXELS`` pixels and
    5x5 up to ``_SMALL_PIXELS``: there the row kernels' per-row set-up and border
    loops, and one partial filter per output row, cost more than a tile copy. 1
    thread, tiles / rows time, min of interleaved rounds: 7x7x960 N=8 0.80, N=1
    0.86; 14x14x384 N=8 0.85; 14x14x576 N=8 0.86; 7x7x1152 5x5 N=8 0.70; at
    19x19x728 N=8 1.31 (N=1 0.91), and on 28x28 maps even. Their forward and input
    gradient measured even with the row kernels (0.87-1.26), and stay there;
    float64 stays there too, which spares CI the compilations.

    3x3 windows the lane kernels take go there instead (2 threads, lanes / tiles,
    min of 3 interleaved rounds): 7x7x960 N=32 0.41 / 0.67-0.73 ms, N=8
    0.105-0.118 / 0.144-0.148, N=1 0.025 / 0.022-0.025; 14x14x384 N=8 0.147 /
    0.21; 14x14x576 N=8 0.24 / 0.36. 5x5 stays on the tiles (7x7x1152 N=8 0.53 /
    0.42)."""
    if not plan.channels_last:
        return _tile_width(plan)
    if (not _flat(plan) or dtypes.accumulator(plan.dtype) != _F32
            or plan.strides[1:] != (1, 1)):
        return 0
    pixels, _, tile = _tile_geometry(plan)
    window = plan.kernel[1:]
    if tile * tiles.WIDE > _TILE_SCRATCH or (window == (3, 3) and _by_lanes(plan, False)):
        return 0
    if (window == (3, 3) and pixels <= _CL_TILE_PIXELS) or \
            (window == (5, 5) and pixels <= _SMALL_PIXELS):
        return tiles.WIDE
    return 0


# Strided forwards: longest output rows (pixels, elements) on the lane kernels;
# stride 1: longest rows (elements; the output's for the forward and the filter
# gradient, the input's for the input gradient).
_LANE_ROW = 28
_LANE_ROW_ELEMS = 1 << 13
# Strided forwards: rows up to 64 pixels. Intel Emerald Rapids (2 threads,
# 6 December, alternating processes, lanes / row kernels, medians of 5, ms):
# 112x112x96 stride 2 (rows of 56 pixels) N=32 3.73 / 8.44 (noisy: 3.57-8.40 /
# 5.19-10.4; 4.48 / 5.54 in another run), N=16 2.16 / 2.02, N=8 1.03 / 1.10,
# N=4 0.47 / 0.49, N=1 0.133 / 0.134.
_LANE_STRIDED_ROW = 64
_LANE_RUN_ELEMS = 1 << 14


def _lanes_fit(plan):
    """Whether the lane kernels are built for ``plan``: channels-last, 1-D or 2-D,
    depth multiplier 1, a window of ``lanes.WINDOWS``, a multiple of 8 channels,
    float32 sums."""
    return (plan.channels_last and _flat(plan) and plan.kernel[1:] in lanes.WINDOWS
            and plan.channels % 8 == 0 and dtypes.accumulator(plan.dtype) == _F32)


def _lanes_filter_gradient(plan):
    """Whether a channels-last filter gradient runs on the lane kernels: where
    :func:`_by_lanes` sends the forward, and strided rows up to ``_LANE_RUN_ELEMS``
    elements (2 threads, N=8, lanes / row kernels, min of 3 interleaved rounds:
    112x112x96 stride 2 1.21 / 1.36 ms; 56x56x144 stride 2 0.45 / 0.52; N=32 1.78
    / 1.99; 56x56x72 5x5 stride 2 0.35 / 0.79), where the strided forward stays on
    the row kernels."""
    if _by_lanes(plan, False):
        return True
    return _lanes_fit(plan) and plan.out_sizes[2] * plan.channels <= _LANE_RUN_ELEMS


def _by_lanes(plan, adjoint):
    """Whether a channels-last forward or filter gradient (input gradient:
    ``adjoint``) runs on the lane kernels (:mod:`.lanes`): 1-D and 2-D, depth
    multiplier 1, the windows of ``lanes.WINDOWS``, a multiple of 8 channels,
    float32 sums; at stride 1, and for strided input gradients with dilation 1
    and column phases that :func:`.lanes.phases_fit`,
    rows of at most ``_LANE_ROW`` pixels or ``_LANE_RUN_ELEMS`` elements (at
    stride 1 also longer rows, when the operands fit :func:`_cached`, are
    16-bit (the row kernels write a 16-bit result as float32, rounded in a
    second pass) or the host's prefetchers keep up, ``simd.KEEPS_UP``);
    strided forwards rows of at most ``_LANE_STRIDED_ROW`` pixels and
    ``_LANE_ROW_ELEMS`` elements.

    2 threads, N=8, float32 NHWC, lanes / row kernels, min of 3 interleaved
    rounds (``_by_lanes`` forced either way). Forward: 56x56x144 0.74-0.83 /
    1.0-1.1 ms; 28x28x240 5x5 0.50-0.57 / 1.29-1.43; 19x19x728 0.42-0.47 /
    0.66-0.75; 56x56x96 7x7 1.6-1.8 / 5.2-5.7; 112x112x32 0.58-0.71 / 1.10-1.17;
    14x14x384 7x7 0.55-0.62 / 1.0; 56x56x72 5x5 stride 2 0.33-0.38 / 0.47-0.51.
    Filter gradient: 56x56x144 0.74 / 1.80; 28x28x240 5x5 0.77 / 1.72;
    19x19x728 0.58 / 0.98; 56x56x96 7x7 1.85 / 5.87; 112x112x32 0.75 / 2.18.
    Long stride-1 rows (in chunks of pixels), lanes / row kernels, forward /
    input gradient / filter gradient: N=1 147x147x128 (rows of 18816 elements)
    0.75-0.77 / 0.75-0.81, 0.61-0.71 / 0.74-0.75, 0.72-0.73 / 1.32; 56x56x576
    0.48 / 0.52-0.55, 0.46-0.48 / 0.49-0.55, 0.48-0.49 / 0.90-0.95; 1-D 1024x512
    5-tap 0.24-0.25 / 0.28-0.29, 0.24-0.25 / 0.26-0.27, 0.20-0.23 / 0.32-0.33,
    and N=8 (32 MB) 0.80-0.85 / 0.94-1.02, 0.80-0.96 / 0.86-0.87, 0.70-0.73 /
    1.09. From memory the row kernels keep them (not where ``simd.KEEPS_UP``,
    ``_LANE_CACHED_BYTES``): N=8 147x147x128 (177 MB) 10.4-11.6
    / 8.0-8.4, 10.8-10.9 / 8.2-8.8, 12.2-12.7 / 11.4-11.5; 56x56x576 (57 MB)
    7.6 / 5.5-5.8. The strided 112x112x96 forward stayed too on an earlier
    host (1.10-1.19 / 0.88-0.90); no longer (``_LANE_STRIDED_ROW``). float64 stays
    there too, which spares CI the compilations. Short rows of many channels
    (the depth multipliers' repeated inputs), forward / input gradient, lanes /
    row kernels: 19x19x1456 0.82 / 1.40, 0.86 / 1.40; 19x19x2912 1.85 / 3.25,
    1.92 / 3.32; 28x28x768 1.09 / 1.51, 1.17 / 1.64; 14x14x2304 0.74 / 1.27,
    0.78 / 1.38 (56x56x576 stays: 15.8 / 5.1). Strided input gradients (stride
    2, by phases), lanes / row kernels, same rounds: 112x112x96 N=8 1.61 / 2.48;
    56x56x144 0.61 / 0.85; 56x56x72 5x5 0.35 / 0.84; N=32 14.0 / 15.9, 2.23 /
    3.92, 1.48 / 3.63."""
    if not _lanes_fit(plan):
        return False
    row = plan.in_sizes[2] if adjoint else plan.out_sizes[2]
    if plan.strides[1:] == (1, 1):
        return (row <= _LANE_ROW or row * plan.channels <= _LANE_RUN_ELEMS
                or _cached(plan) or plan.dtype.itemsize == 2 or simd.KEEPS_UP)
    if adjoint:
        return ((row <= _LANE_ROW or row * plan.channels <= _LANE_RUN_ELEMS)
                and plan.dilations[1:] == (1, 1)
                and lanes.phases_fit(plan.kernel[2], plan.strides[2]))
    return row <= _LANE_STRIDED_ROW and row * plan.channels <= _LANE_ROW_ELEMS


_PARTIAL_WORK, _MORE_PARTIAL_WORK = 8, 32

# Stride-1 rows longer than _LANE_RUN_ELEMS elements run on the lane kernels (in
# chunks of pixels, lanes._LONG_ROW) when the input and output together take at
# most this many bytes: from the caches, the lanes are faster, from memory, the
# row kernels, which read each row in one pass. Where the prefetchers keep up
# (``simd.KEEPS_UP``) the lanes were faster from memory too (Emerald Rapids, 2
# threads, 6 December, alternating processes, medians of 3, row kernels /
# lanes, ms): 147x147x128 N=8 (177 MB) forward 10.6 / 9.8, input gradient
# 11.1 / 8.6, filter gradient 16.8 / 9.6; N=32 (708 MB) 38.2 / 30.2, 39.5 /
# 30.9, 52.5 / 43.2; the depth multiplier's repeated inputs, 56x56x144 M=4 N=8
# (56x56x576, 116 MB) 3.84 / 2.69, 11.2 / 9.0, 7.5 / 6.4, N=32 21.5 / 19.4,
# 41.0 / 41.6, 33.4 / 31.0; M=2 N=8 even.
_LANE_CACHED_BYTES = 32 << 20


def _cached(plan):
    """Whether ``plan``'s input and output take at most ``_LANE_CACHED_BYTES``."""
    elems = math.prod(plan.input_shape) + math.prod(plan.output_shape)
    return elems * plan.dtype.itemsize <= _LANE_CACHED_BYTES


def _tile_params(plan):
    return (plan.strides[1], plan.strides[2], plan.dilations[1], plan.dilations[2],
            plan.pads[1], plan.pads[2], _TILE_BAND)


def _correlate_params(plan, adjoint):
    return _tile_params(plan) + (adjoint,)


def _plane_shape(plan, sizes):
    """The plane and tile kernels' (N, C, H, W) view of a canonical array of spatial
    ``sizes``, or (N, H, W, C) when channels-last."""
    if plan.channels_last:
        return (plan.batch, sizes[1], sizes[2], plan.channels)
    return (plan.batch, plan.channels, sizes[1], sizes[2])


def _plane_params(plan):
    return (plan.strides[1], plan.strides[2], plan.dilations[1], plan.dilations[2],
            plan.pads[1], plan.pads[2])


# -- routing: which kernel computes a plan's primitive, decided once per plan

class _Launch:
    """A primitive as the routing chose to compute it: the kernel, the shapes the
    operands are viewed with (in the kernel's argument order) and its scalar
    arguments.

    Decided once per plan and kept on it (:func:`_route`): re-deciding took
    several microseconds of a small call's budget. ``raw16``: the kernel reads
    16-bit data operands as bit patterns (:func:`halves.value`), so they need no
    widened copy; ``writes16``: it also writes a 16-bit result's bit patterns,
    rounded as it stores them (each result element is stored once, never read
    back), so it needs no float32 sums to round afterwards; ``stream``: the same
    kernel writing with non-temporal stores, run instead of ``kern`` when the
    result array is 64-byte aligned (:func:`_streaming`), or None; it takes
    ``stream_params`` (by default ``params``): the plane kernels stream by a flag
    among their arguments. ``mixes16`` (with ``raw16``): the kernel also reads
    16-bit bit patterns beside float32 operands or results (a separable
    convolution's float32 intermediates); where False, such calls widen the 16-bit
    data first (:func:`_run_correlation`)."""

    __slots__ = ("kern", "shapes", "params", "raw16", "writes16", "stream", "stream_params",
                 "mixes16")

    def __init__(self, kern, shapes, params, raw16=False, writes16=False, stream=None,
                 stream_params=None, mixes16=True):
        self.kern, self.shapes, self.params, self.raw16 = kern, shapes, params, raw16
        self.writes16, self.stream, self.mixes16 = writes16, stream, mixes16
        self.stream_params = params if stream_params is None else stream_params


# Results larger than this (bytes) are written with non-temporal stores by the
# lane kernels: they would not stay in the caches, and a plain store reads each
# line before writing it. Intel Xeon, 2 threads, 64-byte-aligned arrays, plain /
# non-temporal, forward and input gradient: 32x56x56x144 3.9-4.0 / 2.5-2.6 ms
# (58 MB results), 32x112x112x32 3.3 / 2.8 (51 MB); smaller results were slower
# written so: 32x28x28x192 (19 MB) 0.88-0.93 / 1.06-1.10, 8x112x112x32 (13 MB)
# 0.64-0.69 / 0.71-0.75, 8x56x56x144 (14 MB) even. On AMD Zen 4 (``simd.ZEN``)
# results from 8 MB gain, NHWC, the two alternating in one process, medians of
# 9 rounds, forward / input gradient, 32 MB -> 8 MB limit (ms): 8x56x56x144
# (14 MB) 1.31 -> 0.95 / 1.36 -> 0.79; 8x112x112x32 (13 MB) 0.95 -> 0.66 / 1.02
# -> 0.69; 32x28x28x192 (19 MB) 2.16 -> 1.48 / 2.19 -> 1.35; 16x56x56x144 (29
# MB) 4.03 -> 3.39 / 3.77 -> 2.79; 32x14x14x384 (10 MB) 0.58 -> 0.52 / 0.66 ->
# 0.51; 8x56x56x96 7x7 (10 MB, 1 MB limit) 1.94 -> 1.75 / 2.14 -> 1.84; the
# strided 8x56x56x144 input gradient (14 MB) 1.00 -> 0.66. Smaller results lose
# (1 MB limit): 32x7x7x960 (6 MB) 0.28 -> 0.31 / 0.29 -> 0.32, 8x28x28x192 (5
# MB) 0.23 -> 0.26, 4x112x112x32 (6 MB) forward 0.31 -> 0.32; 8x19x19x728 (8
# MB) even. On Intel's Emerald Rapids too (``simd.HOST``; a VM reporting a 300
# MB L3), 32 MB -> 8 MB, public API, NHWC, alternating in one process, medians
# of 9 rounds (ms): 8x112x112x32 (13 MB) forward 0.652 -> 0.494, input gradient
# 0.645 -> 0.515; 8x56x56x144 0.718 -> 0.609, 0.710 -> 0.623; 32x28x28x192 (19
# MB) 1.044 -> 0.888, 1.028 -> 0.912; 32x14x14x384 (10 MB) 0.554 -> 0.480,
# 0.549 -> 0.490; 32x14x14x576 forward 0.848 -> 0.745; strided 8x56x56x144
# input gradient 0.560 -> 0.439, 32x56x56x144 forward 1.498 -> 1.277;
# 8x56x56x144 M=2 forward 1.194 -> 1.024. Slower: 8x56x56x96 7x7 forward and
# input gradient 1.270 -> 1.320 and 1.359 -> 1.407 (4 % in each of three
# runs), 8x19x19x728 M=2 forward 0.735 -> 0.798. A 4 MB or 2 MB limit gained
# more on some smaller results (8x28x28x192, 5 MB: 0.281 -> 0.235; 8x14x14x576,
# 4 MB, 2 MB limit: 0.201 -> 0.171) and lost on others (32x7x7x960, 6 MB: 0.327
# -> 0.340).
#
# AMD Zen 3 (a 2-core KVM guest, AVX2, 32 MB L3) lost with non-temporal stores at
# every size measured, so it never streams there. 2 threads, NHWC float32, the
# public API, streaming / plain, medians of 9 alternating rounds in one process
# (ms): N=1 147x147x128 forward 4.48 / 3.68, input gradient 4.40 / 3.87; N=8
# 56x56x144 forward 5.70 / 4.50; N=32 56x56x144 forward 20.6 / 17.6, 112x112x32
# input gradient 15.6 / 10.6; N=4 147x147x128 forward 9.99 / 9.76.
_STREAM_BYTES = (1 << 62 if simd.HOST == "znver3"
                 else (8 if simd.ZEN or simd.HOST == "emeraldrapids" else 32) << 20)
# The strided input gradient (lane kernels' phases) on Zen streams results from
# twice that: below, plain stores into lines the L3 kept from the call before
# were faster. 2 threads, medians of 8 alternating processes, plain /
# non-temporal (ms): 3x3 stride 2, 2x112x112x96 (10 MB) 0.26 / 0.37, 8x56x56x144
# (14 MB) 0.44 / 0.56, 10x56x56x144 (18 MB) 0.83 / 0.71, 12x56x56x144 (22 MB)
# 1.13 / 0.84; with one tap per pixel, 8x56x56x144 0.32 / 0.55. The stride-1
# kernels still gained at 10-14 MB in the same runs: 32x14x14x384 forward 0.54
# / 0.46, input gradient 0.52 / 0.46; 8x112x112x32 0.72 / 0.56 and 0.75 / 0.56.
_STRIDED_STREAM_SCALE = 2 if simd.ZEN else 1

# Results whose pixels end in a group of 8 channels (a multiple of 8 but not of
# simd.WIDE): on Zen 4 (``simd.ZEN``, whose 16-lane stores are two 8-lane ones
# inside) the forward and the stride-1 input gradient stream them too, each
# vector stored as two halves (the kernels' ``stream`` 2), which only need an
# alignment of 8 lanes. 2 threads, NHWC, the two in one process on the same
# arrays (plain / halves, by ``_STREAM_BYTES``), alternating, 3 rounds of
# fresh arrays, medians, one or two runs (ms): N=32 56x56x72 5x5 forward 3.92 /
# 3.38 and 3.88 / 3.50, input gradient 4.52 / 3.85 and 4.71 / 3.73; N=32
# 19x19x728 forward 4.01 / 3.08, input gradient 3.67 / 2.74; N=32 28x28x120 5x5
# forward 1.47 / 1.38 and 1.41 / 1.44, input gradient 1.79 / 1.67 and 1.94 /
# 1.64; N=16 56x56x72 5x5 forward 1.69 / 1.54 and 1.63 / 1.73, input gradient
# 2.02 / 1.83 and 1.94 / 1.76. The strided input gradient lost
# (N=32 56x56x72 5x5 stride 2: 4.02 / 4.35; N=16 1.20 / 2.00): its phases write
# a pixel's channels, and the halves of the lines two pixels share, at
# different times; it streams whole rows from a scratch row instead (lanes).
# On Intel's Emerald Rapids halves lost (limit 8 MB, the two
# alternating in one process, medians of 9 rounds, plain / halves, ms): N=32
# 28x28x120 5x5 forward 0.930 / 1.648, input gradient 0.965 / 1.557; N=8
# 19x19x728 0.402 / 0.658 and 0.402 / 0.655; N=32 1.57 / 2.52.
_HALVES = {"forward", "backprop_input"}
# ... and only for results above this: in halves, a pixel's stores are not two
# rows at a time (lanes' ``_PAIR_ROWS``), and a result this small stays in the L3
# with its operand under plain stores. Zen 4, 2 threads, NHWC, alternating
# processes each with its own cache, medians of 4 minima, halves from 8 MB /
# from 16 MB (ms): 19x19x728 forward N=8 (8.4 MB) 0.347 / 0.258, input
# gradient 0.351 / 0.261, N=10 (10.5 MB) 0.441 / 0.385; N=12 (12.6 MB) 0.540 /
# 0.568, N=32 28x28x120 5x5 (12 MB) forward 1.05 / 1.18, input gradient 1.07 /
# 1.19; N=24 28x28x120 5x5 (9 MB) 0.773 / 0.679.
_HALVES_BYTES = 10 << 20


def _streaming(plan, name, res_shape, channels):
    """The lane kernel ``name`` (of ``plan``'s window and multiplier) that writes
    its result with non-temporal stores, or None: for float32 results of
    ``res_shape`` larger than ``_STREAM_BYTES`` (the strided input gradient:
    ``_STRIDED_STREAM_SCALE`` times that), with whole vectors of
    ``channels`` per pixel (a multiple of ``simd.WIDE``, so that every vector
    stored starts on a vector boundary), or, on Zen 4, a multiple of 8: the
    kernels of ``_HALVES`` store each vector in halves (results above
    ``_HALVES_BYTES`` too), and the strided input gradient, where its rows are
    whole 64-byte lines, streams each row from a scratch row it was assembled
    in (measured on Zen 4 only). It runs when the result's array is 64-byte
    aligned (:func:`_kernel_for`)."""
    limit = _STREAM_BYTES * (_STRIDED_STREAM_SCALE if name == "backprop_input_strided" else 1)
    if not (simd.STREAMS and plan.dtype == _F32 and channels % 8 == 0
            and math.prod(res_shape) * _F32.itemsize > limit):
        return None
    stream = 1 if channels % simd.WIDE == 0 else 2
    staged = name == "backprop_input_strided" and res_shape[3] * channels % 16 == 0
    halves = name in _HALVES and math.prod(res_shape) * _F32.itemsize > _HALVES_BYTES
    if stream == 2 and not (simd.ZEN and (halves or staged)):
        return None
    k = plan.kernel
    return getattr(lanes.kernels(k[1], k[2], stream=stream, multiplier=plan.multiplier), name)


# Results (bytes) from which the plane kernels' forward and strided input
# gradient stream their planes (:func:`_plane_streaming`). 2 threads, NCHW,
# plain / non-temporal (ms): input gradient, stride 2, N=32 56x56x144 (58 MB)
# 5.7-7.6 / 4.3-4.5, N=32 112x112x96 (154 MB) 15.0 / 12.0-12.7, N=12
# 112x112x96 (58 MB) 4.0-4.8 / 3.9-4.2; forward, N=32 112x112x32 (51 MB)
# 6.5-6.6 / 5.8-6.4, 56x56x144 (58 MB) 7.3-7.5 / 6.1-6.5. Below, the result
# stays partly in the cache and streaming lost: input gradient N=10 112x112x96
# (48 MB) 2.8-3.0 / 3.1-3.7, N=8 (39 MB) 1.9-2.0 / 2.5-2.8; forward N=16
# 56x56x144 (29 MB) 2.2-2.6 / 2.4-2.8.
_STREAM_PLANES = 50 << 20
# The same for the input gradient at a column stride of 2 whose rows are whole
# 64-byte lines: its rows go to memory as they are summed (planes.backprop_input).
_STREAM_ROWS = 16 << 20


def _plane_streaming(plan, adjoint):
    """Whether the plane kernel streams its result planes (its ``stream`` flag):
    the forward (:func:`planes.forward`), or (``adjoint``) the input gradient at
    strides above 1 (:func:`planes.backprop_input`), for a result above
    ``_STREAM_PLANES`` bytes whose planes are whole 64-byte lines (so that each
    plane of a 64-byte-aligned result starts on one: :func:`_kernel_for`)."""
    item = plan.dtype.itemsize
    sizes, shape = ((plan.in_sizes, plan.input_shape) if adjoint
                    else (plan.out_sizes, plan.output_shape))
    rows = adjoint and plan.strides[2] == 2 and sizes[2] * item % 64 == 0
    return (simd.STREAMS and (plan.strides[1] * plan.strides[2] > 1 or not adjoint)
            and sizes[1] * sizes[2] * item % 64 == 0
            and math.prod(shape) * item > (_STREAM_ROWS if rows else _STREAM_PLANES))


def _plane_launch(kern, shapes, plan, stream=False):
    """A :class:`_Launch` of the plane correlation ``kern`` (:func:`planes.forward`
    or :func:`planes.backprop_input`); ``stream``: it streams its result planes
    when the result is 64-byte aligned."""
    params = _plane_params(plan)
    return _Launch(kern, shapes, params + (False,), raw16=True, writes16=True,
                   stream=kern if stream else None, stream_params=params + (True,),
                   mixes16=False)


def _kernel_for(launch, buf):
    """(kernel, scalar arguments) that compute ``launch`` into the result ``buf``:
    the streaming kernel where there is one and ``buf`` is 64-byte aligned."""
    if launch.stream is not None and buf.__array_interface__["data"][0] % 64 == 0:
        return launch.stream, launch.stream_params
    return launch.kern, launch.params


def _route(plan, name, decide):
    """``decide(plan)``, computed once per plan. (Tests that patch the routing
    functions patch this to decide afresh.)"""
    return plan._memo(name, decide, plan)


def _correlation(plan, adjoint):
    """How the forward (or, ``adjoint``, the input gradient) of a depth-multiplier-1
    plan runs: a :class:`_Launch` taking (data, filter, result), or None when it
    runs channels-last between transposes."""
    data, res = (plan.out_sizes, plan.in_sizes) if adjoint else (plan.in_sizes, plan.out_sizes)
    if _in_place_correlation(plan, adjoint):
        return _in_place_correlation_launch(plan, adjoint)
    width = _tile_width(plan, adjoint)
    if width or _by_planes(plan):
        taps = (plan.kernel[1], plan.kernel[2], plan.channels)
        shapes = (_plane_shape(plan, data), taps, _plane_shape(plan, res))
        if width:
            return _Launch(tiles.for_plan(plan, width).correlate, shapes,
                           _correlate_params(plan, adjoint), raw16=True, writes16=True)
        return _plane_launch(planes.backprop_input if adjoint else planes.forward, shapes,
                             plan, _plane_streaming(plan, adjoint))
    if _transpose_pays(plan):
        return None
    five = (plan.input_shape5, plan.output_shape5)
    if _by_lanes(plan, adjoint):
        lk = lanes.kernels(plan.kernel[1], plan.kernel[2])
        if adjoint:
            kern = lk.backprop_input if plan.strides[1:] == (1, 1) else \
                lk.backprop_input_strided
            five = five[::-1]
        else:
            kern = lk.forward
        raw16 = _reads_bits(plan)
        return _Launch(kern, (five[0], plan.filter_shape5, five[1]), _params(plan),
                       raw16=raw16, writes16=raw16,
                       stream=_streaming(plan, kern.py_func.__name__, five[1], plan.channels))
    ks = kernels.for_plan(plan)
    if adjoint:
        kern = ks.backprop_input_cl if plan.channels_last else ks.backprop_input_cf
        five = five[::-1]
    else:
        kern = ks.forward_cl if plan.channels_last else ks.forward_cf
    return _Launch(kern, (five[0], plan.filter_shape5, five[1]), _params(plan),
                   raw16=_reads_bits(plan))


# Windows whose channels-last row kernels read 16-bit operands as bit patterns.
_RAW16_WINDOWS = ((1, 3, 3), (1, 5, 5))


def _reads_bits(plan):
    """Whether the channels-last row and lane kernels take ``plan``'s 16-bit data
    operands as bit patterns instead of widened copies (the lane kernels then also
    write 16-bit results directly): 2-D 3x3 and 5x5 windows. 16-bit / float32 time,
    2 threads, 8x56x56x144 3x3 on the lane kernels (float16 / bfloat16): forward
    0.83 / 0.95, input gradient 0.82 / 1.04, filter gradient 0.90 / 0.89 (``python
    -m numbasep bench --full --dtype float32,float16,bfloat16 --layout NHWC --batch
    8 --case /56x56x144/k3s1/N8``); on the row kernels, reading bits but writing
    float32 sums, 1.36-1.49; with widened copies about 1.75. Other windows keep the
    copies: each kernel read that way is compiled again per 16-bit type, which CI
    pays for every window tested."""
    return plan.channels_last and plan.kernel in _RAW16_WINDOWS


def _forward_route(plan):
    return _correlation(plan, False)


def _repeats_in_registers(plan):
    """The multiplier-1 plan of ``plan``'s repeated input when the lane kernels
    repeat its channels in registers instead (stride 1, a multiplier of
    ``simd.REPEATS``, and what the lanes take at multiplier 1), else None."""
    single = _single_plan(plan)
    if (plan.multiplier not in simd.REPEATS or not _lanes_fit(single)
            or plan.strides[1:] != (1, 1)):
        return None
    return single


def _lane_partials(plan, channels):
    """How many partial filters a lane filter gradient sums into, over ``channels``
    output channels: as :func:`kernels.partial_chunks` splits the output rows,
    but up to 4 partials only while each sums at least ``_PARTIAL_WORK`` times
    its own size of products per tap, and more than 4 only while each sums
    ``_MORE_PARTIAL_WORK`` times: zeroing and summing more partials than that
    cost more than it spread (7x7x960 N=8: 64 partials 0.21 ms, 5 0.14 ms).

    With one bound, 8 times, the small maps at N=8 and 32 still had 20 to 64
    partials, and fewer were faster: 2 threads, NHWC, the public API, the two
    rules alternating in one process, medians of 7 rounds, one bound / two (ms):
    14x14x384 N=8 (20 -> 4 partials) 0.159 -> 0.144, N=32 (64 -> 20) 0.567 ->
    0.531; 14x14x576 N=8 0.228 -> 0.205, N=32 0.831 -> 0.793; 28x28x192 N=1 (8
    -> 4) 0.067 -> 0.061, N=8 (64 -> 20) 0.306 -> 0.285; 56x56x144 N=1 (40 ->
    8) 0.097 -> 0.083; 19x19x728 N=8 (40 -> 8) 0.461 -> 0.430; 28x28x240 5x5 N=8
    (28 -> 4) 0.625 -> 0.582, N=32 (64 -> 28) 2.34 -> 2.28; 7x7x960 N=32 (20 ->
    4) 0.375 -> 0.368, float16 0.349 -> 0.325. A bound of 64 gained about as
    much; it would leave fewer partials, the kernel's only parallelism, for
    machines with more threads (which a split of each partial by channels
    would give back: not done).

    The count is then rounded down to a multiple of 4 (3 to 2): the kernel runs a
    task per partial and Numba gives each thread one contiguous run of tasks, so
    5 partials on 2 threads left one thread 3 to sum while the other did 2. Still
    a function of the problem only, so that the sums do not depend on the thread
    count. 2 threads, NHWC, the public API, alternating in one process, medians
    of 11 rounds (ms): 7x7x960 N=8 (5 -> 4) 0.0985 -> 0.0802, N=32 (21 -> 20)
    0.334 -> 0.319; 19x19x728 N=1 (5 -> 4) 0.0656 -> 0.0589; 14x14x672 5x5 N=8
    (7 -> 4) 0.542 -> 0.471, N=32 (31 -> 28) 1.97 -> 1.88; 28x28x240 5x5 N=8 (31
    -> 28) 0.535 -> 0.517; the eleven other suite rows whose count changed within
    5 %, the two slower ones the 3 -> 2 of 28x28x120 and 28x28x240 5x5 at N=1
    (0.058 -> 0.061, 0.079 -> 0.083)."""
    rows = plan.batch * plan.out_sizes[0] * plan.out_sizes[1]
    fsize = max(1, plan.kernel[0] * plan.kernel[1] * plan.kernel[2] * channels)
    work = rows * plan.out_sizes[2] * channels
    count = max(1, min(kernels.partial_chunks(rows, fsize),
                       max(min(4, work // (_PARTIAL_WORK * fsize)),
                           work // (_MORE_PARTIAL_WORK * fsize))))
    return count - count % 4 if count >= 4 else min(count, 2)


def _multiplier_forward_route(plan):
    """How a forward with a depth multiplier above 1 runs on the lane kernels, each
    input vector read once and its channels repeated in registers for their
    output channels (a :class:`_Launch` on the operands as they are), or None:
    then on the multiplier-1 kernels, from the input with its channels repeated
    in memory. Stride 1, multipliers of ``simd.REPEATS``, and what the lanes take
    at multiplier 1 but the row length (the input's rows are M times shorter
    than the output's). 2 threads, N=8, 3x3, repeated in memory / in registers
    (ms): 56x56x144 M=2 3.4 / 1.16, M=4 11.5 / 2.44 (the repeated input alone
    cost 5.9 ms, 4 of them its fresh pages); 19x19x728 M=2 2.1 / 0.71, M=4 6.8 /
    1.79. Channels-first: :func:`_multiplier_plane_route`."""
    if not plan.channels_last:
        return _multiplier_plane_route(plan, "forward")
    single = _repeats_in_registers(plan)
    if single is None:
        return None
    return _multiplier_launch(plan, "forward", plan.input_shape5, plan.output_shape5, single)


def _multiplier_plane_route(plan, op):
    """How a channels-first ``op`` ("forward", "input_gradient" or
    "filter_gradient") with a depth multiplier above 1 runs on the plane kernels
    (a :class:`_Launch` on the operands as they are), or None: where the plane
    kernels do not take the problem with its input repeated. Each input plane
    is copied once for its M output planes (the input gradient: summed from
    them), instead of the input repeated in memory. 2 threads, N=8, 3x3,
    repeated in memory (on the plane or tile kernels) / planes, forward and
    filter gradient (ms): 56x56x144 M=2 5.4, 4.8 / 2.5, 2.4; M=4 17.2, 15.3 /
    6.0, 5.2; 19x19x728 M=2 2.8, 2.7 / 1.6, 1.7; M=4 7.9, 6.3 / 4.1, 4.6; input
    gradient (medians of ``benchmarks/layout_ratio.py``): 56x56x144 M=2 8.4 / 3.8,
    M=4 21.0 / 7.4; 19x19x728 M=2 4.5 / 2.3, M=4 12.3 / 5.3. Where the
    in-place kernels take the problem (:func:`_same_rows`) the forward reads
    each input plane in place for its M output planes instead, and the input
    gradient reads its M planes' taps as one window (:func:`inplace.repeated`),
    each plane's sum apart and the M added in order of m, as elsewhere: 2
    threads, AMD Zen 4, N=8 3x3, planes / in place, medians of 7 rounds
    alternating in one process (ms), forward: 56x56x144 M=2 2.82 / 1.83, M=4
    5.28 / 3.77; 19x19x728 M=2 1.61 / 1.24, M=4 2.96 / 2.44; input gradient:
    56x56x144 M=2 4.04 / 1.97, M=4 7.65 / 3.67; 19x19x728 M=2 2.71 / 2.16, M=4
    4.84 / 4.85 (measured with all M*KH*KW taps in one sum; the planes' sums
    apart add an addition per plane and vector)."""
    single = _single_plan(plan)
    if not _by_planes(single):
        return None
    xs = _plane_shape(plan, plan.in_sizes)
    ys = _plane_shape(single, plan.out_sizes)
    kh, kw, cm = plan.kernel[1], plan.kernel[2], single.channels
    if op == "filter_gradient":
        chunks = kernels.partial_chunks(plan.batch, kh * kw * cm)
        return _Launch(planes.backprop_filter,
                       (xs, ys, (chunks, kh, kw, cm), (chunks,) + plan.filter_shape5),
                       _plane_params(plan), raw16=True, mixes16=False)
    adjoint = op == "input_gradient"
    if _same_rows(single, _IN_PLACE_WINDOW):
        return _in_place_correlation_launch(single, adjoint, plan.multiplier)
    if adjoint:
        return _plane_launch(planes.backprop_input, (ys, (kh, kw, cm), xs), plan)
    return _plane_launch(planes.forward, (xs, (kh, kw, cm), ys), plan)


def _multiplier_launch(plan, name, data, result, result_plan):
    """A :class:`_Launch` of the lane kernel ``name`` for ``plan``'s depth
    multiplier, taking (data, filter, result) of shapes ``data``,
    ``plan.filter_shape5`` and ``result``; ``result_plan``: a plan whose
    channels are the result's (which decide on streaming stores)."""
    k = plan.kernel
    raw16 = _reads_bits(plan)
    return _Launch(getattr(lanes.kernels(k[1], k[2], multiplier=plan.multiplier), name),
                   (data, plan.filter_shape5, result), _params(plan), raw16=raw16,
                   writes16=raw16,
                   stream=_streaming(plan, name, result, result_plan.channels))


# The largest padded pointwise kernel (bytes) the fused separable forward takes:
# each block of pixels reads one block of its columns for every channel, from L1
# or L2. Larger ones (Xception's 728 -> 728, MobileNetV1's 1024 -> 1024) run on
# NumPy's BLAS, whose blocking for the cache pays there (8x19x19 pixels, 728 ->
# 728, 2 threads: 17 ms against 8.8 ms).
_FUSED_PK_BYTES = 64 << 10


def _pointwise_columns(filters, width):
    """(vecs, FP): the vectors of ``width`` lanes of columns
    :func:`.simd.pointwise_rows` takes at once for ``filters`` columns, and the
    columns padded to a multiple of that many vectors (the fewest padded
    columns; of those, the most vectors at once)."""
    n = -(-filters // width)
    vecs = min(range(simd.POINTWISE_VECS, 0, -1), key=lambda v: -(-n // v) * v)
    return vecs, -(-n // vecs) * vecs * width


def _lanes_of(dtype):
    """The lanes of :func:`.simd.pointwise_rows`'s vectors for ``dtype``."""
    return simd.WIDE // 2 if dtype == _F64 else simd.WIDE


def _fused_separable_route(plan):
    """How a separable forward runs fused (the lane kernels' ``separable_forward``:
    a few depthwise rows at a time, then their pointwise sums while they are in
    the cache): a :class:`_Launch` taking (data, filter, padded pointwise kernel,
    result, scratch) and its ``vecs`` last, or None: then the depthwise forward
    into an intermediate and NumPy's GEMM. Where the depthwise forward runs on
    the lane kernels, for pointwise kernels of up to ``_FUSED_PK_BYTES`` padded.
    2 threads, N=8, 56x56x144 -> 24 filters: 2.0-3.1 ms unfused (the depthwise
    0.64 ms, the GEMM 1.0 ms, and the two pools of threads in each other's way).
    Results larger than ``_STREAM_BYTES`` are streamed as the lane kernels'
    (N=8, 147x147x64 -> 128, 88 MB: 17.3-17.8 -> 14.1-16.0 ms)."""
    if not plan.channels_last or plan.multiplier not in simd.REPEATS:
        return None
    launch = (_forward_route(plan) if plan.multiplier == 1
              else _multiplier_forward_route(plan))
    lk = lanes.kernels(plan.kernel[1], plan.kernel[2], multiplier=plan.multiplier)
    if launch is None or launch.kern is not lk.forward:
        return None
    vecs, fp = _pointwise_columns(plan.filters, simd.WIDE)
    if plan.out_channels * fp * _F32.itemsize > _FUSED_PK_BYTES:
        return None
    result = plan.output_shape5[:4] + (plan.filters,)
    return _Launch(lk.separable_forward,
                   (launch.shapes[0], launch.shapes[1], (plan.out_channels, fp), result),
                   launch.params + (vecs,), raw16=launch.raw16,
                   stream=_streaming(plan, "separable_forward", result, plan.filters))


def _by_products(plan):
    """Whether a plan's pointwise steps run on :mod:`.pointwise` (kernels small
    enough for the fused forward's rule, either way round) rather than on NumPy's
    BLAS (channels-first: :func:`.pointwise.planar_products` and
    :func:`.pointwise.planar_kernel_gradient`).

    On 2 cores NumPy's BLAS threads spin on after a product and hold up the
    depthwise kernels' threads for milliseconds: 2 threads, 56x56x144 -> 24
    filters, separable forward, medians of 15 calls, 4 rounds (ms): N=1
    channels-first float16 0.69-4.1, bfloat16 0.74-4.0, and the channels-last
    calls after them 0.29-3.2; with NumPy's BLAS on one thread 0.49-0.51 and
    0.26-0.28 in every round; with the channels-first products on the planar
    kernels, float32 0.37-0.99 and bfloat16 0.49-0.60 (the gradients: README,
    "What a call costs on the CPU")."""
    c, f = plan.out_channels, plan.filters
    size = dtypes.accumulator(plan.dtype).itemsize
    if not plan.channels_last:
        return c * f * size <= _FUSED_PK_BYTES
    return max(c * _pointwise_columns(f, simd.WIDE)[1],
               f * _pointwise_columns(c, simd.WIDE)[1]) * size <= _FUSED_PK_BYTES


def _padded(m, columns):
    """A fresh 64-byte-aligned copy of the matrix ``m`` with its rows padded with
    zeros to ``columns``, so that every row starts aligned."""
    out = aligned.empty((m.shape[0], columns), m.dtype)
    out[:, :m.shape[1]] = m
    out[:, m.shape[1]:] = 0
    return out


# Elements of depthwise output a part of the fused separable forward computes
# before their pointwise sums: whole rows, about 128 KB of float32 (L2).
_FUSED_ROWS_ELEMS = 1 << 15


def _run_fused_separable(launch, plan, x, dk, pk, buf):
    """Launch the fused separable forward into ``buf`` (float32). The pointwise
    kernel is copied (widened) into its padded form before the depthwise kernel
    takes the same scratch slot."""
    xs, ws, (c, fp), ys = launch.shapes
    padded = _padded(_compute(pk, (c, plan.filters), scratch.OPERAND_1), fp)
    row = ys[3] * c
    jobs = ys[0] * ys[2]
    z = scratch.empty(scratch.INTERMEDIATE_0,
                      (min(jobs, numba.get_num_threads()),
                       max(1, _FUSED_ROWS_ELEMS // row) * row), _F32)
    kern, params = _kernel_for(launch, buf)
    _launch(kern, _data(launch, x, xs, scratch.OPERAND_0, _compute),
            _compute(dk, ws, scratch.OPERAND_1), padded, buf.reshape(ys), z, *params)


# Bytes of the separable gradient's intermediates (the depthwise output and its
# gradient, each) that one chunk of the batch computes at a time.
_GRAD_CHUNK_BYTES = 8 << 20


def _gradient_images(plan):
    """Images per chunk of the batch for a separable gradient on
    :func:`.pointwise.gradients` (channels-last, the pointwise kernel small: see
    :func:`_by_products`), or 0 for the base composition on NumPy's BLAS (also
    when there is nothing to sum).

    Chunks keep the intermediates (the depthwise output and its gradient) small
    enough to stay in the cache between the kernels and in this thread's scratch
    (above 32 MB they were fresh pages every call). 2 threads, float32, the
    whole batch at once against chunks: N=8, 147x147x64 -> 128, 66-68 ms against
    51-52 ms an image at a time; N=32: 321 -> 199 ms; N=32, 56x56x144 -> 24:
    43 -> 31 ms in chunks of 4 images. NumPy's GEMM does better on the whole
    batch (N=32, 19x19x728 -> 728: 107-111 ms, in chunks of 4-16 images 119-123
    ms)."""
    if (not plan.channels_last or not _by_products(plan) or plan.filters == 0
            or math.prod(plan.output_shape5) == 0):
        return 0
    image = (math.prod(plan.output_shape5[1:])
             * dtypes.accumulator(plan.dtype).itemsize)
    return min(plan.batch, max(1, _GRAD_CHUNK_BYTES // image))


def _batch_plan(plan, images):
    """``plan`` for ``images`` of its batch."""
    if images == plan.batch:
        return plan

    def make():
        p = plan.clone()
        p.batch = images
        return p
    return plan._memo(("batch", images), make)


def _transposed_kernel(plan, pk):
    """The pointwise kernel transposed, (F, C) with its rows padded for
    :func:`.pointwise.gradients` (a copy of its own), and the ``vecs`` to sum
    them with."""
    c, f = plan.out_channels, plan.filters
    vecs, cols = _pointwise_columns(c, _lanes_of(dtypes.accumulator(plan.dtype)))
    return _padded(_compute(pk, slot=scratch.OPERAND_0).reshape(c, f).T, cols), vecs


def _pointwise_gradients(plan, z, dout, bt, vecs, dz, dpk):
    """Both pointwise gradients on :func:`.pointwise.gradients` (``bt`` and
    ``vecs`` from :func:`_transposed_kernel`): ``dz`` (the depthwise output's)
    and ``dpk`` (the kernel's: the per-part sums added in order of the parts),
    both in the accumulation dtype."""
    c, f = plan.out_channels, plan.filters
    z2 = z.reshape(-1, c)
    d2 = _compute(dout, slot=scratch.OPERAND_1).reshape(-1, f)
    parts = scratch.empty(scratch.PARTIALS, (min(len(z2), pointwise.PARTS), f, c), dz.dtype)
    _launch(pointwise.gradients, d2, bt, z2, dz.reshape(-1, c), parts, vecs)
    dpk.reshape(c, f)[...] = parts.sum(axis=0).T


def _total(plan, acc, out):
    """A kernel gradient summed over the chunks (accumulation dtype), as the
    caller gets it: into ``out``, or in ``plan.dtype``."""
    if out is None and acc.dtype == plan.dtype:
        return acc
    return _finish(plan, acc, out)


def _input_gradient_route(plan):
    return _correlation(plan, True)


def _multiplier_input_route(plan):
    """How an input gradient with a depth multiplier above 1 runs on the lane
    kernels, each row's gradient of the repeated input summed into the result
    from a scratch row (a :class:`_Launch` on the operands as they are), or
    None: then the gradient of the input repeated, M times the input in memory,
    summed afterwards. Stride 1, as :func:`_multiplier_forward_route`, and a
    multiple of 8 input channels (the sums are stored 8 or 16 at a time). 2
    threads, N=8, 3x3, repeated in memory / scratch rows (ms): 56x56x144 M=2
    9.9-10.9 / 2.8-4.4, M=4 22.5-24.0 / 10.4-10.8; 19x19x728 M=2 3.7-4.9 /
    1.39-1.47, M=4 10.2-10.5 / 2.89-2.97. Channels-first:
    :func:`_multiplier_plane_route`."""
    if not plan.channels_last:
        return _multiplier_plane_route(plan, "input_gradient")
    if plan.channels % 8 or _repeats_in_registers(plan) is None:
        return None
    return _multiplier_launch(plan, "backprop_input", plan.output_shape5, plan.input_shape5,
                              plan)


def _same_rows(plan, taps):
    """Whether the in-place kernels (:mod:`.inplace`) can take ``plan``: what the
    plane kernels take, at stride 1, with output rows as long as the input's and
    windows of up to ``taps`` taps."""
    return (_by_planes(plan) and plan.strides[1:] == (1, 1)
            and plan.out_sizes[2] == plan.in_sizes[2] and plan.kernel[1] * plan.kernel[2] <= taps)


def _from_memory(plan, least):
    """Whether ``plan``'s maps have at least ``_IN_PLACE_PIXELS`` pixels and, but
    for 3x3 windows, its input and output at least ``least`` bytes: where the
    in-place kernels beat the tiles, which keep small maps in the caches.

    3x3 windows read in place from 14x14 at any size since their sizes became
    constants in :mod:`.inplace`. 2 threads, Intel Emerald Rapids, NCHW time,
    tiles / in place, medians of 3 rounds alternating with NHWC in one process
    (ms). Forward, input gradient: N=8 28x28x192 0.72 / 0.30, 0.67 / 0.36;
    14x14x384 0.45 / 0.22, 0.44 / 0.22; 14x14x576 0.64 / 0.35, 0.66 / 0.44; N=32
    28x28x192 1.42 / 1.06, 1.48 / 1.05; 14x14x384 1.17 / 1.08, 1.16 / 0.79;
    14x14x576 1.71 / 1.47, 1.73 / 1.68. Filter gradient: N=8 28x28x192 0.57 /
    0.43, 14x14x384 0.39 / 0.37, 14x14x576 0.71 / 0.53, 19x19x728 1.24 / 1.01;
    N=32 14x14x384 1.80 / 1.36, 14x14x576 1.91 / 1.68, 28x28x192 1.30 / 1.60
    (NCHW / NHWC 1.16 / 1.11: the machine slower in that round). 5x5 and 7x7
    windows stay on the tiles there (N=8 28x28x120 5x5 forward 0.67 / 1.00,
    14x14x384 7x7 0.99 / 1.68), and 7x7 maps (under ``_IN_PLACE_PIXELS``) too."""
    pixels = plan.in_sizes[1] * plan.in_sizes[2]
    data = (math.prod(plan.input_shape) + math.prod(plan.output_shape)) * plan.dtype.itemsize
    return pixels >= _IN_PLACE_PIXELS and (data >= least or plan.kernel[1:] == (3, 3))


def _in_place(plan):
    """Whether the channels-first filter gradient reads its planes in place
    (:mod:`.inplace`): :func:`_same_rows` with windows of up to
    ``_IN_PLACE_TAPS`` taps, and where the tiles would take it,
    :func:`_from_memory` from ``_IN_PLACE_BYTES``.

    2 threads, AMD Zen 4, NCHW filter gradient, in place / the kernels before
    (tiles or planes), medians of 7 alternating rounds (ms): N=32 56x56x144
    3.86 / 7.47, 112x112x32 3.20 / 6.22, 19x19x728 3.64 / 5.54, 28x28x192 1.66 /
    1.93, 14x14x576 2.14 / 2.52; N=8 147x147x128 6.5 / 12.2, 56x56x144 1.00 /
    1.78 (float16 0.70 / 1.11, bfloat16 0.74 / 1.14), 112x112x32 0.79 / 1.31,
    1-D 1024x512 3 taps 0.56 / 1.27, 5 taps 0.79 / 1.40; N=1 147x147x128 0.72 /
    1.33, 56x56x144 0.145 / 0.156, 112x112x32 0.111 / 0.137. The tiles keep small
    maps in the caches (3x3 windows until they took constants, :func:`_from_memory`;
    N=8 14x14x576 0.57 / 0.41, 28x28x192 0.37 / 0.34, 19x19x728
    0.91 / 0.71, N=32 7x7x960 1.72 / 0.78, 14x14x384 1.37 / 1.29), and the planes
    5x5 and 7x7 windows (N=8 56x56x96 7x7 3.42 / 3.21, 14x14x672 5x5 1.38 /
    0.62): a tap's unaligned loads, one per multiply-add, cost more than the
    copies they spare there."""
    if not _same_rows(plan, _IN_PLACE_TAPS):
        return False
    return not _tile_width(plan) or _from_memory(plan, _IN_PLACE_BYTES)


_IN_PLACE_TAPS = 9
_IN_PLACE_PIXELS = 196
_IN_PLACE_BYTES = 24 << 20


def _in_place_correlation(plan, adjoint):
    """Whether the channels-first forward (or, ``adjoint``, the input gradient)
    reads its planes in place (:func:`inplace.correlate`): :func:`_same_rows`
    with windows of up to ``_IN_PLACE_WINDOW`` taps, and where the tiles would
    take it, :func:`_from_memory` from ``_IN_PLACE_CORRELATION_BYTES``.

    Unlike the filter gradient's, each of its multiply-adds loads one operand
    (the tap's weight stays in a register), and it beats the planes on every
    window. 2 threads, AMD Zen 4, NCHW float32, in place / the kernels before,
    forward then input gradient, medians of 7 rounds alternating in one process
    (ms). On the planes: N=32 56x56x144 3.65 / 7.75, 3.58 / 7.41; 112x112x32
    3.19 / 6.33, 3.23 / 6.70; 28x28x192 1.35 / 1.83, 1.36 / 2.00; N=8 56x56x144
    1.50 / 2.30, 0.95 / 1.82 (float16 0.75 / 1.14, 1.00 / 1.45; bfloat16 0.89 /
    1.19, 0.88 / 1.25; float64 1.85 / 3.49, 1.87 / 3.57); 147x147x128 5.68 /
    11.29, 5.85 / 11.63; 56x56x96 7x7 2.81 / 3.00, 2.84 / 3.27; N=1 56x56x144
    0.131 / 0.146, 0.127 / 0.155. Where the tiles take it, from memory: N=32
    19x19x728 2.56 / 4.87, 2.53 / 4.92; 14x14x576 1.65 / 2.55, 1.26 / 2.42;
    14x14x384 0.76 / 0.93, 0.82 / 0.88; 14x14x672 5x5 3.03 / 3.36, 3.20 / 3.49;
    28x28x240 5x5 3.81 / 4.38; N=8 19x19x728 (17 MB) 0.61 / 0.66, 0.61 / 0.72.
    In the caches the tiles stayed faster (3x3 windows until they took
    constants, :func:`_from_memory`): N=8 28x28x192 (10 MB) 0.33 / 0.29,
    14x14x576 0.54 / 0.52, 28x28x240 5x5 (12 MB) 0.98 / 0.73, 14x14x672 5x5
    0.74 / 0.54; N=32 7x7x960 0.72 / 0.48."""
    if not _same_rows(plan, _IN_PLACE_WINDOW):
        return False
    return not _tile_width(plan, adjoint) or _from_memory(plan, _IN_PLACE_CORRELATION_BYTES)


_IN_PLACE_WINDOW = 49
_IN_PLACE_CORRELATION_BYTES = 16 << 20


def _in_place_correlation_launch(plan, adjoint, multiplier=1):
    """The :class:`_Launch` of :func:`inplace.correlate` for ``plan``, of depth
    multiplier 1: that of the same problem with ``multiplier`` when given (its
    input planes each read for that many channels of ``plan``,
    :func:`_multiplier_plane_route`)."""
    kh, kw = plan.kernel[1], plan.kernel[2]
    itemsize = dtypes.accumulator(plan.dtype).itemsize
    data, res = (plan.out_sizes, plan.in_sizes) if adjoint else (plan.in_sizes, plan.out_sizes)
    data, res = _plane_shape(plan, data), _plane_shape(plan, res)
    if _row_blocks(plan, adjoint and multiplier > 1, itemsize):
        if multiplier > 1:
            data = data[:1] + (data[1] // multiplier,) + data[2:]
        masks = inplace.row_masks(plan.in_sizes[2], kw, plan.dilations[2], plan.pads[1],
                                  plan.pads[2], itemsize, adjoint)
        return _Launch(inplace.rows(kh, kw, adjoint), (data, (kh, kw, plan.channels), res),
                       masks, raw16=True, writes16=True, mixes16=False)
    make = inplace.adjoint_masks if adjoint else inplace.masks
    bits, toffs, v0, v1 = make(plan.in_sizes[1], plan.in_sizes[2], plan.out_sizes[1],
                               plan.out_sizes[2], kh, kw, plan.dilations[1], plan.dilations[2],
                               plan.pads[1], plan.pads[2], itemsize)
    if multiplier > 1 and adjoint:
        res = res[:1] + (res[1] // multiplier,) + res[2:]
        bits, toffs = inplace.repeated(bits, toffs, kw, multiplier, data[2] * data[3])
    elif multiplier > 1:
        data = data[:1] + (data[1] // multiplier,) + data[2:]
    return _Launch(inplace.correlate, (data, (kh, kw, plan.channels), res),
                   (bits, toffs, v0, v1), raw16=True, writes16=True, mixes16=False)


def _row_blocks(plan, repeated, itemsize):
    """Whether the in-place correlation of ``plan`` takes its output rows in
    blocks (:func:`inplace.rows`), not as one run of pixels
    (:func:`inplace.correlate`): windows of :data:`inplace.ROW_WINDOWS` of
    dilation 1 in rows, not an input gradient's ``repeated`` planes, on rows of
    at least ``_ROW_VECTORS`` vectors filled to ``_ROW_FILL`` (a row's last
    vector is masked where the runs of pixels waste no lane).

    Each input row's vector then serves the window's height of output rows,
    loaded once per column tap, where the runs load one per tap and output
    vector. AMD Zen 4, NCHW float32, blocks / runs, 2 threads, the public API
    in two copies of the package alternating in one process (median ratio of
    80 rounds): 7x7 56x56x96 forward N=1 0.55, N=8 0.64, N=32 0.70, input
    gradient 0.70, 0.95, 0.97; 5x5 forward 1x112x112x32 0.54, 8x56x56x72
    0.69. 1 thread, the kernels alone, one plane after another (medians of
    200 calls alternating): 147x147x32 5x5 0.54, 7x7 0.61; rows of two vectors
    gained little or lost (28x28x64 7x7 0.94, 28x28x240 5x5 1.03-1.18), and
    3x3 windows too (112x112x32 0.74-0.82, 56x56x144 0.91-1.22, 28x28x192
    1.23-1.36, 147x147x64 1.05-2.0)."""
    lanes = simd.plane_lanes.py_func(itemsize)
    width = plan.in_sizes[2]
    vectors = -(-width // lanes)
    return ((plan.kernel[1], plan.kernel[2]) in inplace.ROW_WINDOWS and plan.dilations[1] == 1
            and not repeated and vectors >= _ROW_VECTORS and width >= _ROW_FILL * vectors * lanes)


_ROW_VECTORS = 3
_ROW_FILL = 0.85


# The tile filter gradient's jobs are (partial filter, block of channels) pairs:
# it gets as few partials as leave it at least this many jobs (1 from 16 blocks).
_TILE_FILTER_JOBS = 16


def _blocked_partials(plan, blocks):
    """How many partial filters a channels-first filter gradient whose jobs are
    (partial, block of channels) pairs sums into: ``blocks`` blocks of channels
    (None: the kernel sizes its blocks to make enough jobs, as the in-place
    kernel does, :func:`inplace.block`), so one partial, or as few as leave
    ``_TILE_FILTER_JOBS`` jobs. A function of the problem only.

    One partial per image (up to 64) cost more in zeroing, storing and summing
    the partials than it spread; with one there is no sum to run at all. 2
    threads, NCHW, public API, alternating in one process, medians of 7 rounds,
    a partial per image / one (ms): in place, 14x14x384 N=8 0.207 -> 0.163,
    N=32 0.695 -> 0.552; 14x14x576 N=8 0.281 -> 0.216, N=32 1.010 -> 0.792;
    19x19x728 N=8 0.522 -> 0.438, N=32 1.955 -> 1.652; 28x28x192 N=32 1.024
    -> 0.914 (4 partials: 0.876; N=8 even); tiles, 7x7x960 N=8 0.179 -> 0.137,
    N=32 0.704 -> 0.573; 7x7x1152 5x5 N=8 0.395 -> 0.303, N=32 1.548 -> 1.220;
    14x14x672 5x5 N=8 0.808 -> 0.701, N=32 3.03 -> 2.69; 14x14x384 7x7 N=32
    3.42 -> 3.12; 28x28x240 5x5 (4 blocks) one partial 2-4 % slower, four
    even."""
    if blocks is None:
        return 1
    chunks = kernels.partial_chunks(plan.batch, plan.kernel[1] * plan.kernel[2] * plan.channels)
    return max(1, min(chunks, _TILE_FILTER_JOBS // blocks))


def _in_place_filter_gradient(plan):
    """The :class:`_Launch` of :func:`inplace.backprop_filter` for ``plan``."""
    kh, kw, c = plan.kernel[1], plan.kernel[2], plan.channels
    chunks = _blocked_partials(plan, None)
    masks = inplace.masks(plan.in_sizes[1], plan.in_sizes[2], plan.out_sizes[1],
                          plan.out_sizes[2], kh, kw, plan.dilations[1], plan.dilations[2],
                          plan.pads[1], plan.pads[2], dtypes.accumulator(plan.dtype).itemsize)
    return _Launch(inplace.backprop_filter,
                   (_plane_shape(plan, plan.in_sizes), _plane_shape(plan, plan.out_sizes),
                    (chunks, kh, kw, c), (chunks, 1, kh, kw, c, 1)),
                   masks + (inplace.block(chunks, c),), raw16=True, mixes16=False)


def _filter_gradient_route(plan):
    """How the filter gradient of a depth-multiplier-1 plan runs: a
    :class:`_Launch` taking (x, dy, partial sums) whose shapes are followed by the
    partial sums' view for :func:`kernels.sum_partials`, or None when it runs
    channels-last."""
    if _transpose_pays(plan):
        return None
    if _in_place(plan):
        return _in_place_filter_gradient(plan)
    width = _filter_tile_width(plan)
    if width or _by_planes(plan):
        kh, kw, c = plan.kernel[1], plan.kernel[2], plan.channels
        # (narrow tiles: larger maps, fewer and longer jobs, which balance over the
        # threads only with a partial per image: 56x56x144 stride 2 N=8, 9 jobs
        # of one partial, 0.737 -> 0.792 ms)
        chunks = (_blocked_partials(plan, -(-c // width)) if width == tiles.WIDE
                  else kernels.partial_chunks(plan.batch, kh * kw * c))
        if width:
            kern, params = tiles.for_plan(plan, width).backprop_filter, _tile_params(plan)
        else:
            kern, params = planes.backprop_filter, _plane_params(plan)
        return _Launch(kern, (_plane_shape(plan, plan.in_sizes),
                              _plane_shape(plan, plan.out_sizes),
                              (chunks, kh, kw, c), (chunks, 1, kh, kw, c, 1)), params,
                       raw16=not (width and plan.channels_last), mixes16=bool(width))
    ks = kernels.for_plan(plan)
    fsize = plan.kernel[0] * plan.kernel[1] * plan.kernel[2] * plan.channels * plan.multiplier
    if not plan.channels_last:
        kern, chunks = ks.backprop_filter_cf, kernels.partial_chunks(plan.batch, fsize)
    elif _lanes_filter_gradient(plan):
        kern = lanes.kernels(plan.kernel[1], plan.kernel[2]).backprop_filter
        chunks = _lane_partials(plan, plan.channels)
    else:
        rows = plan.batch * plan.out_sizes[0] * plan.out_sizes[1]
        kern, chunks = ks.backprop_filter_cl, kernels.partial_chunks(rows, fsize)
    parts = (chunks,) + plan.filter_shape5
    return _Launch(kern, (plan.input_shape5, plan.output_shape5, parts, parts), _params(plan),
                   raw16=_reads_bits(plan))


def _multiplier_filter_route(plan):
    """How a filter gradient with a depth multiplier above 1 runs on the lane
    kernels, reading the input as it is (as :func:`_multiplier_forward_route`),
    or None: then from the input repeated in memory. Partial filters as the
    multiplier-1 lanes split them. 2 threads, N=8, 3x3, repeated in memory / in
    registers (ms): 56x56x144 M=2 5.1 / 1.18, M=4 13.3 / 4.2; 19x19x728 M=2 1.47 /
    0.76, M=4 6.3 / 1.41. Channels-first: :func:`_multiplier_plane_route`."""
    if not plan.channels_last:
        return _multiplier_plane_route(plan, "filter_gradient")
    single = _repeats_in_registers(plan)
    if single is None:
        return None
    parts = (_lane_partials(plan, single.channels),) + plan.filter_shape5
    kern = lanes.kernels(plan.kernel[1], plan.kernel[2], multiplier=plan.multiplier)
    return _Launch(kern.backprop_filter, (plan.input_shape5, plan.output_shape5, parts, parts),
                   _params(plan), raw16=_reads_bits(plan))


def _result16(plan, shape, out):
    """For a kernel that writes 16-bit results itself: (the array to return, the bit
    patterns the kernel writes into it), or None (then float32 sums are rounded
    afterwards): a 16-bit ``plan``, and ``out`` None or C-contiguous of its dtype
    (never one sharing memory with an argument: the operators refuse those)."""
    if plan.dtype.itemsize != 2:
        return None
    if out is None:
        final = aligned.empty(shape, plan.dtype)
    elif out.dtype == plan.dtype and out.flags.c_contiguous:
        final = out
    else:
        return None
    bits = halves.bits(final)
    return None if bits is None else (final, bits)


def _correlate(launch, plan, data, w, shape, out, wide):
    """Run a forward or input-gradient :class:`_Launch`: a result of ``shape``."""
    direct = (launch.writes16 and not wide and (launch.mixes16 or data.dtype.itemsize == 2)
              and _result16(plan, shape, out))
    if direct:
        final, bits = direct
        if not _nothing_to_do(bits, data, w):
            _run_correlation(launch, data, w, bits)
        return final
    buf, final = _result(plan, shape, out, wide)
    if not _nothing_to_do(buf, data, w):
        _run_correlation(launch, data, w, buf)
    return _finish(plan, buf, final)


def _data(launch, a, shape, slot, operand, bits=True):
    """A data operand (not the filter) for ``launch``'s kernel: its 16-bit bit
    patterns when the kernel reads those (and ``bits``), else ``operand(a, shape,
    slot)``."""
    if bits and launch.raw16 and operand is _compute and a.dtype.itemsize == 2:
        raw = halves.bits(aligned.contiguous(a))
        if raw is not None:
            return _read_only(raw, shape)
    return operand(a, shape, slot)


def _run_correlation(launch, data, w, buf, operand=_compute):
    """Launch a correlation into ``buf``; ``operand`` views (and where needed
    converts) the two inputs for the kernel.

    The plane kernels (``mixes16`` False) read 16-bit data as bit patterns only
    when they write 16-bit results too (and the filter gradient only when both
    its data operands are 16-bit, :func:`_run_filter_gradient`): with float32
    sums to write (``wide``, a separable convolution's intermediates) their
    16-bit data is widened first, and float32 data gives float32 sums, rounded
    afterwards. Each mix of 16-bit and float32 operands would be another
    compilation of a plane kernel, about 50 s for the input gradient's (the
    mixes took 290 s of CI's compile time); the widening costs a pass over the
    data, on 16-bit channels-first separable convolutions only (2 threads,
    56x56x144 3x3 with 24 filters, medians of 9, before / after, ms: bfloat16
    N=8 gradient 23.7 / 28.3, forward 7.0 / 9.2, N=1 forward 2.6 / 3.2; float16
    N=8 gradient 27.8 / 27.6; 19x19 and 14x14 maps, on the tiles, as before)."""
    ds, ws, rs = launch.shapes
    kern, params = _kernel_for(launch, buf)
    bits = launch.mixes16 or buf.dtype.itemsize == 2 or not launch.writes16
    _launch(kern, _data(launch, data, ds, scratch.OPERAND_0, operand, bits),
            operand(w, ws, scratch.OPERAND_1), buf.reshape(rs), *params)


def _run_filter_gradient(launch, plan, x, dy, buf, operand=_compute):
    """Launch a filter gradient into ``buf`` (as :func:`_run_correlation`)."""
    xs, ds, ps, sums = launch.shapes
    bits = launch.mixes16 or x.dtype == dy.dtype
    x = _data(launch, x, xs, scratch.OPERAND_0, operand, bits)
    dy = _data(launch, dy, ds, scratch.OPERAND_1, operand, bits)
    if ps[0] == 1:
        # one chunk: its partial sums are the gradient (summing them, a copy)
        _launch(launch.kern, x, dy, buf.reshape(ps), *launch.params)
    else:
        # this thread's buffer, not fresh pages each call (they die before we return)
        parts = scratch.empty(scratch.PARTIALS, ps, buf.dtype)
        _launch(launch.kern, x, dy, parts, *launch.params)
        _launch(kernels.sum_partials, parts.reshape(sums), buf.reshape(plan.filter_shape5))


# primitive -> (route name, routing function, result shape attribute); the routing
# functions are looked up when called, so that tests may patch them
_DIRECT = {
    "depthwise_forward": ("forward", lambda p: _forward_route(p), "output_shape"),
    "depthwise_backprop_input": ("input_gradient", lambda p: _input_gradient_route(p),
                                 "input_shape"),
    "depthwise_backprop_filter": ("filter_gradient", lambda p: _filter_gradient_route(p),
                                  "filter_shape"),
}


def _direct(method, plan, arrays, out):
    """For the repeated-call path: a callable running a depth-multiplier-1 primitive
    straight on its kernel, or None. It serves arrays like ``arrays`` and ``out``
    (same types, shapes, strides and dtypes: what the operators' call key holds)
    when they need no conversion: NumPy arrays in the accumulation dtype,
    C-contiguous and not empty, and ``out`` None or as the kernel writes it. The
    general path's per-call decisions (dtype widening, copies, result buffers,
    routing) are then made once, here; on 7x7 maps they were a third of a call."""
    spec = _DIRECT.get(method)
    if spec is None or plan.multiplier != 1:
        return None
    name, decide, result = spec
    acc = dtypes.accumulator(plan.dtype)
    shape = getattr(plan, result)
    for a in arrays + (() if out is None else (out,)):
        if type(a) is not np.ndarray or a.dtype != acc or not a.flags.c_contiguous \
                or a.size == 0:
            return None
    launch = _route(plan, name, decide)
    if launch is None or 0 in shape:
        return None
    if name == "filter_gradient":
        def direct(x, dy, out):
            if out is None:
                out = aligned.empty(shape, acc)
            _run_filter_gradient(launch, plan, x, dy, out, _read_only)
            return out
    else:
        def direct(data, w, out):
            if out is None:
                out = aligned.empty(shape, acc)
            _run_correlation(launch, data, w, out, _read_only)
            return out
    return direct


def _single_plan(plan):
    """``plan`` for the input with each channel repeated ``plan.multiplier`` times:
    C*M channels, depth multiplier 1 (output channel c*M + m then sees input
    channel c, as in the operator)."""
    def make():
        p = plan.clone()
        p.channels, p.multiplier = plan.channels * plan.multiplier, 1
        return p
    return plan._memo("single", make)


def _repeated(plan, a):
    """``a`` (input-shaped) with each channel repeated ``plan.multiplier`` times, in
    one new buffer (``np.repeat`` was seen to hold a second copy of its input)."""
    a = _compute(a)
    m = plan.multiplier
    if plan.channels_last:
        c = a.shape[-1]
        rep = aligned.empty(a.shape[:-1] + (c * m,), a.dtype)
        if rep.size:
            _launch(groups.repeat, a.reshape(-1, c), rep.reshape(-1, c * m))
        return rep
    rep = aligned.empty(a.shape[:2] + (m,) + a.shape[2:], a.dtype)
    np.copyto(rep, a[:, :, None])
    return rep.reshape((a.shape[0], a.shape[1] * m) + a.shape[2:])


def _wide_plan(plan):
    p = plan.clone()
    p.dtype = dtypes.accumulator(plan.dtype)
    return p


def _channels_last_plan(plan):
    p = plan.clone()
    p.channels_last = True
    return p


def _to_last(a):
    return np.moveaxis(a, 1, -1)


def _back_to_first(plan, res, out):
    """A channels-last result, as the channels-first array the caller gets."""
    moved = np.moveaxis(res, -1, 1)
    if out is not None:
        out[...] = moved
        return out
    return aligned.contiguous(moved, plan.dtype)


_TooHardError = getattr(np, "exceptions", np).TooHardError   # np.exceptions: NumPy >= 1.25


class CPUBackend(base.Backend):
    name = "cpu"

    def prepare(self, obj, argname):
        if type(obj) is np.ndarray:
            return obj
        try:
            return np.asarray(obj)
        except (ValueError, TypeError) as e:
            raise TypeError(f"{argname} could not be read as an array: {e}") from None

    def dtype(self, arr):
        return arr.dtype

    def shares_memory(self, a, b):
        """Exact for the strides a caller can build in practice (views that
        interleave in one buffer do not count); past NumPy's work bound, the
        address ranges decide."""
        try:
            return np.shares_memory(a, b, max_work=1 << 16)
        except _TooHardError:
            return np.may_share_memory(a, b)

    def workspace_bytes(self, plan):
        """Depth multipliers above 1 may be computed on the input with its channels
        repeated (and the input gradient summed from a repeated one): at most M
        times the input, in the accumulation dtype, and as much again for
        channels-first problems computed channels-last (an upper bound: the lane
        kernels repeat channels in registers instead)."""
        if plan.multiplier == 1:
            return 0
        n = plan.batch * plan.in_sizes[0] * plan.in_sizes[1] * plan.in_sizes[2]
        return (n * plan.channels * plan.multiplier * dtypes.accumulator(plan.dtype).itemsize
                * (1 if plan.channels_last else 2))

    def check_out(self, out, argname):
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{argname} must be a numpy.ndarray, got {type(out).__name__}")
        if not out.flags.writeable:
            raise ValueError(f"{argname} is read-only")
        return out

    def intermediate(self, plan, which, shape):
        """This thread's scratch for the separable ops' depthwise output (0) and its
        gradient (1). Fresh 14 MB intermediates cost 1,400-2,400 page faults per
        gradient call (8x56x56x144 -> 24 filters, 2 threads: 16.0 ms with ``out=``,
        26.6 ms without, against 12.4-12.8 ms and no faults reusing them)."""
        slot = scratch.INTERMEDIATE_0 if which == 0 else scratch.INTERMEDIATE_1
        return scratch.empty(slot, shape, dtypes.accumulator(plan.dtype))

    def bind(self, method, plan, arrays, out):
        direct = _direct(method, plan, arrays, out)
        return direct if direct is not None else super().bind(method, plan, arrays, out)

    # -- depthwise ------------------------------------------------------------------
    # Depth multipliers above 1: on the lane kernels (channels-last) or the plane
    # kernels (channels-first) without the repeated input in memory where they
    # take it (:func:`_multiplier_forward_route`, :func:`_multiplier_input_route`,
    # :func:`_multiplier_filter_route`, :func:`_multiplier_plane_route`);
    # otherwise the multiplier-1 kernels on the input with each channel repeated
    # M times, the input gradient summed from that of the repeated input (1
    # thread, N=8, NHWC, M=2:
    # 19x19x728 forward 54 -> 8.4 ms, 56x56x144 126 -> 18.6 ms, against the
    # generic row kernels).
    def depthwise_forward(self, plan, x, w, out=None, wide=False):
        if plan.multiplier > 1:
            launch = _route(plan, "forward", _multiplier_forward_route)
            if launch is not None:
                return _correlate(launch, plan, x, w, plan.output_shape, out, wide)
            p1 = _single_plan(plan)
            return self.depthwise_forward(p1, _repeated(plan, x), w.reshape(p1.filter_shape),
                                          out, wide)
        launch = _route(plan, "forward", _forward_route)
        if launch is None:
            res = self.depthwise_forward(_channels_last_plan(plan), _to_last(x), w, wide=True)
            return _back_to_first(plan if not wide else _wide_plan(plan), res, out)
        return _correlate(launch, plan, x, w, plan.output_shape, out, wide)

    def depthwise_backprop_input(self, plan, dy, w, out=None, wide=False):
        if plan.multiplier > 1:
            launch = _route(plan, "input_gradient", _multiplier_input_route)
            if launch is not None:
                return _correlate(launch, plan, dy, w, plan.input_shape, out, wide)
            return self._sum_repeated(plan, dy, w, out, wide)
        launch = _route(plan, "input_gradient", _input_gradient_route)
        if launch is None:
            res = self.depthwise_backprop_input(_channels_last_plan(plan), _to_last(dy), w,
                                                wide=True)
            return _back_to_first(plan if not wide else _wide_plan(plan), res, out)
        return _correlate(launch, plan, dy, w, plan.input_shape, out, wide)

    def separable_forward(self, plan, x, dk, pk, out=None):
        launch = _route(plan, "separable_forward", _fused_separable_route)
        if launch is None:
            return super().separable_forward(plan, x, dk, pk, out)
        buf, final = _result(plan, plan.separable_output_shape, out, False)
        if not _nothing_to_do(buf, x, dk, pk):
            _run_fused_separable(launch, plan, x, dk, pk, buf)
        return _finish(plan, buf, final)

    def separable_grad(self, plan, x, dk, pk, dout, dx_out=None, ddk_out=None, dpk_out=None):
        images = _route(plan, "gradient_images", _gradient_images)
        if not images:
            return super().separable_grad(plan, x, dk, pk, dout, dx_out, ddk_out, dpk_out)
        acc = dtypes.accumulator(plan.dtype)
        dx = dx_out if dx_out is not None else aligned.empty(plan.input_shape, plan.dtype)
        ddk = aligned.empty(plan.filter_shape, acc)
        dpk = aligned.empty(plan.pointwise_shape, acc)
        ddk_part, dpk_part = np.empty_like(ddk), np.empty_like(dpk)
        bt, vecs = _transposed_kernel(plan, pk)
        for n0 in range(0, plan.batch, images):
            n1 = min(n0 + images, plan.batch)
            part = _batch_plan(plan, n1 - n0)
            xs, dys = x[n0:n1], dout[n0:n1]
            # the first chunk's kernel gradients are the sums' first terms
            first = n0 == 0
            z = self.depthwise_forward(part, xs, dk,
                                       self.intermediate(part, 0, part.output_shape),
                                       wide=True)
            dz = self.intermediate(part, 1, part.output_shape)
            _pointwise_gradients(part, z, dys, bt, vecs, dz, dpk if first else dpk_part)
            self.depthwise_backprop_input(part, dz, dk, dx[n0:n1])
            self.depthwise_backprop_filter(part, xs, dz, ddk if first else ddk_part, wide=True)
            if not first:
                dpk += dpk_part
                ddk += ddk_part
        return dx, _total(plan, ddk, ddk_out), _total(plan, dpk, dpk_out)

    def _sum_repeated(self, plan, dy, w, out, wide):
        """The input gradient with a depth multiplier: the gradient of the repeated
        input, its M copies of each channel summed (in order of m)."""
        p1 = _single_plan(plan)
        rep = self.depthwise_backprop_input(p1, dy, w.reshape(p1.filter_shape), wide=True)
        m = plan.multiplier
        buf, final = _result(plan, plan.input_shape, out, wide)
        if plan.channels_last:
            c = plan.channels
            if buf.size:
                _launch(groups.sum_groups, rep.reshape(-1, c * m), buf.reshape(-1, c))
        else:
            shape = plan.input_shape
            parts = rep.reshape(shape[:2] + (m,) + shape[2:])
            np.copyto(buf, parts[:, :, 0])
            for k in range(1, m):
                np.add(buf, parts[:, :, k], out=buf)
        return _finish(plan, buf, final)

    def depthwise_backprop_filter(self, plan, x, dy, out=None, wide=False):
        if plan.multiplier > 1:
            launch = _route(plan, "filter_gradient", _multiplier_filter_route)
            if launch is None:
                p1 = _single_plan(plan)
                res = self.depthwise_backprop_filter(p1, _repeated(plan, x), dy, None, wide)
                res = res.reshape(plan.filter_shape)
                if out is None:
                    return res
                out[...] = res
                return out
        else:
            launch = _route(plan, "filter_gradient", _filter_gradient_route)
            if launch is None:
                return self.depthwise_backprop_filter(_channels_last_plan(plan), _to_last(x),
                                                      _to_last(dy), out, wide)
        buf, final = _result(plan, plan.filter_shape, out, wide)
        if not _nothing_to_do(buf, x, dy):
            _run_filter_gradient(launch, plan, x, dy, buf)
        return _finish(plan, buf, final)

    # -- pointwise (small kernels on .pointwise, others a GEMM through NumPy's BLAS) -
    def _pk2(self, plan, pk):
        return _compute(pk, slot=scratch.OPERAND_1).reshape(plan.out_channels, plan.filters)

    def _rows(self, plan, a, channels):
        """``a`` as (N, channels, P) for channels-first, (N*P, channels) for channels-last.

        The sizes are spelled out (no ``-1``): with a zero-size dimension NumPy
        cannot infer the missing one.
        """
        p = plan.out_sizes[0] * plan.out_sizes[1] * plan.out_sizes[2]
        if plan.channels_last:
            return a.reshape(plan.batch * p, channels)
        return a.reshape(plan.batch, channels, p)

    def _product(self, a, m, out):
        """``out = a @ m`` on :func:`.pointwise.products`, ``m`` small; channels-first
        (``a`` and ``out`` 3-D), ``out[n] = m.T @ a[n]`` on
        :func:`.pointwise.planar_products`."""
        if _nothing_to_do(out, a, m):
            return
        if a.ndim == 3:
            vecs = _pointwise_columns(min(a.shape[2], pointwise.PLANAR_PIXELS),
                                      _lanes_of(out.dtype))[0]
            # m[i, r] = flat[i*s0 + r*s1], m C-contiguous or the transpose of one
            flat = (m if m.flags.c_contiguous else m.T).reshape(m.size)
            s0, s1 = (st // m.itemsize for st in m.strides)
            _launch(pointwise.planar_products, flat, s1, s0, a, out, vecs)
            return
        vecs, cols = _pointwise_columns(m.shape[1], _lanes_of(out.dtype))
        _launch(pointwise.products, a, _padded(m, cols), out, vecs)

    def pointwise_forward(self, plan, z, pk, out=None, wide=False):
        shape = plan.separable_output_shape
        buf, final = _result(plan, shape, out, wide)
        z2 = self._rows(plan, _compute(z), plan.out_channels)
        pk2 = self._pk2(plan, pk)
        b2 = self._rows(plan, buf, plan.filters)
        if _route(plan, "products", _by_products):
            self._product(z2, pk2, b2)
        elif plan.channels_last:
            np.matmul(z2, pk2, out=b2)
        else:
            np.matmul(pk2.T, z2, out=b2)
        return _finish(plan, buf, final)

    def pointwise_backprop_input(self, plan, dout, pk, out=None, wide=False):
        buf, final = _result(plan, plan.output_shape, out, wide)
        d2 = self._rows(plan, _compute(dout), plan.filters)
        pk2 = self._pk2(plan, pk)
        b2 = self._rows(plan, buf, plan.out_channels)
        if _route(plan, "products", _by_products):
            self._product(d2, pk2.T, b2)
        elif plan.channels_last:
            np.matmul(d2, pk2.T, out=b2)
        else:
            np.matmul(pk2, d2, out=b2)
        return _finish(plan, buf, final)

    def pointwise_backprop_filter(self, plan, z, dout, out=None, wide=False):
        buf, final = _result(plan, plan.pointwise_shape, out, wide)
        z2 = self._rows(plan, _compute(z), plan.out_channels)
        d2 = self._rows(plan, _compute(dout, slot=scratch.OPERAND_1), plan.filters)
        b2 = buf.reshape(plan.out_channels, plan.filters)
        products = _route(plan, "products", _by_products)
        if products and not plan.channels_last:
            if not _nothing_to_do(b2, z2, d2):
                units = plan.batch * -(-z2.shape[2] // pointwise.PLANAR_PIXELS)
                parts = scratch.empty(scratch.PARTIALS, (min(units, pointwise.PARTS),)
                                      + b2.shape, b2.dtype)
                vecs = _pointwise_columns(plan.filters, _lanes_of(b2.dtype))[0]
                _launch(pointwise.planar_kernel_gradient, z2, d2, parts, vecs)
                b2[...] = parts.sum(axis=0)
        elif products:
            if not _nothing_to_do(b2, z2, d2):
                # per part of the pixels (F, C) sums, added in order of the parts
                parts = scratch.empty(scratch.PARTIALS, (min(len(z2), pointwise.PARTS),)
                                      + b2.shape[::-1], b2.dtype)
                vecs = _pointwise_columns(plan.out_channels, _lanes_of(b2.dtype))[0]
                _launch(pointwise.transposed_products, d2, z2, parts, vecs)
                b2[...] = parts.sum(axis=0).T
        elif plan.channels_last:
            np.matmul(z2.T, d2, out=b2)
        else:
            b2[...] = np.einsum("njp,nfp->jf", z2, d2, optimize=True)
        return _finish(plan, buf, final)
