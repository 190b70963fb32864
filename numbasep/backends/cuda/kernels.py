"""``@cuda.jit`` kernels for depthwise convolution and the pointwise (1x1) GEMM.

The CUDA twin of :mod:`numbasep.backends.cpu.kernels`. Arrays are canonical 5-D:
channels-last ``x[N, D, H, W, C]``, ``y[N, OD, OH, OW, C*M]``; channels-first
``x[N, C, D, H, W]``, ``y[N, C*M, OD, OH, OW]``; filters ``w[KD, KH, KW, C, M]``.
A 1-D or 2-D problem is a 3-D one with size-1 leading spatial dimensions.

Element types
-------------
Kernels are built by factories, one per combination of *codecs*: how each
input array's elements are decoded into the accumulator type and how the
result is encoded on store. Three decoders exist:

``"f32"``
    float16 or float32 storage, accumulated in float32 (a float16 element is
    widened exactly).
``"f64"``
    float64 storage and accumulation.
``"bf16"``
    bfloat16 passed as a ``uint16`` view of its bits; decoded exactly by
    ``bits << 16`` reinterpreted as float32. The bits are used rather than
    numba-cuda's own bfloat16 type because that type converts through linked
    C++ shims (a call and a local-memory round trip per element in the PTX),
    needs compute capability 8.0, and the simulator cannot type it the same
    way; two integer instructions do the same job everywhere.

and two encoders: ``"num"`` (the store casts; float32 -> float16 rounds to
nearest even in hardware) and ``"bf16"`` (round to nearest even on the float32
bits, NaN kept NaN). So 16-bit data is read in 16 bits, summed in float32 and
rounded exactly once.

Work split and determinism
--------------------------
Forward and input-gradient kernels give every output element to one thread
(grid-stride loops, so any grid size covers any problem): no atomics, no
races; the input gradient is a gather. The filter gradient is two launches: a
partial kernel where partial ``p`` sums a fixed chunk of the reduction into
``parts[p]`` (channels-last: one thread per filter element and chunk, reading
coalesced along channels; channels-first: one block per filter element and
chunk, reading coalesced along width, reduced in shared memory by a fixed
tree), then :func:`sum_parts` adding the partials in order ``p = 0, 1, ...``.
The chunk counts are chosen from the problem's shape by the driver, never from
the device, so results are bitwise reproducible run to run.

The pointwise step is a tiled GEMM with register blocking (see :func:`gemm`);
its reduction form uses the same partial-buffer scheme.
"""

import numpy as np
from numba import cuda

SIMULATOR = bool(cuda.config.ENABLE_CUDASIM)

# Threads per block of the channels-first filter-gradient kernel (a power of two:
# the shared-memory reduction halves it). The simulator runs one OS thread per
# CUDA thread, so it gets tiny blocks.
FILTER_BLOCK = 8 if SIMULATOR else 256

# GEMM tiling: a block of (GEMM_TY, GEMM_TX) threads computes a
# (GEMM_TY*GEMM_RM) x (GEMM_TX*GEMM_RN) tile of C, each thread an RM x RN
# register tile, stepping through K in slices of GEMM_BK.
if SIMULATOR:
    GEMM_TY, GEMM_TX, GEMM_RM, GEMM_RN, GEMM_BK = 2, 2, 2, 2, 2
else:
    GEMM_TY, GEMM_TX, GEMM_RM, GEMM_RN, GEMM_BK = 16, 16, 4, 4, 16
GEMM_BM = GEMM_TY * GEMM_RM
GEMM_BN = GEMM_TX * GEMM_RN


# ------------------------------------------------------------------------ codecs

@cuda.jit(device=True, inline="always")
def _dec_f32(v):
    return np.float32(v)


@cuda.jit(device=True, inline="always")
def _dec_f64(v):
    return np.float64(v)


@cuda.jit(device=True, inline="always")
def _dec_bf16(u):
    # A bfloat16 is the top half of a float32: shift and reinterpret (exact).
    return np.uint32(np.uint32(u) << np.uint32(16)).view(np.float32)


@cuda.jit(device=True, inline="always")
def _enc_num(v):
    # The array store converts (float32 -> float16 rounds to nearest even).
    return v


@cuda.jit(device=True, inline="always")
def _enc_bf16(v):
    u = np.float32(v).view(np.uint32)
    if v != v:
        # Keep the sign, force a quiet-NaN payload bit: rounding could carry a
        # NaN with a low payload into Inf.
        return np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
    # Round to nearest, ties to even, on the 16 bits that are dropped.
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
                     >> np.uint32(16))


_DECODERS = {"f32": _dec_f32, "f64": _dec_f64, "bf16": _dec_bf16}
_ENCODERS = {"num": _enc_num, "bf16": _enc_bf16}


def decoder_kind(dtype):
    """Decoder name for an array of numpy ``dtype`` as the kernels receive it."""
    name = np.dtype(dtype).name
    if name == "uint16":
        return "bf16"
    if name == "float64":
        return "f64"
    if name in ("float16", "float32"):
        return "f32"
    raise TypeError(f"no CUDA kernel decoder for dtype {name}")


def encoder_kind(dtype):
    """Encoder name for an output array of numpy ``dtype`` as the kernels receive it."""
    return "bf16" if np.dtype(dtype).name == "uint16" else "num"


def _acc_type(dec_kinds):
    return np.float64 if "f64" in dec_kinds else np.float32


# ----------------------------------------------------------------- index helpers

@cuda.jit(device=True, inline="always")
def _first_valid(pad, k, r, s):
    """Smallest output index o >= 0 with o*s - pad + k*r >= 0."""
    t = pad - k * r
    if t <= 0:
        return 0
    return (t + s - 1) // s


@cuda.jit(device=True, inline="always")
def _end_valid(size, pad, k, r, s, out_size):
    """One past the largest output index o with o*s - pad + k*r < size, capped at out_size."""
    t = size - 1 + pad - k * r
    if t < 0:
        return 0
    e = t // s + 1
    return e if e < out_size else out_size


# ---------------------------------------------------------------------- forward

def _make_forward_cl(dec_x, dec_w, enc, acc_t):
    @cuda.jit
    def forward_cl(x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """y[n, od, oh, ow, c*M+m] = sum over taps of x[n, i, c] * w[t, c, m]."""
        N, D, H, W, C = x.shape
        KD, KH, KW, _, M = w.shape
        _, OD, OH, OW, CM = y.shape
        total = N * OD * OH * OW * CM
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        while i < total:
            # Channel fastest: a warp reads consecutive channels (coalesced).
            p = i // CM
            k = i - p * CM
            q = p // OW
            ow = p - q * OW
            p = q // OH
            oh = q - p * OH
            n = p // OD
            od = p - n * OD
            c = k // M
            m = k - c * M
            acc = acc_t(0)
            for kd in range(KD):
                id_ = od * sd - pd + kd * rd
                if id_ < 0 or id_ >= D:
                    continue
                for kh in range(KH):
                    ih = oh * sh - ph + kh * rh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(KW):
                        iw = ow * sw - pw + kw * rw
                        if iw < 0 or iw >= W:
                            continue
                        acc += dec_x(x[n, id_, ih, iw, c]) * dec_w(w[kd, kh, kw, c, m])
            y[n, od, oh, ow, k] = enc(acc)
            i += step
    return forward_cl


def _make_forward_cf(dec_x, dec_w, enc, acc_t):
    @cuda.jit
    def forward_cf(x, w, y, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """Channels-first forward: y[n, c*M+m, od, oh, ow]."""
        N, C, D, H, W = x.shape
        KD, KH, KW, _, M = w.shape
        _, CM, OD, OH, OW = y.shape
        total = N * CM * OD * OH * OW
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        while i < total:
            # Width fastest: a warp reads consecutive columns (coalesced).
            p = i // OW
            ow = i - p * OW
            q = p // OH
            oh = p - q * OH
            p = q // OD
            od = q - p * OD
            n = p // CM
            k = p - n * CM
            c = k // M
            m = k - c * M
            acc = acc_t(0)
            for kd in range(KD):
                id_ = od * sd - pd + kd * rd
                if id_ < 0 or id_ >= D:
                    continue
                for kh in range(KH):
                    ih = oh * sh - ph + kh * rh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(KW):
                        iw = ow * sw - pw + kw * rw
                        if iw < 0 or iw >= W:
                            continue
                        acc += dec_x(x[n, c, id_, ih, iw]) * dec_w(w[kd, kh, kw, c, m])
            y[n, k, od, oh, ow] = enc(acc)
            i += step
    return forward_cf


# --------------------------------------------------------------- backprop input

def _make_backprop_input_cl(dec_dy, dec_w, enc, acc_t):
    @cuda.jit
    def backprop_input_cl(dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """dx[n, i, c]: gather of dy[n, o, c*M+m] * w[t, c, m] over (o, t, m) hitting i."""
        N, D, H, W, C = dx.shape
        KD, KH, KW, _, M = w.shape
        _, OD, OH, OW, CM = dy.shape
        total = N * D * H * W * C
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        while i < total:
            p = i // C
            c = i - p * C
            q = p // W
            iw = p - q * W
            p = q // H
            ih = q - p * H
            n = p // D
            id_ = p - n * D
            acc = acc_t(0)
            # Tap t reaches input i from output o = (i + pad - t*r) / s when that
            # is a whole number inside the output; the numerator falls as t
            # grows, so the first negative one ends the loop.
            for kd in range(KD):
                td = id_ + pd - kd * rd
                if td < 0:
                    break
                od = td // sd
                if od * sd != td or od >= OD:
                    continue
                for kh in range(KH):
                    th = ih + ph - kh * rh
                    if th < 0:
                        break
                    oh = th // sh
                    if oh * sh != th or oh >= OH:
                        continue
                    for kw in range(KW):
                        tw = iw + pw - kw * rw
                        if tw < 0:
                            break
                        ow = tw // sw
                        if ow * sw != tw or ow >= OW:
                            continue
                        for m in range(M):
                            acc += (dec_dy(dy[n, od, oh, ow, c * M + m])
                                    * dec_w(w[kd, kh, kw, c, m]))
            dx[n, id_, ih, iw, c] = enc(acc)
            i += step
    return backprop_input_cl


def _make_backprop_input_cf(dec_dy, dec_w, enc, acc_t):
    @cuda.jit
    def backprop_input_cf(dy, w, dx, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """Channels-first input gradient (gather): dx[n, c, id, ih, iw]."""
        N, C, D, H, W = dx.shape
        KD, KH, KW, _, M = w.shape
        _, CM, OD, OH, OW = dy.shape
        total = N * C * D * H * W
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        while i < total:
            p = i // W
            iw = i - p * W
            q = p // H
            ih = p - q * H
            p = q // D
            id_ = q - p * D
            n = p // C
            c = p - n * C
            acc = acc_t(0)
            for kd in range(KD):
                td = id_ + pd - kd * rd
                if td < 0:
                    break
                od = td // sd
                if od * sd != td or od >= OD:
                    continue
                for kh in range(KH):
                    th = ih + ph - kh * rh
                    if th < 0:
                        break
                    oh = th // sh
                    if oh * sh != th or oh >= OH:
                        continue
                    for kw in range(KW):
                        tw = iw + pw - kw * rw
                        if tw < 0:
                            break
                        ow = tw // sw
                        if ow * sw != tw or ow >= OW:
                            continue
                        for m in range(M):
                            acc += (dec_dy(dy[n, c * M + m, od, oh, ow])
                                    * dec_w(w[kd, kh, kw, c, m]))
            dx[n, c, id_, ih, iw] = enc(acc)
            i += step
    return backprop_input_cf


# -------------------------------------------------------------- backprop filter

def _make_backprop_filter_cl(dec_x, dec_dy, acc_t):
    @cuda.jit
    def backprop_filter_cl(x, dy, parts, KH, KW, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """parts[p, tap, k] = sum over rows of chunk p of x * dy (channels-last).

        Grid x covers filter elements j = tap*CM + k (channel fastest, so a warp
        reads consecutive channels of x and dy); grid y covers the partials.
        Each thread sums its chunk serially, in a fixed order.
        """
        N, D, H, W, C = x.shape
        _, OD, OH, OW, CM = dy.shape
        P, T, _ = parts.shape
        M = CM // C
        rows = N * OD * OH
        L = T * CM
        j0 = np.int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        jstep = np.int64(cuda.gridDim.x) * cuda.blockDim.x
        p = np.int64(cuda.blockIdx.y)
        while p < P:
            r0 = p * rows // P
            r1 = (p + 1) * rows // P
            j = j0
            while j < L:
                t = j // CM
                k = j - t * CM
                q = t // KW
                kw = t - q * KW
                kd = q // KH
                kh = q - kd * KH
                c = k // M
                lo = _first_valid(pw, kw, rw, sw)
                hi = _end_valid(W, pw, kw, rw, sw, OW)
                off = kw * rw - pw
                acc = acc_t(0)
                for r in range(r0, r1):
                    q = r // OH
                    oh = r - q * OH
                    n = q // OD
                    od = q - n * OD
                    id_ = od * sd - pd + kd * rd
                    ih = oh * sh - ph + kh * rh
                    if id_ < 0 or id_ >= D or ih < 0 or ih >= H:
                        continue
                    for ow in range(lo, hi):
                        acc += (dec_x(x[n, id_, ih, ow * sw + off, c])
                                * dec_dy(dy[n, od, oh, ow, k]))
                parts[p, t, k] = acc
                j += jstep
            p += cuda.gridDim.y
    return backprop_filter_cl


def _make_backprop_filter_cf(dec_x, dec_dy, acc_t):
    BS = FILTER_BLOCK

    @cuda.jit
    def backprop_filter_cf(x, dy, parts, KH, KW, sd, sh, sw, rd, rh, rw, pd, ph, pw):
        """parts[p, tap, k] = sum over chunk p of the (n, od, oh, ow) positions.

        One block per (filter element, partial): its threads take positions
        q0 + tid, q0 + tid + BS, ... (width fastest: coalesced reads of x and
        dy), then add their sums with a fixed shared-memory tree.
        """
        N, C, D, H, W = x.shape
        _, CM, OD, OH, OW = dy.shape
        P, T, _ = parts.shape
        M = CM // C
        Q = N * OD * OH * OW
        L = T * CM
        buf = cuda.shared.array(BS, acc_t)
        tid = cuda.threadIdx.x
        p = np.int64(cuda.blockIdx.y)
        while p < P:
            q0 = p * Q // P
            q1 = (p + 1) * Q // P
            j = np.int64(cuda.blockIdx.x)
            while j < L:
                t = j // CM
                k = j - t * CM
                a = t // KW
                kw = t - a * KW
                kd = a // KH
                kh = a - kd * KH
                c = k // M
                acc = acc_t(0)
                q = q0 + tid
                while q < q1:
                    a = q // OW
                    ow = q - a * OW
                    b = a // OH
                    oh = a - b * OH
                    n = b // OD
                    od = b - n * OD
                    id_ = od * sd - pd + kd * rd
                    ih = oh * sh - ph + kh * rh
                    iw = ow * sw - pw + kw * rw
                    if id_ >= 0 and id_ < D and ih >= 0 and ih < H and iw >= 0 and iw < W:
                        acc += dec_x(x[n, c, id_, ih, iw]) * dec_dy(dy[n, k, od, oh, ow])
                    q += BS
                buf[tid] = acc
                cuda.syncthreads()
                s = BS // 2
                while s > 0:
                    if tid < s:
                        buf[tid] += buf[tid + s]
                    cuda.syncthreads()
                    s //= 2
                if tid == 0:
                    parts[p, t, k] = buf[0]
                # buf is reused by the next filter element.
                cuda.syncthreads()
                j += cuda.gridDim.x
            p += cuda.gridDim.y
    return backprop_filter_cf


def _make_sum_parts(dec, enc):
    @cuda.jit
    def sum_parts(parts, out):
        """out[a, b] = parts[0, a, b] + parts[1, a, b] + ..., in that order."""
        P, A, B = parts.shape
        total = A * B
        i = np.int64(cuda.grid(1))
        step = np.int64(cuda.gridsize(1))
        while i < total:
            a = i // B
            b = i - a * B
            s = dec(parts[0, a, b])
            for p in range(1, P):
                s += dec(parts[p, a, b])
            out[a, b] = enc(s)
            i += step
    return sum_parts


# ------------------------------------------------------------------------- GEMM

def _make_gemm(ta, tb, dec_a, dec_b, enc, acc_t):
    TY, TX, RM, RN, BK = GEMM_TY, GEMM_TX, GEMM_RM, GEMM_RN, GEMM_BK
    BM, BN = GEMM_BM, GEMM_BN
    NT = TX * TY
    # One padding column: tile loads walk k fastest for some layouts, and rows
    # BM (BN) words apart would all hit one shared-memory bank. (Shapes must be
    # compile-time constants, hence computed here.)
    SHAPE_A, SHAPE_B = (BK, BM + 1), (BK, BN + 1)

    @cuda.jit
    def gemm(A, B, C, nbatch, SB, SK, a_b, b_b):
        """C[s] = sum over the batches and K-slices of split s of A[b] @ B[b].

        ``A[b]`` is ``[I, K]`` (stored ``[K, I]`` when transposed), ``B[b]`` is
        ``[K, J]`` (stored ``[J, K]`` when transposed); operand batch index is
        ``b * a_b`` / ``b * b_b`` (0 broadcasts a single matrix). Split ``s =
        sb*SK + sk`` covers batches ``[sb*nbatch//SB, (sb+1)*nbatch//SB)`` and
        the ``sk``-th share of the K tiles. With ``SB == nbatch, SK == 1`` this
        is a batched GEMM; otherwise ``C`` is a buffer of partial sums.
        """
        sa = cuda.shared.array(SHAPE_A, acc_t)
        sb_ = cuda.shared.array(SHAPE_B, acc_t)
        acc = cuda.local.array((RM, RN), acc_t)
        av = cuda.local.array(RM, acc_t)
        bv = cuda.local.array(RN, acc_t)
        S, I, J = C.shape
        if ta:
            K = A.shape[1]
        else:
            K = A.shape[2]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * TX + tx
        ktiles = (K + BK - 1) // BK
        s = np.int64(cuda.blockIdx.z)
        while s < S:
            sbi = s // SK
            ski = s - sbi * SK
            b0 = sbi * nbatch // SB
            b1 = (sbi + 1) * nbatch // SB
            kt0 = ski * ktiles // SK
            kt1 = (ski + 1) * ktiles // SK
            i0 = np.int64(cuda.blockIdx.y) * BM
            while i0 < I:
                j0 = np.int64(cuda.blockIdx.x) * BN
                while j0 < J:
                    for r in range(RM):
                        for q in range(RN):
                            acc[r, q] = 0
                    for b in range(b0, b1):
                        ba = b * a_b
                        bb = b * b_b
                        for kt in range(kt0, kt1):
                            k0 = kt * BK
                            # Cooperative tile loads, the contiguous index
                            # fastest across threads (coalesced).
                            for e in range(tid, BM * BK, NT):
                                if ta:
                                    ii = e % BM
                                    kk = e // BM
                                else:
                                    kk = e % BK
                                    ii = e // BK
                                gi = i0 + ii
                                gk = k0 + kk
                                v = acc_t(0)
                                if gi < I and gk < K:
                                    if ta:
                                        v = dec_a(A[ba, gk, gi])
                                    else:
                                        v = dec_a(A[ba, gi, gk])
                                sa[kk, ii] = v
                            for e in range(tid, BN * BK, NT):
                                if tb:
                                    kk = e % BK
                                    jj = e // BK
                                else:
                                    jj = e % BN
                                    kk = e // BN
                                gj = j0 + jj
                                gk = k0 + kk
                                v = acc_t(0)
                                if gj < J and gk < K:
                                    if tb:
                                        v = dec_b(B[bb, gj, gk])
                                    else:
                                        v = dec_b(B[bb, gk, gj])
                                sb_[kk, jj] = v
                            cuda.syncthreads()
                            for kk in range(BK):
                                # Rows ty, ty+TY, ...: neighbouring threads read
                                # neighbouring shared words (no bank conflicts)
                                # and store neighbouring columns of C.
                                for r in range(RM):
                                    av[r] = sa[kk, ty + r * TY]
                                for q in range(RN):
                                    bv[q] = sb_[kk, tx + q * TX]
                                for r in range(RM):
                                    for q in range(RN):
                                        acc[r, q] += av[r] * bv[q]
                            cuda.syncthreads()
                    for r in range(RM):
                        gi = i0 + ty + r * TY
                        if gi < I:
                            for q in range(RN):
                                gj = j0 + tx + q * TX
                                if gj < J:
                                    C[s, gi, gj] = enc(acc[r, q])
                    j0 += np.int64(cuda.gridDim.x) * BN
                i0 += np.int64(cuda.gridDim.y) * BM
            s += cuda.gridDim.z
    return gemm


# ----------------------------------------------------------------------- lookup

_FACTORIES = {
    "forward_cl": (_make_forward_cl, 2, True),
    "forward_cf": (_make_forward_cf, 2, True),
    "backprop_input_cl": (_make_backprop_input_cl, 2, True),
    "backprop_input_cf": (_make_backprop_input_cf, 2, True),
    "backprop_filter_cl": (_make_backprop_filter_cl, 2, False),
    "backprop_filter_cf": (_make_backprop_filter_cf, 2, False),
}

_cache = {}


def depthwise(name, in_kinds, out_kind=None):
    """The depthwise kernel ``name`` for inputs decoded by ``in_kinds``.

    Parameters
    ----------
    name : str
        ``forward_cl``, ``forward_cf``, ``backprop_input_cl``,
        ``backprop_input_cf``, ``backprop_filter_cl`` or ``backprop_filter_cf``.
    in_kinds : tuple of str
        Decoder of each array input (:func:`decoder_kind`).
    out_kind : str, optional
        Encoder of the output (:func:`encoder_kind`); the filter-gradient
        kernels write accumulator-typed partials and take none.
    """
    key = (name, tuple(in_kinds), out_kind)
    try:
        return _cache[key]
    except KeyError:
        pass
    make, nin, has_out = _FACTORIES[name]
    decs = [_DECODERS[k] for k in in_kinds]
    acc_t = _acc_type(in_kinds)
    if has_out:
        kern = make(*decs, _ENCODERS[out_kind], acc_t)
    else:
        kern = make(*decs, acc_t)
    _cache[key] = kern
    return kern


def sum_parts(in_kind, out_kind):
    """The kernel adding partial sums ``parts[P, A, B]`` into ``out[A, B]`` in order."""
    key = ("sum_parts", in_kind, out_kind)
    try:
        return _cache[key]
    except KeyError:
        kern = _cache[key] = _make_sum_parts(_DECODERS[in_kind], _ENCODERS[out_kind])
        return kern


def gemm(ta, tb, a_kind, b_kind, out_kind):
    """The tiled GEMM for operand layouts (``ta``, ``tb``) and element codecs."""
    key = ("gemm", bool(ta), bool(tb), a_kind, b_kind, out_kind)
    try:
        return _cache[key]
    except KeyError:
        kern = _cache[key] = _make_gemm(bool(ta), bool(tb), _DECODERS[a_kind],
                                        _DECODERS[b_kind], _ENCODERS[out_kind],
                                        _acc_type((a_kind, b_kind)))
        return kern
