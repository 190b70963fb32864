"""Vector register operations LLVM does not find on its own, as Numba intrinsics.

Each works on float32 or float64 arrays (one element type per call, 8 lanes) and
leaves bounds to the caller, like the kernels' unsigned indexing does.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)
_LO = ir.Constant(ir.VectorType(_I32, 8), [0, 8, 1, 9, 2, 10, 3, 11])
_HI = ir.Constant(ir.VectorType(_I32, 8), [4, 12, 5, 13, 6, 14, 7, 15])


@intrinsic
def transpose8(typingctx, src, s0, ss, dst, d0, doffs, di):
    """Transpose an 8 x 8 block: row r of the block is ``src[s0 + r*ss : +8]``;
    column c goes to ``dst[d0 + doffs[di + c] : +8]``.

    Eight vector loads, three rounds of interleaving (each round rotates the six
    bits of an element's (row, column) index by one; three rounds swap row and
    column) and eight vector stores. The caller guarantees the bounds."""
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
        for _ in range(3):
            rows = [builder.shuffle_vector(rows[i], rows[i + 4], mask)
                    for i in range(4) for mask in (_LO, _HI)]
        for c in range(8):
            k = builder.add(div, ir.Constant(div.type, c))
            off = builder.add(d0v, builder.load(builder.gep(oary.data, [k])))
            ptr = builder.bitcast(builder.gep(dary.data, [off]), vptr)
            builder.store(rows[c], ptr, align=align)
        return context.get_dummy_value()

    return sig, codegen


_EVEN = ir.Constant(ir.VectorType(_I32, 8), list(range(0, 16, 2)))
_ODD = ir.Constant(ir.VectorType(_I32, 8), list(range(1, 16, 2)))


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


@intrinsic
def taps_dot8(typingctx, acc, a0, astep, x, s0, sstep, toffs, g, g0, gstep, n, taps):
    """For each tap t < ``taps`` (a compile-time constant):
    ``acc[a0 + t*astep : +8] += sum over k < n of x[s0 + k*sstep + toffs[t] : +8] *
    g[g0 + k*gstep : +8]``.

    The filter gradient's inner loop over a row of pixels with the ``taps``
    8-lane sums held in registers and each ``g`` vector loaded once for all taps:
    per pixel and tap one load and one fused multiply-add, where the loop LLVM
    builds from the scalar form stores every partial sum back to memory. Sums in
    pixel order per lane (fused, one rounding per step)."""
    if not isinstance(taps, types.IntegerLiteral):
        return None
    kt = taps.literal_value
    sig = types.void(acc, a0, astep, x, s0, sstep, toffs, g, g0, gstep, n, taps)

    def codegen(context, builder, signature, args):
        accv, a0v, astepv, xv, s0v, sstepv, toffv, gv, g0v, gstepv, nv, _ = args
        aary = context.make_array(signature.args[0])(context, builder, accv)
        xary = context.make_array(signature.args[3])(context, builder, xv)
        tary = context.make_array(signature.args[6])(context, builder, toffv)
        gary = context.make_array(signature.args[7])(context, builder, gv)
        elt = context.get_data_type(signature.args[0].dtype)
        align = context.get_abi_sizeof(elt)
        vty = ir.VectorType(elt, 8)
        vptr = vty.as_pointer()
        ity = s0v.type
        name = "llvm.fma.v8f32" if elt == ir.FloatType() else "llvm.fma.v8f64"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                             name)

        def vec_at(ary, off):
            return builder.bitcast(builder.gep(ary.data, [off]), vptr)

        aptrs, offs, sums = [], [], []
        for t in range(kt):
            off = builder.add(a0v, builder.mul(astepv, ir.Constant(ity, t)))
            aptrs.append(vec_at(aary, off))
            offs.append(builder.load(builder.gep(tary.data, [ir.Constant(ity, t)])))
        # the loop: k and the sums as phi nodes, so they live in registers
        pre = builder.block
        head = builder.append_basic_block("taps.head")
        body = builder.append_basic_block("taps.body")
        done = builder.append_basic_block("taps.done")
        starts = [builder.load(p, align=align) for p in aptrs]
        builder.branch(head)
        builder.position_at_end(head)
        k = builder.phi(ity)
        k.add_incoming(ir.Constant(ity, 0), pre)
        for t in range(kt):
            s = builder.phi(vty)
            s.add_incoming(starts[t], pre)
            sums.append(s)
        builder.cbranch(builder.icmp_signed("<", k, nv), body, done)
        builder.position_at_end(body)
        gk = builder.load(vec_at(gary, builder.add(g0v, builder.mul(k, gstepv))), align=align)
        xk = builder.add(s0v, builder.mul(k, sstepv))
        for t in range(kt):
            xt = builder.load(vec_at(xary, builder.add(xk, offs[t])), align=align)
            sums[t].add_incoming(builder.call(fma, [xt, gk, sums[t]]), body)
        k.add_incoming(builder.add(k, ir.Constant(ity, 1)), body)
        builder.branch(head)
        builder.position_at_end(done)
        for t in range(kt):
            builder.store(sums[t], aptrs[t], align=align)
        return context.get_dummy_value()

    return sig, codegen
