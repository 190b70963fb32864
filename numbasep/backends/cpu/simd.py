"""Vector register operations LLVM does not find on its own, as Numba intrinsics.

Each works on float32 or float64 arrays (one element type per call, 8 lanes) and
leaves bounds to the caller, like the kernels' unsigned indexing does.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


def _mask(*lanes):
    return ir.Constant(ir.VectorType(_I32, 8), list(lanes))


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


_EVEN = _mask(*range(0, 16, 2))
_ODD = _mask(*range(1, 16, 2))


@intrinsic
def deinterleave8(typingctx, src, s0, dst, d0, d1):
    """``dst[d0 : d0+8] = src[s0 : s0+16 : 2]`` and ``dst[d1 : d1+8] = src[s0+1 : s0+16 : 2]``:
    two vector loads, two shuffles, two stores (the loop vectoriser leaves this
    stride-2 split scalar)."""
    sig = types.void(src, s0, dst, d0, d1)

    def codegen(context, builder, signature, args):
        srcv, s0v, dstv, d0v, d1v = args
        sary = context.make_array(signature.args[0])(context, builder, srcv)
        dary = context.make_array(signature.args[2])(context, builder, dstv)
        elt = context.get_data_type(signature.args[0].dtype)
        align = context.get_abi_sizeof(elt)
        ptr = builder.bitcast(builder.gep(sary.data, [s0v]), ir.VectorType(elt, 16).as_pointer())
        v = builder.load(ptr, align=align)
        for off, mask in ((d0v, _EVEN), (d1v, _ODD)):
            half = builder.shuffle_vector(v, v, mask)
            out = builder.gep(dary.data, [off])
            builder.store(half, builder.bitcast(out, ir.VectorType(elt, 8).as_pointer()),
                          align=align)
        return context.get_dummy_value()

    return sig, codegen


class _Lanes:
    """Code generation helpers for the 8-lane intrinsics below: vector loads and
    stores at element offsets of arrays, and a counted loop whose carried values
    are phi nodes (so that they live in registers)."""

    def __init__(self, context, builder, signature, args):
        self.builder = builder
        self.arrays = {i: context.make_array(t)(context, builder, a)
                       for i, (t, a) in enumerate(zip(signature.args, args))
                       if isinstance(t, types.Array)}
        self.elt = context.get_data_type(signature.args[0].dtype)
        self.align = context.get_abi_sizeof(self.elt)
        self.vty = ir.VectorType(self.elt, 8)

    def _ptr(self, i, off):
        return self.builder.bitcast(self.builder.gep(self.arrays[i].data, [off]),
                                    self.vty.as_pointer())

    def load(self, i, off):
        return self.builder.load(self._ptr(i, off), align=self.align)

    def store(self, value, i, off):
        self.builder.store(value, self._ptr(i, off), align=self.align)

    def scalar(self, i, off):
        return self.builder.load(self.builder.gep(self.arrays[i].data, [off]))

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


@intrinsic
def taps_dot8(typingctx, acc, a0, astep, x, s0, sstep, srow, toffs, g, g0, gstep, grow, n, m,
              taps):
    """For each tap t < ``taps`` (a compile-time constant):
    ``acc[a0 + t*astep : +8] += sum over rows r < m and pixels k < n of
    x[s0 + r*srow + k*sstep + toffs[t] : +8] * g[g0 + r*grow + k*gstep : +8]``.

    The filter gradient's inner loops over a block of rows of pixels with the
    ``taps`` 8-lane sums held in registers throughout and each ``g`` vector loaded
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
        v = _Lanes(context, builder, signature, args)
        ity = s0v.type
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v.vty, [v.vty] * 3),
            "llvm.fma.v8f32" if v.elt == ir.FloatType() else "llvm.fma.v8f64")
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


@intrinsic
def taps_row8(typingctx, dst, d0, dstep, x, s0, sstep, toffs, wt, w0, wstep, n, taps):
    """For each k < n: ``dst[d0 + k*dstep : +8] = sum over taps t < taps`` (a
    compile-time constant) ``of x[s0 + k*sstep + toffs[t] : +8] * wt[w0 + t*wstep : +8]``.

    The correlation's inner loop over a row of pixels with the taps' weight
    vectors held in registers: per pixel and tap one load, a multiply and an add
    (unfused and in tap order, as the channels-last kernels round)."""
    kt = _taps(taps)
    if kt is None:
        return None
    sig = types.void(dst, d0, dstep, x, s0, sstep, toffs, wt, w0, wstep, n, taps)

    def codegen(context, builder, signature, args):
        _, d0v, dstepv, _, s0v, sstepv, _, _, w0v, wstepv, nv, _ = args
        v = _Lanes(context, builder, signature, args)
        ity = s0v.type
        ws = [v.load(7, builder.add(w0v, builder.mul(wstepv, ir.Constant(ity, t))))
              for t in range(kt)]
        toff = [v.scalar(6, ir.Constant(ity, t)) for t in range(kt)]

        def pixel(k, _):
            xk = builder.add(s0v, builder.mul(k, sstepv))
            acc = builder.fmul(v.load(3, builder.add(xk, toff[0])), ws[0])
            for t in range(1, kt):
                acc = builder.fadd(acc, builder.fmul(v.load(3, builder.add(xk, toff[t])), ws[t]))
            v.store(acc, 0, builder.add(d0v, builder.mul(k, dstepv)))
            return []

        v.loop(nv, [], pixel)
        return context.get_dummy_value()

    return sig, codegen
