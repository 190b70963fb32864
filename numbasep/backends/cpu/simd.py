"""Vector register operations LLVM does not find on its own, as Numba intrinsics.

Each works on float32 or float64 arrays (one element type per call) and leaves
bounds to the caller, like the kernels' unsigned indexing does. The correlation
and filter-gradient intrinsics (``taps_rows``, ``taps_row_pairs``, ``taps_window``,
``dots_rows``, ``dots_window``) take a channel count, a multiple of 8, and run 16 lanes at a
time where the CPU has AVX-512 (8 elsewhere), then 8 for a last group of 8; they
read 16-bit operands given as bit patterns and write 16-bit results that way.
So does ``sum_groups``, which sums a depth multiplier's groups of channels.
"""

import platform

from llvmlite import binding as llb
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


def _mask(*lanes):
    return ir.Constant(ir.VectorType(_I32, 8), list(lanes))


def _nontemporal(store, builder):
    """Mark ``store`` non-temporal: the line is written to memory without the
    read that a plain store makes first."""
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_I32, 1)]))
    return store


def _splat(builder, value, width):
    """The ``width``-lane vector with ``value`` (a scalar) in every lane: an insert
    and a shuffle, which LLVM turns into one broadcast."""
    e = builder.insert_element(ir.Constant(ir.VectorType(value.type, width), ir.Undefined),
                               value, _I32(0))
    return builder.shuffle_vector(e, e, ir.Constant(ir.VectorType(_I32, width), [0] * width))


def _lanes_below(builder, k, width):
    """The ``<width x i1>`` mask of the lanes below ``k`` (an integer; all lanes
    from ``width`` on, none at 0 or below)."""
    lanes = ir.Constant(ir.VectorType(k.type, width), list(range(width)))
    return builder.icmp_signed("<", lanes, _splat(builder, k, width))


# The AVX sequence for an 8 x 8 transpose: interleave pairs of rows within each
# 128-bit half (unpcklps / unpckhps), combine pairs of those within each half
# (shufps), then swap halves across registers (vperm2f128): 24 shuffles, none of
# them crossing a half before the last round. (Masks index the concatenation of
# the two operands: 0-7 the first, 8-15 the second.)
_UNPACK = (_mask(0, 8, 1, 9, 4, 12, 5, 13), _mask(2, 10, 3, 11, 6, 14, 7, 15))
_PAIRS = (_mask(0, 1, 8, 9, 4, 5, 12, 13), _mask(2, 3, 10, 11, 6, 7, 14, 15))
_HALVES = (_mask(0, 1, 2, 3, 8, 9, 10, 11), _mask(4, 5, 6, 7, 12, 13, 14, 15))


@intrinsic
def transpose8(typingctx, src, s0, ss, dst, d0, doffs, di):
    """Transpose an 8 x 8 block: row r of the block is ``src[s0 + r*ss : +8]``;
    column c goes to ``dst[d0 + doffs[di + c] : +8]``.

    Eight vector loads, 24 shuffles and eight vector stores. The caller
    guarantees the bounds."""
    sig = types.void(src, s0, ss, dst, d0, doffs, di)

    def codegen(context, builder, signature, args):
        srcv, s0v, ssv, dstv, d0v, offv, div = args
        sary = context.make_array(signature.args[0])(context, builder, srcv)
        dary = context.make_array(signature.args[3])(context, builder, dstv)
        oary = context.make_array(signature.args[5])(context, builder, offv)
        elt = context.get_data_type(signature.args[0].dtype)
        align = context.get_abi_sizeof(elt)
        vptr = ir.VectorType(elt, 8).as_pointer()
        rows = []
        for r in range(8):
            off = builder.add(s0v, builder.mul(ssv, ir.Constant(ssv.type, r)))
            ptr = builder.bitcast(builder.gep(sary.data, [off]), vptr)
            rows.append(builder.load(ptr, align=align))

        def shuffle(a, b, mask):
            return builder.shuffle_vector(a, b, mask)

        # t[2i + h]: rows 2i, 2i+1 interleaved (h: low or high pair of each half)
        t = [shuffle(rows[2 * i], rows[2 * i + 1], m) for i in range(4) for m in _UNPACK]
        # q[4j + 2h + k]: column 4e + 2h + k of rows 4j..4j+3, e the half
        q = [shuffle(t[4 * j + h], t[4 * j + 2 + h], m)
             for j in range(2) for h in range(2) for m in _PAIRS]
        cols = [shuffle(q[c % 4], q[4 + c % 4], _HALVES[c // 4]) for c in range(8)]
        for c in range(8):
            k = builder.add(div, ir.Constant(div.type, c))
            off = builder.add(d0v, builder.load(builder.gep(oary.data, [k])))
            ptr = builder.bitcast(builder.gep(dary.data, [off]), vptr)
            builder.store(cols[c], ptr, align=align)
        return context.get_dummy_value()

    return sig, codegen


def _with_bits(floats, other):
    """Whether an intrinsic computing in ``floats`` takes an array of ``other``:
    the same floats, or 16-bit bit patterns (with float32)."""
    return floats in (types.float32, types.float64) and (
        other == floats or (floats == types.float32 and other in (types.uint16, types.int16)))


@intrinsic
def deinterleave(typingctx, src, s0, n, dst, d0, d1):
    """``dst[d0 : d0+n] = src[s0 : s0+2n : 2]`` and ``dst[d1 : d1+n] = src[s0+1 : s0+2n : 2]``
    (16-bit bit patterns widened as loaded, as :func:`.halves.value` reads them).

    A row of a strided plane split into its two column phases: two vector loads,
    two shuffles and two stores per vector of each phase, the row's last pairs
    under masks, so that nothing past ``2n`` elements is read or past ``n``
    written. (The loop vectoriser leaves this stride-2 split scalar. With 8
    pairs at a time and the rest one by one, splitting the rows took more than
    the forward's tap sums over them: 1 thread, planes.forward over 32 planes
    of 56x56 3x3 stride 2 in L2, 61 us, 27 without the split; 51 us with this.
    2 threads, N=8 56x56x144, forward / filter gradient: 0.86 / 0.80 -> 0.72 /
    0.69 ms.)"""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)
            and _with_bits(dst.dtype, src.dtype)):
        return None
    sig = types.void(src, s0, n, dst, d0, d1)

    def codegen(context, builder, signature, args):
        b = builder
        s0v, nv, d0v, d1v = (context.cast(b, args[k], signature.args[k], types.intp)
                             for k in (1, 2, 4, 5))
        L = WIDE // 2 if signature.args[3].dtype == types.float64 else WIDE
        v = _Lanes(context, b, signature, args, L, floats=3)
        ity = s0v.type

        def const(i):
            return ir.Constant(ity, i)
        phases = [ir.Constant(ir.VectorType(_I32, L), list(range(p, 2 * L, 2))) for p in (0, 1)]

        def vector(k, _):
            at = b.add(s0v, b.mul(k, const(2 * L)))
            lo, hi = v.value(0, at), v.value(0, b.add(at, const(L)))
            for d, phase in zip((d0v, d1v), phases):
                v.store(b.shuffle_vector(lo, hi, phase), 3, b.add(d, b.mul(k, const(L))))
            return []
        whole = b.sdiv(nv, const(L))
        v.loop(whole, [], vector)
        left = b.sub(nv, b.mul(whole, const(L)))
        with b.if_then(b.icmp_signed(">", left, const(0))):
            at = b.add(s0v, b.mul(whole, const(2 * L)))
            twice = b.add(left, left)
            lo = v.masked_value(0, at, _lanes_below(b, twice, L))
            hi = v.masked_value(0, b.add(at, const(L)),
                                _lanes_below(b, b.sub(twice, const(L)), L))
            mask = _lanes_below(b, left, L)
            for d, phase in zip((d0v, d1v), phases):
                v.masked_put(b.shuffle_vector(lo, hi, phase), 3,
                             b.add(d, b.mul(whole, const(L))), mask)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a*b + c`` rounded once (float32 or float64; the widest of the three).

    The channels-last correlations sum their taps with it, in tap order, so that
    their scalar loops (which LLVM vectorises) and the register intrinsics below
    round every sum alike. (Letting LLVM contract ``acc += x*w`` would not do:
    where both terms of an addition are products it may fuse either one.)"""
    if not all(isinstance(t, types.Float) for t in (a, b, c)):
        return None
    ty = types.float64 if types.float64 in (a, b, c) else types.float32
    sig = ty(a, b, c)

    def codegen(context, builder, signature, args):
        vals = [context.cast(builder, v, t, ty) for v, t in zip(args, signature.args)]
        lty = context.get_value_type(ty)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(lty, [lty] * 3),
            "llvm.fma.f64" if ty == types.float64 else "llvm.fma.f32")
        return builder.call(fn, vals)

    return sig, codegen


class _Lanes:
    """Code generation helpers for the intrinsics below (``width`` lanes): vector
    loads and stores at element offsets of arrays, and a counted loop whose
    carried values are phi nodes (so that they live in registers)."""

    def __init__(self, context, builder, signature, args, width=8, floats=0):
        self.builder = builder
        self.arrays = {i: context.make_array(t)(context, builder, a)
                       for i, (t, a) in enumerate(zip(signature.args, args))
                       if isinstance(t, types.Array)}
        self.types = signature.args
        # the element type computed in: that of argument ``floats`` (a float array)
        self.elt = context.get_data_type(signature.args[floats].dtype)
        self.align = context.get_abi_sizeof(self.elt)
        self.vty = ir.VectorType(self.elt, width)

    def _ptr(self, i, off):
        return self.builder.bitcast(self.builder.gep(self.arrays[i].data, [off]),
                                    self.vty.as_pointer())

    def load(self, i, off):
        return self.builder.load(self._ptr(i, off), align=self.align)

    def value(self, i, off, rep=1):
        """A vector of array ``i``'s elements as the kernels compute with them: 16-bit
        bit patterns (:func:`.halves.value`: ``uint16`` bfloat16, ``int16``
        float16) widened as loaded, floats as they are. ``rep`` > 1: the vector
        of lanes / ``rep`` elements from ``off``, each repeated ``rep`` times
        (a depth multiplier's input channels, as its output channels see them)."""
        b = self.builder
        n = self.vty.count // rep
        got = self._widened(i, n, lambda vty, align: b.load(
            b.bitcast(b.gep(self.arrays[i].data, [off]), vty.as_pointer()), align=align))
        if rep == 1:
            return got
        return b.shuffle_vector(got, got, ir.Constant(ir.VectorType(_I32, self.vty.count),
                                                      [k // rep for k in range(self.vty.count)]))

    def _widened(self, i, n, load):
        """``load(vty, align)``'s n elements of array i as floats of the type
        computed in: 16-bit bit patterns loaded as such and widened."""
        dtype = self.types[i].dtype
        if dtype not in (types.uint16, types.int16):
            return load(ir.VectorType(self.elt, n), self.align)
        b = self.builder
        raw = load(ir.VectorType(ir.IntType(16), n), 2)
        fty = ir.VectorType(self.elt, n)
        if dtype == types.int16:
            return b.fpext(b.bitcast(raw, ir.VectorType(ir.HalfType(), n)), fty)
        wide = b.shl(b.zext(raw, ir.VectorType(_I32, n)),
                     ir.Constant(ir.VectorType(_I32, n), [16] * n))
        return b.bitcast(wide, fty)

    def masked_value(self, i, off, mask):
        """:meth:`value`, reading only the lanes of the ``<lanes x i1>`` ``mask``
        (the others are not touched and hold zeros)."""
        b = self.builder
        n = self.vty.count

        def load(vty, align):
            kind = {"float": "f32", "double": "f64"}.get(str(vty.element), "i16")
            suffix = f"v{n}{kind}"
            fn = cgutils.get_or_insert_function(
                b.module, ir.FunctionType(vty, [vty.as_pointer(), _I32, mask.type, vty]),
                f"llvm.masked.load.{suffix}.p0{suffix}")
            ptr = b.bitcast(b.gep(self.arrays[i].data, [off]), vty.as_pointer())
            zero = [0] * n if kind == "i16" else [0.0] * n
            return b.call(fn, [ptr, ir.Constant(_I32, align), mask, ir.Constant(vty, zero)])
        return self._widened(i, n, load)

    def put(self, value, i, off, stream=False):
        """Store a vector of results into array ``i``: rounded to 16 bits when the
        array holds bit patterns (as :func:`.halves.narrow_into` rounds: to
        nearest even; a bfloat16 NaN becomes the quiet 0x7FC0 with its sign).
        ``stream``: a non-temporal store of floats (the line is written without
        being read first), which must be aligned to the vector's size; 2: a
        vector of more than 32 bytes in two stores of half a vector each, which
        must be aligned to half its size (32 bytes or less: aligned to its
        size)."""
        dtype = self.types[i].dtype
        if dtype not in (types.uint16, types.int16):
            n = self.vty.count
            if stream == 2 and n * self.align > 32:
                b = self.builder
                for k in (0, n // 2):
                    half = b.shuffle_vector(value, value, ir.Constant(
                        ir.VectorType(_I32, n // 2), list(range(k, k + n // 2))))
                    at = b.gep(self.arrays[i].data, [b.add(off, ir.Constant(off.type, k))])
                    _nontemporal(b.store(half, b.bitcast(at, half.type.as_pointer()),
                                         align=n // 2 * self.align), b)
                return None
            if stream:
                return _nontemporal(self.builder.store(
                    value, self._ptr(i, off), align=n * self.align), self.builder)
            return self.store(value, i, off)
        h = self._narrowed(value, dtype)
        self.builder.store(h, self.builder.bitcast(self.builder.gep(self.arrays[i].data, [off]),
                                                   h.type.as_pointer()), align=2)

    def masked_put(self, value, i, off, mask):
        """:meth:`put` (not streaming) of only the lanes of the ``<lanes x i1>``
        ``mask``: the others are neither read nor written."""
        b = self.builder
        dtype = self.types[i].dtype
        if dtype in (types.uint16, types.int16):
            value, align = self._narrowed(value, dtype), 2
        else:
            align = self.align
        vty = value.type
        kind = {"float": "f32", "double": "f64"}.get(str(vty.element), "i16")
        suffix = f"v{vty.count}{kind}"
        fn = cgutils.get_or_insert_function(
            b.module, ir.FunctionType(ir.VoidType(), [vty, vty.as_pointer(), _I32, mask.type]),
            f"llvm.masked.store.{suffix}.p0{suffix}")
        b.call(fn, [value, b.bitcast(b.gep(self.arrays[i].data, [off]), vty.as_pointer()),
                    ir.Constant(_I32, align), mask])

    def _narrowed(self, value, dtype):
        """The 16-bit bit patterns of ``dtype`` (``int16`` float16, ``uint16``
        bfloat16) that the vector of floats ``value`` rounds to."""
        b = self.builder
        n = self.vty.count
        i16 = ir.VectorType(ir.IntType(16), n)
        if dtype == types.int16:
            return b.bitcast(b.fptrunc(value, ir.VectorType(ir.HalfType(), n)), i16)
        i32 = ir.VectorType(_I32, n)

        def c(k):
            return ir.Constant(i32, [k] * n)
        u = b.bitcast(value, i32)
        lsb = b.and_(b.lshr(u, c(16)), c(1))
        rounded = b.lshr(b.add(b.add(u, c(0x7FFF)), lsb), c(16))
        quiet = b.or_(b.and_(b.lshr(u, c(16)), c(0x8000)), c(0x7FC0))
        nan = b.icmp_unsigned(">", b.and_(u, c(0x7FFFFFFF)), c(0x7F800000))
        return b.trunc(b.select(nan, quiet, rounded), i16)

    def store(self, value, i, off):
        self.builder.store(value, self._ptr(i, off), align=self.align)

    def fma(self):
        """The vector fused multiply-add ``fma(a, b, c) = a*b + c``, one rounding."""
        name = f"llvm.fma.v{self.vty.count}{'f32' if self.elt == ir.FloatType() else 'f64'}"
        return cgutils.get_or_insert_function(
            self.builder.module, ir.FunctionType(self.vty, [self.vty] * 3), name)

    def scalar(self, i, off):
        return self.builder.load(self.builder.gep(self.arrays[i].data, [off]))

    def ask(self, i, lo, hi):
        """:func:`prefetch` the cache lines of array ``i``'s elements [lo, hi), lo
        at the start of a line (none where hi <= lo)."""
        b = self.builder
        arr = self.arrays[i]
        per = ir.Constant(lo.type, 64 // self.itemsize(i))
        count = b.sdiv(b.add(b.sub(hi, lo), b.sub(per, ir.Constant(lo.type, 1))), per)

        def line(k, _):
            _prefetch_line(b, b.gep(arr.data, [b.add(lo, b.mul(k, per))]))
            return []
        self.loop(count, [], line)

    def itemsize(self, i):
        """Bytes an element of array argument ``i``."""
        return self.types[i].dtype.bitwidth // 8

    def loop(self, n, carried, body):
        """``for k in range(n): carried = body(k, carried)``; returns the final values."""
        b = self.builder
        pre = b.block
        head, step, done = (b.append_basic_block(f"lanes.{name}")
                            for name in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(n.type)
        k.add_incoming(ir.Constant(n.type, 0), pre)
        phis = []
        for v in carried:
            phi = b.phi(v.type)
            phi.add_incoming(v, pre)
            phis.append(phi)
        b.cbranch(b.icmp_signed("<", k, n), step, done)
        b.position_at_end(step)
        new = body(k, phis)
        for phi, v in zip(phis, new):
            phi.add_incoming(v, b.block)
        k.add_incoming(b.add(k, ir.Constant(n.type, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)
        return phis


def _taps(taps):
    return taps.literal_value if isinstance(taps, types.IntegerLiteral) else None


def _edges_typed(edges, length):
    """Whether ``edges`` types as None or a ``length``-tuple of integers; None if not."""
    if isinstance(edges, types.NoneType):
        return False
    if isinstance(edges, types.BaseTuple) and len(edges) == length and \
            all(isinstance(t, types.Integer) for t in edges):
        return True
    return None


class _Columns:
    """The columns of a map that an ``edges`` tuple (c0, cpix, ctap, clim,
    cstride), from item ``first`` of ``value``, describes: pixel k's tap j reads
    column ``c0 + k*cpix + j*ctap`` of a map ``clim`` columns wide, whose
    columns are ``cstride`` elements apart. A tap outside the map is still
    loaded, from a column inside, so that no load leaves the map; its lanes
    mask keeps its sum as it was."""

    def __init__(self, context, builder, value, typ, first, width):
        self.b = builder
        self.width = width
        self.c0, self.cpix, self.ctap, self.clim, self.cstride = (
            context.cast(builder, builder.extract_value(value, i), typ[i], types.intp)
            for i in range(first, first + 5))
        self.ity = self.c0.type

    def column(self, k, j):
        """The column pixel k's tap j reads."""
        b = self.b
        return b.add(self.c0, b.add(b.mul(k, self.cpix),
                                    b.mul(ir.Constant(self.ity, j), self.ctap)))

    def inside(self, col):
        return self.b.icmp_unsigned("<", col, self.clim)

    def clamp(self, col):
        """(the element offset that moves column ``col`` into the map, the lanes
        mask saying whether it was inside: all lanes alike)."""
        b = self.b
        ok = self.inside(col)
        zero = ir.Constant(self.ity, 0)
        fixed = b.select(b.icmp_signed("<", col, zero), zero, b.select(
            ok, col, b.sub(self.clim, ir.Constant(self.ity, 1))))
        mty = ir.IntType(self.width)
        mask = b.bitcast(b.select(ok, ir.Constant(mty, -1), ir.Constant(mty, 0)),
                         ir.VectorType(ir.IntType(1), self.width))
        return b.mul(b.sub(fixed, col), self.cstride), mask


def _block_clamps(cols, k0, count, kw, mode):
    """:meth:`_Columns.clamp` of each column a block of ``count`` pixels from pixel
    ``k0`` reads with its ``kw`` taps, keyed (pixel, tap), or, where the pixel
    step is ``mode`` tap steps, by the column ``mode*pixel + tap`` they share."""
    out = {}
    for p in range(count):
        for j in range(kw):
            key = (p, j) if mode is None else mode * p + j
            if key not in out:
                k = cols.b.add(k0, ir.Constant(cols.ity, p))
                out[key] = cols.clamp(cols.column(k, j))
    return out


def _taps_dot(lanes):
    """:func:`_taps_dot_typed` on ``lanes`` lanes, as an intrinsic of its own name."""
    def taps_dot(typingctx, acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m,
                 taps):
        return _taps_dot_typed(lanes, acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep,
                               grow, n, m, taps)
    taps_dot.__name__ = taps_dot.__qualname__ = f"taps_dot{lanes}"
    taps_dot.__doc__ = _taps_dot_typed.__doc__
    return intrinsic(taps_dot)


def _taps_dot_typed(lanes, acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m,
                    taps):
    """For each tap t < ``taps`` (a compile-time constant):
    ``acc[a0 + t*astep : +lanes] += sum over rows r < m and pixels k < n of
    x[s0 + r*srow + k*sstep + toffs[t] : +lanes] * g[g0 + r*grow + k*gstep : +lanes]``.

    The filter gradient's inner loops over a block of rows of pixels with the
    ``taps`` sums held in registers throughout and each ``g`` vector loaded
    once for all taps: per pixel and tap one load and one fused multiply-add,
    where the loop LLVM builds from the scalar form stores every partial sum back
    to memory. (Summing row by row, with the sums stored and reloaded between
    rows, cost 10-16 % more on 7x7 and 14x14 maps.) Sums in row, then pixel
    order per lane (fused, one rounding per step)."""
    kt = _taps(taps)
    if kt is None:
        return None
    sig = types.void(acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m, taps)

    def codegen(context, builder, signature, args):
        _, a0v, astepv, _, s0v, sstepv, srowv, _, _, g0v, gstepv, growv, nv, mv, _ = args
        v = _Lanes(context, builder, signature, args, lanes)
        ity = s0v.type
        fma = v.fma()
        aoffs = [builder.add(a0v, builder.mul(astepv, ir.Constant(ity, t))) for t in range(kt)]
        toff = [v.scalar(7, ir.Constant(ity, t)) for t in range(kt)]

        def row(r, sums):
            xr = builder.add(s0v, builder.mul(r, srowv))
            gr = builder.add(g0v, builder.mul(r, growv))

            def pixel(k, sums):
                gk = v.load(8, builder.add(gr, builder.mul(k, gstepv)))
                xk = builder.add(xr, builder.mul(k, sstepv))
                return [builder.call(fma, [v.load(3, builder.add(xk, toff[t])), gk, sums[t]])
                        for t in range(kt)]
            return v.loop(nv, sums, pixel)

        sums = v.loop(mv, [v.load(0, a) for a in aoffs], row)
        for t in range(kt):
            v.store(sums[t], 0, aoffs[t])
        return context.get_dummy_value()

    return sig, codegen


#: :func:`_taps_dot_typed` on 8 lanes, and on 16 (two AVX2 registers; one with AVX-512).
taps_dot8 = _taps_dot(8)
taps_dot16 = _taps_dot(16)


@intrinsic
def sfence(typingctx):
    """Order the non-temporal stores made so far before any later store (x86
    ``sfence``; only where :data:`STREAMS`): once per part of a streaming
    kernel's jobs, so that no other thread reads a result still in a
    write-combining buffer."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                            "llvm.x86.sse.sfence")
        builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, a, i):
    """Ask for the cache line holding ``a[i]`` (a flat array) to be brought into
    the L2 cache (x86 ``prefetcht1``), without waiting for it."""
    if not isinstance(a, types.Array) or not isinstance(i, types.Integer):
        return None
    sig = types.void(a, i)

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        _prefetch_line(builder, builder.gep(arr.data, [context.cast(
            builder, args[1], signature.args[1], types.intp)]))
        return context.get_dummy_value()

    return sig, codegen


def _prefetch_line(builder, at):
    """:func:`prefetch` of the cache line holding the element at pointer ``at``."""
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]),
        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.bitcast(at, i8p), ir.Constant(_I32, 0), ir.Constant(_I32, 2),
                      ir.Constant(_I32, 1)])


# Output pixels a correlation intrinsic computes at once: independent sums in
# flight, and (stride and dilation 1) neighbours sharing their input loads.
BLOCK = 4

# Rows of 7 or 14 pixels (the 7x7 and 14x14 maps), and multiples of 7 for windows
# at least SEVEN_TAPS wide, go in blocks of 7 pixels at column steps of one
# pixel (the forward and input gradient at stride and dilation 1): no pixel
# computed twice (a row of 7 took two blocks of 4, 8 pixels), and each window
# row's weights loaded once for 7 pixels rather than 4. The same sums, each
# pixel's taps added in the same order. 2 threads, AMD Zen 4, blocks of 4 / 7,
# alternating processes, 3 rounds each (ms): N=32 7x7x1152 5x5 input gradient
# 0.64-0.73 / 0.50-0.54, forward 0.58-0.65 / 0.49-0.57; 14x14x384 7x7 forward
# 1.57-1.76 / 1.24-1.31, input gradient 1.68-1.99 / 1.39-1.67; 7x7x960 forward
# 0.24-0.25 / 0.20-0.23; 56x56x96 7x7 forward 9.6-10.0 / 6.6-6.8. N=8 7x7x1152
# 5x5 input gradient 0.157-0.163 / 0.131-0.141; 14x14x672 5x5 input gradient
# 0.35-0.43 / 0.32-0.33; 56x56x96 7x7 forward 1.48-1.54 / 1.19-1.21; 28x28x120
# 5x5 input gradient 0.28-0.38 / 0.25-0.26. Behind, both from memory: N=32
# 14x14x672 5x5 forward 1.70-1.77 / 1.70-1.89, 28x28x240 5x5 input gradient
# 2.5-2.7 / 2.9-3.3. 3x3 windows on rows of 28 and 56 pixels were even or mixed,
# and stay in blocks of 4. With AVX-512 only (SEVENS): a block of 7 holds 7 sums
# and a window row of up to 7 weights, with its inputs past AVX2's 16 registers;
# 16-lane groups of depth multiplier 1 only (:func:`taps_rows`).
SEVEN_BLOCK = 7
SEVEN_TAPS = 5

# How a block's taps map to input columns, by the pixel step over the column
# step m: pixel p's tap j reads column m*p + j (m = 1: the forward at stride and
# dilation 1; m = -1: the input gradient's gather, whose column step is
# negative; m = 2: the forward at stride 2); any other step (None) reads each
# tap on its own. A column read by several taps is loaded once. Stride 2, N=8,
# 2 threads, each tap on its own / m = 2 (ms): 56x56x72 5x5 0.33-0.36 / 0.25,
# 112x112x96 3x3 0.91-0.92 / 0.89-0.90, 56x56x144 3x3 0.37 / 0.35-0.36.
# Only one step matches a nonzero column step, so the order changes no result;
# m = -1 comes first because the strided input gradient's phases pass column
# step -C for pixel step C, a test LLVM folds to true, dropping the code of the
# other steps (cold compile of the 3x3, 5x5 and 7x7 strided input gradients
# 15.4 -> 10.1 s).
_STEPS = (-1, 1, 2, None)

# The steps ``taps_rows`` generates code for, by its ``steps`` argument: all of
# them (0), those of a forward (1: pixels a stride of one or more column steps
# apart) or those of a gather (-1: the input gradient's negative column steps).
# Any other step still takes the general code (None), so a set leaves out only
# code its callers never run: the stride-1 input gradient's row code, compiled
# with all the steps, took 13.8 s cold, 9.9 with the gather's (3x3, Zen 4).
_STEP_SETS = {0: _STEPS, 1: (1, 2, None), -1: (-1, None)}


def _wide_lanes():
    """float32 lanes of the host's widest vector registers that the intrinsics use:
    16 with AVX-512, else 8 (a 16-lane value would take two AVX2 registers, and a
    block's sums, inputs and weights no longer fit in the 16 of them)."""
    try:
        return 16 if llb.get_host_cpu_features().get("avx512f") else 8
    except Exception:  # pragma: no cover (no feature list)
        return 8


WIDE = _wide_lanes()

# Channel groups that each block of pixels of :func:`taps_rows` takes, one after
# the other, before the next block (``together``), rather than one group across
# the whole row: a block then reads its pixels' channels in order, which the
# hardware prefetchers follow. 2 threads, one group / 8 at a time (ms): N=32
# 112x112x32 forward 2.8-2.9 / 2.1-2.2, 28x28x192 forward 1.09-1.20 / 0.82-0.83,
# input gradient 1.07-1.10 / 0.81-0.99, 7x7x960 forward 0.34-0.35 / 0.28,
# 56x56x144 stride-2 input gradient 2.32-2.49 / 1.70-1.79; N=1 147x147x128
# forward 0.65 / 0.45-0.46. All the groups of a block was slower on 28x28x240
# 5x5 (N=32, 8 / all: 1.45 / 1.72-1.82), whose window rows then leave L1.
# Those were 16-lane groups (AVX-512): 128 channels, 512 bytes of each pixel.
# With AVX2's 8 lanes the count is doubled, the same 128 channels: 8 groups
# read half of each pixel, and the row was passed over twice. AMD Zen 3, 2
# threads, alternating processes (each with its own cache), 25 rounds, median
# of the per-round ratios 16 / 8 groups and its quartiles: N=1 147x147x128
# forward 0.83 (0.73-0.97), input gradient 0.78 (0.60-0.91); N=8 56x56x144
# 0.85 (0.80-0.95), 0.92 (0.79-0.99); 19x19x728 input gradient 0.82
# (0.56-1.02); 28x28x240 5x5 forward 0.85 (0.75-1.04); 14x14x672 5x5 input
# gradient 0.89 (0.69-1.14); 14x14x384 7x7 forward 0.89 (0.74-1.01); even:
# 112x112x32 (4 groups either way) 1.00 (0.74-1.23), 28x28x192 (24 groups)
# 0.99, 7x7x960 (rows of 7 pixels) 1.04 (0.91-1.17).
GROUPS = 128 // WIDE

#: Whether ``taps_rows`` takes blocks of ``SEVEN_BLOCK`` pixels: 32 vector registers.
SEVENS = WIDE == 16

#: The depth multipliers ``taps_rows`` reads an input for directly (each input
#: channel repeated for its output channels, in registers): those that divide
#: a vector of 8 lanes.
REPEATS = (1, 2, 4, 8)
_REPEATS = REPEATS

#: Whether the kernels may write with non-temporal stores (their fence,
#: :func:`sfence`, is an x86 instruction).
STREAMS = platform.machine().lower() in ("x86_64", "amd64")


def _host():
    """LLVM's name for the host's cores (``znver4``, ``emeraldrapids``, ...), or
    an empty string."""
    try:
        return llb.get_host_cpu_name()
    except Exception:  # pragma: no cover (no host name)
        return ""


#: LLVM's name for the host's cores: the hardware prefetchers differ from one
#: generation to the next, and with them which row reads the kernels ask for
#: themselves (``lanes._PREFETCH_BYTES``).
HOST = _host()

#: The host is an AMD Zen core, whose hardware prefetchers leave more of the
#: kernels' row reads to software requests than the Intel cores'.
ZEN = HOST.startswith("znver")

#: The host's hardware prefetchers keep up with the lane kernels' row reads
#: from the L3 and from memory alike (measured on Intel's Emerald Rapids, a VM
#: reporting a 300 MB L3): there the filter gradient does not ask for rows
#: ahead (``lanes._FILTER_ASKS``) and rows of any length stay on the lane
#: kernels at any size (``driver._by_lanes``).
KEEPS_UP = HOST == "emeraldrapids"


def _by_channels(make, offsets, channels_at, repeated, grouped, doc):
    """One intrinsic from the factory ``make(width)`` of typing functions whose
    argument ``channels_at`` counts channel groups of ``width`` lanes: it takes a
    channel count (a multiple of 8) there instead, and runs ``make(WIDE)``'s code
    on the groups of ``WIDE``, then ``make(8)``'s on a last 8 (the element offsets
    at ``offsets`` moved past the others). ``repeated``: None, or (offset,
    repeat): the offset argument into an array whose channels the compile-time
    argument ``repeat`` repeats, which moves past as many elements divided by
    it; ``grouped``: the same for an array holding ``repeat`` elements per
    channel, which moves past as many elements times ``repeat``."""
    wide, narrow = make(WIDE), make(8)

    def typer(typingctx, *args):
        typed = wide(typingctx, *args)
        if typed is None:
            return None
        sig, wide_code = typed
        narrow_code = narrow(typingctx, *args)[1]
        step = {i: (1, 1) for i in offsets}
        if repeated is not None:
            step[repeated[0]] = (1, _taps(args[repeated[1]]))
        if grouped is not None:
            step[grouped[0]] = (_taps(args[grouped[1]]), 1)

        def codegen(context, builder, signature, cargs):
            channels = cargs[channels_at]
            ity = channels.type
            groups = builder.sdiv(channels, ir.Constant(ity, WIDE))
            args_wide = list(cargs)
            args_wide[channels_at] = groups
            wide_code(context, builder, signature, args_wide)
            shift = builder.mul(groups, ir.Constant(ity, WIDE))
            args8 = list(cargs)
            args8[channels_at] = builder.sdiv(builder.sub(channels, shift), ir.Constant(ity, 8))
            for i in offsets:
                mul, div = step[i]
                moved = builder.sdiv(builder.mul(shift, ir.Constant(ity, mul)),
                                     ir.Constant(ity, div))
                args8[i] = builder.add(cargs[i], moved)
            narrow_code(context, builder, signature, args8)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = typer.__qualname__ = make.__name__.lstrip("_")
    typer.__doc__ = doc
    typer.__wrapped__ = wide    # its parameters: how Numba binds a call's arguments
    return intrinsic(typer)


def _taps_rows(width, pair=False):
    def taps_rows(typingctx, dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow,
                  wstep, n, rows, groups, kw, stream, edges, repeat, together, steps):
        return _taps_rows_typed(width, False, dst, d0, dstep, x, s0, sstep, rowstep, colstep,
                                wt, w0, wrow, wstep, n, rows, groups, kw, stream, edges, repeat,
                                together, steps)

    def taps_row_pairs(typingctx, dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0,
                       wrow, wstep, n, rows, groups, kw, stream, edges, repeat, together,
                       steps, drow):
        return _taps_rows_typed(width, True, dst, d0, dstep, x, s0, sstep, rowstep, colstep,
                                wt, w0, wrow, wstep, n, rows, groups, kw, stream, edges, repeat,
                                together, steps, drow)

    return taps_row_pairs if pair else taps_rows


def _taps_rows_typed(width, PAIR, *sigargs):
    """(signature, codegen) of :func:`taps_rows` (PAIR false) or of
    :func:`taps_row_pairs` (PAIR true: ``drow`` the last of ``sigargs``), or None
    for arguments they do not take."""
    (dst, d0, dstep, x, s0, sstep, rowstep, colstep, wt, w0, wrow, wstep, n, rows, groups,
     kw, stream, edges, repeat, together, steps) = sigargs[:21]
    KW, NT, REP, TOG = _taps(kw), _taps(stream), _taps(repeat), _taps(together)
    if KW is None or NT is None or REP not in _REPEATS or TOG is None or TOG == 0 or \
            _taps(steps) not in _STEP_SETS:
        return None
    STEPS = _STEP_SETS[_taps(steps)]
    # together < 0: chunks of -together groups, their blocks computed in pairs
    PAIRED, TOG = TOG < 0, abs(TOG)
    EDGES = _edges_typed(edges, 5)
    if EDGES is None:
        return None
    sig = types.void(*sigargs)

    def codegen(context, builder, signature, args):
        (_, d0v, dstepv, _, s0v, sstepv, rowv, colv, _, w0v, wrowv, wstepv, nv, rowsv, gv,
         _, _, edgesv, _, _, _) = args[:21]
        drowv = args[21] if PAIR else None
        v = _Lanes(context, builder, signature, args, width, floats=8)
        ity = s0v.type
        fma = v.fma()

        def const(i):
            return ir.Constant(ity, i)

        if EDGES:
            cols = _Columns(context, builder, edgesv, signature.args[17], 0, width)

        def clamps(k0, count, mode):
            """Per input vector a block loads, keyed as ``tap`` keys them:
            :meth:`_Columns.clamp` of its column."""
            return _block_clamps(cols, k0, count, KW, mode)

        def row_taps(base, wg, r, sums, count, mode, edge=None):
            """Add window row r's taps into the sums of ``count`` pixels from
            ``base``; ``sums`` None: the first row (the first product is rounded
            alone, as the scalar kernels' first term). ``edge`` (from
            :func:`clamps`): taps of columns outside the map leave their sums as
            they are."""
            return row_uses(base, wg, r, [(r, sums)], count, mode, edge)[0]

        def row_uses(base, wg, r, uses, count, mode, edge=None):
            """:func:`row_taps` of input row r for each (window row, sums) of
            ``uses``, each input vector loaded once for all of them."""
            rb = builder.add(base, builder.mul(r, rowv))
            if mode is None:
                def key(p, k):
                    return (p, k)

                def at(p, k):
                    return builder.add(rb, builder.add(builder.mul(const(p), sstepv),
                                                       builder.mul(const(k), colv)))
            else:
                def key(p, k):
                    return mode * p + k

                def at(p, k):
                    return builder.add(rb, builder.mul(const(key(p, k)), colv))
            loaded = {}

            def tap(p, k):
                if key(p, k) not in loaded:
                    off = at(p, k)
                    if edge is not None:
                        off = builder.add(off, edge[key(p, k)][0])
                    loaded[key(p, k)] = v.value(3, off, REP)
                return loaded[key(p, k)]
            outs = []
            for wr_at, sums in uses:
                wr = builder.add(wg, builder.mul(wr_at, wrowv))
                ws = [v.load(8, builder.add(wr, builder.mul(const(k), wstepv)))
                      for k in range(KW)]
                out = list(sums) if sums is not None else [None] * count
                for k in range(KW):
                    for p in range(count):
                        t = tap(p, k)
                        if sums is None and k == 0:
                            out[p] = builder.fmul(t, ws[k])
                            continue
                        new = builder.call(fma, [t, ws[k], out[p]])
                        out[p] = new if edge is None else builder.select(
                            edge[key(p, k)][1], new, out[p])
                outs.append(out)
            return outs

        def group(k0, gs, count, mode, masked=False):
            """The block of ``count`` pixels from k0 in each channel group of
            ``gs``, their sums side by side (independent chains of
            multiply-adds, each in the order of its taps)."""
            gs = gs if isinstance(gs, list) else [gs]
            goffs = [builder.mul(g, const(width)) for g in gs]
            bases = [builder.add(builder.add(s0v, builder.mul(g, const(width // REP))),
                                 builder.mul(k0, sstepv)) for g in gs]
            wgs = [builder.add(w0v, goff) for goff in goffs]

            def rows_of(r, sums, edge=None):
                out = []
                for i, (base, wg) in enumerate(zip(bases, wgs)):
                    out += row_taps(base, wg, r, None if sums is None else
                                    sums[i * count:(i + 1) * count], count, mode, edge)
                return out
            if PAIR:
                # two output rows, the second's window one input row further
                # down: each input row loaded once for both. Every sum starts at
                # -0 (fma(x, w, -0) is x*w rounded alone, to the bit)
                edge = clamps(k0, count, mode) if masked else None
                nsums = count * len(gs)
                zero = [ir.Constant(v.vty, [-0.0] * width)] * nsums

                def both(r, uses):
                    """Input row r into each (window row, sums) of ``uses``."""
                    outs = [[] for _ in uses]
                    for i, (base, wg) in enumerate(zip(bases, wgs)):
                        got = row_uses(base, wg, r, [
                            (wr_at, sums[i * count:(i + 1) * count])
                            for wr_at, sums in uses], count, mode, edge)
                        for o, g in zip(outs, got):
                            o += g
                    return outs
                first = both(const(0), [(const(0), zero)])[0]

                def middle(r, sums):
                    r1 = builder.add(r, const(1))
                    a, b = both(r1, [(r1, sums[:nsums]), (r, sums[nsums:])])
                    return a + b
                sums = v.loop(builder.sub(rowsv, const(1)), first + zero, middle)
                last = builder.sub(rowsv, const(1))
                tail = both(rowsv, [(last, sums[nsums:])])[0]
                rows_out = [(d0v, sums[:nsums]), (builder.add(d0v, drowv), tail)]
            elif masked:
                # every sum starts at -0 and takes each tap inside by a fused
                # multiply-add: fma(x, w, -0) is x*w rounded alone, to the bit
                edge = clamps(k0, count, mode)
                start = [ir.Constant(v.vty, [-0.0] * width)] * (count * len(gs))
                sums = v.loop(rowsv, start, lambda r, sums: rows_of(r, sums, edge))
                rows_out = [(d0v, sums)]
            else:
                sums = v.loop(builder.sub(rowsv, const(1)), rows_of(const(0), None),
                              lambda r, sums: rows_of(builder.add(r, const(1)), sums))
                rows_out = [(d0v, sums)]
            for dbase, sums in rows_out:
                for i, goff in enumerate(goffs):
                    dg = builder.add(dbase, goff)
                    for p in range(count):
                        k = builder.add(k0, const(p))
                        v.put(sums[i * count + p], 0,
                              builder.add(dg, builder.mul(k, dstepv)), NT)
            return []

        def checked(k0, g, count, mode):
            """:func:`group`, masked where the block's windows reach past the
            edges (the first and last taps of its first and last pixels: the
            extreme columns)."""
            if not EDGES:
                return group(k0, g, count, mode)
            last = builder.add(k0, const(count - 1))
            ends = [cols.inside(cols.column(k, j)) for k in (k0, last) for j in (0, KW - 1)]
            whole = ends[0]
            for e in ends[1:]:
                whole = builder.and_(whole, e)
            with builder.if_else(whole) as (hit, miss):
                with hit:
                    group(k0, g, count, mode)
                with miss:
                    group(k0, g, count, mode, True)
            return []

        # two groups' blocks side by side: 8 chains of multiply-adds in flight
        # (registers for 8 sums and 2 window rows of weights: AVX-512's 32)
        PAIRS = width == 16 and PAIRED and not PAIR

        def layout(size):
            """(blocks, singles, block_start) of blocks of ``size`` pixels:
            ceil(n / size) blocks, the last one ending at pixel n (it overlaps
            the one before and stores the same values again, as each pixel's
            sums are formed the same way in any block): no single-pixel tail,
            whose chain of dependent multiply-adds cost up to a third of a
            56-pixel row; single pixels only when n < size."""
            full = builder.icmp_signed(">=", nv, const(size))
            blocks = builder.select(full, builder.sdiv(builder.add(nv, const(size - 1)),
                                                       const(size)), const(0))
            singles = builder.select(full, const(0), nv)
            last = builder.sub(nv, const(size))

            def block_start(j):
                k = builder.mul(j, const(size))
                return builder.select(builder.icmp_signed("<", k, last), k, last)
            return blocks, singles, block_start

        def run(mode, size=BLOCK):
            blocks, singles, block_start = layout(size)
            if TOG == 1:
                # one group at a time across the row, in loops of its own: the
                # loops below with chunks of one group ran the 5x5 stride-2
                # phases 1.1-1.4x slower (32x56x72: 1.30 / 1.46-1.78 ms)
                def one(g, _):
                    v.loop(blocks, [], lambda j, _: checked(block_start(j), g, size, mode))
                    v.loop(singles, [], lambda j, _: checked(j, g, 1, None))
                    return []
                v.loop(gv, [], one)
                return
            per = const(TOG)

            def groups_of(c, fn, paired):
                g0 = builder.mul(c, per)
                left = builder.sub(gv, g0)
                count = builder.select(builder.icmp_signed("<", left, per), left, per)
                if not paired:
                    v.loop(count, [], lambda i, _: fn(builder.add(g0, i)))
                    return []
                two = const(2)
                pairs = builder.sdiv(count, two)
                v.loop(pairs, [], lambda i, _: fn(
                    [builder.add(g0, builder.mul(i, two)),
                     builder.add(g0, builder.add(builder.mul(i, two), const(1)))]))
                v.loop(builder.sub(count, builder.mul(pairs, two)), [],
                       lambda i, _: fn(builder.add(g0, builder.sub(count, const(1)))))
                return []

            def across(c, paired):
                v.loop(blocks, [], lambda j, _: groups_of(
                    c, lambda g: checked(block_start(j), g, size, mode), paired))
                v.loop(singles, [], lambda j, _: groups_of(
                    c, lambda g: checked(j, g, 1, None), paired))
                return []
            chunks = builder.sdiv(builder.add(gv, const(TOG - 1)), per)
            # blocks of 7 one group at a time: paired, their 14 sums left little
            # room (N=8 14x14x672 5x5 forward 0.31-0.38 -> 0.30-0.37 ms unpaired,
            # 14x14x384 7x7 0.34-0.44 -> 0.32-0.38; N=32 even)
            v.loop(chunks, [], lambda c, _: across(c, PAIRS and size != SEVEN_BLOCK))

        def sevens(kw):
            """Whether the row takes blocks of SEVEN_BLOCK pixels (at column steps of
            one pixel): rows of 7 or 14 pixels, or, for windows at least
            SEVEN_TAPS wide, any multiple of 7 pixels."""
            if kw >= SEVEN_TAPS:
                return builder.icmp_signed("==", builder.srem(nv, const(SEVEN_BLOCK)),
                                           const(0))
            return builder.or_(builder.icmp_signed("==", nv, const(SEVEN_BLOCK)),
                               builder.icmp_signed("==", nv, const(2 * SEVEN_BLOCK)))

        def dispatch(modes):
            if modes[0] is None:
                run(None)
                return
            step = builder.mul(colv, const(modes[0]))
            with builder.if_else(builder.icmp_signed("==", sstepv, step)) as (hit, miss):
                with hit:
                    # not for the 8-lane tail group or a multiplier's repeats: code
                    # to compile for little of the work
                    if SEVENS and width == WIDE and REP == 1 and modes[0] in (-1, 1) and not PAIR:
                        with builder.if_else(sevens(KW)) as (seven, other):
                            with seven:
                                run(modes[0], SEVEN_BLOCK)
                            with other:
                                run(modes[0])
                    else:
                        run(modes[0])
                with miss:
                    dispatch(modes[1:])

        dispatch(STEPS)
        return context.get_dummy_value()

    return sig, codegen


def _taps_row_pairs(width):
    return _taps_rows(width, True)


def _taps_window(width):
    def taps_window(typingctx, dst, d0, x, s0, rowstep, colstep, wt, w0, wrow, wstep, rows,
                    cols, groups, stream):
        NT = _taps(stream)
        if NT is None:
            return None
        sig = types.void(dst, d0, x, s0, rowstep, colstep, wt, w0, wrow, wstep, rows, cols,
                         groups, stream)

        def codegen(context, builder, signature, args):
            _, d0v, _, s0v, rowv, colv, _, w0v, wrowv, wstepv, rowsv, colsv, gv, _ = args
            v = _Lanes(context, builder, signature, args, width, floats=6)
            ity = s0v.type
            fma = v.fma()
            one = ir.Constant(ity, 1)

            def groups(g0, count):
                """Groups g0 .. g0 + count - 1, their sums side by side (independent
                chains of fused multiply-adds in flight)."""
                offs = [builder.mul(builder.add(g0, ir.Constant(ity, k)),
                                    ir.Constant(ity, width)) for k in range(count)]

                def taps(r, j):
                    xo = builder.add(s0v, builder.add(builder.mul(r, rowv), builder.mul(j, colv)))
                    wo = builder.add(w0v, builder.add(builder.mul(r, wrowv),
                                                      builder.mul(j, wstepv)))
                    return [(v.value(2, builder.add(xo, o)), v.load(6, builder.add(wo, o)))
                            for o in offs]

                def add(r, j, acc):
                    return [builder.call(fma, [xv, wv, a]) for (xv, wv), a in zip(taps(r, j), acc)]

                zero = ir.Constant(ity, 0)
                first = [builder.fmul(xv, wv) for xv, wv in taps(zero, zero)]
                acc = v.loop(builder.sub(colsv, one), first,
                             lambda j, acc: add(zero, builder.add(j, one), acc))
                acc = v.loop(builder.sub(rowsv, one), acc,
                             lambda r, acc: v.loop(colsv, acc,
                                                   lambda j, a: add(builder.add(r, one), j, a)))
                for o, a in zip(offs, acc):
                    v.put(a, 0, builder.add(d0v, o), NT)
                return []

            quads = builder.sdiv(gv, ir.Constant(ity, 4))
            v.loop(quads, [], lambda q, _: groups(builder.mul(q, ir.Constant(ity, 4)), 4))
            rest = builder.mul(quads, ir.Constant(ity, 4))
            v.loop(builder.sub(gv, rest), [], lambda g, _: groups(builder.add(rest, g), 1))
            return context.get_dummy_value()

        return sig, codegen

    return taps_window


# Most sums ``dots_rows`` holds in registers for two channel groups a block of
# pixels takes together (their taps' sums side by side), rather than one group
# across the row and then the next: a block then reads its pixels' channels in
# order, and the sums' chains of multiply-adds interleave. 2 threads, one group
# / pairs (ms): N=32 112x112x32 3.0-3.2 / 2.9, 28x28x192 1.09-1.14 / 0.90-0.95;
# N=8 112x112x32 0.67-0.82 / 0.55-0.64, 112x112x96 stride 2 1.15-1.20 /
# 0.92-1.10. 5x5 windows (50 sums) would spill.
_PAIRED_SUMS = 18
# The same bound for whole windows at column steps of two and for windows taken
# one row at a time. With AVX2's 16 registers a pair of 3x3 windows at steps of
# two (18 sums) and of 7-tap window rows (14) spilled, and one group at a time
# was faster; at steps of one whole 3x3 windows kept their pairs (AMD Zen 3,
# filter gradient, 2 threads, alternating processes, median per-round ratio of
# 11-15 rounds, one group / pairs, three runs: 8x56x56x144 stride 2 0.75, 0.76,
# 0.81; 8x112x112x96 stride 2 0.83; 8x56x56x96 7x7 0.81, 0.85, 0.77; 8x14x14x384
# 7x7 0.89, 0.86; 32x56x56x144 stride 2 0.89, 1.02; whole 3x3 windows at steps
# of one mixed, from memory slower: N=32 112x112x32 1.08, 1.26, 28x28x192 1.13,
# 1.14). 5-tap rows (10 sums) keep their pairs (28x28x240 5x5, one group:
# 1.47). Rows of one group whose sums fit the bound still ask ahead.
_FEW_PAIRED_SUMS = 18 if WIDE == 16 else 10
# Rows of exactly SEVEN_BLOCK pixels (7x7 maps) at column steps of one, with
# windows 3 columns wide, take one block of 7 pixels, its edge pixels masked,
# one channel group at a time: in blocks of BLOCK pixels, pairs of groups, such
# a row took a block of 4, then 3 pixels alone (the 2 on the map's edges
# masked), each loading its 3 taps' inputs, where a block shares them. The same
# products in the same order, so the same bits. Zen 4, 2 threads, NHWC, the
# two in one process (two copies of the package), alternating, medians of 80
# rounds, this / before: 7x7x960 N=32 0.855, N=8 0.875, N=1 0.857; 14x14x384
# N=8, 28x28x192 N=8, 56x56x144 N=1, 112x112x32 N=4 1.00-1.01 (untouched: the
# forward's control 1.00-1.06). Rows of 14 pixels as two blocks of 7 lost
# (14x14x384 N=8 0.80 of its time kept by pairs, 14x14x576 N=8 0.80, N=1 0.85).
# With AVX2's 8 lanes too (AMD Zen 3, 2 threads, alternating processes, median
# per-round ratio, this / pairs: 7x7x960 N=8 0.75, 0.86, N=32 0.62, N=1 0.75).
_DOTS_SEVEN = True


def _dots_rows(width):
    def dots_rows(typingctx, acc, a0, astep, x, s0, sstep, rowstep, colstep, g, g0, gstep, n,
                  groups, rows, kw, repeat, edges, lines, xline, gline, asks):
        ROWS, KW, REP = _taps(rows), _taps(kw), _taps(repeat)
        EDGES = _edges_typed(edges, 7)
        if ROWS is None or KW is None or REP not in _REPEATS or EDGES is None or not (
                isinstance(asks, types.UniTuple) and asks.count == 4
                and isinstance(asks.dtype, types.Integer)):
            return None
        sig = types.void(acc, a0, astep, x, s0, sstep, rowstep, colstep, g, g0, gstep, n,
                         groups, rows, kw, repeat, edges, lines, xline, gline, asks)

        def codegen(context, builder, signature, args):
            (_, a0v, astepv, _, s0v, sstepv, rowv, colv, _, g0v, gstepv, nv, gv, _, _,
             _, edgesv, linesv, xlinev, glinev, asksv) = args
            v = _Lanes(context, builder, signature, args, width)
            ity = s0v.type
            fma = v.fma()

            def const(i):
                return ir.Constant(ity, i)

            if EDGES:
                # pixels [lo, hi) have every tap inside; the others are masked
                lo, hi = (context.cast(builder, builder.extract_value(edgesv, i),
                                       edges[i], types.intp) for i in (0, 1))
                columns = _Columns(context, builder, edgesv, edges, 2, width)
            else:
                lo, hi = const(0), nv

            def pixels(xg, gg, k0, count, mode, sums, masked=False):
                dys = [v.value(8, builder.add(gg, builder.mul(builder.add(k0, const(p)),
                                                              gstepv)))
                       for p in range(count)]
                base = builder.add(xg, builder.mul(k0, sstepv))
                edge = _block_clamps(columns, k0, count, KW, mode) if masked else None
                out = list(sums)
                for r in range(ROWS):
                    rb = builder.add(base, builder.mul(const(r), rowv))
                    cols = {}

                    def tap(p, j):
                        key = (p, j) if mode is None else mode * p + j
                        if key in cols:
                            return cols[key]
                        if mode is None:
                            off = builder.add(rb, builder.add(
                                builder.mul(const(p), sstepv), builder.mul(const(j), colv)))
                        else:
                            off = builder.add(rb, builder.mul(const(key), colv))
                        if edge is not None:
                            off = builder.add(off, edge[key][0])
                        cols[key] = v.value(3, off, REP)
                        return cols[key]
                    for p in range(count):
                        for j in range(KW):
                            t = r * KW + j
                            new = builder.call(fma, [tap(p, j), dys[p], out[t]])
                            out[t] = new if edge is None else builder.select(
                                edge[(p, j) if mode is None else mode * p + j][1], new, out[t])
                return out

            blocks = builder.sdiv(builder.sub(hi, lo), const(BLOCK))
            done = builder.add(lo, builder.mul(blocks, const(BLOCK)))
            bounds = [tuple(context.cast(builder, builder.extract_value(asksv, k), asks.dtype,
                                         types.intp) for k in (i, i + 1)) for i in (0, 2)]
            any_asks = builder.or_(*(builder.icmp_signed("<", a, b) for a, b in bounds))

            def asker(units):
                """ask(t): block t's share of the asks, x[xa:xb] and g[ga:gb] in
                equal shares of whole lines, one before each block of each line
                of each of ``units`` (a pair of groups or one alone)."""
                shares = builder.mul(builder.mul(units, linesv), blocks)
                shares = builder.select(builder.icmp_signed(">", shares, const(0)), shares,
                                        const(1))
                asking = []
                for arg, (lo_, hi_) in zip((3, 8), bounds):
                    per = const(64 // v.itemsize(arg))
                    lo_ = builder.sub(lo_, builder.srem(lo_, per))
                    count = builder.sdiv(builder.add(builder.sub(hi_, lo_),
                                                     builder.sub(per, const(1))), per)
                    share = builder.mul(builder.sdiv(builder.add(count, builder.sub(
                        shares, const(1))), shares), per)
                    asking.append((arg, lo_, hi_, share))

                def ask(t):
                    for arg, lo_, hi_, share in asking:
                        a = builder.add(lo_, builder.mul(t, share))
                        b = builder.add(a, share)
                        v.ask(arg, a, builder.select(builder.icmp_signed("<", b, hi_), b, hi_))
                return ask

            def groups_at(gis, mode, unit, ask, seven=False):
                goffs = [builder.mul(gi, const(width)) for gi in gis]
                aoffs = [builder.add(builder.add(a0v, goff), builder.mul(const(t), astepv))
                         for goff in goffs for t in range(ROWS * KW)]
                at = [(builder.add(s0v, builder.mul(gi, const(width // REP))),
                       builder.add(g0v, goff)) for gi, goff in zip(gis, goffs)]
                sums = [v.load(0, a) for a in aoffs]
                taps = ROWS * KW

                def line(o, sums):
                    here = [(builder.add(xg, builder.mul(o, xlinev)),
                             builder.add(gg, builder.mul(o, glinev))) for xg, gg in at]

                    def each(k0, count, mode, s, masked=False):
                        out = []
                        for i, (xg, gg) in enumerate(here):
                            out += pixels(xg, gg, k0, count, mode, s[i * taps:(i + 1) * taps],
                                          masked)
                        return out

                    if seven:
                        # a row of SEVEN_BLOCK pixels: one block, its edge pixels masked
                        return each(const(0), SEVEN_BLOCK, mode, sums, EDGES)
                    if EDGES:
                        # the pixels before the interior, one at a time, masked
                        sums = v.loop(lo, sums, lambda j, s: each(j, 1, None, s, True))

                    def block(j, s):
                        return each(builder.add(lo, builder.mul(j, const(BLOCK))), BLOCK,
                                    mode, s)

                    def asking(j, s):
                        ask(builder.add(builder.mul(builder.add(builder.mul(unit, linesv), o),
                                                    blocks), j))
                        return block(j, s)
                    sums = v.loop(blocks, sums, block if ask is None else asking)
                    sums = v.loop(builder.sub(hi, done), sums, lambda j, s: each(
                        builder.add(done, j), 1, None, s))
                    if EDGES:
                        sums = v.loop(builder.sub(nv, hi), sums, lambda j, s: each(
                            builder.add(hi, j), 1, None, s, True))
                    return sums

                sums = v.loop(linesv, sums, line)
                for a_, s in zip(aoffs, sums):
                    v.store(s, 0, a_)
                return []

            def sevens():
                """Rows of SEVEN_BLOCK pixels at column steps of one: a block each,
                one channel group at a time (a pair's 18 sums and 14 gradient
                vectors would fill AVX-512's 32 registers)."""
                v.loop(gv, [], lambda i, _: groups_at([i], 1, None, None, True))

            def units_of(mode, pair, ask):
                """The row's channel groups in units of a pair of groups (``pair``)
                or one alone, each unit across the row; ``ask``: ``asker``."""
                units = builder.sdiv(gv, const(2)) if pair else gv
                ask = None if ask is None else ask(units)

                def at(i):
                    if not pair:
                        return [i]
                    return [builder.mul(i, const(2)),
                            builder.add(builder.mul(i, const(2)), const(1))]
                v.loop(units, [], lambda i, _: groups_at(at(i), mode, i, ask))
                if pair:
                    first = builder.mul(units, const(2))
                    v.loop(builder.sub(gv, first), [], lambda i, _: groups_at(
                        [builder.add(first, i)], mode, None, None))

            def every(mode):
                bound = _PAIRED_SUMS if mode == 1 and ROWS > 1 else _FEW_PAIRED_SUMS
                pair = mode is not None and 2 * ROWS * KW <= bound
                if mode in (1, 2) and width == WIDE and ROWS * KW <= bound:
                    # the units again, asking, for rows that ask (at steps 1
                    # and 2 only: code to compile again): in the blocks' loop
                    # the asks' arithmetic alone cost stride-2 rows a quarter,
                    # a branch per pair 8 % on 14x14 maps
                    with builder.if_else(any_asks) as (asking, quiet):
                        with asking:
                            units_of(mode, pair, asker)
                        with quiet:
                            units_of(mode, pair, None)
                else:
                    units_of(mode, pair, None)

            with builder.if_else(builder.icmp_signed("==", sstepv, colv)) as (hit, miss):
                with hit:
                    if _DOTS_SEVEN and KW == 3 and width == WIDE:
                        # (rows that ask keep their loops: the requests ride on them)
                        wanted = builder.and_(builder.icmp_signed("==", nv, const(SEVEN_BLOCK)),
                                              builder.not_(any_asks))
                        with builder.if_else(wanted) as (seven, other):
                            with seven:
                                sevens()
                            with other:
                                every(1)
                    else:
                        every(1)
                with miss:
                    two = builder.icmp_signed("==", sstepv, builder.mul(colv, const(2)))
                    with builder.if_else(two) as (hit2, miss2):
                        with hit2:
                            every(2)
                        with miss2:
                            every(None)
            return context.get_dummy_value()

        return sig, codegen

    return dots_rows


def _dots_window(width):
    def dots_window(typingctx, acc, a0, arow, astep, x, s0, rowstep, colstep, g, g0, rows, cols,
                    groups, repeat):
        REP = _taps(repeat)
        if REP not in _REPEATS:
            return None
        sig = types.void(acc, a0, arow, astep, x, s0, rowstep, colstep, g, g0, rows, cols,
                         groups, repeat)

        def codegen(context, builder, signature, args):
            _, a0v, arowv, astepv, _, s0v, rowv, colv, _, g0v, rowsv, colsv, gv, _ = args
            v = _Lanes(context, builder, signature, args, width)
            ity = s0v.type
            fma = v.fma()

            def const(i):
                return ir.Constant(ity, i)

            def groups_at(q0, count):
                offs = [builder.mul(builder.add(q0, const(k)), const(width))
                        for k in range(count)]
                dys = [v.value(8, builder.add(g0v, o)) for o in offs]

                def tap(r, j, _):
                    xo = builder.add(s0v, builder.add(builder.mul(r, rowv), builder.mul(j, colv)))
                    ao = builder.add(a0v, builder.add(builder.mul(r, arowv),
                                                      builder.mul(j, astepv)))
                    for o, d in zip(offs, dys):
                        at = builder.add(ao, o)
                        xv = v.value(4, builder.add(xo, builder.sdiv(o, const(REP))), REP)
                        v.store(builder.call(fma, [xv, d, v.load(0, at)]), 0, at)
                    return []

                v.loop(rowsv, [], lambda r, _: v.loop(colsv, [], lambda j, c: tap(r, j, c)))
                return []

            quads = builder.sdiv(gv, const(4))
            v.loop(quads, [], lambda q, _: groups_at(builder.mul(q, const(4)), 4))
            rest = builder.mul(quads, const(4))
            v.loop(builder.sub(gv, rest), [], lambda k, _: groups_at(builder.add(rest, k), 1))
            return context.get_dummy_value()

        return sig, codegen

    return dots_window


def _sum_groups(width):
    def sum_groups(typingctx, dst, d0, dstep, src, s0, sstep, n, groups, repeat, stream):
        REP, NT = _taps(repeat), _taps(stream)
        if REP not in _REPEATS or NT is None:
            return None
        sig = types.void(dst, d0, dstep, src, s0, sstep, n, groups, repeat, stream)

        def codegen(context, builder, signature, args):
            _, d0v, dstepv, _, s0v, sstepv, nv, gv, _, _ = args
            v = _Lanes(context, builder, signature, args, width, floats=3)
            ity = s0v.type

            def const(i):
                return ir.Constant(ity, i)

            def pick(vecs, idx):
                """The elements ``idx`` (ascending, counted from the first lane of
                ``vecs[0]``) of the vectors ``vecs``, as one vector: a shuffle of the
                two vectors they lie in, or two halves picked so and joined."""
                lo, hi = idx[0] // width, idx[-1] // width
                if hi - lo <= 1:
                    a = vecs[lo]
                    b = vecs[hi] if hi > lo else a
                    mask = ir.Constant(ir.VectorType(_I32, len(idx)),
                                       [k - lo * width for k in idx])
                    return builder.shuffle_vector(a, b, mask)
                h = len(idx) // 2
                a, b = pick(vecs, idx[:h]), pick(vecs, idx[h:])
                return builder.shuffle_vector(
                    a, b, ir.Constant(ir.VectorType(_I32, len(idx)), list(range(len(idx)))))

            def group(g, src0, dst0):
                at = builder.add(src0, builder.mul(g, const(width * REP)))
                vecs = [v.load(3, builder.add(at, const(i * width))) for i in range(REP)]
                total = None
                for m in range(REP):
                    part = pick(vecs, [lane * REP + m for lane in range(width)])
                    total = part if total is None else builder.fadd(total, part)
                v.put(total, 0, builder.add(dst0, builder.mul(g, const(width))), NT)
                return []

            def pixel(k, _):
                src0 = builder.add(s0v, builder.mul(k, sstepv))
                dst0 = builder.add(d0v, builder.mul(k, dstepv))
                v.loop(gv, [], lambda g, _: group(g, src0, dst0))
                return []

            v.loop(nv, [], pixel)
            return context.get_dummy_value()

        return sig, codegen

    return sum_groups


#: Per intrinsic: its factory, the arguments that are element offsets into the
#: channel-carrying arrays, the argument holding the channel count, (offset,
#: repeat) for an input whose channels a depth multiplier repeats, and (offset,
#: repeat) for one holding ``repeat`` elements per channel.
CHANNEL_ARGS = {
    "taps_rows": (_taps_rows, (1, 4, 9), 14, (4, 18), None),
    "taps_row_pairs": (_taps_row_pairs, (1, 4, 9), 14, (4, 18), None),
    "taps_window": (_taps_window, (1, 3, 7), 12, None, None),
    "dots_rows": (_dots_rows, (1, 4, 9), 12, (4, 15), None),
    "dots_window": (_dots_window, (1, 5, 9), 12, (5, 13), None),
    "sum_groups": (_sum_groups, (1, 4), 7, None, (4, 8)),
}

taps_rows = _by_channels(*CHANNEL_ARGS["taps_rows"], """For each pixel k < n and channel c < channels (a multiple of 8; as vectors):
    ``dst[d0 + c + k*dstep] = sum over window rows r < rows and columns j < kw of``
    ``x[s0 + c + k*sstep + r*rowstep + j*colstep] * wt[w0 + c + r*wrow + j*wstep]``,
    ``kw`` a compile-time constant, ``rows`` >= 1; ``stream`` (a compile-time 0
    or 1): non-temporal stores, for results too large to stay in the caches
    (every store must then be aligned to the vector's size: float32 results, a
    64-byte-aligned ``dst`` and offsets, strides and a channel count that keep
    each group's vector on one; the caller orders them with :func:`sfence`).
    ``edges``: None when every tap lies inside the map, or ``(c0, cpix, ctap,
    width, cstride)``: pixel k's tap j reads map column ``c0 + k*cpix +
    j*ctap``, columns ``cstride`` elements apart, and the taps of columns outside
    [0, width) are left out of the sums (each pixel must keep one inside).
    ``repeat`` (a compile-time 1, 2, 4 or 8): x holds a depth multiplier's
    input, whose channel ``c // repeat`` output channel c sees (``s0`` and the
    steps count x's own elements; each vector of x is read as lanes / repeat
    elements repeated in registers). ``together`` (a compile-time count): the
    channel groups each block of pixels takes before the next block (1: one
    group at a time across the whole row; see ``GROUPS``); negative: as many
    as its magnitude, two groups' blocks side by side with 16 lanes (8
    independent chains of multiply-adds, where one block's 4 leave FMA units
    idle: the lane kernels' short rows of 5x5 and 7x7 windows). ``steps`` (a
    compile-time 0, 1 or -1): the pixel steps, in column steps, whose blocks
    share input loads that code is generated for (``_STEP_SETS``: all, a
    forward's 1 and 2, a gather's -1); other steps take the general code.

    A correlation's inner loops over a row of pixels, ``together`` groups of 16
    (then 8) channels at a time: blocks of ``BLOCK`` pixels whose sums stay in
    registers through the window; each window row's weights loaded once per block
    and, where the pixel step is 1 or -1 column steps, each input vector loaded once
    for all the block's taps that read it. Per tap and pixel one fused multiply-add,
    in (row, column) order, the first product rounded alone: the channels-last
    kernels' sums (:func:`fma`). Blocks whose windows the edges cut load a column
    inside in place of each one outside and keep their sums with a lanes mask (a
    masked multiply-add), from -0 (so that the first product is still rounded
    alone). 16-bit operands and results may be bit patterns (:func:`.halves.value`;
    results rounded to nearest even as stored).""")

taps_row_pairs = _by_channels(*CHANNEL_ARGS["taps_row_pairs"], """:func:`taps_rows` for two
    output rows at once, the second at ``dst[d0 + drow]`` whose window sits one
    ``rowstep`` further down (``rows`` + 1 input rows, each loaded once for both;
    ``rows`` >= 1). The same sums as two calls of :func:`taps_rows`.""")

taps_window = _by_channels(*CHANNEL_ARGS["taps_window"], """For each channel c < channels (a multiple of 8; as vectors):
    ``dst[d0 + c] = sum over rows r < rows and columns j < cols of``
    ``x[s0 + c + r*rowstep + j*colstep] * wt[w0 + c + r*wrow + j*wstep]``,
    ``rows``, ``cols`` >= 1: one output pixel whose window the map's edges cut,
    summed as :func:`taps_rows` sums (fused, in (row, column) order, the first
    product rounded alone), four channel groups side by side; ``stream`` as in
    :func:`taps_rows`.""")

dots_rows = _by_channels(*CHANNEL_ARGS["dots_rows"], """For each channel c < channels (a multiple of 8; as vectors), window row r <
    rows and column j < kw (compile-time constants):
    ``acc[a0 + c + (r*kw + j)*astep] += sum over lines i < lines and pixels k < n of``
    ``x[s0 + c + i*xline + k*sstep + r*rowstep + j*colstep] *``
    ``g[g0 + c + i*gline + k*gstep]``.

    The filter gradient's inner loops over ``lines`` rows of output pixels
    (``edges`` the same for each): the taps' sums held in registers from the
    first row's first pixel to the last row's last (for two channel
    groups at a time where they fit, ``_PAIRED_SUMS``), each output-gradient
    vector loaded once for all taps and, where the pixel step is one or two
    column steps, each input vector once for all the taps of a block of
    ``BLOCK`` pixels that read it (rows of 7 pixels at column steps of one
    and windows 3 columns wide: one block of 7, a group at a time, its edge
    pixels masked; ``_DOTS_SEVEN``). Fused multiply-adds in (line,
    pixel) order per tap and lane. 16-bit operands may be bit patterns (:func:`.halves.value`).
    ``repeat``: as in :func:`taps_rows`, for x.

    ``edges``: None, or (lo, hi, c0, cpix, ctap, clim, cstride): the sum leaves
    out the taps that fall outside a map's columns, pixel k's tap j reading
    column ``c0 + k*cpix + j*ctap`` of ``clim`` (``cstride`` elements apart;
    the x offsets then point at the column, inside the map or not). Pixels [lo,
    hi) must have every tap inside; the others are summed one at a time, their
    taps outside loaded from a column inside and left out of the sums by a
    mask, so that a map's side pixels join the sums in registers, in pixel
    order, with the pixels between them.

    ``asks``: (xa, xb, ga, gb), the cache lines of ``x[xa:xb]`` and ``g[ga:gb]``
    to ask for (:func:`prefetch`) in equal shares before each block of pixels,
    where pixels step one or two column steps and groups go in pairs (in the
    16-lane code on AVX-512 hosts: the 8-lane tail group does not ask); (0,
    0, 0, 0) asks for none. A loop of its own, so that rows that do not ask
    run the loop as before.""")

dots_window = _by_channels(*CHANNEL_ARGS["dots_window"], """For each channel c < channels (a multiple of 8; as vectors), row r < rows and
    column j < cols: ``acc[a0 + c + r*arow + j*astep] +=``
    ``x[s0 + c + r*rowstep + j*colstep] * g[g0 + c]``: one output-gradient pixel
    whose window the map's edges cut, into the filter gradient's sums (fused,
    four channel groups side by side); ``repeat``: as in :func:`taps_rows`, for
    x.""")

sum_groups = _by_channels(*CHANNEL_ARGS["sum_groups"], """For each pixel k < n and channel c < channels (a multiple of 8; as vectors):
    ``dst[d0 + c + k*dstep] = src[s0 + c*repeat + k*sstep] + src[s0 + c*repeat + 1 +
    k*sstep] + ...``, the ``repeat`` (a compile-time 1, 2, 4 or 8) adjacent
    elements of channel c summed in order: a depth multiplier's input gradient
    from that of the input repeated (output channel c*M + m sees input channel
    c). Each vector of ``dst`` from ``repeat`` loaded vectors by shuffles, where
    the loop vectoriser leaves the strided sums scalar; ``stream`` and 16-bit
    results as in :func:`taps_rows`.""")


@intrinsic
def tap_sums(typingctx, dst, d0, src, offs, wv, ntaps, length):
    """``dst[d0 + i] = src[offs[0] + i]*wv[0] + src[offs[1] + i]*wv[1] + ...`` for
    i < ``length`` (a multiple of 32), the products added in order of k: the
    first rounded alone, each further one fused (:func:`fma`), as the
    channels-last kernels sum their taps; zeros when ``ntaps`` is 0. The plane
    kernels' tap sums: 16 lanes at a time where the CPU has AVX-512 (8 for
    float64, 8 elsewhere), four vectors' sums held in registers through all the
    taps, where the loop vectoriser used 8 lanes and stored the sums back after
    every third tap. (Fused, 0.85 us per 56x56 3x3 plane in L1, against 1.0 us
    with a separate multiply and add.)"""
    sig = types.void(dst, d0, src, offs, wv, ntaps, length)

    def codegen(context, builder, signature, args):
        _, d0v, _, _, _, nv, lenv = args
        f64 = signature.args[0].dtype == types.float64
        width = WIDE // 2 if f64 else WIDE
        v = _Lanes(context, builder, signature, args, width, floats=0)
        fma = v.fma()
        ity = d0v.type
        nv = context.cast(builder, nv, signature.args[5], types.intp)
        lenv = context.cast(builder, lenv, signature.args[6], types.intp)

        def const(i):
            return ir.Constant(ity, i)

        def tap(k):
            off = context.cast(builder, v.scalar(3, k), signature.args[3].dtype, types.intp)
            return off, _splat(builder, v.scalar(4, k), width)

        def block(i0, count):
            off, w = tap(const(0))
            sums = [builder.fmul(v.load(2, builder.add(off, builder.add(i0, const(u * width)))),
                                 w) for u in range(count)]

            def more(k, sums):
                off, w = tap(builder.add(k, const(1)))
                return [builder.call(fma, [
                    v.load(2, builder.add(off, builder.add(i0, const(u * width)))), w, s])
                    for u, s in enumerate(sums)]
            sums = v.loop(builder.sub(nv, const(1)), sums, more)
            for u, s in enumerate(sums):
                v.store(s, 0, builder.add(d0v, builder.add(i0, const(u * width))))
            return []

        def zeros(i0, count):
            for u in range(count):
                v.store(ir.Constant(v.vty, [0.0] * width), 0,
                        builder.add(d0v, builder.add(i0, const(u * width))))
            return []

        quad = 4 * width
        quads = builder.sdiv(lenv, const(quad))
        rest_at = builder.mul(quads, const(quad))
        rest = builder.sdiv(builder.sub(lenv, rest_at), const(width))
        with builder.if_else(builder.icmp_signed(">", nv, const(0))) as (some, none):
            with some:
                v.loop(quads, [], lambda j, _: block(builder.mul(j, const(quad)), 4))
                v.loop(rest, [], lambda j, _: block(builder.add(rest_at,
                                                                builder.mul(j, const(width))), 1))
            with none:
                v.loop(quads, [], lambda j, _: zeros(builder.mul(j, const(quad)), 4))
                v.loop(rest, [], lambda j, _: zeros(builder.add(rest_at,
                                                                builder.mul(j, const(width))), 1))
        return context.get_dummy_value()

    return sig, codegen


# Pairs of vectors (2L columns each) that interleaved_sums computes at once.
_PAIRED_BLOCK = 4


# Half ``half`` of the 2L columns whose even and odd ones are the vectors E
# (lanes 0..L-1 of a shuffle of two) and O (L..2L-1): E[k], O[k], E[k+1], ...
def _zip_half(width, half):
    return ir.Constant(ir.VectorType(_I32, width),
                       [half * width // 2 + k // 2 + width * (k % 2) for k in range(width)])


@intrinsic
def interleaved_sums(typingctx, dst, d0, src, s0, offs, wv, t0, n0, n1, width, stream):
    """``dst[d0 + i]`` for i < ``width``: the sum, in order of t, of ``src[s0 + i//2
    + offs[t]] * wv[t]`` over the ``n0`` taps t from ``t0`` where i is even, the
    ``n1`` after them where i is odd; the first product rounded alone, each
    further one fused (:func:`fma`), as :func:`tap_sums` adds; +0 with no taps.

    One row of the input gradient at a column stride of 2, in place of two
    phase planes' tap sums and their interleaving afterwards: the even and the
    odd columns' sums, a vector of each, interleaved in registers and stored
    as two vectors of consecutive columns, up to ``_PAIRED_BLOCK`` such pairs
    at a time. ``src`` is float32 or float64 and must hold a vector past the
    last element read; ``dst`` the same or (with float32) 16-bit bit
    patterns, rounded as stored. ``stream`` (0 or 1): whole vectors stored
    non-temporally (``dst[d0]`` on a 64-byte boundary); the row's last vectors
    that it does not fill under a mask."""
    if not (isinstance(src, types.Array) and _with_bits(src.dtype, dst.dtype)
            and all(isinstance(a, types.Array) for a in (dst, offs, wv))
            and isinstance(offs.dtype, types.Integer)):
        return None
    sig = types.void(dst, d0, src, s0, offs, wv, t0, n0, n1, width, stream)

    def codegen(context, builder, signature, args):
        b = builder
        f64 = signature.args[2].dtype == types.float64
        L = WIDE // 2 if f64 else WIDE
        v = _Lanes(context, b, signature, args, L, floats=2)
        fma = v.fma()
        d0v, s0v, t0v, n0v, n1v, wdv = (context.cast(b, args[k], signature.args[k], types.intp)
                                        for k in (1, 3, 6, 7, 8, 9))
        streamv = context.cast(b, args[10], signature.args[10], types.intp)
        ity = d0v.type

        def const(i):
            return ir.Constant(ity, i)
        start = ir.Constant(v.vty, [-0.0] * L)
        zero = ir.Constant(v.vty, [0.0] * L)

        def sums(first, n, js):
            """Vectors of sums of the n taps from ``first`` at the columns js."""
            def tap(t, carried):
                t = b.add(first, t)
                off = b.add(s0v, context.cast(b, v.scalar(4, t), signature.args[4].dtype,
                                              types.intp))
                w = _splat(b, v.scalar(5, t), L)
                return [b.call(fma, [v.load(2, b.add(off, j)), w, s])
                        for j, s in zip(js, carried)]
            # (-0 plus the first product is that product, to the bit)
            got = v.loop(n, [start] * len(js), tap)
            none = b.icmp_signed("==", n, const(0))
            return [b.select(none, zero, s) for s in got]

        def emit(j0, count, streaming, last=None):
            """``count`` pairs of vectors of columns from column 2*j0; ``last``: the
            columns left for the last pair (1 to 2L), stored under masks."""
            js = [b.add(j0, const(u * L)) for u in range(count)]
            even = sums(t0v, n0v, js)
            odd = sums(b.add(t0v, n0v), n1v, js)
            for u, (j, e, o) in enumerate(zip(js, even, odd)):
                for half in (0, 1):
                    value = b.shuffle_vector(e, o, _zip_half(L, half))
                    at = b.add(d0v, b.add(b.add(j, j), const(half * L)))
                    if last is None or u < count - 1:
                        v.put(value, 0, at, stream=streaming)
                        continue
                    left = b.sub(last, const(half * L))
                    with b.if_else(b.icmp_signed(">=", left, const(L))) as (whole, part):
                        with whole:
                            v.put(value, 0, at, stream=streaming)
                        with part:
                            with b.if_then(b.icmp_signed(">", left, const(0))):
                                v.masked_put(value, 0, at,
                                             _lanes_below(b, left, L))

        block = const(_PAIRED_BLOCK * 2 * L)
        blocks = b.sdiv(wdv, block)
        rest = b.sub(wdv, b.mul(blocks, block))
        # pairs in the last, partial block, and columns in its last pair
        tail = b.sdiv(b.add(rest, const(2 * L - 1)), const(2 * L))
        last = b.sub(rest, b.mul(b.sub(tail, const(1)), const(2 * L)))
        tail_j0 = b.mul(blocks, const(_PAIRED_BLOCK * L))
        for streaming in (0, 1):
            with b.if_then(b.icmp_signed("==", streamv, const(streaming))):
                v.loop(blocks, [], lambda k, _: emit(
                    b.mul(k, const(_PAIRED_BLOCK * L)), _PAIRED_BLOCK, streaming) or [])
                for count in range(1, _PAIRED_BLOCK + 1):
                    with b.if_then(b.icmp_signed("==", tail, const(count))):
                        emit(tail_j0, count, streaming, last)
        return context.get_dummy_value()

    return sig, codegen

#: Slots per tap of :func:`tap_dots`'s partial sums: a vector's lanes (the first
#: 8 or 16 used), so that callers need not know the host's vector width.
DOT_SLOTS = 16
# Taps whose dot products share each load of ``g`` in :func:`tap_dots`: with two
# vectors per step their 18 sums, the 2 loaded ``g`` vectors and a temporary fit
# the 32 AVX-512 registers (one vector per step with AVX2: 11 of 16).
_DOT_GROUP = 9


def _in_tap_groups(v, ntaps, taps):
    """Generate ``taps(t0, size)`` for the ``ntaps`` taps (a run-time count) in
    groups of up to ``_DOT_GROUP``, the sizes as even as they come; ``size`` is a
    compile-time constant in each case (the sums it keeps in registers)."""
    b = v.builder
    ity = ntaps.type
    step = ir.Constant(ity, _DOT_GROUP)
    groups = b.sdiv(b.add(ntaps, ir.Constant(ity, _DOT_GROUP - 1)), step)

    def group(k, _):
        t0 = b.sdiv(b.mul(k, ntaps), groups)
        t1 = b.sdiv(b.mul(b.add(k, ir.Constant(ity, 1)), ntaps), groups)
        done = b.append_basic_block("taps.done")
        switch = b.switch(b.sub(t1, t0), done)
        for size in range(1, _DOT_GROUP + 1):
            case = b.append_basic_block(f"taps.{size}")
            switch.add_case(ir.Constant(ity, size), case)
            b.position_at_end(case)
            taps(t0, size)
            b.branch(done)
        b.position_at_end(done)
        return []

    v.loop(groups, [], group)


@intrinsic
def tap_dots(typingctx, part, src, offs, ntaps, g, i0, i1):
    """``part[t*DOT_SLOTS + j] += sum of src[offs[t] + i] * g[i]`` over the i in
    ``[i0, i1)`` that are lane j of a vector (``i1 - i0`` a multiple of 32), for
    each tap t < ``ntaps``.

    The plane filter gradient's dot products: taps in groups of up to 9 whose
    lane sums stay in registers over the whole range, each ``g`` vector loaded
    once for the group, so that a multiply-add takes about one load, where the
    loop vectoriser's one dot product at a time took two. The lanes' sums are
    left apart (added up by the caller): per lane, fused, in order of i."""
    floats = (types.float32, types.float64)
    if not (all(isinstance(a, types.Array) for a in (part, src, offs, g))
            and part.dtype in floats and src.dtype == g.dtype == part.dtype
            and isinstance(offs.dtype, types.Integer)):
        return None
    sig = types.void(part, src, offs, ntaps, g, i0, i1)

    def codegen(context, builder, signature, args):
        b = builder
        f64 = signature.args[0].dtype == types.float64
        width = WIDE // 2 if f64 else WIDE
        units = 2 if WIDE == 16 else 1
        v = _Lanes(context, builder, signature, args, width, floats=0)
        fma = v.fma()
        nv, i0v, i1v = (context.cast(b, args[k], signature.args[k], types.intp)
                        for k in (3, 5, 6))
        ity = nv.type

        def const(i):
            return ir.Constant(ity, i)

        step = units * width
        steps = b.sdiv(b.sub(i1v, i0v), const(step))
        zero = ir.Constant(v.vty, [0.0] * width)

        def taps(t0, size):
            offs = [context.cast(b, v.scalar(2, b.add(t0, const(t))), signature.args[2].dtype,
                                 types.intp) for t in range(size)]

            def advance(j, sums):
                i = b.add(i0v, b.mul(j, const(step)))
                gv = [v.load(4, b.add(i, const(u * width))) for u in range(units)]
                return [b.call(fma, [v.load(1, b.add(offs[t], b.add(i, const(u * width)))),
                                     gv[u], sums[t * units + u]])
                        for t in range(size) for u in range(units)]
            sums = v.loop(steps, [zero] * (size * units), advance)
            for t in range(size):
                total = sums[t * units]
                for u in range(1, units):
                    total = b.fadd(total, sums[t * units + u])
                at = b.mul(b.add(t0, const(t)), const(DOT_SLOTS))
                v.store(b.fadd(v.load(0, at), total), 0, at)

        _in_tap_groups(v, nv, taps)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def plane_lanes(itemsize):
    """Lanes of one vector of :func:`plane_dots` for sums of ``itemsize`` bytes:
    the pixels each of its lane masks covers."""
    return WIDE if itemsize == 4 else WIDE // 2


@intrinsic
def plane_dots(typingctx, part, a0, x, x0, g, g0, toffs, masks, ntaps, KW, nvec, v0, v1):
    """For each tap t < ``ntaps`` (of a window KW wide) and lane j < L
    (:func:`plane_lanes`): ``part[a0 + t*DOT_SLOTS + j] +=`` the sum over v < nvec
    of ``x[x0 + v*L + j + toffs[t]] * g[g0 + v*L + j]``, taking only the terms
    whose lane bit j is set in ``masks[(t + 1)*nvec + v]`` (a subset of
    ``masks[v]``, which says which ``g`` elements exist; integers of at least 16
    bits). The vectors v in
    ``[v0, v1)`` must read ``x`` and ``g`` only inside the planes at every lane
    and tap; there ``masks[(ntaps + 1 + t % KW)*nvec + v]``, the lanes whose tap
    column lies inside the map, must equal tap t's mask (:func:`.inplace.masks`).

    The channels-first filter gradient of one plane that needs no copy (stride
    1, output rows as long as the input's), tap t reading the input plane
    ``toffs[t]`` pixels from the output pixel. A term left out is neither read
    nor added (masked loads, masked multiply-adds), so the padding, a row's
    wrap into the next and anything past the arrays are never touched, and an
    Inf or NaN outside the window makes no NaN. Inside [v0, v1) the loads need no
    mask and the multiply-adds take a column's mask, the same for the window's
    rows: a mask load per tap and vector (AMD Zen 4) had cost about as much as
    the multiply-add. Taps in groups of up to 9, as in :func:`tap_dots`; per
    lane the sums are fused, from -0, in order of v, and left apart for the
    caller to add up. ``x`` and ``g`` may hold 16-bit bit patterns
    (:func:`.halves.value`), widened as loaded to ``part``'s float type."""
    floats = (types.float32, types.float64)
    bits = (types.uint16, types.int16)
    if not (all(isinstance(a, types.Array) for a in (part, x, g, toffs, masks))
            and part.dtype in floats
            and (x.dtype == g.dtype == part.dtype
                 or (part.dtype == types.float32 and x.dtype in bits and g.dtype == x.dtype))
            and isinstance(toffs.dtype, types.Integer)
            and isinstance(masks.dtype, types.Integer) and masks.dtype.bitwidth >= 16):
        return None
    sig = types.void(part, a0, x, x0, g, g0, toffs, masks, ntaps, KW, nvec, v0, v1)

    def codegen(context, builder, signature, args):
        b = builder
        v, fma, const, mask, start, (a0v, x0v, g0v, nv, kwv, nvecv, v0v, v1v) = _plane_code(
            context, builder, signature, args, 0, 7, (1, 3, 5, 8, 9, 10, 11, 12))
        width = v.vty.count
        columns = b.mul(b.add(nv, const(1)), nvecv)

        def taps(t0, size):
            ts = [b.add(t0, const(t)) for t in range(size)]
            offs = [context.cast(b, v.scalar(6, t), signature.args[6].dtype, types.intp)
                    for t in ts]
            rows = [b.mul(b.add(t, const(1)), nvecv) for t in ts]
            cols = [b.add(columns, b.mul(b.srem(t, kwv), nvecv)) for t in ts]

            def vectors(first, inside):
                def vector(k, sums):
                    k = b.add(first, k)
                    at = b.mul(k, const(width))
                    if inside:
                        gv = v.value(4, b.add(g0v, at))
                    else:
                        gv = v.masked_value(4, b.add(g0v, at), mask(k))
                    out = []
                    for t in range(size):
                        src = b.add(b.add(x0v, at), offs[t])
                        if inside:
                            m = mask(b.add(cols[t], k))
                            xv = v.value(2, src)
                        else:
                            m = mask(b.add(rows[t], k))
                            xv = v.masked_value(2, src, m)
                        out.append(b.select(m, b.call(fma, [xv, gv, sums[t]]), sums[t]))
                    return out
                return vector

            sums = [start] * size
            sums = v.loop(v0v, sums, vectors(const(0), False))
            sums = v.loop(b.sub(v1v, v0v), sums, vectors(v0v, True))
            sums = v.loop(b.sub(nvecv, v1v), sums, vectors(v1v, False))
            for t in range(size):
                at = b.add(a0v, b.mul(ts[t], const(DOT_SLOTS)))
                v.store(b.fadd(v.load(0, at), sums[t]), 0, at)

        _in_tap_groups(v, nv, taps)
        return context.get_dummy_value()

    return sig, codegen


# Vectors of output pixels whose sums :func:`plane_taps` holds in registers
# through all the taps, where every lane and tap reads inside the plane.
_PLANE_VECS = 4


def _correlation_operands(y, x, w, offs, masks):
    """Whether :func:`plane_taps` and :func:`plane_rows` take these types: float32
    or float64 taps ``w``, ``x`` and ``y`` of that type or (with float32 taps)
    16-bit bit patterns, integer offsets and masks of at least 16 bits."""
    floats = (types.float32, types.float64)
    bits = (types.uint16, types.int16)
    return (all(isinstance(a, types.Array) for a in (y, x, w, offs, masks))
            and w.dtype in floats
            and all(a.dtype == w.dtype or (w.dtype == types.float32 and a.dtype in bits)
                    for a in (x, y))
            and isinstance(offs.dtype, types.Integer)
            and isinstance(masks.dtype, types.Integer) and masks.dtype.bitwidth >= 16)


@intrinsic
def plane_taps(typingctx, y, y0, x, x0, w, w0, wstep, toffs, masks, ntaps, group, KW, nvec,
               v0, v1):
    """For each lane j < L (:func:`plane_lanes`) of each vector v < ``nvec`` whose
    bit j is set in ``masks[v]``: ``y[y0 + v*L + j] =`` the sum over taps t <
    ``ntaps`` (of a window ``KW`` wide), in order of t, of ``x[x0 + v*L + j +
    toffs[t]] * w[w0 + t*wstep]``, taking only the taps whose bit j is set in
    ``masks[(t + 1)*nvec + v]``; the other elements of ``y`` are not touched.
    The taps come in groups of ``group`` (a divisor of ``ntaps``), each summed
    on its own and the groups' sums added in order: a depth multiplier's input
    gradient, its M planes' sums added as the other kernels add them. A lane
    whose bit is clear in ``masks[(ntaps + 1 + KW)*nvec + v]`` (no tap inside)
    gets +0, the empty sum, as in the other kernels.
    Masks and [v0, v1) as for :func:`plane_dots` (:func:`.inplace.masks`).

    The channels-first forward (and stride-1 input gradient) of one plane that
    needs no copy: output rows as long as the input's, so that tap t reads the
    input ``toffs[t]`` pixels from the output pixel. As in :func:`plane_dots`,
    a term left out is neither read nor added (an Inf or NaN in the padding's
    place makes no NaN), the vectors in [v0, v1) load without masks and add
    under their column's mask, ``_PLANE_VECS`` of them at a time with their sums
    in registers; the sums start from -0 and are fused, so a sum's first product
    is rounded alone, as the other kernels sum. ``x`` may hold 16-bit bit
    patterns, widened as loaded, and ``y`` too, the sums rounded as stored
    (:meth:`_Lanes.put`); ``w`` is float32 then, or the float type of both."""
    if not _correlation_operands(y, x, w, toffs, masks):
        return None
    sig = types.void(y, y0, x, x0, w, w0, wstep, toffs, masks, ntaps, group, KW, nvec, v0, v1)

    def codegen(context, builder, signature, args):
        b = builder
        v, fma, const, mask, start, (y0v, x0v, w0v, wsv, nv, gv, kwv, nvecv, v0v, v1v) = \
            _plane_code(context, builder, signature, args, 4, 8,
                        (1, 3, 5, 6, 9, 10, 11, 12, 13, 14))
        width = v.vty.count
        columns = b.mul(b.add(nv, const(1)), nvecv)
        empty = b.add(columns, b.mul(kwv, nvecv))

        def vectors(first, count, inside):
            """The step k of a loop over vectors from ``first``, ``count`` at a time."""
            def step(k, _):
                # one base index per operand, each vector at a constant distance from
                # it: per-vector indices left LLVM with a pointer each, spilled
                k0 = b.add(first, b.mul(k, const(count)))
                ks = [b.add(k0, const(u)) for u in range(count)]
                at0 = b.mul(k0, const(width))
                at = [b.add(at0, const(u * width)) for u in range(count)]

                def tap(t, carried, g0):
                    t = b.add(g0, t)
                    kw, sums = carried[0], carried[1:]
                    off = context.cast(b, v.scalar(7, t), signature.args[7].dtype, types.intp)
                    wt = v.scalar(4, b.add(w0v, b.mul(t, wsv)))
                    wt = _splat(b, wt, width)
                    out = []
                    src0 = b.add(b.add(x0v, off), at0)
                    if inside:
                        m0 = b.add(b.add(columns, b.mul(kw, nvecv)), k0)
                    else:
                        m0 = b.add(b.mul(b.add(t, const(1)), nvecv), k0)
                    for u, s in enumerate(sums):
                        src = b.add(src0, const(u * width))
                        m = mask(b.add(m0, const(u)))
                        if inside:
                            xv = v.value(2, src)
                        else:
                            xv = v.masked_value(2, src, m)
                        out.append(b.select(m, b.call(fma, [xv, wt, s]), s))
                    kw = b.add(kw, const(1))
                    kw = b.select(b.icmp_signed("==", kw, kwv), const(0), kw)
                    return [kw] + out
                def grouped(g, carried):
                    kw, totals = carried[0], carried[1:]
                    g0 = b.mul(g, gv)
                    got = v.loop(gv, [kw] + [start] * count, lambda t, c: tap(t, c, g0))
                    return [got[0]] + [b.fadd(a, s) for a, s in zip(totals, got[1:])]
                # (-0 + the first group's sum is that sum, to the bit)
                sums = v.loop(b.sdiv(nv, gv), [const(0)] + [start] * count, grouped)[1:]
                zero = ir.Constant(v.vty, [0.0] * width)
                sums = [b.select(mask(b.add(empty, ks[u])), s, zero) for u, s in enumerate(sums)]
                for u, s in enumerate(sums):
                    dst = b.add(y0v, at[u])
                    if inside:
                        v.put(s, 0, dst)
                    else:
                        v.masked_put(s, 0, dst, mask(ks[u]))
                return []
            return step

        inner = b.sub(v1v, v0v)
        blocks = b.sdiv(inner, const(_PLANE_VECS))
        rest_at = b.add(v0v, b.mul(blocks, const(_PLANE_VECS)))
        v.loop(v0v, [], vectors(const(0), 1, False))
        v.loop(blocks, [], vectors(v0v, _PLANE_VECS, True))
        v.loop(b.sub(v1v, rest_at), [], vectors(rest_at, 1, True))
        v.loop(b.sub(nvecv, v1v), [], vectors(v1v, 1, False))
        return context.get_dummy_value()

    return sig, codegen


# Output rows whose sums :func:`plane_rows` holds in registers at once: each input
# row it loads serves up to a window's height of them. 14 for AVX-512's 32
# registers; with AVX2's 16 they spilled, and blocks of 4 rows were faster
# (AMD Zen 3, 2 threads, NCHW, alternating processes each with its own cache, 9
# rounds, median per-round ratio 4 / 14 rows and its quartiles: 56x56x96 7x7
# forward N=8 0.80 (0.72-0.94), N=1 0.92 (0.70-0.96), input gradient N=8 0.88
# (0.86-0.96), N=1 0.87 (0.78-1.00); 8x56x56x72 5x5 forward 0.66 (0.42-0.75);
# 8x28x28x240 5x5 even, 0.97 forward, 0.96 input gradient; 7 rows in between).
# Another 9 rounds, 14 / 4 rows: 56x56x96 7x7 forward N=32 1.71 (1.48-1.74), N=8
# 1.40, input gradient N=32 1.22 (1.21-1.32); 32x28x28x240 5x5 forward 1.09.
PLANE_ROWS = 14 if WIDE == 16 else 4


@intrinsic
def plane_rows(typingctx, y, y0, x, x0, w, w0, coffs, cmasks, H, OH, W, P, KH, KW, down):
    """For each output row oh < ``OH`` of a plane ``W`` wide and each of its pixels
    c < W: ``y[y0 + oh*W + c] =`` the sum over taps (kh, kw) of a KH x KW window
    (literal sizes), in order of ``kh*KW + kw``, of ``x[x0 + ih*W + c +
    coffs[kw]] * w[w0 + kh*KW + kw]``, ``ih = oh - P + kh`` (``down`` 1: ``oh -
    P - kh``), taking the terms whose input row lies in [0, H) and whose lane
    bit is set in ``cmasks[j*(KW + 2) + kw]`` (j = c // L, the vector of the
    row, L lanes (:func:`plane_lanes`): the columns that exist and whose tap
    column lies inside the map). ``cmasks[j*(KW + 2) + KW]``: the columns that
    exist; ``[... + KW + 1]``: those with a tap column inside. A pixel with no
    tap inside gets +0, the empty sum.

    :func:`plane_taps` of a window of dilation 1 in rows (``down`` 0: the
    forward; 1: the stride-1 input gradient, whose taps read the rows upwards),
    ``PLANE_ROWS`` output rows at a time, column vector by column vector: each
    input row's vector is loaded once per column tap and serves every output
    row of the block that reads it, where :func:`plane_taps` loads a vector per
    tap and output vector. Each sum adds its terms in the same order, from -0,
    fused, so the results are those of :func:`plane_taps` to the bit. Rows are
    whole vectors (the last one masked), so rows of a length just over a
    multiple of L waste lanes. ``x``, ``y`` may hold 16-bit bit patterns as in
    :func:`plane_taps`."""
    KH_, KW_, DOWN = _taps(KH), _taps(KW), _taps(down)
    if not (KH_ and KW_ and DOWN in (0, 1)
            and _correlation_operands(y, x, w, coffs, cmasks)):
        return None
    sig = types.void(y, y0, x, x0, w, w0, coffs, cmasks, H, OH, W, P, KH, KW, down)
    R = PLANE_ROWS

    def codegen(context, builder, signature, args):
        b = builder
        v, fma, const, mask, start, (y0v, x0v, w0v, hv, ohv, wv, pv) = _plane_code(
            context, builder, signature, args, 4, 7, (1, 3, 5, 8, 9, 10, 11))
        width = v.vty.count
        nvec = b.sdiv(b.add(wv, const(width - 1)), const(width))
        blocks = b.sdiv(b.add(ohv, const(R - 1)), const(R))
        offs = [context.cast(b, v.scalar(6, const(k)), signature.args[6].dtype, types.intp)
                for k in range(KW_)]
        wts = [_splat(b, v.scalar(4, b.add(w0v, const(t))), width) for t in range(KH_ * KW_)]
        zero = ir.Constant(v.vty, [0.0] * width)
        # u: an input row's place in the block, ih = oh0 - P + u; output row r reads
        # it through row tap kh = u - r (down: r - u), in order of kh
        us = range(R + KH_ - 1) if not DOWN else range(R - 1, -KH_, -1)

        def block(i, _):
            oh0 = b.mul(i, const(R))

            def column(j, _):
                m0 = b.mul(j, const(KW_ + 2))
                ms = [mask(b.add(m0, const(k))) for k in range(KW_ + 2)]
                full = b.icmp_signed("==", b.bitcast(ms[KW_], ir.IntType(width)),
                                     ir.Constant(ir.IntType(width), (1 << width) - 1))
                at = b.mul(j, const(width))
                sums = [start] * R
                for u in us:
                    ih = b.add(b.sub(oh0, pv), const(u))
                    inside = b.and_(b.icmp_signed(">=", ih, const(0)),
                                    b.icmp_signed("<", ih, hv))
                    pre = b.block
                    then, after = b.append_basic_block("row"), b.append_basic_block("rowed")
                    b.cbranch(inside, then, after)
                    b.position_at_end(then)
                    new = list(sums)
                    src = b.add(b.add(x0v, b.mul(ih, wv)), at)
                    for kw in range(KW_):
                        xv = v.masked_value(2, b.add(src, offs[kw]), ms[kw])
                        for r in range(R):
                            kh = r - u if DOWN else u - r
                            if 0 <= kh < KH_:
                                new[r] = b.select(ms[kw], b.call(
                                    fma, [xv, wts[kh * KW_ + kw], new[r]]), new[r])
                    done = b.block
                    b.branch(after)
                    b.position_at_end(after)
                    for r in range(R):
                        if new[r] is not sums[r]:
                            phi = b.phi(v.vty)
                            phi.add_incoming(sums[r], pre)
                            phi.add_incoming(new[r], done)
                            sums[r] = phi
                for r in range(R):
                    oh = b.add(oh0, const(r))
                    below = b.icmp_signed("<", oh, ohv)
                    lo = b.sub(oh, pv) if not DOWN else b.sub(b.sub(oh, pv), const(KH_ - 1))
                    rows = b.and_(b.icmp_signed(">=", b.add(lo, const(KH_ - 1)), const(0)),
                                  b.icmp_signed("<", lo, hv))
                    keep = b.and_(ms[KW_ + 1], b.select(
                        rows, ir.Constant(ms[0].type, [1] * width),
                        ir.Constant(ms[0].type, [0] * width)))
                    value = b.select(keep, sums[r], zero)
                    dst = b.add(b.add(y0v, b.mul(oh, wv)), at)
                    # a row's whole vectors stored plainly: with every store masked,
                    # 1 thread, AMD Zen 4, N=1 56x56x96 7x7 forward 0.60 ms, 0.46 so
                    with b.if_else(b.and_(full, below)) as (plain, part):
                        with plain:
                            v.put(value, 0, dst)
                        with part:
                            there = b.select(below, ms[KW_],
                                             ir.Constant(ms[0].type, [0] * width))
                            v.masked_put(value, 0, dst, there)
                return []
            v.loop(nvec, [], column)
            return []
        v.loop(blocks, [], block)
        return context.get_dummy_value()

    return sig, codegen


def _plane_code(context, builder, signature, args, floats, masks, ints):
    """What :func:`plane_dots`, :func:`plane_taps` and :func:`plane_rows` generate
    code with: the :class:`_Lanes` of the float type of argument ``floats`` (16
    lanes of float32 with AVX-512), its fused multiply-add, ``const(i)`` (an
    index constant), ``mask(k)`` (the ``<lanes x i1>`` mask ``masks[k]`` of
    argument ``masks``, bit j for lane j), a vector of -0 to start sums from,
    and the integer arguments ``ints`` as indices."""
    b = builder
    width = WIDE // 2 if signature.args[floats].dtype == types.float64 else WIDE
    v = _Lanes(context, builder, signature, args, width, floats=floats)
    values = [context.cast(b, args[k], signature.args[k], types.intp) for k in ints]
    ity = values[0].type
    mty = ir.VectorType(ir.IntType(1), width)

    def const(i):
        return ir.Constant(ity, i)

    def mask(k):
        got = v.scalar(masks, k)
        if got.type.width > width:
            got = b.trunc(got, ir.IntType(width))
        return b.bitcast(got, mty)
    return v, v.fma(), const, mask, ir.Constant(v.vty, [-0.0] * width), values


@intrinsic
def stream_copy(typingctx, dst, d0, src, s0, n):
    """``dst[d0 : d0+n] = src[s0 : s0+n]`` (one dtype), 64 bytes a step, written
    with non-temporal stores where :data:`STREAMS` (``dst[d0]`` must lie on a
    64-byte boundary, ``n`` elements fill whole steps, and the caller fences,
    :func:`sfence`): a result assembled in the cache sent to memory without the
    read of each line that a plain store makes."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == src.dtype):
        return None
    sig = types.void(dst, d0, src, s0, n)

    def codegen(context, builder, signature, args):
        dstv, d0v, srcv, s0v, nv = args
        d0v, s0v, nv = (context.cast(builder, a, t, types.int64)
                        for a, t in zip((d0v, s0v, nv), [signature.args[i] for i in (1, 3, 4)]))
        elt = context.get_data_type(signature.args[0].dtype)
        size = context.get_abi_sizeof(elt)
        vty = ir.VectorType(elt, 64 // size)
        ity = ir.IntType(64)
        to, fro = (context.make_array(signature.args[i])(context, builder, a).data
                   for i, a in ((0, dstv), (2, srcv)))

        def move(k, _):
            j = builder.mul(k, ir.Constant(ity, vty.count))
            at = builder.bitcast(builder.gep(fro, [builder.add(s0v, j)]), vty.as_pointer())
            to_at = builder.bitcast(builder.gep(to, [builder.add(d0v, j)]), vty.as_pointer())
            st = builder.store(builder.load(at, align=size), to_at, align=64)
            if STREAMS:
                _nontemporal(st, builder)
            return []
        lanes = _Lanes(context, builder, signature, args)
        lanes.loop(builder.sdiv(nv, ir.Constant(ity, vty.count)), [], move)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy_rows(typingctx, dst, d0, dstep, src, s0, sstep, rows, cols):
    """``dst[d0 + r*dstep + j] = src[s0 + r*sstep + j]`` for r < ``rows`` and
    j < ``cols``: 16-bit bit patterns (:func:`.halves.value`) widened as read and
    rounded as written (:meth:`_Lanes.put`), floats copied. The plane kernels'
    copies between an operand and a padded scratch, whose rows (7 to 112 elements
    on the suite) the loop vectoriser left scalar: whole vectors, then one vector
    ending at the row's end (its overlap rewrites the same values); a row shorter
    than a vector element by element. dst and src must not overlap."""
    floats = [t for t in (dst, src) if t.dtype in (types.float32, types.float64)]
    if not floats or any(t.dtype != floats[0].dtype for t in floats):
        return None
    sig = types.void(dst, d0, dstep, src, s0, sstep, rows, cols)

    def codegen(context, builder, signature, args):
        _, d0v, dstepv, _, s0v, sstepv, rowsv, colsv = args
        at = 0 if signature.args[0].dtype in (types.float32, types.float64) else 3
        width = WIDE // 2 if floats[0].dtype == types.float64 else WIDE
        ity = ir.IntType(64)
        d0v, dstepv, s0v, sstepv, rowsv, colsv = (
            context.cast(builder, a, t, types.int64) for a, t in zip(
                (d0v, dstepv, s0v, sstepv, rowsv, colsv),
                [signature.args[i] for i in (1, 2, 4, 5, 6, 7)]))
        vec = _Lanes(context, builder, signature, args, width, floats=at)
        one = _Lanes(context, builder, signature, args, 1, floats=at)

        def const(i):
            return ir.Constant(ity, i)

        def row(r, _):
            s = builder.add(s0v, builder.mul(r, sstepv))
            d = builder.add(d0v, builder.mul(r, dstepv))

            def move(lanes, j):
                lanes.put(lanes.value(3, builder.add(s, j)), 0, builder.add(d, j))
                return []
            with builder.if_else(builder.icmp_signed(">=", colsv, const(width))) as (wide, short):
                with wide:
                    whole = builder.sdiv(colsv, const(width))
                    vec.loop(whole, [], lambda k, _: move(vec, builder.mul(k, const(width))))
                    with builder.if_then(builder.icmp_signed(
                            ">", builder.srem(colsv, const(width)), const(0))):
                        move(vec, builder.sub(colsv, const(width)))
                with short:
                    one.loop(colsv, [], lambda k, _: move(one, k))
            return []

        vec.loop(rowsv, [], row)
        return context.get_dummy_value()

    return sig, codegen



#: The most vectors of columns :func:`pointwise_rows` sums at once.
POINTWISE_VECS = 4


def _pixel_block(vecs):
    """Rows :func:`pointwise_rows` sums at once, by the vectors of columns it takes
    at once: their sums fill 16-24 registers (of AVX-512's 32), leaving room for
    the column vectors and the broadcast elements."""
    return min(16, 24 // vecs)


@intrinsic
def pointwise_rows(typingctx, dst, d0, dstep, a, a0, astep, aloop, b, b0, bloop, J, K, n,
                   vecs, stream):
    """For each row k < n and column j < J: ``dst[d0 + k*dstep + j] =``
    ``a[a0 + k*astep]*b[b0 + j] + a[a0 + k*astep + aloop]*b[b0 + bloop + j] + ... +``
    ``a[a0 + k*astep + (K-1)*aloop]*b[b0 + (K-1)*bloop + j]``, K >= 1: the products
    added in order of i < K, the first rounded alone, each further one fused.
    Floats of one type. ``stream`` true: whole vectors of columns are written
    with non-temporal stores (only where :data:`STREAMS`; ``dst``, ``d0`` and
    ``dstep`` must put every vector of columns on a 64-byte boundary, and the
    caller fences, :func:`sfence`).

    The pointwise (1x1) steps of a separable convolution as small products of
    matrices: the forward (a: the depthwise result's pixels, b: the pointwise
    kernel), the gradient of its input (a: the output gradient, b: the kernel
    transposed) and of the kernel (a: the output gradient transposed, b: the
    depthwise result). ``vecs`` (1 to :data:`POINTWISE_VECS`) vectors of
    :data:`WIDE` lanes (half as many for float64) of columns for a block of rows
    (:func:`_pixel_block`, or 4 or 1 when n is smaller; the last block
    overlapping the one before) at a time, their sums in registers through all
    K terms, each b vector loaded once per block and each a element broadcast
    once; a lanes mask leaves the columns from J on out of the loads and the
    stores. (NumPy's BLAS, 8x56x56 pixels, 144 -> 24 columns, 2 threads: 1.0 ms,
    with its threads spinning into the next kernel's.)"""
    if not all(isinstance(t, types.Array) and t.dtype == dst.dtype for t in (dst, a, b)):
        return None
    if dst.dtype not in (types.float32, types.float64):
        return None
    sig = types.void(dst, d0, dstep, a, a0, astep, aloop, b, b0, bloop, J, K, n, vecs, stream)

    def codegen(context, builder, signature, args):
        f64 = signature.args[0].dtype == types.float64
        width = WIDE // 2 if f64 else WIDE
        v = _Lanes(context, builder, signature, args, width)
        fma = v.fma()
        (d0v, dstepv, a0v, astepv, aloopv, b0v, bloopv, Jv, Kv, nv, vecsv, streamv) = (
            context.cast(builder, args[i], signature.args[i], types.intp)
            for i in (1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14))
        ity = d0v.type
        ivty = ir.VectorType(ity, width)
        iota = ir.Constant(ivty, list(range(width)))
        fty = "f64" if f64 else "f32"
        mty = ir.VectorType(ir.IntType(1), width)
        masked_store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [
                v.vty, v.vty.as_pointer(), _I32, mty]),
            f"llvm.masked.store.v{width}{fty}.p0v{width}{fty}")
        masked_load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v.vty, [v.vty.as_pointer(), _I32, mty, v.vty]),
            f"llvm.masked.load.v{width}{fty}.p0v{width}{fty}")
        zero = ir.Constant(v.vty, [0.0] * width)
        align = ir.Constant(_I32, v.align)

        def const(i):
            return ir.Constant(ity, i)

        def rows(V, j0, k0, R):
            cols = [builder.add(j0, const(u * width)) for u in range(V)]
            keep = [builder.icmp_signed("<", builder.add(iota, _splat(builder, c, width)),
                                        _splat(builder, Jv, width))
                    for c in cols]
            arows = [builder.add(a0v, builder.mul(builder.add(k0, const(p)), astepv))
                     for p in range(R)]

            def terms(i):
                brow = builder.add(b0v, builder.mul(i, bloopv))
                bs = [builder.call(masked_load, [v._ptr(7, builder.add(brow, c)), align, m,
                                                 zero])
                      for c, m in zip(cols, keep)]
                at = builder.mul(i, aloopv)
                av = [_splat(builder, v.scalar(3, builder.add(r, at)), width) for r in arows]
                return av, bs

            av, bs = terms(const(0))
            sums = [builder.fmul(av[p], bs[u]) for p in range(R) for u in range(V)]

            def more(i, sums):
                av, bs = terms(builder.add(i, const(1)))
                return [builder.call(fma, [av[p], bs[u], sums[p * V + u]])
                        for p in range(R) for u in range(V)]
            sums = v.loop(builder.sub(Kv, const(1)), sums, more)
            for u in range(V):
                ats = [builder.add(builder.add(d0v, builder.mul(builder.add(k0, const(p)),
                                                                dstepv)), cols[u])
                       for p in range(R)]
                whole = builder.and_(builder.icmp_signed("!=", streamv, const(0)),
                                     builder.icmp_signed("<=", builder.add(cols[u],
                                                                           const(width)), Jv))
                with builder.if_else(whole) as (streamed, masked):
                    with streamed:
                        for p in range(R):
                            v.put(sums[p * V + u], 0, ats[p], stream=STREAMS)
                    with masked:
                        for p in range(R):
                            builder.call(masked_store, [sums[p * V + u], v._ptr(0, ats[p]),
                                                        align, keep[u]])
            return []

        def cover(V, j0, R):
            """Every row in blocks of R, the last overlapping the one before (its
            rows stored again, with the same sums), n >= R."""
            last = builder.sub(nv, const(R))
            blocks = builder.sdiv(builder.add(nv, const(R - 1)), const(R))

            def block(bi, _):
                k0 = builder.mul(bi, const(R))
                return rows(V, j0, builder.select(builder.icmp_signed("<", k0, last), k0,
                                                  last), R)
            v.loop(blocks, [], block)

        def run(V):
            R = _pixel_block(V)
            step = V * width

            def columns(jb, _):
                j0 = builder.mul(jb, const(step))
                with builder.if_else(builder.icmp_signed(">=", nv, const(R))) as (full, few):
                    with full:
                        cover(V, j0, R)
                    with few:
                        with builder.if_else(builder.icmp_signed(">=", nv, const(4))) as (
                                some, one):
                            with some:
                                cover(V, j0, 4)
                            with one:
                                cover(V, j0, 1)
                return []
            v.loop(builder.sdiv(builder.add(Jv, const(step - 1)), const(step)), [], columns)

        for V in range(1, POINTWISE_VECS + 1):
            with builder.if_then(builder.icmp_signed("==", vecsv, const(V))):
                run(V)
        return context.get_dummy_value()

    return sig, codegen
